"""Compiled Winograd F(4×4, 3×3) (winograd_jit): the NumPy engine's answer, dilation through
phases, float32 rounding, determinism, fallbacks and the kernels the preparer loads."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.conv.algorithm import algorithms
from netrun.conv.cpu import jit_winograd
from netrun.conv.problem import ConvProblem
from netrun.core.net import SimpleNet
from netrun.core.operator import Operator
from netrun.kernels import jit, parallel
from tests.algos.test_algorithms import DIRECTIONS, problems, run_all
from tests.algos.test_jit_depthwise import _spy

needs_numba = pytest.mark.skipif(not jit.available(),
                                 reason="Numba is not installed (or NETRUN_JIT=0)")
ALGORITHMS = algorithms("cpu")
ALGO = ALGORITHMS["winograd_jit"]
SHAPES = {   # ResNet-like "same" 3×3, the benchmark's dilated layer (smaller), odd everything
    "3x3 same": ConvProblem(3, 16, 14, 13, 24, 3, 3, 1, 1, 1, 1, 1, 1),
    "dilation 2": ConvProblem(2, 32, 14, 14, 16, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2),
    "uneven": ConvProblem(2, 8, 11, 9, 8, 3, 3, 1, 1, 0, 3, 2, 1, 3, 1),
}


@needs_numba
@settings(max_examples=15, deadline=None)
@given(data=st.data(), dilation=st.integers(1, 3))
def test_large_dilations_and_pads_match_the_reference(data, dilation):
    """Dilations up to 3 (up to 9 phases), pads up to 3 either side; float64."""
    p, seed = data.draw(problems(kernel=3, stride=1, group=1, dilation=dilation, max_side=9))
    got, refs = run_all(ALGO, p, seed)
    for what, a, r in zip(DIRECTIONS, got, refs):
        np.testing.assert_allclose(a, r, rtol=1e-9, atol=1e-9, err_msg=f"{what} {p.describe()}")


@needs_numba
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_float32_agrees_with_the_numpy_engine(shape):
    """float32 against the algorithm NumPy runs in its place (winograd_f4x4 undilated,
    shift_gemm dilated) and the float64 reference: F(4×4)'s rounding, about 1e-6."""
    p = replace(SHAPES[shape], dtype="float32")
    got, refs = run_all(ALGO, p, 5)
    with jit.disabled():
        numpy_engine, _ = run_all(ALGO, p, 5)
    for what, a, b, r in zip(DIRECTIONS, got, numpy_engine, refs):
        assert a.dtype == np.float32
        scale = float(np.abs(r).max())
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=2e-5 * scale, err_msg=f"{what} {shape}")
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5 * scale, err_msg=f"{what} {shape}")


@needs_numba
def test_bitwise_identical_across_runs(monkeypatch):
    """Same inputs, same bits: the chunks' partial filter spectra are summed in chunk order
    (tests/test_determinism.py checks that the thread count changes nothing either)."""
    monkeypatch.setattr(parallel, "thread_count", lambda: 2)
    monkeypatch.setattr(parallel, "MIN_ELEMENTS", 0)
    p = replace(SHAPES["dilation 2"], dtype="float32")
    first, _ = run_all(ALGO, p, 7)
    again, _ = run_all(ALGO, p, 7)
    for what, a, b in zip(DIRECTIONS, first, again):
        assert np.array_equal(a, b), f"{what} differs between two runs"


def test_without_the_engine_it_runs_the_numpy_algorithms(monkeypatch):
    """jit.disabled() (or CuPy): winograd_f4x4 for undilated problems, shift_gemm for dilated
    ones, so a remembered choice stays valid; no kernel runs."""
    from netrun.kernels.jit import winograd as kernels

    def refuse(*args):
        raise AssertionError("a compiled kernel ran")

    monkeypatch.setattr(kernels, "gather", refuse)
    monkeypatch.setattr(kernels, "scatter", refuse)
    ran = []
    for name in ("winograd_f4x4", "shift_gemm"):
        real = ALGORITHMS[name].forward
        monkeypatch.setattr(ALGORITHMS[name], "forward",
                            lambda *a, name=name, real=real, **k: ran.append(name) or real(*a, **k))
    for shape in ("3x3 same", "dilation 2"):
        p = replace(SHAPES[shape], dtype="float64")
        with jit.disabled():
            got, refs = run_all(ALGO, p, 2)
        for what, a, r in zip(DIRECTIONS, got, refs):
            np.testing.assert_allclose(a, r, rtol=1e-9, atol=1e-9, err_msg=f"{what} {shape}")
    assert ran[0] == "winograd_f4x4" and set(ran[1:]) == {"shift_gemm"}


def test_applicability(monkeypatch):
    same = SHAPES["3x3 same"]
    assert ALGO.applicable(same) == jit.available()
    assert ALGO.applicable(SHAPES["dilation 2"]) == jit.available()
    for outside in (replace(same, sh=2), replace(same, kh=5, kw=5), replace(same, group=2, k=24),
                    replace(same, dtype="float16")):
        assert not ALGO.applicable(outside), outside.describe()
    monkeypatch.setenv(jit.ENV, "0")
    assert not ALGO.applicable(same)


def test_tiles_count_every_phase():
    # 14×14 output at dilation 2: four 7×7 phases, each 2×2 tiles of 4×4
    assert jit_winograd.tiles(SHAPES["dilation 2"]) == 16
    # 14×13 output undilated ("same" pads): 4×4 tiles, the last row and column partly used
    assert jit_winograd.tiles(SHAPES["3x3 same"]) == 16


def test_binding_a_3x3_conv_prepares_the_kernels(monkeypatch):
    """Loaded at bind time for stride-1 3×3 group-1 convs (heuristic or fixed), not others."""
    from netrun.kernels.jit import winograd as kernels

    prepared = []
    monkeypatch.setattr(kernels, "prepare", lambda dtype="float32": prepared.append(dtype))
    monkeypatch.setattr(jit, "available", lambda: True)
    from netrun.kernels.jit import im2col
    monkeypatch.setattr(im2col, "prepare", lambda: None)
    ws = netrun.Workspace()

    def bind(**args):
        prepared.clear()
        Operator(netrun.op("Conv", ["X", "W"], ["Y"], **args), ws)
        return len(prepared)

    assert bind(kernel=3) == 1
    assert bind(kernel=3, dilation=2, algo="winograd_jit") == 1
    assert bind(kernel=5) == 0
    assert bind(kernel=3, stride=2) == 0
    assert bind(kernel=3, algo="shift_gemm") == 0
    with jit.disabled():
        assert bind(kernel=3) == 0


@needs_numba
def test_the_prepared_signatures_are_the_ones_a_float32_conv_op_calls(monkeypatch):
    """Every kernel call of a float32 3×3 conv and its gradient has exactly the types the
    preparer compiles: nothing is compiled in the first iteration."""
    from numba.core.sigutils import normalize_signature

    from netrun.kernels.jit import winograd as kernels

    ws = netrun.Workspace()
    rng = np.random.default_rng(0)
    for blob, shape in (("X", (3, 4, 6, 6)), ("W", (5, 4, 3, 3)), ("b", (5,)),
                        ("Y_grad", (3, 5, 6, 6))):
        ws.feed_blob(blob, rng.standard_normal(shape).astype(np.float32))
    conv = netrun.op("Conv", ["X", "W", "b"], ["Y"], kernel=3, pad=1, algo="winograd_jit")
    net = SimpleNet(netrun.NetDef("n", [conv, *netrun.gradient_ops(conv)[0]]), ws)
    called = _spy(monkeypatch, kernels, ("gather", "scatter"))
    net.run()
    assert [o.ctx.state["algo"] for o in net.ops] == ["winograd_jit", "winograd_jit"]
    for name, signature in kernels._signatures("float32").items():
        assert set(called[name]) == {normalize_signature(signature)[0]}, name
