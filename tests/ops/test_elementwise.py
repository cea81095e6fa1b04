"""Add/Sub/Mul/Div (NumPy and Caffe2 legacy broadcasting) and Sum: gradients, PyTorch,
in-place runs, shape inference and errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.core.schema import TensorSpec, get_schema
from netrun.errors import SchemaError, ShapeError
from tests.opcheck import check_gradient, netrun_forward_backward, run_op, torch_forward_backward
from tests.checks import checks_ops

BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
SETTINGS = settings(max_examples=15, deadline=None)


@st.composite
def broadcast_pair(draw):
    """(A shape, B shape) that broadcast: B may drop leading dims, either may have 1s."""
    out = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    a = [d if draw(st.booleans()) else 1 for d in out]
    b = [d if draw(st.booleans()) else 1 for d in out]
    b = b[draw(st.integers(0, len(b))):]
    if draw(st.booleans()):
        a, b = b, a
    return tuple(a), tuple(b)


@st.composite
def legacy_pair(draw):
    """(A shape, B shape, axis) for Caffe2's broadcast=1: B matches A's dims from axis on."""
    a = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)))
    axis = draw(st.integers(0, len(a) - 1))
    end = draw(st.integers(axis, len(a)))
    b = [d if draw(st.booleans()) else 1 for d in a[axis:end]]
    suffix = end == len(a) and draw(st.booleans())
    return a, tuple(b), -1 if suffix else axis


def _inputs(type_, a_shape, b_shape, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    if type_ == "Div":  # keep B away from 0
        b = np.sign(b + 1e-9) * (np.abs(b) + 0.5)
    return a, b


@checks_ops(*BINARY, kind="finite_differences")
@pytest.mark.parametrize("type_", sorted(BINARY))
@SETTINGS
@given(shapes=broadcast_pair(), seed=st.integers(0, 2**16))
def test_numpy_broadcasting_gradient(type_, shapes, seed):
    a, b = _inputs(type_, *shapes, seed)
    op = netrun.op(type_, ["A", "B"], ["Y"])
    (y,) = run_op(op, {"A": a, "B": b})
    np.testing.assert_allclose(y, BINARY[type_](a, b), rtol=1e-12)
    check_gradient(op, {"A": a, "B": b})


@checks_ops(*BINARY, kind="finite_differences")
@pytest.mark.parametrize("type_", sorted(BINARY))
@SETTINGS
@given(case=legacy_pair(), seed=st.integers(0, 2**16))
def test_legacy_broadcast_axis_gradient(type_, case, seed):
    a_shape, b_shape, axis = case
    a, b = _inputs(type_, a_shape, b_shape, seed)
    op = netrun.op(type_, ["A", "B"], ["Y"], broadcast=1, axis=axis)
    start = len(a_shape) - len(b_shape) if axis == -1 else axis
    aligned = b.reshape((1,) * start + b_shape + (1,) * (len(a_shape) - start - len(b_shape)))
    (y,) = run_op(op, {"A": a, "B": b})
    assert y.shape == a.shape
    np.testing.assert_allclose(y, BINARY[type_](a, aligned), rtol=1e-12)
    check_gradient(op, {"A": a, "B": b})


@pytest.mark.parametrize("type_", sorted(BINARY))
def test_legacy_broadcast_caffe2_bias_example(type_):
    # Caffe2's classic use: add a per-channel bias of shape (C,) to NCHW at axis 1.
    a, b = _inputs(type_, (2, 3, 4, 5), (3,), 7)
    op = netrun.op(type_, ["A", "B"], ["Y"], broadcast=1, axis=1)
    np.testing.assert_allclose(run_op(op, {"A": a, "B": b})[0],
                               BINARY[type_](a, b[None, :, None, None]), rtol=1e-12)


TORCH = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
         "Div": lambda a, b: a / b}


@checks_ops(*BINARY, kind="torch_gradient")
@pytest.mark.parametrize("type_", sorted(BINARY))
@pytest.mark.parametrize("a_shape,b_shape", [((4, 3, 5), (4, 3, 5)), ((4, 3, 5), (3, 1)),
                                             ((1, 5), (4, 3, 1)), ((6,), ())])
def test_matches_torch_float32(type_, a_shape, b_shape, device):
    torch = pytest.importorskip("torch")
    a, b = (x.astype(np.float32) for x in _inputs(type_, a_shape, b_shape, 8))
    (ty,), (tda, tdb), dy = torch_forward_backward(TORCH[type_], [a, b])
    (y,), grads = netrun_forward_backward(netrun.op(type_, ["A", "B"], ["Y"]),
                                          {"A": a, "B": b}, dy, device)
    assert y.dtype == grads["A"].dtype == grads["B"].dtype == np.float32
    np.testing.assert_allclose(y, ty, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grads["A"], tda, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["B"], tdb, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("type_,index", [("Add", 0), ("Add", 1), ("Sub", 0), ("Sub", 1),
                                         ("Div", 0)])
def test_in_place_forward_keeps_gradient_correct(type_, index):
    a, b = _inputs(type_, (3, 4), (3, 4), 9)
    dy = np.random.default_rng(10).standard_normal((3, 4))
    _, ref = netrun_forward_backward(netrun.op(type_, ["A", "B"], ["Y"]), {"A": a, "B": b}, dy)
    out = ["A", "B"][index]
    op = netrun.op(type_, ["A", "B"], [out])
    # The gradient must not read the overwritten input: dY stands in for its shape.
    grad_ops, _ = netrun.gradient_ops(op)
    assert all(n != out or n == f"{out}_grad" for o in grad_ops for n in o.inputs[1:3])
    (y,), grads = netrun_forward_backward(op, {"A": a, "B": b}, dy)
    np.testing.assert_allclose(y, BINARY[type_](a, b), rtol=1e-12)
    for name in ("A", "B"):
        np.testing.assert_allclose(grads[name], ref[name], rtol=1e-12)


def test_mul_in_place_is_rejected():
    with pytest.raises(SchemaError, match="in place"):
        run_op(netrun.op("Mul", ["A", "B"], ["A"]), {"A": np.ones(2), "B": np.ones(2)})


@pytest.mark.parametrize("type_,factor", [("Add", 2.0), ("Sub", 0.0), ("Mul", None)])
def test_same_blob_for_both_inputs(type_, factor):
    x = np.random.default_rng(11).standard_normal((2, 3))
    dy = np.ones((2, 3))
    _, grads = netrun_forward_backward(netrun.op(type_, ["X", "X"], ["Y"]), {"X": x}, dy)
    expected = 2 * x if factor is None else factor * dy
    np.testing.assert_allclose(grads["X"], expected, rtol=1e-12)


def test_repeated_input_with_other_contributions_in_the_backward_builder():
    # L = X*X + X + X: the builder accumulates X's gradient from Mul(X, X) and Sum(.., X, X).
    net = netrun.NetDef("n", [netrun.op("Mul", ["X", "X"], ["Y"]),
                              netrun.op("Sum", ["Y", "X", "X"], ["L"])])
    grads = netrun.add_gradient_ops(net, ["L"])
    x = np.random.default_rng(12).standard_normal((2, 3))
    ws = netrun.Workspace("cpu")
    ws.feed_blob("X", x)
    ws.feed_blob("L_grad", np.ones((2, 3)))   # the seed, instead of the ConstantFill
    for o in net.ops:
        if o.type != "ConstantFill":
            ws.run_operator_once(o)
    np.testing.assert_allclose(ws.fetch_blob(grads["X"]), 2 * x + 2, rtol=1e-12)


def test_integer_inputs_keep_integer_dtype():
    a, b = np.array([7, -7, 9], dtype=np.int32), np.array([2, 2, 3], dtype=np.int32)
    assert run_op(netrun.op("Add", ["A", "B"], ["Y"]), {"A": a, "B": b})[0].dtype == np.int32
    (q,) = run_op(netrun.op("Div", ["A", "B"], ["Y"]), {"A": a, "B": b})
    assert q.dtype == np.int32 and q.tolist() == [3, -4, 3]   # floor division


@checks_ops("Sum", kind="finite_differences")
@SETTINGS
@given(n=st.integers(1, 4), shape=st.lists(st.integers(1, 3), max_size=3).map(tuple),
       seed=st.integers(0, 2**16))
def test_sum_forward_and_gradient(n, shape, seed):
    rng = np.random.default_rng(seed)
    xs = {f"X{i}": rng.standard_normal(shape) for i in range(n)}
    op = netrun.op("Sum", list(xs), ["Y"])
    np.testing.assert_allclose(run_op(op, xs)[0], sum(xs.values()), rtol=1e-12)
    check_gradient(op, xs)


def test_sum_in_place_accumulates_and_repeated_input_scales():
    a, b = np.arange(6.0).reshape(2, 3), np.ones((2, 3))
    (y,) = run_op(netrun.op("Sum", ["A", "B", "B"], ["A"]), {"A": a, "B": b})
    np.testing.assert_allclose(y, a + 2)
    check_gradient(netrun.op("Sum", ["A", "B", "B"], ["Y"]), {"A": a, "B": b})
    grad_ops, grad_of = netrun.gradient_ops(netrun.op("Sum", ["G", "T"], ["G"]))
    assert [o.type for o in grad_ops] == ["Copy"] and grad_of["G"] == "G_grad"


def _inferred(op, inputs):
    schema = get_schema(op.type)
    specs = [TensorSpec(x.shape, x.dtype.name) for x in inputs]
    return [(s.shape, s.dtype) for s in schema.infer_shapes(op, schema.verify(op), specs)]


@pytest.mark.parametrize("type_", sorted(BINARY))
@settings(max_examples=10, deadline=None)
@given(shapes=broadcast_pair())
def test_shape_inference_matches_real_shapes(type_, shapes):
    a, b = (x.astype(np.float32) for x in _inputs(type_, *shapes, 0))
    op = netrun.op(type_, ["A", "B"], ["Y"])
    (y,) = run_op(op, {"A": a, "B": b})
    assert _inferred(op, [a, b]) == [(y.shape, "float32")]
    (g,) = netrun.gradient_ops(op)[0]
    specs = [y, a, b] + ([y] if type_ == "Div" else [])
    assert _inferred(g, specs) == [(a.shape, "float32"), (b.shape, "float32")]


@pytest.mark.parametrize("args,match", [
    ({}, r"A and B cannot be broadcast together.*A 2×3, B 4"),
    ({"broadcast": 1, "axis": 1}, r"axis 1.*A 2×3, B 4"),
])
def test_incompatible_shapes_name_both_shapes(args, match):
    op = netrun.op("Add", ["A", "B"], ["Y"], **args)
    schema = get_schema("Add")
    with pytest.raises(ShapeError, match=match):
        schema.infer_shapes(op, schema.verify(op), [TensorSpec((2, 3)), TensorSpec((4,))])
    with pytest.raises(ShapeError, match=match):
        run_op(op, {"A": np.ones((2, 3)), "B": np.ones(4)})


def test_sum_shape_mismatch_names_both():
    with pytest.raises(ShapeError, match="input 0.*2×3.*input 1.*3×2"):
        run_op(netrun.op("Sum", ["A", "B"], ["Y"]), {"A": np.ones((2, 3)), "B": np.ones((3, 2))})


@pytest.mark.parametrize("args,match", [
    ({"axis": 1}, "'axis' applies only with broadcast=1"),
    ({"broadcast": 1, "axis": -2}, "'axis' is -2"),
    ({"broadcast": 2}, "'broadcast' is 2"),
])
def test_bad_arguments_fail_at_build_time(args, match):
    op = netrun.op("Mul", ["A", "B"], ["Y"], name="mul1", **args)
    with pytest.raises(SchemaError, match=match) as info:
        netrun.Workspace("cpu").create_net(netrun.NetDef("n", [op]))
    assert "mul1" in str(info.value)


def test_cost_counts_output_elements():
    schema = get_schema("Add")
    op = netrun.op("Add", ["A", "B"], ["Y"])
    ins, outs = [TensorSpec((8, 4)), TensorSpec((4,))], [TensorSpec((8, 4))]
    cost = schema.cost(schema.verify(op), ins, outs)
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (32, 144, 128)
