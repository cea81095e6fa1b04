"""The compiled depthwise algorithm (and the compiled im2col) against the reference, the NumPy
engine and itself."""
from __future__ import annotations

import types
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.conv.algorithm import algorithms
from netrun.conv.cpu import im2col as im2col_module
from netrun.conv.problem import ConvProblem
from netrun.core.net import SimpleNet
from netrun.core.operator import Operator
from netrun.kernels import jit, parallel
from tests.algos.reference import ref_conv
from tests.algos.test_algorithms import DIRECTIONS, problems, run_all

needs_numba = pytest.mark.skipif(not jit.available(),
                                 reason="Numba is not installed (or NETRUN_JIT=0)")
ALGO = algorithms("cpu")["depthwise_jit"]
KERNELS = ("forward", "backward_data", "backward_filter")
# MobileNet-like: 3×3 "same" at stride 1, a stride-2 one, and a multiplier with dilation
SHAPES = {
    "3x3 same": ConvProblem(4, 8, 14, 13, 8, 3, 3, 1, 1, 1, 1, 1, 1, group=8),
    "3x3 stride 2": ConvProblem(3, 6, 15, 16, 6, 3, 3, 2, 2, 1, 1, 0, 1, group=6),
    "5x3 multiplier 2 dilation": ConvProblem(2, 4, 11, 9, 8, 5, 3, 1, 2, 2, 0, 3, 1, 2, 1,
                                             group=4),
}


def _split(p: ConvProblem, seed: int, threads: int, monkeypatch):
    """The four results (y, dx, dw, db) with the work split over `threads` threads."""
    monkeypatch.setattr(parallel, "thread_count", lambda: threads)
    monkeypatch.setattr(parallel, "MIN_ELEMENTS", 0)
    got, _ = run_all(ALGO, p, seed)
    return got


@needs_numba
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_matches_the_reference_and_the_numpy_engine(data):
    """float64, random depthwise problems: kernels, strides, pads, dilations, multipliers."""
    p, seed = data.draw(problems(depthwise=True))
    assert ALGO.applicable(p)
    got, refs = run_all(ALGO, p, seed)
    with jit.disabled():
        numpy_engine, _ = run_all(ALGO, p, seed)
    for what, a, r, b in zip(DIRECTIONS, got, refs, numpy_engine):
        np.testing.assert_allclose(a, r, rtol=1e-9, atol=1e-9, err_msg=f"{what} {p.describe()}")
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9, err_msg=f"{what} {p.describe()}")


@needs_numba
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_float32_agrees_with_the_numpy_engine(shape):
    p = replace(SHAPES[shape], dtype="float32")
    got, refs = run_all(ALGO, p, 5)
    with jit.disabled():
        numpy_engine, _ = run_all(ALGO, p, 5)
    for what, a, b, r in zip(DIRECTIONS, got, numpy_engine, refs):
        assert a.dtype == np.float32
        scale = float(np.abs(r).max())
        # float32 rounding of sums over kh·kw (forward, data) or N·oH·oW (filter, bias) terms
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{what} {shape}")
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{what} {shape}")


@needs_numba
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_bitwise_identical_across_runs_and_thread_counts(shape, monkeypatch):
    """Same inputs, same bits: twice on one thread, and with the work split over 3 threads
    (backward-filter splits whole channels, so no sum depends on the split)."""
    p = replace(SHAPES[shape], dtype="float32")
    first = _split(p, 7, 1, monkeypatch)
    again = _split(p, 7, 1, monkeypatch)
    split = _split(p, 7, 3, monkeypatch)
    for what, a, b, c in zip(DIRECTIONS, first, again, split):
        assert np.array_equal(a, b), f"{what} differs between two runs"
        assert np.array_equal(a, c), f"{what} differs with 3 threads"


@needs_numba
def test_the_work_goes_through_parallel_chunks(monkeypatch):
    p = replace(SHAPES["3x3 same"], dtype="float32")
    seen = []
    real = parallel.chunks
    monkeypatch.setattr(parallel, "chunks", lambda xp, n, fn, work=0: seen.append(n)
                        or real(xp, n, fn, work))
    run_all(ALGO, p, 0)
    # forward: N·K planes, backward-data: N·C planes, backward-filter: C channels
    assert seen == [p.n * p.k, p.n * p.c, p.c]


@needs_numba
def test_non_contiguous_outputs_are_written_through_scratch():
    p = ConvProblem(2, 4, 6, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, group=4, dtype="float64")
    rng = np.random.default_rng(0)
    x, w, dy, b = (rng.standard_normal(s) for s in
                   ((p.n, p.c, p.h, p.w), (p.k, 1, p.kh, p.kw), (p.n, p.k, p.oh, p.ow), (p.k,)))
    scratch = netrun.Workspace().scratch
    y = np.zeros((p.n, p.k, p.oh, p.ow * 2))[..., ::2]       # every other column
    dw, db = np.zeros((p.k, 1, p.kh, p.kw * 2))[..., ::2], np.zeros(2 * p.k)[::2]
    ALGO.forward(np, x, w, p, y, scratch, bias=b)
    ALGO.backward_filter(np, x, dy, p, dw, scratch, dbias=db)
    with jit.disabled():
        y_ref, dw_ref, db_ref = np.empty(y.shape), np.empty(dw.shape), np.empty(p.k)
        ALGO.forward(np, x, w, p, y_ref, scratch, bias=b)
        ALGO.backward_filter(np, x, dy, p, dw_ref, scratch, dbias=db_ref)
    np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, db_ref, rtol=1e-12, atol=1e-12)


def test_other_array_modules_and_the_switch_run_the_numpy_algorithm(monkeypatch):
    """Inside jit.disabled(), or on another array module (CuPy on a GPU workspace), no kernel
    runs and the NumPy depthwise algorithm gives the answer."""
    from netrun.kernels.jit import depthwise as kernels

    def refuse(*args):
        raise AssertionError("a compiled kernel ran")

    for name in KERNELS:
        monkeypatch.setattr(kernels, name, refuse)
    p = replace(SHAPES["3x3 stride 2"], dtype="float64")
    with jit.disabled():
        got, refs = run_all(ALGO, p, 2)
    for what, a, r in zip(DIRECTIONS, got, refs):
        np.testing.assert_allclose(a, r, rtol=1e-9, atol=1e-9, err_msg=what)
    # NumPy under another name: what jit.enabled sees of CuPy
    other = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    assert not jit.enabled(other)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((p.n, p.c, p.h, p.w)), rng.standard_normal((p.k, 1, p.kh, p.kw))
    y = np.full((p.n, p.k, p.oh, p.ow), np.nan)
    ALGO.forward(other, x, w, p, y, netrun.Workspace().scratch)
    y_ref, _ = ref_conv(x, w, (p.sh, p.sw), (p.pt, p.pl, p.pb, p.pr), (p.dh, p.dw), p.group)
    np.testing.assert_allclose(y, y_ref, rtol=1e-9, atol=1e-9)


def test_applicability(monkeypatch):
    depthwise = ConvProblem(2, 4, 5, 5, 8, 3, 3, group=4)
    assert not ALGO.applicable(ConvProblem(2, 4, 5, 5, 8, 3, 3, group=2))   # 2 channels a group
    assert not ALGO.applicable(ConvProblem(2, 4, 5, 5, 8, 3, 3, group=4, dtype="float16"))
    assert not ALGO.applicable(ConvProblem(2, 1, 5, 5, 8, 3, 3, group=1))   # a plain conv
    assert ALGO.applicable(depthwise) == jit.available()
    monkeypatch.setenv(jit.ENV, "0")                # the engine switched off
    assert not ALGO.applicable(depthwise)


def test_binding_a_grouped_conv_prepares_the_float32_kernels(monkeypatch):
    """The compiled code loads when a grouped conv op is bound, not in its first iteration;
    plain convs, other fixed algorithms and a disabled engine load nothing."""
    from netrun.kernels.jit import depthwise as kernels

    prepared = []
    for name in KERNELS:
        monkeypatch.setattr(getattr(kernels, name), "prepare",
                            lambda *sigs, name=name: prepared.append((name, sigs)))
    monkeypatch.setattr(jit, "available", lambda: True)
    ws = netrun.Workspace()

    def bind(**args):
        prepared.clear()
        Operator(netrun.op("Conv", ["X", "W"], ["Y"], kernel=3, **args), ws)
        return [name for name, _ in prepared]

    assert bind(group=4) == list(KERNELS)
    assert [sigs for _, sigs in prepared] == [(kernels.SIGNATURES[n],) for n in KERNELS]
    assert bind(group=4, algo="depthwise_jit") == list(KERNELS)
    assert bind() == []
    assert bind(group=4, algo="depthwise") == []
    with jit.disabled():
        assert bind(group=4) == []


def _spy(monkeypatch, module, names) -> dict:
    """Record the Numba types of the first call of each kernel (the real kernel still runs)."""
    import numba

    called: dict = {}
    for name in names:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, name=name, real=real: (
            called.setdefault(name, []).append(tuple(numba.typeof(a) for a in args)),
            real(*args)))
    return called


@needs_numba
def test_the_prepared_signatures_are_the_ones_a_float32_conv_op_calls(monkeypatch):
    """The argument types of every kernel call of a float32 depthwise conv and its gradient
    are exactly those the preparer compiles: nothing is compiled in the first iteration."""
    from numba.core.sigutils import normalize_signature

    from netrun.kernels.jit import depthwise as kernels

    ws = netrun.Workspace()
    rng = np.random.default_rng(0)
    for blob, shape in (("X", (2, 4, 6, 6)), ("W", (4, 1, 3, 3)), ("b", (4,)),
                        ("Y_grad", (2, 4, 6, 6))):
        ws.feed_blob(blob, rng.standard_normal(shape).astype(np.float32))
    conv = netrun.op("Conv", ["X", "W", "b"], ["Y"], kernel=3, pad=1, group=4,
                     algo="depthwise_jit")
    net = SimpleNet(netrun.NetDef("n", [conv, *netrun.gradient_ops(conv)[0]]), ws)   # binds
    called = _spy(monkeypatch, kernels, KERNELS)
    net.run()
    assert [o.ctx.state["algo"] for o in net.ops] == ["depthwise_jit", "depthwise_jit"]
    assert set(called) == set(KERNELS)
    for name in KERNELS:
        assert set(called[name]) == {normalize_signature(kernels.SIGNATURES[name])[0]}, name


# The compiled im2col / col2im (netrun.kernels.jit.im2col) -----------------------------------
@needs_numba
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_im2col_and_col2im_are_bitwise_those_of_numpy(data):
    """Both column layouts and the scatter-add back, on random geometries (float32)."""
    from netrun.kernels.jit import im2col as compiled

    p, seed = data.draw(problems())
    p = replace(p, dtype="float32")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((p.n, p.c, p.h, p.w)).astype(np.float32)
    scratch = netrun.Workspace().scratch
    for batch_inner in (False, True):
        with jit.disabled():   # the NumPy path (with the engine on it calls the kernel)
            ref = im2col_module._im2col(np, x, p, scratch, batch_inner).copy()
        col = compiled.im2col(x, p, scratch, batch_inner)
        assert np.array_equal(col, ref), f"batch_inner={batch_inner} {p.describe()}"
    col = rng.standard_normal((p.n, p.c, p.kh, p.kw, p.oh, p.ow)).astype(np.float32)
    ref, got = np.full(x.shape, np.nan, np.float32), np.full(x.shape, np.nan, np.float32)
    with jit.disabled():
        im2col_module._col2im(np, col, p, ref, scratch)
    compiled.col2im(col, p, got)
    assert np.array_equal(got, ref), p.describe()


@needs_numba
def test_im2col_tap_wholly_in_the_left_padding_writes_only_its_own_row():
    """A tap whose window lies in the left padding zero-fills its row and no further (the
    fill once ran past oW into the next image's row in the batch-inner layout)."""
    from netrun.kernels.jit import im2col as compiled

    p = ConvProblem(2, 1, 1, 3, 1, 1, 3, 1, 1, 0, 2, 0, 0, 1, 2, dtype="float32")
    x = np.arange(1, 7, dtype=np.float32).reshape(2, 1, 1, 3)
    scratch = netrun.Workspace().scratch
    with jit.disabled():
        ref = im2col_module._im2col(np, x, p, scratch, True).copy()
    assert np.array_equal(compiled.im2col(x, p, scratch, True), ref)


@needs_numba
def test_im2col_calls_only_the_signatures_it_prepares(monkeypatch):
    from numba.core.sigutils import normalize_signature

    from netrun.kernels.jit import im2col as compiled

    called = _spy(monkeypatch, compiled, ("unfold", "fold"))
    p = ConvProblem(3, 4, 9, 8, 5, 3, 3, 2, 2, 1, 1, 1, 1, dtype="float32")
    x = np.ones((p.n, p.c, p.h, p.w), np.float32)
    scratch = netrun.Workspace().scratch
    compiled.im2col(x[1:], p, scratch, False)                 # a block of the batch
    compiled.im2col(x[1:], p, scratch, True)
    compiled.col2im(np.ones((2, p.c, 3, 3, p.oh, p.ow), np.float32), p, x[:2])
    for name, signatures in compiled.SIGNATURES.items():
        assert set(called[name]) == {normalize_signature(s)[0] for s in signatures}, name
