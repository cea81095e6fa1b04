"""SpatialBN and LRN: finite differences (float64), PyTorch (float32), Caffe's formulas, errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import infer_op
from netrun.errors import SchemaError, ShapeError
from tests.opcheck import check_gradient, run_op
from tests.checks import F, checks_ops, requires_torch, skip_unless_torch, torch

FAST = settings(max_examples=10, deadline=None)
BN_IN = ["X", "scale", "bias", "rm", "rv"]
BN_TRAIN_OUT = ["Y", "rm", "rv", "saved_mean", "saved_inv_std"]


def _bn_inputs(rng, shape, order, dtype=np.float64):
    c = shape[1] if order == "NCHW" else shape[-1]
    return {"X": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
            "scale": rng.uniform(0.5, 1.5, c).astype(dtype),
            "bias": rng.standard_normal(c).astype(dtype),
            "rm": rng.standard_normal(c).astype(dtype),
            "rv": rng.uniform(0.5, 2.0, c).astype(dtype)}


def _to_nchw(x, order):
    return x if order == "NCHW" else np.moveaxis(x, -1, 1)


# SpatialBN: finite differences --------------------------------------------------------------
@checks_ops("SpatialBN", kind="finite_differences")
@FAST
@given(order=st.sampled_from(["NCHW", "NHWC"]), seed=st.integers(0, 2**16),
       shape=st.sampled_from([(3, 2), (2, 3, 2, 2), (2, 2, 3)]), is_test=st.booleans())
def test_spatial_bn_gradient(order, seed, shape, is_test):
    inputs = _bn_inputs(np.random.default_rng(seed), shape, order)
    outs = ["Y"] if is_test else BN_TRAIN_OUT
    op = netrun.op("SpatialBN", BN_IN, outs, order=order, is_test=int(is_test), epsilon=1e-3)
    check_gradient(op, inputs, check=["X", "scale", "bias"], outputs=[0], atol=1e-5, rtol=1e-4)


# SpatialBN: PyTorch ---------------------------------------------------------------------------
@checks_ops("SpatialBN", kind="torch_gradient")
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_spatial_bn_training_matches_torch(device, order):
    rng = np.random.default_rng(1)
    shape = (4, 3, 5, 6) if order == "NCHW" else (4, 5, 6, 3)
    inp = _bn_inputs(rng, shape, order, np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    op = netrun.op("SpatialBN", BN_IN, BN_TRAIN_OUT, order=order, momentum=0.9, epsilon=1e-5)
    grad_ops, grad_of = netrun.gradient_ops(op)
    ws = netrun.Workspace(device)
    for k, v in inp.items():
        ws.feed_blob(k, v)
    ws.run_operator_once(op)
    ws.feed_blob("Y_grad", dy)
    for g in grad_ops:
        ws.run_operator_once(g)
    tol = {"rtol": 1e-4, "atol": 1e-5}
    axes = tuple(i for i in range(4) if i != (1 if order == "NCHW" else 3))
    np.testing.assert_allclose(ws.fetch_blob("saved_mean"), inp["X"].mean(axes), **tol)
    np.testing.assert_allclose(ws.fetch_blob("saved_inv_std"),
                               1 / np.sqrt(inp["X"].var(axes) + 1e-5), **tol)
    skip_unless_torch()

    x = torch.tensor(_to_nchw(inp["X"], order), requires_grad=True)
    w = torch.tensor(inp["scale"], requires_grad=True)
    b = torch.tensor(inp["bias"], requires_grad=True)
    rm, rv = torch.tensor(inp["rm"]), torch.tensor(inp["rv"])
    # torch's momentum weighs the batch: torch 0.1 is Caffe2's 0.9.
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    y.backward(torch.tensor(_to_nchw(dy, order)))

    np.testing.assert_allclose(_to_nchw(ws.fetch_blob("Y"), order), y.detach().numpy(), **tol)
    np.testing.assert_allclose(ws.fetch_blob("rm"), rm.numpy(), **tol)   # updated in place
    np.testing.assert_allclose(ws.fetch_blob("rv"), rv.numpy(), **tol)   # unbiased variance
    np.testing.assert_allclose(_to_nchw(ws.fetch_blob(grad_of["X"]), order), x.grad.numpy(),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ws.fetch_blob(grad_of["scale"]), w.grad.numpy(), rtol=1e-4,
                               atol=1e-3)
    np.testing.assert_allclose(ws.fetch_blob(grad_of["bias"]), b.grad.numpy(), rtol=1e-4,
                               atol=1e-3)
    assert grad_of["rm"] is None and grad_of["rv"] is None


@checks_ops("SpatialBN", kind="torch")
@requires_torch
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_spatial_bn_eval_matches_torch(device, order):
    shape = (2, 3, 4, 4) if order == "NCHW" else (2, 4, 4, 3)
    inp = _bn_inputs(np.random.default_rng(2), shape, order, np.float32)
    op = netrun.op("SpatialBN", BN_IN, ["Y"], order=order, is_test=1, epsilon=1e-3)
    (y,) = run_op(op, inp, device)
    ref = F.batch_norm(torch.tensor(_to_nchw(inp["X"], order)), torch.tensor(inp["rm"]),
                       torch.tensor(inp["rv"]), torch.tensor(inp["scale"]),
                       torch.tensor(inp["bias"]), training=False, eps=1e-3)
    np.testing.assert_allclose(_to_nchw(y, order), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_spatial_bn_running_stats_accumulate_over_runs():
    rng = np.random.default_rng(3)
    inp = _bn_inputs(rng, (6, 2, 3, 3), "NCHW", np.float32)
    op = netrun.op("SpatialBN", BN_IN, BN_TRAIN_OUT, momentum=0.8)
    ws = netrun.Workspace("cpu")
    for k, v in inp.items():
        ws.feed_blob(k, v)
    rm, rv = inp["rm"].astype(np.float64), inp["rv"].astype(np.float64)
    for _ in range(3):
        x = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
        ws.feed_blob("X", x)
        ws.run_operator_once(op)
        rm = 0.8 * rm + 0.2 * x.mean((0, 2, 3))
        rv = 0.8 * rv + 0.2 * x.var((0, 2, 3), ddof=1)
    np.testing.assert_allclose(ws.fetch_blob("rm"), rm, rtol=1e-5)
    np.testing.assert_allclose(ws.fetch_blob("rv"), rv, rtol=1e-5)


def test_spatial_bn_schema_rules():
    schema = netrun.get_schema("SpatialBN")
    with pytest.raises(SchemaError, match="must be the same blob as input 3"):
        schema.verify(netrun.op("SpatialBN", BN_IN, ["Y", "rm2", "rv", "sm", "siv"]))
    with pytest.raises(SchemaError, match="'is_test'"):
        schema.verify(netrun.op("SpatialBN", BN_IN, ["Y"]))
    with pytest.raises(SchemaError, match="'is_test'"):
        schema.verify(netrun.op("SpatialBN", BN_IN, BN_TRAIN_OUT, is_test=1))
    with pytest.raises(SchemaError, match="'momentum' is 1.5"):
        schema.verify(netrun.op("SpatialBN", BN_IN, BN_TRAIN_OUT, momentum=1.5))
    with pytest.raises(SchemaError, match="'order' is 'NCWH'"):
        schema.verify(netrun.op("SpatialBN", BN_IN, BN_TRAIN_OUT, order="NCWH"))


def test_spatial_bn_shapes():
    op = netrun.op("SpatialBN", BN_IN, BN_TRAIN_OUT)
    x, c = TensorSpec((8, 3, 5, 5)), TensorSpec((3,))
    specs = infer_op(op, [x, c, c, c, c])
    real = run_op(op, _bn_inputs(np.random.default_rng(4), (8, 3, 5, 5), "NCHW", np.float32))
    assert [s.shape for s in specs.outputs] == [r.shape for r in real]
    assert [s.dtype for s in specs.outputs] == [str(r.dtype) for r in real]
    with pytest.raises(ShapeError, match="scale has shape 4 but X has 3 channels.*X 8×3×5×5"):
        infer_op(op, [x, TensorSpec((4,)), c, c, c])
    with pytest.raises(ShapeError, match="more than one value per channel"):
        infer_op(op, [TensorSpec((1, 3)), c, c, c, c])


# LRN ------------------------------------------------------------------------------------
def lrn_reference(x: np.ndarray, size: int, alpha: float, beta: float, k: float,
                  within: bool) -> np.ndarray:
    """Caffe's LRN on NCHW, element by element (float64)."""
    n, c, h, w = x.shape
    pad = (size - 1) // 2
    sq = np.pad(x.astype(np.float64) ** 2, [(0, 0), (pad, pad), (pad, pad), (pad, pad)])
    y = np.empty(x.shape)
    for i, j, r, s in np.ndindex(x.shape):
        if within:  # 1 + alpha/size² · Σ over a size×size window (k fixed at 1)
            scale = 1 + alpha / size**2 * sq[i, j + pad, r:r + size, s:s + size].sum()
        else:
            scale = k + alpha / size * sq[i, j:j + size, r + pad, s + pad].sum()
        y[i, j, r, s] = x[i, j, r, s] * scale ** -beta
    return y


@checks_ops("LRN", kind="finite_differences")
@FAST
@given(size=st.sampled_from([1, 3, 5]), within=st.booleans(), two_outputs=st.booleans(),
       seed=st.integers(0, 2**16))
def test_lrn_gradient(size, within, two_outputs, seed):
    x = np.random.default_rng(seed).standard_normal((2, 4, 3, 3))
    args = {"norm_region": "WITHIN_CHANNEL"} if within else {"bias": 2.0}
    op = netrun.op("LRN", ["X"], ["Y", "S"] if two_outputs else ["Y"], size=size, alpha=0.6,
                   beta=0.75, **args)
    check_gradient(op, {"X": x}, outputs=[0])


@pytest.mark.parametrize("within", [False, True])
def test_lrn_matches_caffe_formula(within):
    x = np.random.default_rng(5).standard_normal((2, 5, 4, 4))
    args = {"norm_region": "WITHIN_CHANNEL"} if within else {"bias": 1.5}
    op = netrun.op("LRN", ["X"], ["Y"], size=3, alpha=0.3, beta=0.6, **args)
    (y,) = run_op(op, {"X": x})
    np.testing.assert_allclose(y, lrn_reference(x, 3, 0.3, 0.6, 1.5, within), rtol=1e-12)


@checks_ops("LRN", kind="torch_gradient")
@requires_torch
def test_lrn_matches_torch(device):
    # torch's local_response_norm also divides alpha by size (an average over the window).
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((2, 7, 5, 5)) * 3).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    op = netrun.op("LRN", ["X"], ["Y", "scale"], size=5, alpha=1e-2, beta=0.75, bias=2.0)
    grad_ops, grad_of = netrun.gradient_ops(op)
    ws = netrun.Workspace(device)
    ws.feed_blob("X", x)
    ws.run_operator_once(op)
    ws.feed_blob("Y_grad", dy)
    ws.feed_blob("scale_grad", np.zeros_like(x))
    for g in grad_ops:
        ws.run_operator_once(g)
    xt = torch.tensor(x, requires_grad=True)
    yt = F.local_response_norm(xt, 5, alpha=1e-2, beta=0.75, k=2.0)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(ws.fetch_blob("Y"), yt.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ws.fetch_blob(grad_of["X"]), xt.grad.numpy(), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("within", [False, True])
def test_lrn_nhwc_equals_nchw(within):
    x = np.random.default_rng(7).standard_normal((2, 5, 3, 4))
    args = {"size": 3, "alpha": 0.5, "norm_region": "WITHIN_CHANNEL" if within else
            "ACROSS_CHANNELS"}
    (y,) = run_op(netrun.op("LRN", ["X"], ["Y"], **args), {"X": x})
    (y2,) = run_op(netrun.op("LRN", ["X"], ["Y"], order="NHWC", **args),
                   {"X": np.moveaxis(x, 1, -1).copy()})
    np.testing.assert_allclose(np.moveaxis(y2, -1, 1), y, rtol=1e-12)


def test_lrn_bad_arguments_fail_at_build_time():
    schema = netrun.get_schema("LRN")
    with pytest.raises(SchemaError, match="LRN.*'size' is 4.*odd"):
        schema.verify(netrun.op("LRN", ["X"], ["Y"], size=4))
    with pytest.raises(SchemaError, match="'bias' is 2.0.*WITHIN_CHANNEL"):
        schema.verify(netrun.op("LRN", ["X"], ["Y"], bias=2.0, norm_region="WITHIN_CHANNEL"))
    with pytest.raises(SchemaError, match="'norm_region' is 'ACROSS'"):
        schema.verify(netrun.op("LRN", ["X"], ["Y"], norm_region="ACROSS"))


def test_lrn_shapes():
    op = netrun.op("LRN", ["X"], ["Y", "scale"])
    specs = infer_op(op, [TensorSpec((2, 6, 3, 3))]).outputs
    real = run_op(op, {"X": np.ones((2, 6, 3, 3), np.float32)})
    assert [(s.shape, s.dtype) for s in specs] == [(r.shape, str(r.dtype)) for r in real]
    with pytest.raises(ShapeError, match="WITHIN_CHANNEL needs X with at least 3 axes"):
        infer_op(netrun.op("LRN", ["X"], ["Y"], norm_region="WITHIN_CHANNEL"),
                 [TensorSpec((4, 6))])


def test_backward_pass_through_bn_and_lrn_with_in_place_ops_after_them():
    # LRNGradient reads X and scale, not Y, so an in-place op may overwrite LRN's output;
    # SpatialBN's running stats are written in place and get no gradient.
    op = netrun.op
    net = netrun.NetDef("n", [
        op("SpatialBN", BN_IN, BN_TRAIN_OUT),
        op("LRN", ["Y"], ["Z", "Z_scale"], size=3, alpha=0.5),
        op("Relu", ["Z"], ["Z"]),
        op("AveragedLoss", ["Z"], ["loss"])])
    grads = netrun.add_gradient_ops(net, ["loss"])
    assert {"X", "scale", "bias"} <= set(grads) and "rm" not in grads and "rv" not in grads
    inputs = _bn_inputs(np.random.default_rng(8), (4, 3, 2, 2), "NCHW")
    ws = netrun.Workspace("cpu")
    for k, v in inputs.items():
        ws.feed_blob(k, v)
    ws.run_net_once(net)
    for o in net.ops:  # shape inference of every forward and gradient op matches the run
        specs = infer_op(o, [TensorSpec(ws.get_blob(n).shape, str(ws.get_blob(n).dtype))
                             for n in o.inputs]).outputs
        assert [s.shape for s in specs] == [ws.get_blob(n).shape for n in o.outputs], o.type

    def loss(x):
        y = run_op(netrun.op("SpatialBN", BN_IN, BN_TRAIN_OUT), {**inputs, "X": x})[0]
        z = run_op(netrun.op("LRN", ["Y"], ["Z"], size=3, alpha=0.5), {"Y": y})[0]
        return np.maximum(z, 0).mean()

    x, eps, idx = inputs["X"].copy(), 1e-6, (1, 2, 0, 1)
    x[idx] += eps
    plus = loss(x)
    x[idx] -= 2 * eps
    numeric = (plus - loss(x)) / (2 * eps)
    assert abs(numeric) > 1e-4  # this element is not cut off by the Relu
    assert ws.fetch_blob(grads["X"])[idx] == pytest.approx(numeric, rel=1e-5, abs=1e-8)
