"""Every convolution algorithm against the NumPy reference (float64) and PyTorch (float32)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.conv.algorithm import ConvProblem, algorithms, applicable_algorithms
from netrun.conv.cpu import fft as fft_module
from netrun.conv.cpu import im2col as im2col_module
from netrun.kernels import jit, onednn
from tests.algos.reference import ref_conv

ALGORITHMS = algorithms("cpu")   # name -> the registered CPU algorithm

# What each algorithm must handle: the constraints of the random problems it is tested on.
# A new algorithm needs an entry here (test_every_algorithm_has_a_strategy).
CONSTRAINTS = {
    "im2col_gemm": {},
    "gemm_1x1": {"kernel": 1, "pads": False, "dilation": 1},
    "shift_gemm": {"stride_h": 1},
    "fft": {"stride": 1},
    "dft_gemm": {"stride": 1},
    "winograd_f2x2": {"kernel": 3, "stride": 1, "dilation": 1},
    "winograd_f4x4": {"kernel": 3, "stride": 1, "dilation": 1},
    "depthwise": {"depthwise": True},
    "depthwise_jit": {"depthwise": True},   # needs Numba: skipped without it
    "winograd_jit": {"kernel": 3, "stride": 1, "group": 1},   # needs Numba too
    "onednn": {"dtype": "float32"},   # needs oneDNN (netrun[onednn]); float32 only
}


@st.composite
def problems(draw, kernel=None, stride=None, stride_h=None, dilation=None, pads=True,
             depthwise=False, group=None, max_side=6, dtype="float64"):
    """A random ConvProblem (float64 unless told) within the constraints, and a seed."""
    group = group or draw(st.sampled_from([1, 1, 2, 3]))
    cg = 1 if depthwise else draw(st.integers(1, 3))
    group = draw(st.sampled_from([2, 3, 4])) if depthwise else group
    kg, n = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kh, kw = (kernel, kernel) if kernel else (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    sh, sw = (stride, stride) if stride else (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    sh = stride_h or sh
    dh, dw = (dilation, dilation) if dilation else (draw(st.integers(1, 2)),
                                                  draw(st.integers(1, 2)))
    pad = [draw(st.integers(0, 3)) for _ in range(4)] if pads else [0, 0, 0, 0]
    dkh, dkw = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    h = draw(st.integers(max(1, dkh - pad[0] - pad[2]), dkh + max_side))
    w = draw(st.integers(max(1, dkw - pad[1] - pad[3]), dkw + max_side))
    return ConvProblem(n, cg * group, h, w, kg * group, kh, kw, sh, sw, *pad, dh, dw, group,
                       dtype), draw(st.integers(0, 2**16))


def run_all(algo, p: ConvProblem, seed: int, scratch=None):
    """(forward with bias, backward_data, backward_filter, db) and the reference values."""
    scratch = scratch or netrun.Workspace().scratch
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((p.n, p.c, p.h, p.w)).astype(p.dtype)
    w = rng.standard_normal((p.k, p.cg, p.kh, p.kw)).astype(p.dtype)
    dy = rng.standard_normal((p.n, p.k, p.oh, p.ow)).astype(p.dtype)
    b = rng.standard_normal(p.k).astype(p.dtype)
    y_ref, grads = ref_conv(x.astype(np.float64), w.astype(np.float64), (p.sh, p.sw),
                            (p.pt, p.pl, p.pb, p.pr), (p.dh, p.dw), p.group)
    dx_ref, dw_ref = grads(dy.astype(np.float64))
    # NaN-filled outputs: an algorithm that leaves any element unwritten fails
    y, dx, dw, db = (np.full(s, np.nan, p.dtype) for s in (y_ref.shape, x.shape, w.shape, (p.k,)))
    algo.forward(np, x, w, p, y, scratch, bias=b)
    algo.backward_data(np, dy, w, p, dx, scratch)
    algo.backward_filter(np, x, dy, p, dw, scratch, dbias=db)
    refs = (y_ref + b[None, :, None, None], dx_ref, dw_ref, dy.astype(np.float64).sum((0, 2, 3)))
    return (y, dx, dw, db), refs


DIRECTIONS = ("forward", "backward_data", "backward_filter", "bias gradient")


def _needs_engine(name: str) -> None:
    if name in ("depthwise_jit", "winograd_jit") and not jit.available():
        pytest.skip("the compiled engine (Numba) is not installed")
    if name == "onednn" and not onednn.available():
        pytest.skip("the oneDNN engine is not installed (or NETRUN_ONEDNN=off)")


def _close(a, r, err_msg: str, rtol: float = 1e-9) -> None:
    """a ≈ r: to rtol in float64; float32 results to float32 rounding of their sums."""
    if a.dtype == np.float32:
        scale = float(np.abs(r).max()) if r.size else 1.0
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5 * max(scale, 1.0),
                                   err_msg=err_msg)
    else:
        np.testing.assert_allclose(a, r, rtol=rtol, atol=rtol, err_msg=err_msg)


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_every_algorithm_matches_the_reference(name, data):
    algo = ALGORITHMS[name]
    _needs_engine(name)
    p, seed = data.draw(problems(**CONSTRAINTS[name]))
    assert algo.applicable(p), f"{name} should handle {p.describe()}"
    assert algo.workspace_bytes(p) >= 0
    got, refs = run_all(algo, p, seed)
    for what, a, r in zip(DIRECTIONS, got, refs):
        _close(a, r, f"{name} {what} on {p.describe()}")


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_both_gradients_at_once_match_the_reference(name, data):
    """`backward` (used when one algorithm was chosen for both directions; dft_gemm
    transforms dY once for both) gives the two gradients and db."""
    algo = ALGORITHMS[name]
    _needs_engine(name)
    p, seed = data.draw(problems(**CONSTRAINTS[name]))
    (_, dx_ref, dw_ref, db_ref), x, w, dy = _gradient_refs(p, seed)
    dx, dw, db = (np.full(a.shape, np.nan, p.dtype) for a in (x, w, db_ref))
    algo.backward(np, x, dy, w, p, dx, dw, netrun.Workspace().scratch, dbias=db)
    for what, a, r in (("dx", dx, dx_ref), ("dw", dw, dw_ref), ("db", db, db_ref)):
        _close(a, r, f"{name} {what} on {p.describe()}")


def _gradient_refs(p: ConvProblem, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((p.n, p.c, p.h, p.w)).astype(p.dtype)
    w = rng.standard_normal((p.k, p.cg, p.kh, p.kw)).astype(p.dtype)
    dy = rng.standard_normal((p.n, p.k, p.oh, p.ow)).astype(p.dtype)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    _, grads = ref_conv(x64, w64, (p.sh, p.sw), (p.pt, p.pl, p.pb, p.pr), (p.dh, p.dw), p.group)
    dx_ref, dw_ref = grads(dy64)
    return (None, dx_ref, dw_ref, dy64.sum((0, 2, 3))), x, w, dy


def test_every_algorithm_has_a_strategy():
    from netrun.conv.gpu.base import GPUAlgorithm

    cpu = algorithms("cpu")
    assert set(CONSTRAINTS) == set(cpu)
    # the CPU registry holds CPU algorithms only: GPU ones live under "gpu"
    assert all(a.backend == "cpu" and not isinstance(a, GPUAlgorithm) for a in cpu.values())
    assert not set(cpu) & set(algorithms("gpu"))
    # registration order is the order searches time them and the rules' last resort: first
    # the algorithm that runs every problem
    assert next(iter(cpu)) == "im2col_gemm", list(cpu)


OUTSIDE = {   # a problem just outside each algorithm's constraints
    "gemm_1x1": ConvProblem(2, 4, 5, 5, 4, 1, 1, pt=1),
    "shift_gemm": ConvProblem(2, 4, 5, 5, 4, 3, 3, sh=2),
    "fft": ConvProblem(2, 4, 5, 5, 4, 3, 3, sw=2),
    "dft_gemm": ConvProblem(2, 4, 5, 5, 4, 3, 3, sh=2),
    "winograd_f2x2": ConvProblem(2, 4, 5, 5, 4, 3, 3, dh=2),
    "winograd_f4x4": ConvProblem(2, 4, 7, 7, 4, 5, 5),
    "depthwise": ConvProblem(2, 4, 5, 5, 4, 3, 3, group=2),
    "depthwise_jit": ConvProblem(2, 4, 5, 5, 4, 3, 3, group=2),
    "winograd_jit": ConvProblem(2, 4, 5, 5, 4, 3, 3, sw=2),
    "onednn": ConvProblem(2, 4, 5, 5, 4, 3, 3, dtype="float64"),
}


@pytest.mark.parametrize("name", sorted(OUTSIDE))
def test_algorithms_reject_what_they_cannot_run(name):
    _needs_engine(name)
    assert not ALGORITHMS[name].applicable(OUTSIDE[name])
    assert ALGORITHMS["im2col_gemm"].applicable(OUTSIDE[name])   # the fallback runs them all


# float32 against PyTorch on realistic shapes --------------------------------------------------
TORCH_CASES = {   # (N, C, H, W, K, kernel, stride, pad, dilation, group)
    "lenet conv2": (4, 20, 12, 12, 50, 5, 1, 0, 1, 1),
    "cifar conv2": (3, 32, 16, 16, 32, 5, 1, 2, 1, 1),
    "3x3 pad 1": (2, 16, 14, 13, 24, 3, 1, 1, 1, 1),
    "3x3 stride 2": (2, 16, 14, 14, 8, 3, 2, 1, 1, 1),
    "1x1": (2, 32, 7, 7, 64, 1, 1, 0, 1, 1),
    "depthwise 3x3": (2, 16, 10, 10, 16, 3, 1, 1, 1, 16),
    "dilation 2": (2, 16, 9, 9, 16, 3, 1, 2, 2, 1),
    "grouped": (2, 12, 8, 8, 6, 3, 1, 1, 1, 3),
}


def _torch_case(case):
    n, c, h, w, k, ker, s, pad, d, g = TORCH_CASES[case]
    return ConvProblem(n, c, h, w, k, ker, ker, s, s, pad, pad, pad, pad, d, d, g, "float32")


@pytest.mark.parametrize("case", sorted(TORCH_CASES))
def test_algorithms_match_torch_in_float32(case):
    torch = pytest.importorskip("torch", reason="PyTorch is the float32 reference")
    p = _torch_case(case)
    rng = np.random.default_rng(1)
    x, w, dy, b = (rng.standard_normal(s).astype(np.float32) for s in
                   ((p.n, p.c, p.h, p.w), (p.k, p.cg, p.kh, p.kw), (p.n, p.k, p.oh, p.ow), (p.k,)))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride=p.sh, padding=p.pt, dilation=p.dh,
                                    groups=p.group)
    ty.backward(torch.tensor(dy))
    refs = [t.detach().numpy() for t in (ty, tx.grad, tw.grad, tb.grad)]
    ran = []
    for algo in applicable_algorithms(p):
        scratch = netrun.Workspace().scratch
        y, dx, dw, db = (np.full(r.shape, np.nan, np.float32) for r in refs)
        algo.forward(np, x, w, p, y, scratch, bias=b)
        algo.backward_data(np, dy, w, p, dx, scratch)
        algo.backward_filter(np, x, dy, p, dw, scratch, dbias=db)
        # float32 rounding of sums over C·kh·kw (or N·oH·oW) terms; Winograd F(4×4) and FFT
        # round more (transform constants up to 8, and log-depth butterflies)
        rtol = 2e-4 if algo.name in ("winograd_f4x4", "winograd_jit", "fft") else 5e-5
        for what, got, ref in zip(DIRECTIONS, (y, dx, dw, db), refs):
            scale = float(np.abs(ref).max())
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale,
                                       err_msg=f"{algo.name} {what} on {case}")
        ran.append(algo.name)
    assert ran and ran[0] == "im2col_gemm"


# Details --------------------------------------------------------------------------------------
def test_im2col_blocks_over_the_batch(monkeypatch):
    """With a tiny column budget every image is its own block; results do not change."""
    monkeypatch.setattr(im2col_module, "COL_BUFFER_BYTES", 1)
    algo = ALGORITHMS["im2col_gemm"]
    p = ConvProblem(3, 4, 6, 5, 4, 3, 2, 2, 1, 1, 0, 2, 1, 1, 2, 2, "float64")
    assert algo.block(p) == 1
    got, refs = run_all(algo, p, 0)
    for a, r in zip(got, refs):
        np.testing.assert_allclose(a, r, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("per_image", [0, 1 << 30])
def test_im2col_filter_gradient_both_ways(per_image, monkeypatch):
    """Per-image products summed (small filters) and one batch-inner GEMM agree."""
    monkeypatch.setattr(im2col_module, "PER_IMAGE_FILTER_ELEMENTS", per_image)
    p = ConvProblem(3, 4, 7, 6, 6, 3, 2, 1, 2, 1, 0, 2, 1, 2, 1, 2, "float64")
    got, refs = run_all(ALGORITHMS["im2col_gemm"], p, 5)
    np.testing.assert_allclose(got[2], refs[2], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got[3], refs[3], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name,module", [("shift_gemm", "netrun.conv.cpu.shift"),
                                         ("winograd_f4x4", "netrun.conv.cpu.winograd"),
                                         ("dft_gemm", "netrun.conv.cpu.dft_gemm"),
                                         ("depthwise", "netrun.conv.cpu.depthwise"),
                                         ("winograd_jit", "netrun.conv.cpu.jit_winograd")])
def test_blocked_algorithms_agree_across_block_sizes(name, module, monkeypatch):
    """One image per block and the whole batch in one block give the same answer."""
    import importlib

    _needs_engine(name)
    mod = importlib.import_module(module)
    p = ConvProblem(3, 4, 7, 6, 4, 3, 3, 1, 1, 1, 0, 2, 1, 1, 1, 4 if name == "depthwise" else 1,
                    "float64")
    monkeypatch.setattr(mod, "BLOCK_BYTES", 1)
    assert ALGORITHMS[name].block(p) == 1
    small, refs = run_all(ALGORITHMS[name], p, 3)
    monkeypatch.setattr(mod, "BLOCK_BYTES", 1 << 40)
    assert ALGORITHMS[name].block(p) == 3
    whole, _ = run_all(ALGORITHMS[name], p, 3)
    for a, b, r in zip(small, whole, refs):
        np.testing.assert_allclose(a, r, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_fft_grid_sizes_are_5_smooth():
    for n in (1, 7, 11, 13, 20, 29, 58, 97):
        g = fft_module.good_size(n)
        assert g >= n and g < 2 * n + 1
        m = g
        for f in (2, 3, 5):
            while m % f == 0:
                m //= f
        assert m == 1, (n, g)
    assert fft_module.good_size(13) == 15 and fft_module.good_size(17) == 18


def test_algorithms_keep_float32():
    """No silent float64 promotion: scratch and results stay in the problem's dtype."""
    p = ConvProblem(2, 4, 6, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1)
    ws = netrun.Workspace()
    for algo in applicable_algorithms(p):
        run_all(algo, p, 0, ws.scratch)
    dtypes = {str(buf.dtype) for buf in ws.memory.keyed.values()}
    assert dtypes <= {"float32", "complex64", "bool"}, dtypes


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_algorithms_agree_when_the_batch_is_split_across_threads(name, monkeypatch):
    """Chunks of images on worker threads (3 here, an uneven split of 5 images), partial
    filter gradients summed: the same answer as the reference."""
    from netrun.kernels import parallel

    monkeypatch.setattr(parallel, "thread_count", lambda: 3)
    monkeypatch.setattr(parallel, "MIN_ELEMENTS", 0)
    calls = []
    real = parallel.chunks
    monkeypatch.setattr(parallel, "chunks", lambda *a, **k: calls.append(1) or real(*a, **k))
    for module in ("netrun.conv.cpu.im2col", "netrun.conv.cpu.shift", "netrun.conv.cpu.dft_gemm"):
        import importlib

        monkeypatch.setattr(importlib.import_module(module), "chunks", parallel.chunks)
    _needs_engine(name)
    if name == "onednn":   # it runs layers below its chunk size as one call
        from netrun.conv.cpu import onednn as onednn_conv

        # the worker threads here; the OpenMP team's path: tests/algos/test_onednn.py
        monkeypatch.setenv("NETRUN_OMP", "off")

        monkeypatch.setattr(onednn_conv, "CHUNK_MIN_FLOPS", 1)

        monkeypatch.setattr(onednn_conv, "CHUNK_FLOPS", 1)
    depthwise = ConvProblem(5, 6, 7, 6, 6, 3, 3, 1, 1, 1, 0, 2, 1, group=6, dtype="float64")
    cases = {"gemm_1x1": ConvProblem(5, 6, 5, 4, 4, 1, 1, 2, 1, dtype="float64"),
             "depthwise": depthwise, "depthwise_jit": depthwise,
             "winograd_jit": ConvProblem(5, 6, 7, 6, 4, 3, 3, 1, 1, 1, 0, 2, 1, 1, 2, 1,
                                         "float64"),
             "onednn": ConvProblem(5, 6, 7, 6, 4, 3, 3, 1, 1, 1, 0, 2, 1, 1, 1, 2, "float32")}
    p = cases.get(name, ConvProblem(5, 6, 7, 6, 4, 3, 3, 1, 1, 1, 0, 2, 1, 1, 1, 2, "float64"))
    got, refs = run_all(ALGORITHMS[name], p, 4)
    for what, a, r in zip(DIRECTIONS, got, refs):
        _close(a, r, f"{name} {what}", rtol=1e-10)
    if name in ("im2col_gemm", "shift_gemm", "depthwise", "dft_gemm", "depthwise_jit",
                "winograd_jit", "onednn"):
        assert calls, f"{name} did not go through parallel.chunks"
