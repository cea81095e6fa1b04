"""Softmax family and losses: finite differences (float64), PyTorch (float32), shapes, errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.core.shape_inference import infer_op
from netrun.core.schema import TensorSpec
from netrun.errors import NetrunError, SchemaError, ShapeError
from tests.opcheck import check_gradient, netrun_forward_backward, run_op
from tests.checks import F, checks_ops, requires_torch, torch

FAST = settings(max_examples=12, deadline=None)
RTOL, ATOL = 1e-5, 1e-6  # float32 rounding for O(1) values


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _loss_and_grad(op, inputs, dloss=1.0, device="cpu"):
    """Run a loss op, feed d(loss), run its gradient ops; return (outputs, grad_of, ws)."""
    grad_ops, grad_of = netrun.gradient_ops(op)
    ws = netrun.Workspace(device, seed=0)
    for k, v in inputs.items():
        ws.feed_blob(k, v)
    ws.run_operator_once(op)
    loss = ws.fetch_blob(op.outputs[-1])
    for j, name in enumerate(op.outputs):
        y = ws.fetch_blob(name)
        ws.feed_blob(f"{name}_grad", np.full_like(y, dloss) if j == len(op.outputs) - 1
                     else np.zeros_like(y))
    for g in grad_ops:
        ws.run_operator_once(g)
    return [ws.fetch_blob(o) for o in op.outputs], {
        n: ws.fetch_blob(g) for n, g in grad_of.items() if g}, loss


# Finite differences (float64) -------------------------------------------------------------
@checks_ops("Softmax", "LogSoftmax", kind="finite_differences")
@FAST
@given(n=st.integers(1, 4), d=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_softmax_and_log_softmax_gradients(n, d, seed):
    x = _rng(seed).standard_normal((n, d)) * 2
    check_gradient(netrun.op("Softmax", ["X"], ["Y"]), {"X": x})
    check_gradient(netrun.op("LogSoftmax", ["X"], ["Y"]), {"X": x})


@FAST
@given(seed=st.integers(0, 2**16), axis=st.sampled_from([1, 2, -1]))
def test_softmax_gradient_with_axis(seed, axis):
    x = _rng(seed).standard_normal((2, 3, 4))
    check_gradient(netrun.op("Softmax", ["X"], ["Y"], axis=axis), {"X": x})
    check_gradient(netrun.op("LogSoftmax", ["X"], ["Y"], axis=axis), {"X": x})


@checks_ops("SoftmaxWithLoss", kind="finite_differences")
@FAST
@given(n=st.integers(1, 5), d=st.integers(2, 5), seed=st.integers(0, 2**16),
       weighted=st.booleans(), ignore=st.booleans(), scale=st.sampled_from([1.0, 0.5, 3.0]))
def test_softmax_with_loss_gradient(n, d, seed, weighted, ignore, scale):
    rng = _rng(seed)
    x = rng.standard_normal((n, d)) * 2
    labels = rng.integers(0, d, n).astype(np.int32)
    args = {"scale": scale}
    if ignore:
        labels[0] = 7  # an ignored label may lie outside [0, D)
        args["ignore_label"] = 7
    inputs = {"X": x, "L": labels}
    names = ["X", "L"]
    if weighted:
        inputs["W"] = rng.uniform(0.1, 2.0, n)
        names.append("W")
    op = netrun.op("SoftmaxWithLoss", names, ["P", "loss"], **args)
    check_gradient(op, inputs, check=["X"], outputs=[1])


@checks_ops("LabelCrossEntropy", kind="finite_differences")
@FAST
@given(n=st.integers(1, 4), d=st.integers(2, 5), seed=st.integers(0, 2**16))
def test_label_cross_entropy_gradient(n, d, seed):
    rng = _rng(seed)
    x = rng.uniform(0.1, 1.0, (n, d))
    labels = rng.integers(0, d, n)
    check_gradient(netrun.op("LabelCrossEntropy", ["X", "L"], ["Y"]), {"X": x, "L": labels})


@checks_ops("SigmoidCrossEntropyWithLogits", kind="finite_differences")
@FAST
@given(shape=st.sampled_from([(5,), (2, 3), (2, 2, 3)]), seed=st.integers(0, 2**16))
def test_sigmoid_cross_entropy_gradient(shape, seed):
    rng = _rng(seed)
    x, t = rng.standard_normal(shape) * 3, rng.random(shape)
    check_gradient(netrun.op("SigmoidCrossEntropyWithLogits", ["X", "T"], ["Y"]),
                   {"X": x, "T": t}, check=["X"])


@checks_ops("SquaredL2Distance", "AveragedLoss", kind="finite_differences")
@FAST
@given(shape=st.sampled_from([(4,), (3, 2), (2, 3, 2)]), seed=st.integers(0, 2**16))
def test_squared_l2_distance_and_averaged_loss_gradients(shape, seed):
    rng = _rng(seed)
    x, y = rng.standard_normal(shape), rng.standard_normal(shape)
    check_gradient(netrun.op("SquaredL2Distance", ["X", "Y"], ["D"]), {"X": x, "Y": y})
    check_gradient(netrun.op("AveragedLoss", ["X"], ["L"]), {"X": x})


# PyTorch references (float32) -------------------------------------------------------------
@checks_ops("Softmax", "LogSoftmax", kind="torch_gradient")
@requires_torch
@pytest.mark.parametrize("type_, fn", [("Softmax", "softmax"), ("LogSoftmax", "log_softmax")])
def test_softmax_matches_torch(device, type_, fn):
    rng = _rng(1)
    x = (rng.standard_normal((6, 10)) * 4).astype(np.float32)
    dy = rng.standard_normal((6, 10)).astype(np.float32)
    (y,), grads = netrun_forward_backward(netrun.op(type_, ["X"], ["Y"]), {"X": x}, dy, device)
    xt = torch.tensor(x, requires_grad=True)
    yt = getattr(F, fn)(xt, dim=1)
    yt.backward(torch.tensor(dy))
    assert y.dtype == np.float32 and grads["X"].dtype == np.float32
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["X"], xt.grad.numpy(), rtol=1e-4, atol=1e-5)


@checks_ops("SoftmaxWithLoss", kind="torch_gradient")
@requires_torch
@pytest.mark.parametrize("ignore, weighted", [(False, False), (True, False), (True, True),
                                              (False, True)])
def test_softmax_with_loss_matches_torch_cross_entropy(device, ignore, weighted):
    rng = _rng(2)
    n, d = 12, 7
    x = (rng.standard_normal((n, d)) * 3).astype(np.float32)
    labels = rng.integers(0, d, n).astype(np.int64)
    class_w = rng.uniform(0.2, 2.0, d).astype(np.float32)
    kwargs, args, inputs, names = {}, {}, {"X": x, "L": labels}, ["X", "L"]
    if ignore:
        labels[[1, 4, 5]] = 3
        kwargs["ignore_index"] = args["ignore_label"] = 3
    if weighted:
        # torch weighs by class; per-example weights w_i = class_w[label_i] are the same thing.
        kwargs["weight"] = torch.tensor(class_w)
        inputs["W"] = class_w[labels]
        names.append("W")
    op = netrun.op("SoftmaxWithLoss", names, ["P", "loss"], **args)
    (p, loss), grads, _ = _loss_and_grad(op, inputs, dloss=1.5, device=device)
    xt = torch.tensor(x, requires_grad=True)
    lt = F.cross_entropy(xt, torch.tensor(labels), **kwargs)
    (lt * 1.5).backward()
    assert loss.shape == () and loss.dtype == np.float32
    np.testing.assert_allclose(loss, lt.item(), rtol=RTOL)
    np.testing.assert_allclose(p, F.softmax(xt, 1).detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["X"], xt.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert "L" not in grads and "W" not in grads  # labels and weights get no gradient


@checks_ops("LabelCrossEntropy", kind="torch_gradient")
@requires_torch
def test_label_cross_entropy_matches_torch_nll(device):
    rng = _rng(3)
    p = F.softmax(torch.tensor(rng.standard_normal((5, 4)), dtype=torch.float32), 1).numpy()
    labels = rng.integers(0, 4, 5).astype(np.int32)
    dy = rng.standard_normal(5).astype(np.float32)
    (y,), grads = netrun_forward_backward(netrun.op("LabelCrossEntropy", ["X", "L"], ["Y"]),
                                          {"X": p, "L": labels}, dy, device)
    pt = torch.tensor(p, requires_grad=True)
    yt = F.nll_loss(torch.log(pt), torch.tensor(labels, dtype=torch.int64), reduction="none")
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["X"], pt.grad.numpy(), rtol=RTOL, atol=ATOL)


@checks_ops("SigmoidCrossEntropyWithLogits", kind="torch_gradient")
@requires_torch
def test_sigmoid_cross_entropy_matches_torch(device):
    rng = _rng(4)
    x = (rng.standard_normal((4, 6)) * 5).astype(np.float32)
    x[0, :2] = [80.0, -80.0]  # far beyond exp()'s float32 range
    t = rng.random((4, 6)).astype(np.float32)
    dy = rng.standard_normal(4).astype(np.float32)
    op = netrun.op("SigmoidCrossEntropyWithLogits", ["X", "T"], ["Y"])
    (y,), grads = netrun_forward_backward(op, {"X": x, "T": t}, dy, device)
    xt = torch.tensor(x, requires_grad=True)
    yt = F.binary_cross_entropy_with_logits(xt, torch.tensor(t), reduction="none").mean(-1)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=RTOL, atol=1e-5)
    np.testing.assert_allclose(grads["X"], xt.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert grads["T"] is None  # targets are labels here


@checks_ops("SquaredL2Distance", kind="torch_gradient")
@requires_torch
def test_squared_l2_distance_matches_torch_mse(device):
    rng = _rng(5)
    x, y = (rng.standard_normal((2, 3, 4, 5)).astype(np.float32) for _ in range(2))
    dd = rng.standard_normal(2).astype(np.float32)
    op = netrun.op("SquaredL2Distance", ["X", "Y"], ["D"])
    (dist,), grads = netrun_forward_backward(op, {"X": x, "Y": y}, dd, device)
    xt, yt = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    ref = 0.5 * F.mse_loss(xt, yt, reduction="none").sum(dim=(1, 2, 3))
    ref.backward(torch.tensor(dd))
    np.testing.assert_allclose(dist, ref.detach().numpy(), rtol=RTOL)
    np.testing.assert_allclose(grads["X"], xt.grad.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["Y"], yt.grad.numpy(), rtol=RTOL, atol=ATOL)


@checks_ops("AveragedLoss", kind="torch_gradient")
@requires_torch
def test_averaged_loss_matches_torch_mean(device):
    x = _rng(6).standard_normal((3, 4, 5)).astype(np.float32)
    op = netrun.op("AveragedLoss", ["X"], ["L"])
    (loss,), grads, _ = _loss_and_grad(op, {"X": x}, dloss=2.0, device=device)
    xt = torch.tensor(x, requires_grad=True)
    (xt.mean() * 2.0).backward()
    assert loss.shape == () and loss.dtype == np.float32
    np.testing.assert_allclose(loss, xt.mean().item(), rtol=RTOL)
    np.testing.assert_allclose(grads["X"], xt.grad.numpy(), rtol=RTOL)


# Numerics and semantics --------------------------------------------------------------------
def test_softmax_is_stable_for_huge_logits():
    x = np.array([[1e4, 0.0, -1e4], [-3e4, -3e4, -3e4]], np.float32)
    (p,) = run_op(netrun.op("Softmax", ["X"], ["Y"]), {"X": x})
    (lp,) = run_op(netrun.op("LogSoftmax", ["X"], ["Y"]), {"X": x})
    np.testing.assert_allclose(p, [[1, 0, 0], [1 / 3] * 3], atol=1e-7)
    np.testing.assert_allclose(lp, [[0, -1e4, -2e4], [np.log(1 / 3)] * 3], rtol=1e-6)
    op = netrun.op("SoftmaxWithLoss", ["X", "L"], ["P", "loss"])
    _, loss = run_op(op, {"X": x, "L": np.array([2, 0])})
    # P[0, 2] underflows to 0, yet the loss is the exact (finite) 1e4 + 1e4 + log(1/3)-ish value.
    np.testing.assert_allclose(loss, (2e4 + np.log(3)) / 2, rtol=1e-6)


def test_softmax_axis_coerces_trailing_axes_like_caffe2():
    x = _rng(7).standard_normal((2, 3, 4))
    (y,) = run_op(netrun.op("Softmax", ["X"], ["Y"], axis=1), {"X": x})
    flat = x.reshape(2, 12)
    ref = np.exp(flat) / np.exp(flat).sum(1, keepdims=True)
    np.testing.assert_allclose(y, ref.reshape(2, 3, 4), rtol=1e-12)


def test_softmax_in_place():
    x = _rng(8).standard_normal((3, 4)).astype(np.float32)
    ws = netrun.Workspace("cpu")
    ws.feed_blob("X", x)
    ws.run_operator_once(netrun.op("Softmax", ["X"], ["X"]))
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(ws.fetch_blob("X"), e / e.sum(1, keepdims=True), rtol=RTOL,
                               atol=ATOL)


def test_softmax_with_loss_all_ignored_gives_zero_loss_and_gradient():
    x = _rng(9).standard_normal((3, 4)).astype(np.float32)
    op = netrun.op("SoftmaxWithLoss", ["X", "L"], ["P", "loss"], ignore_label=255)
    (_, loss), grads, _ = _loss_and_grad(op, {"X": x, "L": np.full(3, 255)})
    assert loss == 0.0 and not np.any(grads["X"])


def test_softmax_with_loss_float_labels_and_n_by_1_labels():
    rng = _rng(10)
    x = rng.standard_normal((4, 3))
    labels = rng.integers(0, 3, 4)
    op = netrun.op("SoftmaxWithLoss", ["X", "L"], ["P", "loss"])
    ref = run_op(op, {"X": x, "L": labels})[1]
    assert run_op(op, {"X": x, "L": labels.astype(np.float32)})[1] == ref  # Caffe's float labels
    assert run_op(op, {"X": x, "L": labels.reshape(4, 1)})[1] == ref


@pytest.mark.parametrize("label", [-1, 3, 9])
def test_label_out_of_range_is_an_error(label):
    op = netrun.op("SoftmaxWithLoss", ["X", "L"], ["P", "loss"])
    with pytest.raises(NetrunError, match=f"label {label} is outside \\[0, 3\\)"):
        run_op(op, {"X": np.zeros((2, 3)), "L": np.array([0, label])})


def test_labels_are_not_differentiable():
    op = netrun.op("SoftmaxWithLoss", ["X", "L", "W"], ["P", "loss"])
    _, grad_of = netrun.gradient_ops(op)
    assert grad_of == {"X": "X_grad", "L": None, "W": None}


# Shape inference and errors ----------------------------------------------------------------
CASES = [
    (netrun.op("Softmax", ["X"], ["Y"], axis=2), {"X": np.zeros((2, 3, 4), np.float32)}),
    (netrun.op("LogSoftmax", ["X"], ["Y"]), {"X": np.zeros((2, 3), np.float64)}),
    (netrun.op("SoftmaxWithLoss", ["X", "L", "W"], ["P", "loss"]),
     {"X": np.zeros((2, 3), np.float32), "L": np.zeros(2, np.int32),
      "W": np.ones(2, np.float32)}),
    (netrun.op("LabelCrossEntropy", ["X", "L"], ["Y"]),
     {"X": np.ones((2, 3), np.float32), "L": np.zeros(2, np.int64)}),
    (netrun.op("SigmoidCrossEntropyWithLogits", ["X", "T"], ["Y"]),
     {"X": np.zeros((2, 3, 4), np.float32), "T": np.zeros((2, 3, 4), np.float32)}),
    (netrun.op("SigmoidCrossEntropyWithLogits", ["X", "T"], ["Y"]),
     {"X": np.zeros(4, np.float32), "T": np.zeros(4, np.float32)}),
    (netrun.op("SquaredL2Distance", ["X", "Y"], ["D"]),
     {"X": np.zeros((3, 2, 2), np.float32), "Y": np.zeros((3, 2, 2), np.float32)}),
    (netrun.op("AveragedLoss", ["X"], ["L"]), {"X": np.zeros((3, 2), np.float64)}),
]


@pytest.mark.parametrize("op, inputs", CASES, ids=lambda c: getattr(c, "type", ""))
def test_shape_inference_matches_outputs_forward_and_backward(op, inputs):
    outs = run_op(op, inputs)
    specs = infer_op(op, [TensorSpec(v.shape, str(v.dtype)) for v in inputs.values()])
    assert [(s.shape, s.dtype) for s in specs.outputs] == [(o.shape, str(o.dtype)) for o in outs]
    assert specs.cost.flops > 0 and specs.cost.bytes_written > 0
    grad_ops, _ = netrun.gradient_ops(op)
    ws = netrun.Workspace("cpu")
    for k, v in inputs.items():
        ws.feed_blob(k, v)
    ws.run_operator_once(op)
    for name, y in zip(op.outputs, outs):
        ws.feed_blob(f"{name}_grad", np.ones_like(y))
    for g in grad_ops:
        ins = [TensorSpec(ws.get_blob(n).shape, str(ws.get_blob(n).dtype)) for n in g.inputs]
        gspecs = infer_op(g, ins).outputs
        ws.run_operator_once(g)
        got = [ws.get_blob(n) for n in g.outputs]
        assert [(s.shape, s.dtype) for s in gspecs] == [(a.shape, str(a.dtype)) for a in got]


@pytest.mark.parametrize("op, specs, message", [
    (netrun.op("SoftmaxWithLoss", ["X", "L"], ["P", "loss"]),
     [TensorSpec((8, 10)), TensorSpec((7,), "int32")],
     "labels have 7 entries but X has 8 examples: X 8×10, labels 7"),
    (netrun.op("SoftmaxWithLoss", ["X", "L", "W"], ["P", "loss"]),
     [TensorSpec((8, 10)), TensorSpec((8,), "int32"), TensorSpec((4,))],
     "weights have 4 entries but X has 8 examples"),
    (netrun.op("Softmax", ["X"], ["Y"], axis=3), [TensorSpec((2, 3))], "axis 3 is out of range"),
    (netrun.op("SquaredL2Distance", ["X", "Y"], ["D"]), [TensorSpec((2, 3)), TensorSpec((3, 2))],
     "'X' has shape 2×3 but 'Y' has shape 3×2"),
    (netrun.op("LabelCrossEntropy", ["X", "L"], ["Y"]),
     [TensorSpec((2, 3, 4)), TensorSpec((2,), "int32")], "X must be N×D"),
])
def test_shape_errors_name_blobs_and_shapes(op, specs, message):
    with pytest.raises(ShapeError, match=message.replace("(", r"\(")):
        infer_op(op, specs)


def test_bad_arguments_fail_at_build_time():
    with pytest.raises(SchemaError, match="'axis' must be an integer"):
        netrun.get_schema("Softmax").verify(netrun.op("Softmax", ["X"], ["Y"], axis="1"))
    with pytest.raises(SchemaError, match="takes 2 to 3 input"):
        netrun.get_schema("SoftmaxWithLoss").verify(netrun.op("SoftmaxWithLoss", ["X"],
                                                              ["P", "loss"]))
