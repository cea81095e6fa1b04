"""Concat, Split, Slice, Flatten, Reshape, Transpose, Copy, StopGradient, ReduceSum/Mean:
forward against NumPy/PyTorch, finite-difference gradients, shape inference, errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.core.schema import TensorSpec, get_schema
from netrun.errors import GradientError, SchemaError, ShapeError
from tests.opcheck import check_gradient, netrun_forward_backward, run_op, torch_forward_backward
from tests.checks import checks_ops

SETTINGS = settings(max_examples=15, deadline=None)
shapes = st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple)


def _inferred(op, inputs):
    schema = get_schema(op.type)
    specs = [TensorSpec(x.shape, x.dtype.name) for x in inputs]
    return [s.shape for s in schema.infer_shapes(op, schema.verify(op), specs)]


def _randn(seed, *shape_list):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shape_list]


# Concat / Split -------------------------------------------------------------------------
@checks_ops("Concat", kind="finite_differences")
@SETTINGS
@given(shape=shapes, data=st.data(), n=st.integers(1, 3), add_axis=st.booleans(),
       seed=st.integers(0, 2**16))
def test_concat_forward_gradient_and_inference(shape, data, n, add_axis, seed):
    ndim = len(shape) + add_axis
    axis = data.draw(st.integers(-ndim, ndim - 1))
    sizes = [data.draw(st.integers(1, 3)) for _ in range(n)]
    k = axis % len(shape) if not add_axis else None
    xs = _randn(seed, *[shape if add_axis else shape[:k] + (s,) + shape[k + 1:] for s in sizes])
    names = [f"X{i}" for i in range(n)]
    op = netrun.op("Concat", names, ["Y", "info"], axis=axis, add_axis=int(add_axis))
    y, info = run_op(op, dict(zip(names, xs)))
    want = np.stack(xs, axis) if add_axis else np.concatenate(xs, axis)
    np.testing.assert_array_equal(y, want)
    assert info.dtype == np.int32 and info.tolist() == ([1] * n if add_axis else sizes)
    assert _inferred(op, xs) == [y.shape, (n,)]
    check_gradient(op, dict(zip(names, xs)))


@checks_ops("Split", kind="finite_differences")
@SETTINGS
@given(shape=shapes, data=st.data(), seed=st.integers(0, 2**16))
def test_split_sizes_equal_parts_and_gradient(shape, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dim = shape[axis]
    cuts = sorted(data.draw(st.lists(st.integers(0, dim), max_size=2)))
    sizes = np.diff([0] + cuts + [dim]).tolist()
    (x,) = _randn(seed, shape)
    outs = [f"Y{i}" for i in range(len(sizes))]
    for op in (netrun.op("Split", ["X"], outs, axis=axis, split=sizes),
               netrun.op("Split", ["X", "S"], outs, axis=axis)):
        inputs = {"X": x, "S": np.array(sizes, dtype=np.int32)}
        ys = run_op(op, {k: inputs[k] for k in op.inputs})
        for y, want in zip(ys, np.split(x, np.cumsum(sizes)[:-1], axis)):
            np.testing.assert_array_equal(y, want)
        check_gradient(op, inputs, check=["X"])
    # Equal parts: as many as the dim has elements.
    op = netrun.op("Split", ["X"], [f"Y{i}" for i in range(dim)], axis=axis)
    assert _inferred(op, [x]) == [y.shape for y in run_op(op, {"X": x})]


def test_split_add_axis_is_inverse_of_stacking():
    (x,) = _randn(0, (2, 3, 4))
    op = netrun.op("Split", ["X"], ["A", "B", "C"], axis=1, add_axis=1)
    ys = run_op(op, {"X": x})
    assert [y.shape for y in ys] == [(2, 4)] * 3 == _inferred(op, [x])
    np.testing.assert_array_equal(np.stack(ys, 1), x)
    check_gradient(op, {"X": x})


@checks_ops("Concat", kind="torch_gradient")
@checks_ops("Split", kind="torch")
def test_concat_and_split_match_torch_float32():
    torch = pytest.importorskip("torch")
    a, b = (x.astype(np.float32) for x in _randn(1, (2, 3, 4), (2, 5, 4)))
    (ty,), (tda, tdb), dy = torch_forward_backward(lambda a, b: torch.cat([a, b], 1), [a, b])
    (y, _), grads = netrun_forward_backward(netrun.op("Concat", ["A", "B"], ["Y", "info"]),
                                            {"A": a, "B": b}, dy)
    np.testing.assert_array_equal(y, ty)
    np.testing.assert_array_equal(grads["A"], tda)
    np.testing.assert_array_equal(grads["B"], tdb)
    t = torch.tensor(y)
    ys = run_op(netrun.op("Split", ["Y"], ["P", "Q"], axis=1, split=[3, 5]), {"Y": y})
    for got, want in zip(ys, torch.split(t, [3, 5], dim=1)):
        np.testing.assert_array_equal(got, want.numpy())


def test_concat_axis_out_of_range_names_both_shapes():
    op = netrun.op("Concat", ["A", "B"], ["Y", "info"], axis=3)
    schema = get_schema("Concat")
    with pytest.raises(ShapeError, match=r"axis 3 is out of range.*input 0 2×3, input 1 2×4"):
        schema.infer_shapes(op, schema.verify(op), [TensorSpec((2, 3)), TensorSpec((2, 4))])


def test_concat_mismatch_names_both_shapes():
    op = netrun.op("Concat", ["A", "B"], ["Y"], axis=1)
    with pytest.raises(ShapeError, match=r"input 0 has shape 2×3 but input 1 has shape 4×3.*"
                                         r"only along axis 1"):
        run_op(op, {"A": np.ones((2, 3)), "B": np.ones((4, 3))})


def test_concat_gradient_needs_split_info():
    with pytest.raises(GradientError, match="split_info"):
        netrun.gradient_ops(netrun.op("Concat", ["A", "B"], ["Y"]))


def test_concat_of_the_same_blob_twice():
    (x,) = _randn(2, (2, 3))
    check_gradient(netrun.op("Concat", ["X", "X"], ["Y", "info"]), {"X": x})


@pytest.mark.parametrize("inputs,args,match", [
    (["X"], {"split": [1, 2, 3]}, "'split' has 3 sizes but the op has 2 outputs"),
    (["X", "S"], {"split": [1, 2]}, "either as argument 'split' or as input 1"),
    (["X"], {"split": [-1, 2]}, "negative size"),
])
def test_split_bad_arguments_fail_at_build_time(inputs, args, match):
    op = netrun.op("Split", inputs, ["A", "B"], name="split1", **args)
    with pytest.raises(SchemaError, match=match) as info:
        netrun.Workspace("cpu").create_net(netrun.NetDef("n", [op]))
    assert "split1" in str(info.value)


def test_split_uneven_sizes_fail_in_inference():
    op = netrun.op("Split", ["X"], ["A", "B"], axis=1)
    with pytest.raises(ShapeError, match=r"5 elements along axis 1.*2 equal parts: X 2×5"):
        run_op(op, {"X": np.ones((2, 5))})


# Slice ----------------------------------------------------------------------------------
@checks_ops("Slice", kind="finite_differences")
@SETTINGS
@given(shape=shapes, data=st.data(), seed=st.integers(0, 2**16))
def test_slice_caffe2_negative_ends_and_gradient(shape, data, seed):
    n = data.draw(st.integers(1, len(shape)))
    starts, ends, index = [], [], []
    for d in shape[:n]:
        lo = data.draw(st.integers(0, d - 1))
        hi = data.draw(st.integers(lo + 1, d))
        # Caffe2: a negative end v means dim + 1 + v, so -1 is the end.
        ends.append(hi - d - 1 if data.draw(st.booleans()) else hi)
        starts.append(lo)
        index.append(slice(lo, hi))
    (x,) = _randn(seed, shape)
    op = netrun.op("Slice", ["X"], ["Y"], starts=starts, ends=ends)
    (y,) = run_op(op, {"X": x})
    np.testing.assert_array_equal(y, x[tuple(index)])
    assert _inferred(op, [x]) == [y.shape]
    check_gradient(op, {"X": x})


def test_slice_errors():
    with pytest.raises(SchemaError, match="'starts' .1 values. and 'ends' .2 values."):
        run_op(netrun.op("Slice", ["X"], ["Y"], starts=[0], ends=[1, 2]), {"X": np.ones(3)})
    with pytest.raises(ShapeError, match=r"dim 0 of X 4×2: start 3 and end 1"):
        run_op(netrun.op("Slice", ["X"], ["Y"], starts=[3], ends=[1]), {"X": np.ones((4, 2))})


# Flatten / Reshape ----------------------------------------------------------------------
@checks_ops("Flatten", kind="finite_differences")
@checks_ops("Flatten", kind="torch")
@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten_matches_torch_and_gradient(axis):
    (x,) = _randn(3, (2, 3, 4))
    op = netrun.op("Flatten", ["X"], ["Y"], axis=axis)
    (y,) = run_op(op, {"X": x})
    assert _inferred(op, [x]) == [y.shape]
    check_gradient(op, {"X": x})
    # Last, so the finite differences run without torch too.
    torch = pytest.importorskip("torch")
    k = axis + 3 if axis < 0 else axis
    want = torch.tensor(x).reshape(int(np.prod(x.shape[:k])), -1).numpy()
    np.testing.assert_array_equal(y, want)


def test_flatten_returns_a_view_and_later_in_place_ops_do_not_write_through():
    ws = netrun.Workspace("cpu")
    ws.feed_blob("X", np.arange(6.0).reshape(2, 3) - 2)
    ws.run_operator_once(netrun.op("Flatten", ["X"], ["Y"], axis=0))
    assert np.shares_memory(ws.get_blob("Y"), ws.get_blob("X"))
    ws.run_operator_once(netrun.op("Relu", ["Y"], ["Y"]))
    np.testing.assert_array_equal(ws.fetch_blob("X").min(), -2)


@checks_ops("Reshape", kind="finite_differences")
@SETTINGS
@given(shape=shapes, data=st.data(), seed=st.integers(0, 2**16))
def test_reshape_zero_and_minus_one(shape, data, seed):
    target = [0 if data.draw(st.booleans()) else d for d in shape]
    if data.draw(st.booleans()):
        target[data.draw(st.integers(0, len(shape) - 1))] = -1
    if data.draw(st.booleans()):
        target.append(1)
    (x,) = _randn(seed, shape)
    op = netrun.op("Reshape", ["X"], ["Y", "old"], shape=target)
    y, old = run_op(op, {"X": x})
    assert y.shape == shape + (1,) * (len(target) - len(shape))
    assert old.dtype == np.int64 and tuple(old) == shape
    assert _inferred(op, [x]) == [y.shape, (len(shape),)]
    check_gradient(op, {"X": x})


@checks_ops("Reshape", kind="torch_gradient")
def test_reshape_matches_torch_float32_and_runs_in_place():
    torch = pytest.importorskip("torch")
    (x,) = (a.astype(np.float32) for a in _randn(4, (4, 3, 2)))
    (ty,), (tdx,), dy = torch_forward_backward(lambda t: t.reshape(4, -1), [x])
    (y, _), grads = netrun_forward_backward(
        netrun.op("Reshape", ["X"], ["Y", "old"], shape=[0, -1]), {"X": x}, dy)
    np.testing.assert_array_equal(y, ty)
    np.testing.assert_array_equal(grads["X"], tdx)
    (y, _), grads = netrun_forward_backward(
        netrun.op("Reshape", ["X"], ["X", "old"], shape=[0, -1]), {"X": x}, dy)
    np.testing.assert_array_equal(y, ty)
    np.testing.assert_array_equal(grads["X"], tdx)


def test_reshape_with_shape_input_and_single_output():
    (x,) = _randn(5, (2, 2, 3))
    op = netrun.op("Reshape", ["X", "S"], ["Y"])
    (y,) = run_op(op, {"X": x, "S": np.array([3, 0, -1], dtype=np.int64)})
    np.testing.assert_array_equal(y, x.reshape(3, 2, 2))
    # Only the rank is known before the shape tensor is read.
    assert _inferred(op, [x, np.zeros(3, np.int64)]) == [(-1, -1, -1), (3,)]
    check_gradient(netrun.op("Reshape", ["X"], ["Y"], shape=[3, 4]), {"X": x})


@pytest.mark.parametrize("args,match", [
    ({"shape": [-1, -1]}, "at most one -1"),
    ({"shape": [2, -3]}, "'shape' is"),
    ({}, "missing argument 'shape'"),
])
def test_reshape_bad_arguments_fail_at_build_time(args, match):
    op = netrun.op("Reshape", ["X"], ["Y"], name="r1", **args)
    with pytest.raises(SchemaError, match=match) as info:
        netrun.Workspace("cpu").create_net(netrun.NetDef("n", [op]))
    assert "r1" in str(info.value)


def test_reshape_size_mismatch_names_the_shape():
    with pytest.raises(ShapeError, match=r"reshape X 2×3 \(6 elements\) to shape \[4, -1\]"):
        run_op(netrun.op("Reshape", ["X"], ["Y"], shape=[4, -1]), {"X": np.ones((2, 3))})


# Transpose / Copy / StopGradient ---------------------------------------------------------
@checks_ops("Transpose", kind="finite_differences")
@SETTINGS
@given(shape=shapes, data=st.data(), seed=st.integers(0, 2**16))
def test_transpose_permutations_and_gradient(shape, data, seed):
    perm = data.draw(st.permutations(range(len(shape))))
    axes = [a - len(shape) if data.draw(st.booleans()) else a for a in perm]
    (x,) = _randn(seed, shape)
    for args in ({"axes": axes}, {}):
        op = netrun.op("Transpose", ["X"], ["Y"], **args)
        (y,) = run_op(op, {"X": x})
        np.testing.assert_array_equal(y, np.transpose(x, perm if args else None))
        assert y.flags.c_contiguous and _inferred(op, [x]) == [y.shape]
        check_gradient(op, {"X": x})


@checks_ops("Transpose", kind="torch_gradient")
def test_transpose_matches_torch_permute():
    torch = pytest.importorskip("torch")
    (x,) = (a.astype(np.float32) for a in _randn(6, (2, 3, 4, 5)))
    (ty,), (tdx,), dy = torch_forward_backward(lambda t: t.permute(0, 2, 3, 1), [x])
    (y,), grads = netrun_forward_backward(
        netrun.op("Transpose", ["X"], ["Y"], axes=[0, 2, 3, 1]), {"X": x}, dy)
    np.testing.assert_array_equal(y, ty)
    np.testing.assert_array_equal(grads["X"], tdx)


def test_transpose_bad_axes():
    with pytest.raises(SchemaError, match="'axes' is \\[0, 0\\], not a permutation"):
        run_op(netrun.op("Transpose", ["X"], ["Y"], axes=[0, 0]), {"X": np.ones((2, 2))})
    with pytest.raises(ShapeError, match="axes \\[1, 0\\] has 2 entries but X 2×2×2 has 3"):
        run_op(netrun.op("Transpose", ["X"], ["Y"], axes=[1, 0]), {"X": np.ones((2, 2, 2))})


@checks_ops("Copy", kind="finite_differences")
def test_copy_is_a_real_copy_with_identity_gradient():
    ws = netrun.Workspace("cpu")
    ws.feed_blob("X", np.ones(3))
    ws.run_operator_once(netrun.op("Copy", ["X"], ["Y"]))
    assert not np.shares_memory(ws.get_blob("X"), ws.get_blob("Y"))
    check_gradient(netrun.op("Copy", ["X"], ["Y"]), {"X": np.arange(3.0)})


def test_stop_gradient_passes_values_and_blocks_gradients():
    x = np.arange(4.0)
    for out in ("Y", "X"):
        assert run_op(netrun.op("StopGradient", ["X"], [out]), {"X": x})[0].tolist() == x.tolist()
    assert netrun.gradient_ops(netrun.op("StopGradient", ["X"], ["Y"]))[0] == []
    net = netrun.NetDef("n", [netrun.op("Scale", ["X"], ["H"], scale=2.0),
                              netrun.op("StopGradient", ["H"], ["H"]),
                              netrun.op("Mul", ["H", "W"], ["Y"])])
    grads = netrun.add_gradient_ops(net, ["Y"])
    assert "W" in grads and "X" not in grads


# ReduceSum / ReduceMean -----------------------------------------------------------------
@checks_ops("ReduceSum", "ReduceMean", kind="finite_differences")
@pytest.mark.parametrize("type_,ref", [("ReduceSum", np.sum), ("ReduceMean", np.mean)])
@SETTINGS
@given(shape=shapes, data=st.data(), keepdims=st.booleans(), seed=st.integers(0, 2**16))
def test_reduce_axes_keepdims_and_gradient(type_, ref, shape, data, keepdims, seed):
    picked = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    axes = [a - len(shape) if data.draw(st.booleans()) else a for a in picked]
    (x,) = _randn(seed, shape)
    op = netrun.op(type_, ["X"], ["Y"], axes=axes, keepdims=int(keepdims))
    (y,) = run_op(op, {"X": x})
    want = ref(x, axis=tuple(picked) if picked else None, keepdims=keepdims)
    np.testing.assert_allclose(y, want, rtol=1e-12)
    assert _inferred(op, [x]) == [y.shape]
    check_gradient(op, {"X": x})


@checks_ops("ReduceSum", "ReduceMean", kind="torch_gradient")
@pytest.mark.parametrize("type_", ["ReduceSum", "ReduceMean"])
def test_reduce_matches_torch_float32(type_):
    torch = pytest.importorskip("torch")
    (x,) = (a.astype(np.float32) for a in _randn(7, (4, 3, 5)))
    fn = (lambda t: t.sum((0, 2))) if type_ == "ReduceSum" else (lambda t: t.mean((0, 2)))
    (ty,), (tdx,), dy = torch_forward_backward(fn, [x])
    (y,), grads = netrun_forward_backward(
        netrun.op(type_, ["X"], ["Y"], axes=[0, -1], keepdims=0), {"X": x}, dy)
    np.testing.assert_allclose(y, ty, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads["X"], tdx, rtol=1e-6, atol=1e-7)


def test_reduce_axis_errors():
    with pytest.raises(SchemaError, match="'axes' repeats an axis"):
        run_op(netrun.op("ReduceSum", ["X"], ["Y"], axes=[1, 1]), {"X": np.ones((2, 2))})
    with pytest.raises(ShapeError, match="same dim twice for X 2×2"):
        run_op(netrun.op("ReduceSum", ["X"], ["Y"], axes=[1, -1]), {"X": np.ones((2, 2))})
    with pytest.raises(ShapeError, match="axis 2 is out of range for 2 dims: X 2×2"):
        run_op(netrun.op("ReduceMean", ["X"], ["Y"], axes=[2]), {"X": np.ones((2, 2))})


def test_costs_of_views_and_copies():
    flat, trans = get_schema("Flatten"), get_schema("Transpose")
    spec = [TensorSpec((2, 3, 4))]
    assert flat.cost(flat.verify(netrun.op("Flatten", ["X"], ["Y"])), spec, spec).bytes_read == 0
    cost = trans.cost(trans.verify(netrun.op("Transpose", ["X"], ["Y"])), spec, spec)
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (0, 96, 96)
