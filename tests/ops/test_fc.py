"""FC, MatMul, BatchMatMul: gradients, PyTorch, skipped dX, shape/cost inference, errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.core.schema import TensorSpec, get_schema
from netrun.errors import SchemaError, ShapeError
from tests.opcheck import check_gradient, netrun_forward_backward, run_op, torch_forward_backward
from tests.checks import checks_ops

SETTINGS = settings(max_examples=15, deadline=None)


@st.composite
def fc_case(draw):
    """X of 2-4 dims, an axis (maybe negative), W as N×K or N×(K split in two)."""
    x = tuple(draw(st.lists(st.integers(1, 3), min_size=2, max_size=4)))
    axis = draw(st.integers(1, len(x) - 1))
    k, n = math.prod(x[axis:]), draw(st.integers(1, 4))
    split_w = len(x) - axis >= 2 and draw(st.booleans())
    w = (n,) + x[axis:] if split_w else (n, k)
    neg = draw(st.booleans())
    return x, w, axis - len(x) if neg else axis, -(len(w) - 1) if split_w and neg else 1


def _reference_fc(x, w, b, axis):
    m = math.prod(x.shape[:axis])
    return (x.reshape(m, -1) @ w.reshape(w.shape[0], -1).T + b).reshape(x.shape[:axis] + (-1,))


@checks_ops("FC", kind="finite_differences")
@SETTINGS
@given(case=fc_case(), seed=st.integers(0, 2**16))
def test_fc_gradient(case, seed):
    x_shape, w_shape, axis, axis_w = case
    rng = np.random.default_rng(seed)
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal(w_shape), rng.standard_normal(
        w_shape[0])
    op = netrun.op("FC", ["X", "W", "b"], ["Y"], axis=axis, axis_w=axis_w)
    (y,) = run_op(op, {"X": x, "W": w, "b": b})
    np.testing.assert_allclose(y, _reference_fc(x, w, b, axis % len(x_shape)), rtol=1e-12)
    check_gradient(op, {"X": x, "W": w, "b": b})


@checks_ops("FC", kind="torch_gradient")
@pytest.mark.parametrize("batch", [1, 16])
def test_fc_matches_torch_linear_float32(batch, device):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, 3, 4, 4)).astype(np.float32)
    w = rng.standard_normal((10, 48)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    (ty,), (tdx, tdw, tdb), dy = torch_forward_backward(
        lambda x, w, b: torch.nn.functional.linear(x.flatten(1), w, b), [x, w, b])
    (y,), grads = netrun_forward_backward(netrun.op("FC", ["X", "W", "b"], ["Y"]),
                                          {"X": x, "W": w, "b": b}, dy, device)
    assert y.dtype == np.float32 and y.shape == (batch, 10)
    scale = np.abs(ty).max()
    np.testing.assert_allclose(y, ty, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(grads["X"], tdx, rtol=1e-5, atol=1e-5 * np.abs(tdx).max())
    np.testing.assert_allclose(grads["W"], tdw, rtol=1e-5, atol=1e-5 * np.abs(tdw).max())
    np.testing.assert_allclose(grads["b"], tdb, rtol=1e-5, atol=1e-5 * np.abs(tdb).max())


def test_fc_gradient_skips_dx_when_nobody_needs_it():
    net = netrun.NetDef("n", [netrun.op("FC", ["data", "W", "b"], ["Y"])])
    grads = netrun.add_gradient_ops(net, ["Y"], params=["W", "b"])
    (fc_grad,) = [o for o in net.ops if o.type == "FCGradient"]
    assert fc_grad.outputs == ("W_grad", "b_grad") and "data" not in grads
    rng = np.random.default_rng(2)
    x, w, dy = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((3, 5))
    g = fc_grad.with_(inputs=("X", "W", "dY"))
    dw, db = run_op(g, {"X": x, "W": w, "dY": dy})
    assert _inferred(g, [x, w, dy]) == [(5, 4), (5,)]
    np.testing.assert_allclose(dw, dy.T @ x, rtol=1e-12)
    np.testing.assert_allclose(db, dy.sum(0), rtol=1e-12)
    full, _ = netrun.gradient_ops(netrun.op("FC", ["X", "W", "b"], ["Y"]))
    assert full[0].outputs == ("W_grad", "b_grad", "X_grad")


@checks_ops("MatMul", kind="finite_differences")
@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
@settings(max_examples=8, deadline=None)
@given(m=st.integers(1, 3), k=st.integers(1, 3), n=st.integers(1, 3), seed=st.integers(0, 99))
def test_matmul_gradient(ta, tb, m, k, n, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if ta else (m, k))
    b = rng.standard_normal((n, k) if tb else (k, n))
    op = netrun.op("MatMul", ["A", "B"], ["Y"], trans_a=ta, trans_b=tb)
    (y,) = run_op(op, {"A": a, "B": b})
    np.testing.assert_allclose(y, (a.T if ta else a) @ (b.T if tb else b), rtol=1e-12)
    check_gradient(op, {"A": a, "B": b})


@checks_ops("MatMul", kind="torch_gradient")
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_matmul_matches_torch_float32(ta, tb):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((7, 5) if ta else (5, 7)).astype(np.float32)
    b = rng.standard_normal((6, 7) if tb else (7, 6)).astype(np.float32)
    fn = lambda a, b: torch.matmul(a.T if ta else a, b.T if tb else b)  # noqa: E731
    (ty,), (tda, tdb), dy = torch_forward_backward(fn, [a, b])
    (y,), grads = netrun_forward_backward(
        netrun.op("MatMul", ["A", "B"], ["Y"], trans_a=ta, trans_b=tb), {"A": a, "B": b}, dy)
    for got, want in ((y, ty), (grads["A"], tda), (grads["B"], tdb)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_matmul_gradient_only_for_needed_inputs():
    net = netrun.NetDef("n", [netrun.op("MatMul", ["data", "W"], ["Y"])])
    netrun.add_gradient_ops(net, ["Y"], params=["W"])
    assert [o.outputs for o in net.ops if o.type == "MatMul"][1:] == [("W_grad",)]


@st.composite
def bmm_case(draw):
    lead = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    la = [d if draw(st.booleans()) else 1 for d in lead][draw(st.integers(0, len(lead))):]
    lb = [d if draw(st.booleans()) else 1 for d in lead][draw(st.integers(0, len(lead))):]
    m, k, n = (draw(st.integers(1, 3)) for _ in range(3))
    ta, tb = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    return tuple(la) + ((k, m) if ta else (m, k)), tuple(lb) + ((n, k) if tb else (k, n)), ta, tb


@checks_ops("BatchMatMul", kind="finite_differences")
@SETTINGS
@given(case=bmm_case(), seed=st.integers(0, 2**16))
def test_batch_matmul_broadcast_gradient(case, seed):
    a_shape, b_shape, ta, tb = case
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    op = netrun.op("BatchMatMul", ["A", "B"], ["Y"], trans_a=ta, trans_b=tb)
    (y,) = run_op(op, {"A": a, "B": b})
    want = np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b)
    np.testing.assert_allclose(y, want, rtol=1e-12)
    check_gradient(op, {"A": a, "B": b})


@checks_ops("BatchMatMul", kind="torch_gradient")
@pytest.mark.parametrize("a_shape,b_shape", [((4, 3, 5), (4, 5, 2)), ((2, 1, 3, 5), (4, 5, 2))])
def test_batch_matmul_matches_torch_float32(a_shape, b_shape):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in (a_shape, b_shape))
    fn = torch.bmm if len(a_shape) == 3 else torch.matmul
    (ty,), (tda, tdb), dy = torch_forward_backward(fn, [a, b])
    (y,), grads = netrun_forward_backward(netrun.op("BatchMatMul", ["A", "B"], ["Y"]),
                                          {"A": a, "B": b}, dy)
    for got, want in ((y, ty), (grads["A"], tda), (grads["B"], tdb)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _inferred(op, inputs):
    schema = get_schema(op.type)
    specs = [TensorSpec(x.shape, x.dtype.name) for x in inputs]
    return [s.shape for s in schema.infer_shapes(op, schema.verify(op), specs)]


@pytest.mark.parametrize("type_,args,shapes", [
    ("FC", {"axis": 2}, [(2, 3, 4), (5, 4), (5,)]),
    ("MatMul", {"trans_b": 1}, [(2, 3), (4, 3)]),
    ("BatchMatMul", {"trans_a": 1}, [(3, 1, 4, 2), (5, 4, 6)]),
])
def test_shape_inference_matches_real_shapes(type_, args, shapes):
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s) for s in shapes]
    names = ["X", "W", "b"][:len(shapes)]
    op = netrun.op(type_, names, ["Y"], **args)
    outs = run_op(op, dict(zip(names, arrays)))
    assert _inferred(op, arrays) == [o.shape for o in outs]


def test_fc_cost_counts_multiply_adds():
    schema = get_schema("FC")
    op = netrun.op("FC", ["X", "W", "b"], ["Y"])
    ins = [TensorSpec((8, 3, 4)), TensorSpec((10, 12)), TensorSpec((10,))]
    cost = schema.cost(schema.verify(op), ins, schema.infer_shapes(op, schema.verify(op), ins))
    assert cost.flops == 2 * 8 * 10 * 12 + 8 * 10
    assert cost.bytes_read == 4 * (96 + 120 + 10) and cost.bytes_written == 4 * 80


@pytest.mark.parametrize("type_,shapes,match", [
    ("FC", [(8, 3, 5, 5), (4, 50), (4,)], r"K=75 but W expects K=50: X 8×3×5×5, W 4×50"),
    ("FC", [(8, 6), (4, 6), (3,)], r"b must have one value per output \(N=4\): W 4×6, b 3"),
    ("MatMul", [(2, 3), (4, 5)], r"A has K=3 but B has K=4.*A 2×3, B 4×5"),
    ("MatMul", [(2, 2, 3), (3, 5)], r"exactly 2 dims: A 2×2×3, B 3×5"),
    ("BatchMatMul", [(2, 3, 4), (3, 4, 5)],
     r"batch dims of A and B cannot be broadcast.*A 2×3×4, B 3×4×5"),
])
def test_shape_errors_name_both_shapes(type_, shapes, match):
    names = ["X", "W", "b"][:len(shapes)]
    op = netrun.op(type_, names, ["Y"])
    schema = get_schema(type_)
    with pytest.raises(ShapeError, match=match):
        schema.infer_shapes(op, schema.verify(op), [TensorSpec(s) for s in shapes])
    with pytest.raises(ShapeError, match=match):
        run_op(op, {n: np.ones(s) for n, s in zip(names, shapes)})


def test_fc_axis_out_of_range():
    op = netrun.op("FC", ["X", "W", "b"], ["Y"], axis=3)
    with pytest.raises(ShapeError, match="'axis' is 3, out of range for X 2×3"):
        run_op(op, {"X": np.ones((2, 3)), "W": np.ones((4, 3)), "b": np.ones(4)})


@pytest.mark.parametrize("type_,inputs,args,match", [
    ("MatMul", ["A", "B"], {"trans_a": 2}, "'trans_a' is 2"),
    ("FC", ["X", "W", "b"], {"axis": 1.5}, "'axis' must be an integer"),
    ("FC", ["X", "W"], {}, "takes 3 input"),
    ("BatchMatMul", ["A", "B"], {"transpose": 1}, "unknown argument 'transpose'"),
])
def test_bad_arguments_fail_at_build_time(type_, inputs, args, match):
    op = netrun.op(type_, inputs, ["Y"], name="dense1", **args)
    with pytest.raises(SchemaError, match=match) as info:
        netrun.Workspace("cpu").create_net(netrun.NetDef("n", [op]))
    assert "dense1" in str(info.value)
