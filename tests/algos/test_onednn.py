"""The oneDNN engine (netrun.kernels.onednn) and its conv algorithm "onednn": every direction
against the float64 reference (groups, dilation, pads, strides, bias, fused ReLU), the
library's discovery and messages, its enum values found by name, the NETRUN_ONEDNN switch."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import netrun
from netrun.conv.algorithm import ConvProblem, algorithms, applicable_algorithms
from netrun.conv.rules import fixed_algorithm, preference, rule_choice
from netrun.errors import BackendError, ShapeError
from netrun.kernels import jit, onednn, parallel
from netrun.kernels.onednn import library, threads
from tests.algos.reference import ref_conv
from tests.algos.test_algorithms import DIRECTIONS, problems, run_all

REPO = Path(__file__).resolve().parents[2]
needs_onednn = pytest.mark.skipif(not onednn.available(),
                                  reason="oneDNN is not installed (or NETRUN_ONEDNN=off)")
ALGO = algorithms("cpu")["onednn"]


def _close(a, r, what: str) -> None:
    """float32 against the float64 reference: rounding of sums of up to a few hundred terms."""
    scale = max(float(np.abs(r).max()), 1.0)
    np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5 * scale, err_msg=what)


@needs_onednn
@settings(max_examples=25, deadline=None)
@given(data=st.data(), relu=st.booleans())
def test_every_direction_matches_the_reference(data, relu):
    """Random groups, strides, pads (asymmetric), dilations; bias; ReLU fused or not."""
    p, seed = data.draw(problems(dtype="float32", max_side=9))
    got, refs = run_all(ALGO, p, seed)
    for what, a, r in zip(DIRECTIONS, got, refs):
        _close(a, r, f"{what} on {p.describe()}")
    if relu:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((p.n, p.c, p.h, p.w)).astype(np.float32)
        w = rng.standard_normal((p.k, p.cg, p.kh, p.kw)).astype(np.float32)
        y = np.full((p.n, p.k, p.oh, p.ow), np.nan, np.float32)
        ALGO.forward(np, x, w, p, y, netrun.Workspace().scratch, relu=True)
        y_ref, _ = ref_conv(x.astype(np.float64), w.astype(np.float64), (p.sh, p.sw),
                            (p.pt, p.pl, p.pb, p.pr), (p.dh, p.dw), p.group)
        _close(y, np.maximum(y_ref, 0), f"forward with ReLU on {p.describe()}")
        assert (y >= 0).all()


@needs_onednn
@pytest.mark.parametrize("shape", [
    ConvProblem(2, 16, 12, 12, 32, 3, 3, 1, 1, 1, 1, 1, 1),          # blocked, 16-channel
    ConvProblem(3, 32, 9, 9, 64, 1, 1, 2, 2),                        # 1×1 stride 2
    ConvProblem(2, 3, 23, 23, 16, 7, 7, 2, 2, 3, 3, 3, 3),           # a stem
    ConvProblem(2, 32, 10, 10, 32, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 4),  # grouped and dilated
])
def test_blocked_layouts_and_fused_bias_relu(shape):
    """Shapes where oneDNN reorders into its blocked layouts: all directions, and `backward`
    (both gradients at once) equals the two calls."""
    got, refs = run_all(ALGO, shape, 3)
    for what, a, r in zip(DIRECTIONS, got, refs):
        _close(a, r, f"{what} on {shape.describe()}")
    rng = np.random.default_rng(3)
    p = shape
    x, w, dy = (rng.standard_normal(s).astype(np.float32) for s in
                ((p.n, p.c, p.h, p.w), (p.k, p.cg, p.kh, p.kw), (p.n, p.k, p.oh, p.ow)))
    dx, dw, db = np.full(x.shape, np.nan, np.float32), np.full(w.shape, np.nan, np.float32), \
        np.full(p.k, np.nan, np.float32)
    ALGO.backward(np, x, dy, w, p, dx, dw, netrun.Workspace().scratch, dbias=db)
    dx2, dw2, db2 = np.empty_like(dx), np.empty_like(dw), np.empty_like(db)
    scratch = netrun.Workspace().scratch
    ALGO.backward_data(np, dy, w, p, dx2, scratch)
    ALGO.backward_filter(np, x, dy, p, dw2, scratch, dbias=db2)
    for a, b in ((dx, dx2), (dw, dw2), (db, db2)):
        assert np.array_equal(a, b)


@needs_onednn
def test_both_gradients_chunked_equal_the_two_calls(monkeypatch):
    """`backward` stages dY once per batch chunk for both primitives: the same bits as the two
    separate passes, with the batch cut into chunks on two workers."""
    from netrun.conv.cpu import onednn as onednn_conv

    monkeypatch.setattr(onednn_conv, "CHUNK_MIN_FLOPS", 1)

    monkeypatch.setattr(onednn_conv, "CHUNK_FLOPS", 1)
    monkeypatch.setattr(parallel, "thread_count", lambda: 2)
    p = ConvProblem(8, 16, 10, 10, 16, 3, 3, 1, 1, 1, 1, 1, 1)
    rng = np.random.default_rng(4)
    x, w, dy = (rng.standard_normal(s).astype(np.float32) for s in
                ((p.n, p.c, p.h, p.w), (p.k, p.cg, p.kh, p.kw), (p.n, p.k, p.oh, p.ow)))
    got = [np.full(s, np.nan, np.float32) for s in (x.shape, w.shape, (p.k,))]
    ALGO.backward(np, x, dy, w, p, got[0], got[1], netrun.Workspace().scratch, dbias=got[2])
    want = [np.empty_like(a) for a in got]
    scratch = netrun.Workspace().scratch
    ALGO.backward_data(np, dy, w, p, want[0], scratch)
    ALGO.backward_filter(np, x, dy, p, want[1], scratch, dbias=want[2])
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


@needs_onednn
def test_non_contiguous_outputs_and_inputs():
    p = ConvProblem(2, 8, 7, 7, 8, 3, 3, 1, 1, 1, 1, 1, 1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((p.n, p.c, p.h, p.w * 2)).astype(np.float32)[..., ::2]
    w = rng.standard_normal((p.k, p.cg, p.kh, p.kw)).astype(np.float32)
    big = np.zeros((p.n, p.k * 2, p.oh, p.ow), np.float32)
    ALGO.forward(np, x, w, p, big[:, ::2], netrun.Workspace().scratch)
    y_ref, _ = ref_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1, 1, 1),
                        (1, 1), 1)
    _close(big[:, ::2], y_ref, "strided output")
    assert not big[:, 1::2].any()


@needs_onednn
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_same_bits_on_1_2_3_threads(direction, monkeypatch):
    """Per direction, a problem big enough that oneDNN splits it across its threads and the
    filter gradient's batch is cut into chunks."""
    p = ConvProblem(8, 32, 14, 14, 48, 3, 3, 1, 1, 1, 1, 1, 1)
    rng = np.random.default_rng(1)
    x, w, dy, b = (rng.standard_normal(s).astype(np.float32) for s in
                   ((p.n, p.c, p.h, p.w), (p.k, p.cg, p.kh, p.kw), (p.n, p.k, p.oh, p.ow), (p.k,)))
    results = []
    for count in (1, 2, 3):
        monkeypatch.setattr(parallel, "thread_count", lambda c=count: c)
        scratch = netrun.Workspace().scratch
        if direction == "forward":
            out = [np.empty(dy.shape, np.float32)]
            ALGO.forward(np, x, w, p, out[0], scratch, bias=b, relu=True)
        elif direction == "backward_data":
            out = [np.empty(x.shape, np.float32)]
            ALGO.backward_data(np, dy, w, p, out[0], scratch)
        else:
            out = [np.empty(w.shape, np.float32), np.empty(p.k, np.float32)]
            ALGO.backward_filter(np, x, dy, p, out[0], scratch, dbias=out[1])
        results.append(out)
    for count, other in zip((2, 3), results[1:]):
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b), f"{direction}: 1 and {count} threads differ"


@needs_onednn
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_chunks_on_the_openmp_team_give_the_worker_threads_bits(threads, monkeypatch):
    """The batch's fixed chunks (5 images in 2 uneven chunks) run as one call on the OpenMP
    team (netrun.kernels.onednn.team) or one by one on worker threads: every direction, the
    fused residual and the combined gradients give the same bits either way."""
    from netrun.conv.cpu import onednn as onednn_conv
    from netrun.kernels import omp
    from netrun.kernels.onednn import team

    if not omp.usable(np):
        pytest.skip("Numba's OpenMP threading layer is not available here")
    monkeypatch.setattr(onednn_conv, "CHUNK_MIN_FLOPS", 1)
    monkeypatch.setattr(onednn_conv, "CHUNK_FLOPS", 1)
    monkeypatch.setattr(parallel, "thread_count", lambda: threads)
    p = ConvProblem(5, 16, 9, 9, 24, 3, 3, 1, 1, 1, 1, 1, 1)
    rng = np.random.default_rng(7)
    x, w, dy, r, b = (rng.standard_normal(s).astype(np.float32) for s in
                      ((p.n, p.c, p.h, p.w), (p.k, p.cg, p.kh, p.kw), (p.n, p.k, p.oh, p.ow),
                       (p.n, p.k, p.oh, p.ow), (p.k,)))

    def every_direction() -> list[np.ndarray]:
        scratch = netrun.Workspace().scratch
        y, yr = np.empty(dy.shape, np.float32), np.empty(dy.shape, np.float32)
        ALGO.forward(np, x, w, p, y, scratch, bias=b, relu=True)
        ALGO.forward(np, x, w, p, yr, scratch, bias=b, relu=True, residual=r)
        dx, dw, db = np.empty(x.shape, np.float32), np.empty(w.shape, np.float32), \
            np.empty(p.k, np.float32)
        ALGO.backward_data(np, dy, w, p, dx, scratch)
        ALGO.backward_filter(np, x, dy, p, dw, scratch, dbias=db)
        both = [np.empty(x.shape, np.float32), np.empty(w.shape, np.float32),
                np.empty(p.k, np.float32)]
        ALGO.backward(np, x, dy, w, p, both[0], both[1], scratch, dbias=both[2])
        return [y, yr, dx, dw, db, *both]

    calls = []
    real = team.run
    monkeypatch.setattr(team, "run", lambda chunks, slots: calls.append(len(chunks))
                        or real(chunks, slots))
    on_team = every_direction()
    assert calls and set(calls) == {2}
    monkeypatch.setenv("NETRUN_OMP", "off")
    calls.clear()
    on_workers = every_direction()
    assert not calls
    for i, (a, c) in enumerate(zip(on_team, on_workers)):
        assert np.array_equal(a, c), f"output {i}: the team and the worker threads differ"
    y_ref, _ = ref_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1, 1, 1),
                        (1, 1), 1)
    want = np.maximum(y_ref + b.reshape(1, -1, 1, 1) + r, 0)
    np.testing.assert_allclose(on_team[1], want, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_a_team_call_binding_more_argument_sets_than_a_primitive_keeps(monkeypatch):
    """Every call of a team run is bound before any runs: a primitive used by more chunks
    than the argument sets it keeps (Primitive.BOUND) must not release the first chunks'
    memory objects while binding the last (it did: a crash, or another chunk's arrays)."""
    from netrun.conv.cpu import onednn as onednn_conv
    from netrun.kernels import omp
    from netrun.kernels.onednn import api

    if not omp.usable(np):
        pytest.skip("Numba's OpenMP threading layer is not available here")
    monkeypatch.setattr(onednn_conv, "CHUNK_MIN_FLOPS", 1)
    monkeypatch.setattr(onednn_conv, "CHUNK_FLOPS", 1)
    monkeypatch.setattr(parallel, "thread_count", lambda: 2)
    monkeypatch.setattr(api.Primitive, "BOUND", 1)
    p = ConvProblem(8, 16, 9, 9, 16, 3, 3, 1, 1, 1, 1, 1, 1)   # 4 equal chunks
    rng = np.random.default_rng(8)
    x, w, dy = (rng.standard_normal(s).astype(np.float32) for s in
                ((p.n, p.c, p.h, p.w), (p.k, p.cg, p.kh, p.kw), (p.n, p.k, p.oh, p.ow)))

    def run() -> list[np.ndarray]:
        scratch = netrun.Workspace().scratch
        out = [np.full(dy.shape, np.nan, np.float32), np.full(x.shape, np.nan, np.float32),
               np.full(w.shape, np.nan, np.float32)]
        ALGO.forward(np, x, w, p, out[0], scratch)
        ALGO.backward(np, x, dy, w, p, out[1], out[2], scratch)
        return out

    on_team = run()
    monkeypatch.setenv("NETRUN_OMP", "off")
    on_workers = run()
    for i, (a, c) in enumerate(zip(on_team, on_workers)):
        assert np.array_equal(a, c), f"output {i}: the team and the worker threads differ"
    y_ref, _ = ref_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1, 1, 1),
                        (1, 1), 1)
    np.testing.assert_allclose(on_team[0], y_ref, rtol=1e-4, atol=1e-4)


# The library ----------------------------------------------------------------------------------
@needs_onednn
def test_enum_values_are_found_by_name():
    from netrun.kernels.onednn import api

    lib = api.get()
    # oneDNN 3.x's numbers, found through the library's *2str functions rather than typed in
    assert lib.enums.fmt["any"] == 1 and lib.enums.fmt["abcd"] == 5
    assert lib.enums.prop["forward_training"] == 64 and lib.enums.alg["eltwise_relu"] == 0x20
    assert lib.enums.dt["f32"] == 3 and lib.enums.scratchpad["user"] == 1


@needs_onednn
def test_an_unknown_enum_name_is_an_error(monkeypatch):
    from netrun.kernels.onednn import api, enums

    monkeypatch.setitem(enums.NAMES, "dnnl_dt2str", ("f32", "no_such_type"))
    with pytest.raises(LookupError, match="no_such_type"):
        enums.derive(api.get().lib)


@needs_onednn
def test_a_failed_call_names_the_status():
    from netrun.kernels.onednn import api

    lib = api.get()
    bad = api.MemoryDesc.tagged(lib, (2, 3), "ab")
    with pytest.raises(api.OneDNNError, match="invalid_arguments"):
        lib.check(lib.lib.dnnl_memory_desc_create_with_tag(
            None, 2, api.dims((2, 3)), lib.f32, lib.enums.fmt["ab"]), "memory_desc_create")
    assert bad.size == 24


@needs_onednn
def test_a_call_failing_on_the_team_names_the_status_and_the_kernel():
    """A status other than success from inside the compiled team kernel is an error that
    names it, as a failed ctypes call is (here: a null primitive, which oneDNN refuses)."""
    from types import SimpleNamespace

    from netrun.kernels import omp
    from netrun.kernels.onednn import api, team

    if not omp.usable(np):
        pytest.skip("Numba's OpenMP threading layer is not available here")
    null = SimpleNamespace(handle=SimpleNamespace(value=0), impl="null primitive", BOUND=16,
                           bound=lambda args: (api.ExecArg * 1)())
    with pytest.raises(api.OneDNNError, match=r"null primitive, on the team.*invalid_arg"):
        team.run([[(null, [])], [(null, [])]], 2)


def test_a_missing_library_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(library, "_LOADED", {})
    monkeypatch.setattr(library, "candidates", lambda: ["/nonexistent/libdnnl.so.3",
                                                        "libdnnl-not-here.so.3"])
    monkeypatch.delenv(library.ENV, raising=False)
    assert library.load() is None
    assert "pip install onednn-cpu-gomp" in library.why_not()
    with pytest.raises(BackendError, match=r"netrun\[onednn\]"):
        library.require()


def test_a_missing_libgomp_is_explained(monkeypatch):
    import ctypes

    def no_gomp(path, *a, **k):
        raise OSError("libgomp.so.1: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(library, "_LOADED", {})
    monkeypatch.setattr(library, "candidates", lambda: ["libdnnl.so.3"])
    monkeypatch.setattr(ctypes, "CDLL", no_gomp)
    monkeypatch.delenv(library.ENV, raising=False)
    assert library.load() is None
    assert "GNU OpenMP" in library.why_not() and "libgomp1" in library.why_not()


def test_loading_leaves_openmps_environment_alone():
    """OpenMP's variables are process-wide: setting them would slow PyTorch's OpenMP too."""
    code = ("import os; from netrun.kernels import onednn; onednn.available(); "
            "print(sorted(k for k in os.environ if 'OMP' in k))")
    env = {k: v for k, v in os.environ.items() if "OMP" not in k}
    env.pop("NETRUN_ONEDNN", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, text=True,
                         capture_output=True, check=True).stdout
    assert out.strip() == "[]"


@needs_onednn
def test_a_call_leaves_the_callers_openmp_thread_count_as_it_was(monkeypatch):
    """libgomp is shared with the rest of the process (PyTorch's OpenMP): a count of 1 left
    on the main thread would run the user's other OpenMP code on one thread."""
    get, set_ = threads._gomp()
    before = get()
    set_(3)
    try:
        p = ConvProblem(1, 4, 6, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((p.n, p.c, p.h, p.w)).astype(np.float32)
        w = rng.standard_normal((p.k, p.c, p.kh, p.kw)).astype(np.float32)
        y = np.empty((p.n, p.k, p.oh, p.ow), np.float32)
        monkeypatch.setattr(parallel, "thread_count", lambda: 1)   # runs on this thread
        ALGO.forward(np, x, w, p, y, netrun.Workspace().scratch)
        assert get() == 3
    finally:
        set_(before)


# The switch -----------------------------------------------------------------------------------
def test_switched_off_it_is_never_used(monkeypatch):
    monkeypatch.setenv(library.ENV, "off")
    p = ConvProblem(2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1)
    assert not onednn.available() and not ALGO.applicable(p)
    assert "NETRUN_ONEDNN" in onednn.why_not()
    with pytest.raises(ShapeError, match="switched off"):
        fixed_algorithm(p, "onednn", "cpu")


def _fresh_conv_net(switch: str) -> tuple[str, str]:
    """(whether libdnnl is mapped, the algorithm the conv op chose) in a new process."""
    code = (
        "import numpy as np, netrun\n"
        "from netrun.core.net import SimpleNet\n"
        "ws = netrun.Workspace()\n"
        "rng = np.random.default_rng(0)\n"
        "ws.feed_blob('X', rng.standard_normal((16, 16, 16, 16)).astype(np.float32))\n"
        "ws.feed_blob('W', rng.standard_normal((16, 16, 3, 3)).astype(np.float32))\n"
        "conv = netrun.op('Conv', ['X', 'W'], ['Y'], kernel=3, pad=1)\n"
        "net = SimpleNet(netrun.NetDef('n', [conv]), ws)\n"
        "net.run()\n"
        "print('libdnnl' in open('/proc/self/maps').read(), net.ops[0].ctx.state['algo'])\n")
    env = {**os.environ, library.ENV: switch,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    loaded, algo = done.stdout.split()[:2]
    return loaded, algo


def test_a_net_with_the_switch_off_never_loads_it():
    """NETRUN_ONEDNN=off: a conv net runs on NumPy algorithms and libdnnl is never loaded; with
    the switch on (and oneDNN installed) the same net runs on it."""
    loaded, algo = _fresh_conv_net("off")
    assert loaded == "False" and "onednn" not in algo
    if onednn.available():
        loaded, algo = _fresh_conv_net("on")
        assert loaded == "True" and "onednn" in algo


@needs_onednn
def test_the_rules_prefer_it_where_it_measured_faster():
    """3×3 layers of ResNet-20's widths: every direction; 1×1: only for one image; a first
    layer's data gradient and a wide layer's filter gradient: the NumPy algorithms."""
    def pick(p, direction):
        return rule_choice(p, applicable_algorithms(p), direction, "cpu", np).name

    r20 = ConvProblem(32, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1)
    assert [pick(r20, d) for d in DIRECTIONS[:3]] == ["onednn"] * 3
    one = replace(r20, kh=1, kw=1, pt=0, pl=0, pb=0, pr=0)
    assert "onednn" not in preference(one) and pick(one, "forward") == "gemm_1x1"
    stem = ConvProblem(8, 3, 64, 64, 64, 7, 7, 2, 2, 3, 3, 3, 3)
    assert pick(stem, "forward") == "onednn" and pick(stem, "backward_data") != "onednn"
    wide = ConvProblem(8, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 1, 1)
    assert pick(wide, "forward") == "onednn" and pick(wide, "backward_filter") != "onednn"
    with_winograd = ConvProblem(128, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1, 1, 1)
    assert pick(with_winograd, "forward") == "winograd_jit" or not jit.available()
    # one image (an OpenMP team): every forward kernel, however small, 1×1 and Winograd's too
    for p in (replace(r20, n=1), replace(one, n=1), replace(with_winograd, n=1),
              ConvProblem(1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 1, 1)):
        assert pick(p, "forward") == "onednn", p.describe()
    assert pick(replace(one, n=2), "forward") == "gemm_1x1"


@needs_onednn
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("n", [1, 3])
def test_a_forward_pass_runs_on_an_openmp_team_and_matches_the_reference(relu, n, monkeypatch):
    """A forward pass on a direct JIT kernel is one call on a team of netrun's thread count,
    at any batch (no chunks); in a worker thread's chunk, a team of one."""
    from netrun.conv.cpu import onednn as onednn_conv
    from netrun.kernels.onednn import team as on_team

    monkeypatch.setattr(parallel, "thread_count", lambda: 2)
    monkeypatch.setattr(onednn_conv, "CHUNK_MIN_FLOPS", 1)   # chunks, were it chunked
    monkeypatch.setattr(onednn_conv, "CHUNK_FLOPS", 1)
    monkeypatch.setattr(on_team, "run", lambda *a: pytest.fail("ran as chunks"))
    p = ConvProblem(n, 5, 9, 7, 70, 3, 3, 2, 1, 1, 0, 2, 1)
    team = onednn_conv._team(p, True, relu)
    assert team is not None and team.threads == 2
    assert onednn_conv._team(p, True, relu, threads=1).threads == 1
    rng = np.random.default_rng(3)
    x = rng.standard_normal((p.n, p.c, p.h, p.w)).astype(np.float32)
    w = rng.standard_normal((p.k, p.c, p.kh, p.kw)).astype(np.float32)
    b = rng.standard_normal(p.k).astype(np.float32)
    y = np.full((p.n, p.k, p.oh, p.ow), np.nan, np.float32)
    ALGO.forward(np, x, w, p, y, netrun.Workspace().scratch, bias=b, relu=relu)
    ref, _ = ref_conv(x.astype(np.float64), w.astype(np.float64), (p.sh, p.sw),
                      (p.pt, p.pl, p.pb, p.pr), (p.dh, p.dw), p.group)
    ref = ref + b[None, :, None, None]
    _close(y, np.maximum(ref, 0) if relu else ref, f"forward of {n} images")


@needs_onednn
def test_memory_objects_are_reused_while_the_buffers_stay_and_evicted_when_they_move():
    """A primitive keeps each thread's recent argument sets; new addresses get new ones."""
    from netrun.kernels.onednn import conv as engine

    spec = engine.ConvSpec(1, 8, 6, 6, 8, 3, 3, 6, 6, (1, 1), (0, 0), (1, 1), (1, 1), 1)
    d = engine.plan(spec, "forward", 1, plain=True)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    scratch = netrun.Workspace().scratch
    outs = []
    for i in range(d.prim.BOUND + 3):   # fresh arrays: every call binds a new set
        x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
        y = np.full((1, 8, 6, 6), np.nan, np.float32)
        engine.run(d, 1, scratch, src=x, weights=w, dst=y)
        ref, _ = ref_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1, 1, 1),
                          (1, 1), 1)
        _close(y, ref, f"call {i}")
        outs.append((x, y))
    assert len(d.prim._bound.sets) == d.prim.BOUND
    live = len(d.prim._memories)
    x, y = outs[-1]
    engine.run(d, 1, scratch, src=x, weights=w, dst=y)   # the same buffers again: no new ones
    assert len(d.prim._memories) == live


@needs_onednn
@pytest.mark.parametrize("batch", [1, 8])
def test_binding_builds_the_primitives_the_first_run_needs(batch, monkeypatch):
    """The bind-time warm-up compiles oneDNN's primitives for the real batch's chunk sizes
    (forward with its bias and ReLU, both gradients), and the OpenMP team's kernel where the
    chunks run on it, so running builds none."""
    from netrun.kernels import omp
    from netrun.kernels.onednn import conv as engine
    from netrun.kernels.onednn import team

    prepared = []
    real = team.prepare
    monkeypatch.setattr(team, "prepare", lambda: prepared.append(1) or real())

    ws = netrun.Workspace()
    rng = np.random.default_rng(0)
    # a shape no other test uses: the memo of primitives is process-wide
    ws.feed_blob("X", rng.standard_normal((batch, 24, 19, 19)).astype(np.float32))
    ws.feed_blob("W", rng.standard_normal((48, 24, 3, 3)).astype(np.float32))
    ws.feed_blob("b", rng.standard_normal(48).astype(np.float32))
    conv = netrun.op("Conv", ["X", "W", "b"], ["Y"], kernel=3, pad=1, relu=1, algo="onednn")
    grad = netrun.gradient_ops(conv)[0]
    ws.feed_blob("Y_grad", rng.standard_normal((batch, 48, 19, 19)).astype(np.float32))
    before = len(engine._PLANS)
    ws.create_net(netrun.NetDef("n", [conv, *grad]))   # binds: plans memory, warms up
    bound = len(engine._PLANS)
    assert bound > before
    assert bool(prepared) == (batch > 1 and omp.usable(np))   # batch 8: two chunks
    ws.run_net("n")
    assert len(engine._PLANS) == bound


@needs_onednn
@pytest.mark.parametrize("batch", [1, 8])
def test_constant_filters_are_kept_reordered_and_follow_every_write(batch):
    """From the second run with the same filters on, the op keeps them in oneDNN's layout;
    a feed, an op writing them and a touched in-place write all reach the output."""
    ws = netrun.Workspace()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, 16, 12, 12)).astype(np.float32)
    ws.feed_blob("X", x)
    ws.feed_blob("b", np.zeros(32, np.float32))
    conv = netrun.op("Conv", ["X", "W", "b"], ["Y"], kernel=3, pad=1, algo="onednn")
    ws.create_net(netrun.NetDef("infer", [conv]))
    # another net that writes W in place (as an update op does)
    ws.create_net(netrun.NetDef("update", [netrun.op("Scale", ["W"], ["W"], scale=-1.0)]))

    def check(what: str) -> None:
        w = ws.fetch_blob("W")
        ref, _ = ref_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1, 1, 1),
                          (1, 1), 1)
        _close(ws.fetch_blob("Y"), ref, what)

    ws.feed_blob("W", rng.standard_normal((32, 16, 3, 3)).astype(np.float32))
    for i in range(3):
        ws.run_net("infer")
        check(f"run {i}")
    op = ws._nets["infer"].ops[0]
    kept = [v for k, v in op.ctx.state["kept_filters"].items() if k != "seen"]
    assert len(kept) == 1, "the third run with the same filters should use a kept copy"

    ws.feed_blob("W", rng.standard_normal((32, 16, 3, 3)).astype(np.float32))
    ws.run_net("infer")
    check("after a feed")
    for i in range(3):
        ws.run_net("update")
        ws.run_net("infer")
        check(f"after an op wrote W ({i})")
    for _ in range(2):
        ws.run_net("infer")
    ws.get_blob("W")[...] *= 0.5
    ws.touch("W")
    ws.run_net("infer")
    check("after an in-place write and touch")


@needs_onednn
@pytest.mark.parametrize("batch,relu", [(1, True), (8, True), (8, False), (3, True)])
@pytest.mark.parametrize("compiled", [True, False])
def test_a_residual_is_summed_out_of_the_blocked_layout(batch, relu, compiled):
    """out = conv + b + S, then the ReLU: one pass from oneDNN's blocked output (20 channels:
    a padded last block), or NumPy's without the compiled engine."""
    p = ConvProblem(batch, 12, 9, 9, 20, 3, 3, 1, 1, 1, 1, 1, 1)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((p.n, p.c, p.h, p.w)).astype(np.float32)
    w = rng.standard_normal((p.k, p.c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(p.k).astype(np.float32)
    s = rng.standard_normal((p.n, p.k, p.oh, p.ow)).astype(np.float32)
    y = np.full_like(s, np.nan)
    if not compiled:
        with jit.disabled():
            ALGO.forward(np, x, w, p, y, netrun.Workspace().scratch, bias=b, relu=relu,
                         residual=s)
    elif not jit.available():
        pytest.skip("the compiled engine (Numba) is not installed")
    else:
        ALGO.forward(np, x, w, p, y, netrun.Workspace().scratch, bias=b, relu=relu,
                     residual=s)
    ref, _ = ref_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1, 1, 1),
                      (1, 1), 1)
    ref = ref + b[None, :, None, None] + s
    _close(y, np.maximum(ref, 0) if relu else ref, "forward with a residual")


@needs_onednn
@pytest.mark.parametrize("direction", ["backward_data", "backward_weights"])
@pytest.mark.parametrize("case", ["strided, blocked", "half-blocked"])
def test_backward_passes_on_blocked_arrays_run_jit_kernels(direction, case):
    """Gradients on the layout plan's blocked arrays: built for those layouts where a JIT
    kernel takes them (a stride-2 1×1 layer: no NHWC kernel behind reorders), else as oneDNN
    likes (a 20-channel NCHW input with a blocked output: its reference kernel takes the
    layouts as they are, at seconds a call)."""
    from netrun.kernels.onednn import conv as engine

    block = engine.channel_block()
    if case == "strided, blocked":
        spec = engine.ConvSpec(32, 16, 32, 32, 32, 1, 1, 16, 16, (2, 2), (0, 0), (0, 0),
                               (0, 0), 1)
        layout = engine.Layout(block, block)
    else:
        spec = engine.ConvSpec(32, 20, 12, 12, 32, 3, 3, 10, 10, (1, 1), (0, 0), (0, 0),
                               (0, 0), 1)
        layout = engine.Layout(0, block)
    d = engine.plan(spec, direction, 1, layout=layout)
    assert d is not None and d.prim.impl.startswith(("jit", "brg")), d.prim.impl
    if case == "strided, blocked" and direction == "backward_data":
        assert not d.prim.impl.startswith("brgconv"), d.prim.impl   # its NHWC kernel


@needs_onednn
@pytest.mark.parametrize("batch", [1, 4])
def test_a_residual_is_added_where_the_output_goes(batch):
    """A blocked pass with a residual adds what its output holds (oneDNN's sum post-op): a
    residual elsewhere is copied there by a first call, one in the output's own memory (the
    memory plan's in-place pair) is not; the bits are the same either way, and the values
    are conv + b + S, then the ReLU."""
    from netrun.kernels.onednn import conv as engine
    from tests.ops.test_layout_ops import blocked_reference

    block = engine.channel_block()
    if not block:
        pytest.skip("oneDNN keeps convolutions in NCHW on this CPU (no blocked kernel)")
    spec = engine.ConvSpec(batch, 16, 8, 8, 24, 3, 3, 8, 8, (1, 1), (0, 0), (1, 1), (1, 1), 1)
    d = engine.plan(spec, "forward", 1, True, True, layout=engine.Layout(block, block, True))
    assert d is not None and d.fill is not None
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    s = rng.standard_normal((batch, 24, 8, 8)).astype(np.float32)
    xb, sb = blocked_reference(x, block), blocked_reference(s, block)
    scratch = netrun.Workspace().scratch
    apart, over = np.full_like(sb, np.nan), sb.copy()
    copied, _, _ = engine.steps(d, scratch, src=xb, weights=w, bias=b, dst=apart, residual=sb)
    engine.execute(copied, 1)
    summed, _, _ = engine.steps(d, scratch, src=xb, weights=w, bias=b, dst=over, residual=over)
    engine.execute(summed, 1)
    assert copied[0][0] is d.fill and len(copied) == len(summed) + 1
    assert all(step[0] is not d.fill for step in summed)
    np.testing.assert_array_equal(over, apart)
    ref, _ = ref_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1, 1, 1),
                      (1, 1), 1)
    ref = np.maximum(ref + b[None, :, None, None] + s, 0)
    _close(over, blocked_reference(ref, block), "conv + b + S, then the ReLU")
    with pytest.raises(engine.api.OneDNNError, match="residual"):
        engine.steps(d, scratch, src=xb, weights=w, bias=b, dst=over)
