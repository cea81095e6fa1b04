"""Pointwise activations: finite-difference gradients, PyTorch references, in-place runs,
shape inference and build-time argument checks."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.core.schema import TensorSpec, get_schema
from netrun.errors import SchemaError, ShapeError
from tests.opcheck import check_gradient, netrun_forward_backward, run_op, torch_forward_backward
from tests.checks import checks_ops

SETTINGS = settings(max_examples=12, deadline=None)
shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)


def _nudge(x: np.ndarray, kinks=(0.0,), gap: float = 0.05) -> np.ndarray:
    """Move values within `gap` of a kink away from it (finite differences straddle kinks)."""
    for k in kinks:
        near = np.abs(x - k) < gap
        x = np.where(near, k + np.where(x >= k, gap, -gap), x)
    return x


# type, args, input transform (domain and kinks), numpy reference
UNARY = {
    "Relu": ({}, _nudge, lambda x: np.maximum(x, 0)),
    "LeakyRelu": ({"alpha": 0.2}, _nudge, lambda x: np.where(x > 0, x, 0.2 * x)),
    "Elu": ({"alpha": 0.7}, _nudge, lambda x: np.where(x > 0, x, 0.7 * np.expm1(x))),
    "Sigmoid": ({}, lambda x: x, lambda x: 1 / (1 + np.exp(-x))),
    "Tanh": ({}, lambda x: x, np.tanh),
    "Softplus": ({}, lambda x: x, lambda x: np.log1p(np.exp(x))),
    "Abs": ({}, _nudge, np.abs),
    "Exp": ({}, lambda x: x, np.exp),
    "Log": ({}, lambda x: np.abs(x) + 0.3, np.log),
    "Sqrt": ({}, lambda x: np.abs(x) + 0.3, np.sqrt),
    "Clip": ({"min": -0.5, "max": 0.8}, lambda x: _nudge(x, (-0.5, 0.8)),
             lambda x: np.clip(x, -0.5, 0.8)),
    "Scale": ({"scale": -1.5}, lambda x: x, lambda x: -1.5 * x),
}


@checks_ops(*UNARY, kind="finite_differences")
@pytest.mark.parametrize("type_", sorted(UNARY))
@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_unary_gradient_and_reference(type_, shape, seed):
    args, prep, ref = UNARY[type_]
    x = prep(np.random.default_rng(seed).standard_normal(shape) * 2)
    op = netrun.op(type_, ["X"], ["Y"], **args)
    (y,) = run_op(op, {"X": x})
    assert y.dtype == np.float64 and y.shape == x.shape
    np.testing.assert_allclose(y, ref(x), rtol=1e-12, atol=1e-12)
    check_gradient(op, {"X": x}, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("alpha", [-0.3, 0.0, 1.7])
def test_leaky_relu_alpha_outside_unit_interval(alpha):
    x = _nudge(np.random.default_rng(1).standard_normal((3, 4)))
    op = netrun.op("LeakyRelu", ["X"], ["Y"], alpha=alpha)
    np.testing.assert_allclose(run_op(op, {"X": x})[0], np.where(x > 0, x, alpha * x))
    check_gradient(op, {"X": x})
    # Y's sign no longer tells X's when alpha < 0: the gradient must read X then.
    grad_ops, _ = netrun.gradient_ops(op)
    assert grad_ops[0].inputs[0] == ("X" if alpha < 0 else "Y")


TORCH = {
    "LeakyRelu": lambda F, x: F.leaky_relu(x, 0.2),
    "Elu": lambda F, x: F.elu(x, 0.7),
    "Sigmoid": lambda F, x: x.sigmoid(),
    "Tanh": lambda F, x: x.tanh(),
    "Softplus": lambda F, x: F.softplus(x),
    "Abs": lambda F, x: x.abs(),
    "Exp": lambda F, x: x.exp(),
    "Log": lambda F, x: x.log(),
    "Sqrt": lambda F, x: x.sqrt(),
    "Clip": lambda F, x: x.clamp(-0.5, 0.8),
    "Scale": lambda F, x: -1.5 * x,
}


@checks_ops(*TORCH, kind="torch_gradient")
@pytest.mark.parametrize("type_", sorted(TORCH))
def test_unary_matches_torch_float32(type_, device):
    torch = pytest.importorskip("torch")
    args, prep, _ = UNARY[type_]
    x = prep(np.random.default_rng(2).standard_normal((4, 3, 5)) * 2).astype(np.float32)
    (ty,), (tdx,), dy = torch_forward_backward(lambda t: TORCH[type_](torch.nn.functional, t), [x])
    (y,), grads = netrun_forward_backward(netrun.op(type_, ["X"], ["Y"], **args), {"X": x}, dy,
                                          device)
    assert y.dtype == np.float32 and grads["X"].dtype == np.float32
    np.testing.assert_allclose(y, ty, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(grads["X"], tdx, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("type_", ["Relu", "LeakyRelu", "Elu", "Sigmoid", "Tanh", "Softplus",
                                   "Exp", "Sqrt", "Clip", "Scale"])
def test_in_place_forward_and_gradient_match_out_of_place(type_):
    args, prep, _ = UNARY[type_]
    x = prep(np.random.default_rng(3).standard_normal((3, 5)))
    dy = np.random.default_rng(4).standard_normal((3, 5))
    (y,), grads = netrun_forward_backward(netrun.op(type_, ["X"], ["Y"], **args), {"X": x}, dy)
    # In place: Y overwrites X, and the gradient op overwrites dY (X_grad) with dX.
    op = netrun.op(type_, ["X"], ["X"], **args)
    assert get_schema(type_).inplace == ((0, 0),)
    (y_in,), grads_in = netrun_forward_backward(op, {"X": x}, dy)
    np.testing.assert_allclose(y_in, y, rtol=1e-12)
    np.testing.assert_allclose(grads_in["X"], grads["X"], rtol=1e-12)


@pytest.mark.parametrize("type_", ["Abs", "Log", "PRelu"])
def test_ops_whose_gradient_reads_x_do_not_run_in_place(type_):
    inputs = ["X", "s"] if type_ == "PRelu" else ["X"]
    with pytest.raises(SchemaError, match="in place"):
        run_op(netrun.op(type_, inputs, ["X"]), {"X": np.ones(3), "s": np.ones(1)})


def test_sigmoid_softplus_are_stable_at_extremes():
    x = np.array([-800.0, -40.0, 0.0, 40.0, 800.0], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        (y,) = run_op(netrun.op("Sigmoid", ["X"], ["Y"]), {"X": x})
        (sp,) = run_op(netrun.op("Softplus", ["X"], ["Y"]), {"X": x})
    np.testing.assert_allclose(y, [0, 4.248354e-18, 0.5, 1, 1], rtol=1e-6)
    np.testing.assert_allclose(sp, [0, 4.248354e-18, np.log(2), 40, 800], rtol=1e-6)
    (dx,) = run_op(netrun.op("SoftplusGradient", ["Y", "dY"], ["dX"]),
                   {"Y": sp, "dY": np.ones_like(x)})
    np.testing.assert_allclose(dx, y, rtol=1e-6)   # d softplus = sigmoid


@checks_ops("PRelu", kind="finite_differences")
@pytest.mark.parametrize("order,slope_shape", [("NCHW", (3,)), ("NCHW", (1,)),
                                               ("NHWC", (5,)), ("NHWC", (1,))])
@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_prelu_gradient(order, slope_shape, n, seed):
    rng = np.random.default_rng(seed)
    x = _nudge(rng.standard_normal((n, 3, 2, 5)))
    slope = rng.standard_normal(slope_shape)
    op = netrun.op("PRelu", ["X", "s"], ["Y"], order=order)
    view = slope.reshape((1, -1, 1, 1) if order == "NCHW" else (1, 1, 1, -1))
    np.testing.assert_allclose(run_op(op, {"X": x, "s": slope})[0], np.where(x > 0, x, view * x))
    check_gradient(op, {"X": x, "s": slope})


@checks_ops("PRelu", kind="torch_gradient")
@pytest.mark.parametrize("channels", [4, 1])
def test_prelu_matches_torch_float32(channels):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    w = rng.uniform(0.05, 0.5, channels).astype(np.float32)
    (ty,), (tdx, tdw), dy = torch_forward_backward(torch.nn.functional.prelu, [x, w])
    (y,), grads = netrun_forward_backward(netrun.op("PRelu", ["X", "w"], ["Y"]),
                                          {"X": x, "w": w}, dy)
    np.testing.assert_allclose(y, ty, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grads["X"], tdx, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grads["w"], tdw, rtol=1e-5, atol=1e-5)


def test_prelu_channel_mismatch_names_both_shapes():
    op = netrun.op("PRelu", ["X", "s"], ["Y"])
    with pytest.raises(ShapeError, match=r"X has 3 channels but slope has 2.*X 2×3×4, slope 2"):
        run_op(op, {"X": np.ones((2, 3, 4)), "s": np.ones(2)})


def _inferred(op, inputs):
    schema = get_schema(op.type)
    specs = [TensorSpec(x.shape, x.dtype.name) for x in inputs]
    return [s.shape for s in schema.infer_shapes(op, schema.verify(op), specs)]


@pytest.mark.parametrize("type_", sorted(UNARY))
def test_shape_inference_matches_forward_and_gradient(type_):
    args, prep, _ = UNARY[type_]
    x = prep(np.random.default_rng(6).standard_normal((2, 3, 4)))
    op = netrun.op(type_, ["X"], ["Y"], **args)
    assert _inferred(op, [x]) == [run_op(op, {"X": x})[0].shape]
    grad_ops, _ = netrun.gradient_ops(op)
    g = grad_ops[-1]
    assert _inferred(g, [x, x]) == [(2, 3, 4)]
    cost = get_schema(type_).cost(get_schema(type_).verify(op), [TensorSpec((2, 3, 4))],
                                  [TensorSpec((2, 3, 4))])
    assert cost.flops >= 24 and cost.bytes_read == cost.bytes_written == 96


@pytest.mark.parametrize("type_,args,match", [
    ("Elu", {"alpha": -1.0}, "'alpha'"),
    ("Clip", {"min": 2.0, "max": 1.0}, "'min'"),
    ("PRelu", {"order": "NCWH"}, "'order'"),
    ("LeakyRelu", {"alpah": 0.1}, "did you mean 'alpha'"),
    ("Scale", {"scale": "big"}, "'scale' must be a number"),
])
def test_bad_arguments_fail_at_build_time(type_, args, match):
    inputs = ["X", "s"] if type_ == "PRelu" else ["X"]
    op = netrun.op(type_, inputs, ["Y"], name="act1", **args)
    with pytest.raises(SchemaError, match=match) as info:
        netrun.Workspace("cpu").create_net(netrun.NetDef("n", [op]))
    assert "act1" in str(info.value)
