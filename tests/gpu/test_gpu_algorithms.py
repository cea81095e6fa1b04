"""GPU convolution algorithms: results against the CPU's im2col in float64, how one is chosen
(rules, fixed names, the timing search and its cache), and that CPU problems never see them."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import netrun
from netrun import conv as algos
from netrun.conv import select
from netrun.conv.algorithm import algorithms, applicable_algorithms
from netrun.conv.gpu.base import GPUAlgorithm
from netrun.conv.problem import DIRECTIONS, ConvProblem
from netrun.conv.rules import fixed_algorithm
from netrun.errors import ShapeError

CPU, GPU = algorithms("cpu"), algorithms("gpu")   # name -> algorithm, per backend

PROBLEMS = {   # ConvProblem(n, c, h, w, k, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, group)
    "3x3 pad 1": ConvProblem(2, 3, 6, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1),
    "3x3 no pad": ConvProblem(1, 4, 7, 6, 3, 3, 3),
    "5x5 stride 2": ConvProblem(2, 2, 9, 8, 3, 5, 5, 2, 2, 2, 2, 2, 2),
    "dilated asymmetric": ConvProblem(1, 2, 8, 9, 3, 3, 2, 1, 2, 1, 0, 2, 1, 2, 1),
    "groups": ConvProblem(2, 4, 5, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, group=2),
    "depthwise": ConvProblem(2, 3, 6, 5, 6, 3, 3, 2, 1, 1, 1, 1, 1, group=3),
    "1x1": ConvProblem(2, 5, 4, 5, 3, 1, 1),
    "1x1 stride 2": ConvProblem(1, 3, 5, 6, 4, 1, 1, 2, 2),
}


def _reference(p: ConvProblem, x, w, dy):
    """(Y + bias, dX, dW, db) from the CPU's im2col + GEMM in float64."""
    ref = CPU["im2col_gemm"]
    scratch = netrun.Workspace("cpu").scratch
    bias = np.linspace(-1, 1, p.k)
    y = np.empty((p.n, p.k, p.oh, p.ow))
    ref.forward(np, x, w, p, y, scratch, bias=bias)
    dx, dw, db = np.empty(x.shape), np.empty(w.shape), np.empty(p.k)
    ref.backward_data(np, dy, w, p, dx, scratch)
    ref.backward_filter(np, x, dy, p, dw, scratch, dbias=db)
    return bias, (y, dx, dw, db)


def _run_gpu(backend, algo, p, x, w, dy, bias, dtype="float64"):
    """The algorithm's three directions on the GPU backend, as host arrays."""
    xp, dev = backend.xp, backend.to_device
    scratch = netrun.Workspace("gpu").scratch
    gx, gw, gdy, gb = dev(x), dev(w), dev(dy), dev(bias)
    y, dx = backend.empty((p.n, p.k, p.oh, p.ow), dtype), backend.empty(x.shape, dtype)
    dw, db = backend.empty(w.shape, dtype), backend.empty((p.k,), dtype)
    algo.forward(xp, gx, gw, p, y, scratch, bias=gb)
    algo.backward_data(xp, gdy, gw, p, dx, scratch)
    algo.backward_filter(xp, gx, gdy, p, dw, scratch, dbias=db)
    return [backend.to_host(a) for a in (y, dx, dw, db)]


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_every_applicable_gpu_algorithm_matches_im2col(gpu, name):
    p = dataclasses.replace(PROBLEMS[name], dtype="float64")   # one problem on every backend
    rng = np.random.default_rng(0)
    x = rng.standard_normal((p.n, p.c, p.h, p.w))
    w = rng.standard_normal((p.k, p.cg, p.kh, p.kw))
    dy = rng.standard_normal((p.n, p.k, p.oh, p.ow))
    bias, refs = _reference(p, x, w, dy)
    ran = []
    for algo in applicable_algorithms(p, "gpu"):
        got = _run_gpu(gpu, algo, p, x, w, dy, bias)
        for what, a, r in zip(("forward", "backward_data", "backward_filter", "dbias"), got, refs):
            np.testing.assert_allclose(a, r, rtol=1e-9, atol=1e-9,
                                       err_msg=f"{algo.name} {what} on {p.describe()}")
        ran.append(algo.name)
    assert "gpu_im2col_gemm" in ran


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_cudnn_agrees_with_im2col_in_float32(gpu, name):
    """cuDNN (float32 only) against the float64 reference: full float32 arithmetic (no TF32
    engines), deterministic (two runs, the same bits). Skipped where it has no plan."""
    p = PROBLEMS[name]
    algo = GPU["cudnn"]
    if not algo.fits(p) or not all(algo.supports(gpu.xp, p, d) for d in
                                   ("forward", "backward_data", "backward_filter")):
        pytest.skip("cuDNN is not installed here, or has no deterministic float32 plan for it")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((p.n, p.c, p.h, p.w))
    w = rng.standard_normal((p.k, p.cg, p.kh, p.kw))
    dy = rng.standard_normal((p.n, p.k, p.oh, p.ow))
    bias, refs = _reference(p, x, w, dy)
    f32 = [a.astype(np.float32) for a in (x, w, dy, bias)]
    first = _run_gpu(gpu, algo, p, *f32, dtype="float32")
    again = _run_gpu(gpu, algo, p, *f32, dtype="float32")
    for what, a, b, r in zip(("forward", "backward_data", "backward_filter", "dbias"), first,
                             again, refs):
        np.testing.assert_array_equal(a, b, err_msg=f"cudnn {what} differs between runs")
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5 * np.abs(r).max(),
                                   err_msg=f"cudnn {what} on {p.describe()}")


def test_im2col_blocks_give_the_same_result(gpu, monkeypatch):
    import netrun.conv.gpu.im2col as im2col

    p = PROBLEMS["5x5 stride 2"]
    algo = GPU["gpu_im2col_gemm"]
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((p.n, p.c, p.h, p.w)), rng.standard_normal((p.k, p.c, 5, 5))
    dy = rng.standard_normal((p.n, p.k, p.oh, p.ow))
    whole = _run_gpu(gpu, algo, p, x, w, dy, np.zeros(p.k))
    monkeypatch.setattr(im2col, "BLOCK_BYTES", 1)          # one image per block
    assert algo.block(p) == 1
    blocked = _run_gpu(gpu, algo, p, x, w, dy, np.zeros(p.k))
    for a, b in zip(whole, blocked):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_registration_order_starts_with_im2col_and_ends_with_cudnn():
    """The order searches time them and the rules' last resort (the first): the algorithm that
    runs every problem first, the optional engines (which may lack a plan) last."""
    names = list(GPU)
    assert names[0] == "gpu_im2col_gemm" and names[-2:] == ["cudnn", "cudnn_tf32"], names


def test_tf32_engines_are_candidates_only_when_allowed():
    p = PROBLEMS["3x3 pad 1"]
    tf32 = GPU["cudnn_tf32"]
    assert tf32.reduced_precision and not GPU["cudnn"].reduced_precision
    for mode in ("heuristic", "exhaustive", "deterministic"):
        off = select.candidates(p, algos.AlgoSettings(mode=mode), "gpu")
        assert tf32 not in off
        on = select.candidates(p, algos.AlgoSettings(mode=mode, tf32=True), "gpu")
        assert (tf32 in on) == tf32.fits(p)


def test_cpu_problems_never_get_gpu_algorithms(gpu):
    assert GPU and all(isinstance(a, GPUAlgorithm) and a.backend == "gpu" for a in GPU.values())
    for p in PROBLEMS.values():
        assert not any(isinstance(a, GPUAlgorithm) for a in applicable_algorithms(p))
        assert not any(isinstance(a, GPUAlgorithm) for a in select.candidates(
            p, algos.AlgoSettings()))
        assert all(isinstance(a, GPUAlgorithm) for a in select.candidates(
            p, algos.AlgoSettings(), "gpu"))
    # and a CPU conv op in the same process still picks a CPU algorithm
    ws = netrun.Workspace("cpu")
    ws.feed_blob("X", np.ones((1, 2, 5, 5), np.float32))
    ws.feed_blob("W", np.ones((3, 2, 3, 3), np.float32))
    net = ws.create_net(netrun.NetDef("n", [netrun.op("Conv", ["X", "W"], ["Y"], kernel=3)]))
    ws.run_net("n")
    assert not net.ops[0].ctx.state["algo"].startswith("gpu_")


def _conv_net(ws, x_shape, w_shape, **args):
    rng = np.random.default_rng(0)
    ws.feed_blob("X", rng.standard_normal(x_shape).astype(np.float32))
    ws.feed_blob("W", rng.standard_normal(w_shape).astype(np.float32))
    ws.feed_blob("Y_grad", np.ones(1, np.float32))   # replaced below once Y's shape is known
    fwd = netrun.op("Conv", ["X", "W"], ["Y"], **args)
    grad_ops, _ = netrun.gradient_ops(fwd)
    net = ws.create_net(netrun.NetDef("conv", [fwd]))
    ws.run_net("conv")
    ws.feed_blob("Y_grad", np.ones(ws.fetch_blob("Y").shape, np.float32))
    gnet = ws.create_net(netrun.NetDef("grad", grad_ops))
    ws.run_net("grad")
    return net.ops[0], gnet.ops[0]


@pytest.mark.parametrize("shapes, args, want", [
    (((2, 3, 6, 6), (4, 3, 3, 3)), dict(kernel=3, pad=1), "gpu_im2col_gemm"),
    (((2, 3, 6, 6), (4, 3, 1, 1)), dict(kernel=1), "gpu_gemm_1x1"),
    (((2, 3, 6, 6), (6, 1, 3, 3)), dict(kernel=3, group=3), "gpu_depthwise"),
    (((2, 3, 6, 6), (4, 3, 3, 3)), dict(kernel=3, algo="fft"), "gpu_fft"),
    (((2, 3, 6, 6), (4, 3, 3, 3)), dict(kernel=3, algo="shift_gemm"), "gpu_im2col_gemm"),
    (((2, 3, 6, 6), (4, 3, 3, 3)), dict(kernel=3, algo="gpu_winograd_f4x4"), "gpu_winograd_f4x4"),
    (((2, 3, 7, 7), (4, 3, 5, 5)), dict(kernel=5, algo="winograd_f2x2"), "gpu_im2col_gemm"),
])
def test_rules_and_fixed_names(gpu, shapes, args, want):
    ws = netrun.Workspace("gpu")
    fwd, grad = _conv_net(ws, *shapes, **args)
    p = fwd.ctx.state["plan"].problem
    ruled = "algo" not in args or fixed_algorithm(p, args["algo"], "gpu") is None
    if ruled and GPU["cudnn"].fits(p) and all(
            GPU["cudnn"].supports(gpu.xp, p, d) for d in DIRECTIONS):
        want = "cudnn"      # the rules' first choice wherever cuDNN is installed and has plans
    assert fwd.ctx.state["algo"] == want
    assert grad.ctx.state["algo"] == want
    plan = grad.ctx.state["plan"]
    assert set(plan.algos) == {"backward_filter", "backward_data"}
    assert {a.name for a in plan.algos.values()} == {want} and plan.label == want
    assert fwd.ctx.state["plan"].algos == {"forward": GPU[want]}


def test_fixed_gpu_algorithm_that_cannot_run_fails(gpu):
    ws = netrun.Workspace("gpu")
    with pytest.raises(ShapeError, match="gpu_winograd_f2x2.*cannot run"):
        _conv_net(ws, (1, 2, 7, 7), (3, 2, 5, 5), kernel=5, algo="gpu_winograd_f2x2")


def test_gpu_algorithm_names_never_run_gpu_algorithms_on_the_cpu(gpu):
    """A GPU algorithm's name on a CPU workspace means its CPU counterpart (the rules where
    there is none or it cannot run p): a CPU problem never gets a GPU algorithm."""
    p = PROBLEMS["3x3 pad 1"]
    assert fixed_algorithm(p, "gpu_im2col_gemm", "cpu") is CPU["im2col_gemm"]
    assert fixed_algorithm(p, "gpu_gemm_1x1", "cpu") is None     # gemm_1x1 cannot run 3×3
    assert fixed_algorithm(p, "cudnn", "cpu") is None            # no CPU counterpart
    with pytest.raises(ShapeError, match="unknown convolution algorithm"):
        fixed_algorithm(p, "gpu_nonesuch", "cpu")
    ws = netrun.Workspace("cpu")
    for fixed in ("gpu_im2col_gemm", "cudnn"):
        chosen = select.choose(ws.conv, p, "forward", ws.backend, fixed)
        assert not isinstance(chosen, GPUAlgorithm) and chosen.name in CPU


def test_exhaustive_search_is_cached_per_gpu_with_library_versions(gpu, tmp_path):
    counts = []
    for _ in range(2):   # the second workspace finds every answer in the cache
        ws = netrun.Workspace("gpu")
        algos.configure(ws, mode="exhaustive", cache_dir=str(tmp_path))
        fwd, grad = _conv_net(ws, (2, 4, 6, 6), (4, 4, 3, 3), kernel=3, pad=1)
        counts.append((ws.conv.stats.searches, ws.conv.stats.cache_hits))
        assert fwd.ctx.state["algo"] in GPU
    assert counts == [(3, 0), (0, 3)]
    (path,) = tmp_path.glob("gpu-*.json")
    data = json.loads(path.read_text())
    keys = list(data["entries"])
    assert len(keys) == 3 and all("cuda_runtime=" in k and "cupy=" in k for k in keys)
    for entry in data["entries"].values():
        assert set(entry["times_ms"]) >= {"gpu_im2col_gemm", "gpu_fft", "gpu_winograd_f2x2"}
        assert not any(not name.startswith(("gpu_", "cudnn")) for name in entry["times_ms"])


def test_workspace_limit_and_deterministic_mode(gpu):
    p = PROBLEMS["3x3 pad 1"]
    tiny = algos.AlgoSettings(workspace_limit=0)
    (only,) = select.candidates(p, tiny, "gpu")
    assert only.workspace_bytes(p) == min(a.workspace_bytes(p)
                                          for a in applicable_algorithms(p, "gpu"))
    assert isinstance(only, GPUAlgorithm)
    det = select.candidates(p, algos.AlgoSettings(mode="deterministic"), "gpu")
    assert det and all(a.deterministic and isinstance(a, GPUAlgorithm) for a in det)
