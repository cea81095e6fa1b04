"""SpatialBNRelu and the compiled BN/ReLU passes (netrun.kernels.batch_norm): finite
differences (float64), PyTorch (BatchNorm + ReLU, float32), the fused op against SpatialBN
then Relu, both engines against each other, and the same bits on any thread count."""
from __future__ import annotations

import numpy as np
import pytest

import netrun
from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import infer_op
from netrun.errors import ShapeError
from netrun.kernels import jit, omp, parallel
from tests.checks import F, checks_ops, requires_torch, torch
from tests.opcheck import check_gradient, netrun_forward_backward, run_op

BN_IN = ["X", "scale", "bias", "rm", "rv"]
TRAIN_OUT = ["Y", "rm", "rv", "saved_mean", "saved_inv_std"]
ENGINES = ["compiled", "numpy"]
needs_numba = pytest.mark.skipif(not jit.available(), reason="Numba is not installed")


def _engine(name: str):
    """A context for the engine: the compiled kernels (skipped without Numba), or NumPy."""
    if name == "compiled":
        if not jit.available():
            pytest.skip("Numba is not installed")
        return _Nothing()
    return jit.disabled()


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _inputs(rng, shape, order, dtype=np.float64, offset=1.0):
    c = shape[1] if order == "NCHW" else shape[-1]
    return {"X": (rng.standard_normal(shape) * 2 + offset).astype(dtype),
            "scale": rng.uniform(0.5, 1.5, c).astype(dtype),
            "bias": rng.standard_normal(c).astype(dtype),
            "rm": rng.standard_normal(c).astype(dtype),
            "rv": rng.uniform(0.5, 2.0, c).astype(dtype)}


def _nchw(x, order):
    return x if order == "NCHW" else np.moveaxis(x, -1, 1)


def _bn_relu(order="NCHW", is_test=0, **kw):
    outs = ["Y"] if is_test else TRAIN_OUT
    return netrun.op("SpatialBNRelu", BN_IN, outs, order=order, is_test=is_test, **kw)


# Finite differences ---------------------------------------------------------------------------
@checks_ops("SpatialBNRelu", kind="finite_differences")
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("order,shape", [("NCHW", (2, 3, 2, 2)), ("NHWC", (2, 2, 3, 3)),
                                         ("NCHW", (4, 2))])
@pytest.mark.parametrize("is_test", [0, 1])
def test_spatial_bn_relu_gradient(engine, order, shape, is_test):
    inputs = _inputs(np.random.default_rng(7), shape, order, offset=0.0)
    op = _bn_relu(order, is_test, epsilon=1e-3)
    with _engine(engine):
        y = run_op(op, inputs)[0]
        assert (y == 0).any() and (y > 0).any()     # both sides of the ReLU are checked
        assert np.abs(y[y != 0]).min() > 1e-4       # no kink within the differences' step
        check_gradient(op, inputs, check=["X", "scale", "bias"], outputs=[0], atol=1e-5,
                       rtol=1e-4)


# PyTorch ----------------------------------------------------------------------------------------
@checks_ops("SpatialBNRelu", kind="torch_gradient")
@requires_torch
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("is_test", [0, 1])
def test_spatial_bn_relu_matches_torch(engine, order, is_test):
    rng = np.random.default_rng(1)
    shape = (8, 3, 5, 6) if order == "NCHW" else (8, 5, 6, 3)
    inp = _inputs(rng, shape, order, np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    op = _bn_relu(order, is_test, momentum=0.9, epsilon=1e-5)
    with _engine(engine):
        outs, grads = netrun_forward_backward(op, inp, dy)

    x = torch.tensor(_nchw(inp["X"], order), requires_grad=True)
    w = torch.tensor(inp["scale"], requires_grad=True)
    b = torch.tensor(inp["bias"], requires_grad=True)
    rm, rv = torch.tensor(inp["rm"]), torch.tensor(inp["rv"])
    # torch's momentum weighs the batch: torch 0.1 is Caffe2's 0.9.
    y = F.relu(F.batch_norm(x, rm, rv, w, b, training=not is_test, momentum=0.1, eps=1e-5))
    y.backward(torch.tensor(_nchw(dy, order)))

    tol = {"rtol": 1e-4, "atol": 1e-4}
    np.testing.assert_allclose(_nchw(outs[0], order), y.detach().numpy(), **tol)
    if not is_test:
        np.testing.assert_allclose(outs[1], rm.numpy(), **tol)
        np.testing.assert_allclose(outs[2], rv.numpy(), **tol)
    np.testing.assert_allclose(_nchw(grads["X"], order), x.grad.numpy(), **tol)
    np.testing.assert_allclose(grads["scale"], w.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(grads["bias"], b.grad.numpy(), rtol=1e-4, atol=1e-3)


# Fused = SpatialBN then Relu, bit for bit ------------------------------------------------------
def _unfused_and_fused(inp, dy, order, is_test):
    outs = ["Y0"] if is_test else ["Y0", "rm", "rv", "sm", "si"]
    net = [netrun.op("SpatialBN", BN_IN, outs, order=order, is_test=is_test),
           netrun.op("Relu", ["Y0"], ["Y"])]
    ws = netrun.Workspace("cpu")
    for k, v in inp.items():
        ws.feed_blob(k, v)
    for o in net:
        ws.run_operator_once(o)
    stats = ["rm", "rv"] if is_test else ["sm", "si"]
    ws.feed_blob("dY", dy)
    for o in (netrun.op("ReluGradient", ["Y", "dY"], ["dY0"]),
              netrun.op("SpatialBNGradient", ["X", "scale", *stats, "dY0"], ["dX", "ds", "db"],
                        order=order, is_test=is_test)):
        ws.run_operator_once(o)
    unfused = [ws.fetch_blob(n) for n in ("Y", "dX", "ds", "db")]

    ws = netrun.Workspace("cpu")
    for k, v in inp.items():
        ws.feed_blob(k, v)
    fused_outs = ["Y"] if is_test else ["Y", "rm", "rv", "sm", "si"]
    ws.run_operator_once(netrun.op("SpatialBNRelu", BN_IN, fused_outs, order=order,
                                   is_test=is_test))
    ws.feed_blob("dY", dy)
    ws.run_operator_once(netrun.op("SpatialBNReluGradient", ["X", "scale", *stats, "dY", "Y"],
                                   ["dX", "ds", "db"], order=order, is_test=is_test))
    return unfused, [ws.fetch_blob(n) for n in ("Y", "dX", "ds", "db")]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("is_test", [0, 1])
def test_fused_is_spatial_bn_then_relu_bit_for_bit(engine, order, is_test):
    rng = np.random.default_rng(3)
    shape = (4, 3, 5, 5) if order == "NCHW" else (4, 5, 5, 3)
    inp = _inputs(rng, shape, order, np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    dy.reshape(-1)[::7] = np.nan      # NaN·0 stays NaN through the mask in both
    with _engine(engine):
        unfused, fused = _unfused_and_fused(inp, dy, order, is_test)
    for name, u, f in zip(("Y", "dX", "dscale", "dbias"), unfused, fused):
        np.testing.assert_array_equal(f, u, err_msg=name)


def test_gradient_maker_makes_the_fused_gradient():
    op = _bn_relu()
    grad_ops, grad_of = netrun.gradient_ops(op)
    assert [g.type for g in grad_ops] == ["SpatialBNReluGradient"]
    assert list(grad_ops[0].inputs) == ["X", "scale", "saved_mean", "saved_inv_std", "Y_grad",
                                        "Y"]
    assert grad_of["rm"] is None and grad_of["rv"] is None
    (g,), _ = netrun.gradient_ops(_bn_relu(is_test=1))
    assert list(g.inputs)[2:4] == ["rm", "rv"] and dict(g.args)["is_test"] == 1


def test_fused_shapes_and_errors():
    c, x = TensorSpec((3,)), TensorSpec((8, 3, 5, 5))
    assert [s.shape for s in infer_op(_bn_relu(), [x, c, c, c, c]).outputs] == [
        (8, 3, 5, 5), (3,), (3,), (3,), (3,)]
    grad = netrun.op("SpatialBNReluGradient", ["X", "s", "m", "i", "dY", "Y"], ["dX", "ds", "db"])
    assert [s.shape for s in infer_op(grad, [x, c, c, c, x, x]).outputs] == [
        (8, 3, 5, 5), (3,), (3,)]
    with pytest.raises(ShapeError, match="Y has shape 8×3×5×4 but X has shape 8×3×5×5"):
        infer_op(grad, [x, c, c, c, x, TensorSpec((8, 3, 5, 4))])


# The engines agree; the compiled passes ignore the thread count ------------------------------
def _run_all(inp, dy, order, is_test):
    op = _bn_relu(order, is_test) if is_test else netrun.op("SpatialBN", BN_IN, TRAIN_OUT,
                                                            order=order)
    outs, grads = netrun_forward_backward(op, inp, dy)
    relu = run_op(netrun.op("Relu", ["X"], ["Y"]), {"X": inp["X"]})
    relu_grad = run_op(netrun.op("ReluGradient", ["X", "dY"], ["dX"]), {"X": inp["X"], "dY": dy})
    return outs + [grads["X"], grads["scale"], grads["bias"]] + relu + relu_grad


@needs_numba
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("is_test", [0, 1])
def test_compiled_and_numpy_engines_agree(order, is_test):
    rng = np.random.default_rng(5)
    shape = (16, 4, 6, 7) if order == "NCHW" else (16, 6, 7, 4)
    inp = _inputs(rng, shape, order, np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    compiled = _run_all(inp, dy, order, is_test)
    with jit.disabled():
        plain = _run_all(inp, dy, order, is_test)
    for i, (a, b) in enumerate(zip(compiled, plain)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5, err_msg=f"output {i}")
    if is_test:   # the inference map: the same IEEE operations in the same order
        np.testing.assert_array_equal(compiled[0], plain[0])
    np.testing.assert_array_equal(compiled[-2], plain[-2])   # Relu: exact
    np.testing.assert_array_equal(compiled[-1], plain[-1])   # ReluGradient: exact


@needs_numba
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_compiled_passes_give_the_same_bits_on_any_thread_count(order, monkeypatch):
    monkeypatch.setattr(parallel, "MIN_ELEMENTS", 1)      # several chunks even when small
    monkeypatch.setattr(parallel, "CHUNK_ELEMENTS", 1)
    rng = np.random.default_rng(6)
    shape = (16, 3, 5, 5) if order == "NCHW" else (16, 5, 5, 3)
    inp = _inputs(rng, shape, order, np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    results = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(parallel, "thread_count", lambda t=threads: t)
        results.append(_run_all(inp, dy, order, 0))
    for other in results[1:]:
        for i, (a, b) in enumerate(zip(results[0], other)):
            np.testing.assert_array_equal(a, b, err_msg=f"output {i}")


@needs_numba
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("is_test", [0, 1])
def test_passes_on_the_openmp_team_give_the_worker_threads_bits(order, is_test, monkeypatch):
    if not omp.usable(np):
        pytest.skip("Numba's OpenMP threading layer does not load here")
    monkeypatch.setattr(parallel, "MIN_ELEMENTS", 1)      # several chunks even when small
    monkeypatch.setattr(parallel, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(parallel, "thread_count", lambda: 2)
    # the passes go on the team where its threads spin briefly; PyTorch, imported by the
    # tests, loads libgomp first with its long spin, which would keep them off it
    monkeypatch.setattr(omp, "_SPIN", {"short": True})
    rng = np.random.default_rng(7)
    shape = (16, 3, 5, 5) if order == "NCHW" else (16, 5, 5, 3)
    inp = _inputs(rng, shape, order, np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    launched, launch = [], omp.launch
    monkeypatch.setattr(omp, "launch", lambda k, *a: launched.append(k.__name__) or launch(k, *a))
    on_team = _run_all(inp, dy, order, is_test)
    passes = {"inference_team"} if is_test else {"stats_team", "normalize_team",
                                                 "gradient_sums_team"}
    assert passes | {"gradient_input_team", "relu_team", "relu_gradient_team"} <= set(launched)
    launched.clear()
    monkeypatch.setenv(omp.ENV, "off")
    on_workers = _run_all(inp, dy, order, is_test)
    assert not launched
    for i, (a, b) in enumerate(zip(on_team, on_workers)):
        np.testing.assert_array_equal(a, b, err_msg=f"output {i}")


@pytest.mark.parametrize("engine", ENGINES)
def test_batch_statistics_keep_their_precision_far_from_zero(engine):
    # mean 1000, std 0.01: E[x²] − E[x]² in float32 (or unshifted float64 lanes) loses it all
    rng = np.random.default_rng(8)
    x = (1000 + 0.01 * rng.standard_normal((32, 2, 16, 16))).astype(np.float32)
    inp = {"X": x, "scale": np.ones(2, np.float32), "bias": np.zeros(2, np.float32),
           "rm": np.zeros(2, np.float32), "rv": np.ones(2, np.float32)}
    with _engine(engine):
        outs = run_op(netrun.op("SpatialBN", BN_IN, TRAIN_OUT, epsilon=1e-12), inp)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(outs[3], x64.mean((0, 2, 3)), rtol=1e-7)
    np.testing.assert_allclose(outs[4], 1 / np.sqrt(x64.var((0, 2, 3))), rtol=1e-5)


@pytest.mark.parametrize("engine", ENGINES)
def test_relu_in_place_and_non_finite_values(engine):
    x = np.array([[-1.0, 0.0, -0.0, 2.5, np.nan, np.inf, -np.inf, 1e-30]], np.float32)
    dy = np.array([[1.0, 2.0, 3.0, np.nan, 5.0, 6.0, np.nan, 8.0]], np.float32)
    with _engine(engine):
        (y,) = run_op(netrun.op("Relu", ["X"], ["X"]), {"X": x})
        (dx,) = run_op(netrun.op("ReluGradient", ["Y", "dY"], ["dY"]), {"Y": x, "dY": dy})
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(dx, dy * (x > 0))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("out", ["A", "B", "Y"])
def test_add_relu_into_either_input_and_non_finite_values(engine, out):
    # the compiled pass runs on the output array alone where it is an input (vectorized)
    rng = np.random.default_rng(10)
    a = np.concatenate([[-1.0, 0.0, -0.0, np.nan, np.inf, -np.inf, np.inf, 1e-30],
                        rng.standard_normal(1000)]).astype(np.float32)
    b = np.concatenate([[0.5, -0.0, 0.0, 1.0, -np.inf, 1.0, np.nan, -1e-30],
                        rng.standard_normal(1000)]).astype(np.float32)
    with _engine(engine):
        (y,) = run_op(netrun.op("AddRelu", ["A", "B"], [out]), {"A": a, "B": b})
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(y, np.maximum(a + b, 0))


def _blocked_team_case(monkeypatch, several: bool, seed: int, shape) -> tuple:
    """(inputs with X blocked in 8s, dY, 8), the passes on a team of 2 (with its short spin,
    as in the team test above) in several chunks when `several`."""
    monkeypatch.setattr(parallel, "thread_count", lambda: 2)
    monkeypatch.setattr(omp, "_SPIN", {"short": True})
    if several:
        monkeypatch.setattr(parallel, "MIN_ELEMENTS", 1)
        monkeypatch.setattr(parallel, "CHUNK_ELEMENTS", 1)
    n, c, h, w = shape
    rng = np.random.default_rng(seed)
    inp = _inputs(rng, shape, "NCHW", np.float32, offset=2.0)
    inp["X"] = np.ascontiguousarray(inp["X"].reshape(n, c // 8, 8, h, w).transpose(0, 1, 3, 4, 2))
    return inp, rng.standard_normal(inp["X"].shape).astype(np.float32), 8


@needs_numba
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("chunks", ["one", "several"])
def test_blocked_training_passes_in_one_call_give_the_separate_passes_bits(relu, chunks,
                                                                          monkeypatch):
    """A blocked SpatialBN(Relu)'s training forward and gradient as one team call each
    (statistics, per-channel terms, then Y or dX: netrun.kernels.batch_norm.train_forward)
    compute every output the separate passes and NumPy terms do, bit for bit."""
    if not omp.usable(np):
        pytest.skip("Numba's OpenMP threading layer does not load here")
    from netrun.kernels import batch_norm

    inp, dy, block = _blocked_team_case(monkeypatch, chunks == "several", 9, (12, 16, 5, 7))
    op = netrun.op("SpatialBNRelu" if relu else "SpatialBN", BN_IN, TRAIN_OUT, blocked=block,
                   momentum=0.9)
    whole, forward, backward = [], batch_norm.train_forward, batch_norm.train_backward
    monkeypatch.setattr(batch_norm, "train_forward",
                        lambda *a: whole.append(forward(*a)) or whole[-1])
    monkeypatch.setattr(batch_norm, "train_backward",
                        lambda *a: whole.append(backward(*a)) or whole[-1])
    outs, grads = netrun_forward_backward(op, inp, dy)
    assert len(whole) == 2 and all(callable(call) for call in whole)
    monkeypatch.setattr(batch_norm, "train_forward", lambda *a: None)
    monkeypatch.setattr(batch_norm, "train_backward", lambda *a: None)
    passes, pass_grads = netrun_forward_backward(op, inp, dy)
    for name, a, b in zip(TRAIN_OUT, outs, passes):
        np.testing.assert_array_equal(a, b, err_msg=name)
    for name in ("X", "scale", "bias"):
        np.testing.assert_array_equal(grads[name], pass_grads[name], err_msg=f"d{name}")


@needs_numba
def test_blocked_training_passes_repeat_their_team_call_with_the_same_bits(monkeypatch):
    """In a net, a blocked SpatialBNRelu and its gradient repeat their one team call
    (netrun.ops.common.repeat_team_call) while their arrays stay: step after step, with X
    and dY changed in place, the bits of running the kernels each time; a new X binds again."""
    if not omp.usable(np):
        pytest.skip("Numba's OpenMP threading layer does not load here")
    from netrun.ops import norm

    inp, dy, block = _blocked_team_case(monkeypatch, True, 11, (8, 16, 4, 5))
    op = netrun.op("SpatialBNRelu", BN_IN, TRAIN_OUT, blocked=block, momentum=0.9)
    grads = netrun.gradient_ops(op)[0]
    names = ["Y", "rm", "rv", "saved_mean", "saved_inv_std", "X_grad", "scale_grad",
             "bias_grad"]

    def run(repeat: bool) -> tuple[list, list]:
        if not repeat:
            monkeypatch.setattr(norm, "repeat_team_call", lambda ctx, call: None)
        ws = netrun.Workspace(memory_plan=True)
        for name, value in {**inp, "Y_grad": dy}.items():
            ws.feed_blob(name, value.copy())
        ws.create_net(netrun.NetDef(name="step", ops=[op, *grads]))
        out, repeats = [], []
        for step in range(6):
            if step == 2:    # new values in place
                ws.get_blob("X")[...] *= 0.5
                ws.get_blob("Y_grad")[...] *= -1
            if step == 4:    # a new array: the calls bind again
                ws.feed_blob("X", inp["X"][::-1].copy())
            ws.run_net("step")
            out.append([ws.fetch_blob(name).copy() for name in names])
            repeats.append([o._repeat for o in ws._nets["step"].ops])
        return out, repeats

    repeated, repeats = run(True)
    kept = [r[0] for r in repeats]
    assert all(r is not None for step in repeats for r in step)
    assert kept[1] is kept[0] and kept[3] is kept[0] and kept[4] is not kept[0]
    plain, never = run(False)
    assert not any(r for step in never for r in step)
    for i, (a, b) in enumerate(zip(repeated, plain)):
        for name, u, v in zip(names, a, b):
            np.testing.assert_array_equal(u, v, err_msg=f"step {i} {name}")
    assert not np.array_equal(repeated[1][0], repeated[2][0])   # they read the new values
