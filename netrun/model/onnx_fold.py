"""ONNX nodes evaluated at load time: constants and the shape arithmetic exporters emit.

PyTorch writes `x.view(x.size(0), -1)` as Shape -> Gather -> Unsqueeze -> Concat -> Reshape.
None of these compute on activations, so they run here on NumPy values, with the elements
that stand for the batch size tracked (`Const.batch_at`) so that the Reshape can copy the
batch dimension (0) instead of freezing the size seen at load time.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from netrun.model.onnx_graph import Graph, Node, Unsupported

# TensorProto.DataType -> NumPy dtype, for Cast and ConstantOfShape.
DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
          7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32,
          13: np.uint64}


def foldable(cx: Graph, node: Node) -> bool:
    """Whether the node runs at load time: a Constant, a Shape, or a folding op whose inputs
    are all known."""
    if node.op_type in ("Constant", "Shape"):
        return True
    present = [n for n in node.inputs if n]
    return node.op_type in FOLDERS and bool(present) and all(cx.const(n) is not None
                                                             for n in present)


def _tagged_1d(node: Node, batch_at: frozenset[int], ndim: int) -> None:
    if batch_at and ndim > 1:
        raise Unsupported("does shape arithmetic with the batch size that netrun cannot follow")


def constant(cx: Graph, node: Node) -> None:
    """Constant: its value attribute, as a load-time value."""
    keys = [k for k in ("value", "value_float", "value_floats", "value_int", "value_ints")
            if k in node.attrs]
    for k in ("sparse_value", "value_string", "value_strings"):
        if k in node.attrs:
            node.attr(k)
            raise Unsupported(f"Constant with '{k}' is not supported")
    if len(keys) != 1:
        raise Unsupported("a Constant needs exactly one value attribute")
    value = node.attr(keys[0])
    dtype = np.float32 if keys[0].startswith("value_float") else np.int64
    cx.set_const(node, np.asarray(value) if keys[0] == "value" else np.asarray(value, dtype))


def shape(cx: Graph, node: Node) -> None:
    """Shape of an activation (dim 0 tagged as the batch) or of a load-time value."""
    name = node.inputs[0]
    c = cx.const(name)
    dims = np.asarray(c.value.shape if c is not None else cx.shape(cx.data(name)), np.int64)
    tags = frozenset() if c is not None else frozenset({0})
    start, end = node.attr("start", 0), node.attr("end", None)
    index = np.arange(len(dims))[slice(start, end)]
    cx.set_const(node, dims[index], batch_at=frozenset(i for i, k in enumerate(index)
                                                       if k in tags))


def gather(cx: Graph, node: Node) -> None:
    """Gather on load-time values (a dim picked out of a Shape, say)."""
    data, indices = cx.const(node.inputs[0]), cx.const(node.inputs[1])
    axis = node.attr("axis", 0)
    _tagged_1d(node, data.batch_at, data.value.ndim)
    idx = np.asarray(indices.value, np.int64)
    n = data.value.shape[axis]
    if np.any((idx < -n) | (idx >= n)):
        raise Unsupported(f"index out of range for axis {axis} of size {n}")
    idx = np.where(idx < 0, idx + n, idx)
    out = np.take(data.value, idx, axis=axis)
    tags = frozenset(i for i, k in enumerate(idx.reshape(-1)) if int(k) in data.batch_at)
    cx.set_const(node, out, batch_at=tags)


def squeeze_axes(cx: Graph, node: Node) -> list[int]:
    """Squeeze's and Unsqueeze's axes: an attribute before opset 13, an input from it on."""
    if cx.opset < 13:
        return list(node.attr("axes", []))
    return cx.const_array(node.input(1), "axes").tolist() if node.input(1) else []


def unsqueeze(cx: Graph, node: Node) -> None:
    """Unsqueeze of a load-time value."""
    c = cx.const(node.inputs[0])
    axes = squeeze_axes(cx, node)
    rank = c.value.ndim + len(axes)
    out = np.expand_dims(c.value, tuple(sorted(a + rank if a < 0 else a for a in axes)))
    _tagged_1d(node, c.batch_at, out.ndim)
    cx.set_const(node, out, batch_at=c.batch_at)


def squeeze(cx: Graph, node: Node) -> None:
    """Squeeze of a load-time value."""
    c = cx.const(node.inputs[0])
    axes = [a + c.value.ndim if a < 0 else a for a in squeeze_axes(cx, node)]
    out = np.squeeze(c.value, tuple(axes) if axes else None)
    cx.set_const(node, out, batch_at=c.batch_at if out.size == c.value.size else frozenset())


def concat(cx: Graph, node: Node) -> None:
    """Concat of load-time values (a target shape put together)."""
    parts = [cx.const(n) for n in node.inputs if n]
    axis = node.attr("axis")
    out = np.concatenate([p.value for p in parts], axis=axis)
    tags, offset = set(), 0
    for p in parts:
        _tagged_1d(node, p.batch_at, p.value.ndim)
        tags |= {offset + k for k in p.batch_at}
        offset += p.value.shape[0] if p.value.ndim else 1
    cx.set_const(node, out, batch_at=frozenset(tags))


def cast(cx: Graph, node: Node) -> None:
    """Cast of a load-time value."""
    c = cx.const(node.inputs[0])
    to = node.attr("to")
    node.attr("saturate")
    if to not in DTYPES:
        raise Unsupported(f"Cast to type {to} is not supported")
    cx.set_const(node, c.value.astype(DTYPES[to]), batch_at=c.batch_at)


def slice_(cx: Graph, node: Node) -> None:
    """Slice of a load-time value."""
    c = cx.const(node.inputs[0])
    value = c.value
    if cx.opset < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes, steps = node.attr("axes", list(range(len(starts)))), [1] * len(starts)
    else:
        starts = cx.const_array(node.input(1), "starts").tolist()
        ends = cx.const_array(node.input(2), "ends").tolist()
        axes = (cx.const_array(node.input(3), "axes").tolist() if node.input(3)
                else list(range(len(starts))))
        steps = cx.const_array(node.input(4), "steps").tolist() if node.input(4) else \
            [1] * len(starts)
    index = [slice(None)] * value.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = slice(int(s), int(e), int(st))
    positions = np.arange(value.size).reshape(value.shape)[tuple(index)]
    _tagged_1d(node, c.batch_at, value.ndim)
    tags = frozenset(i for i, k in enumerate(positions.reshape(-1)) if int(k) in c.batch_at)
    cx.set_const(node, value[tuple(index)], batch_at=tags)


def identity(cx: Graph, node: Node) -> None:
    """Identity of a load-time value."""
    c = cx.const(node.inputs[0])
    cx.set_const(node, c.value, batch_at=c.batch_at)


def _arith(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    def fold(cx: Graph, node: Node) -> None:
        """Evaluate one node."""
        a, b = (cx.const(n) for n in node.inputs[:2])
        if a.batch_at or b.batch_at:
            raise Unsupported("does arithmetic with the batch size, which netrun cannot follow")
        cx.set_const(node, np.asarray(fn(a.value, b.value)).astype(
            np.result_type(a.value, b.value)))
    return fold


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.result_type(a, b).kind in "iu":     # ONNX's integer Div truncates toward zero
        return np.trunc(np.true_divide(a, b))
    return np.true_divide(a, b)


def constant_of_shape(cx: Graph, node: Node) -> None:
    """ConstantOfShape of a load-time shape."""
    dims = cx.const_array(node.inputs[0], "the shape").astype(np.int64)
    value = node.attr("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    cx.set_const(node, np.full(tuple(dims.tolist()), fill[0], dtype=fill.dtype))


def reshape(cx: Graph, node: Node) -> None:
    """Reshape of a load-time value."""
    c = cx.const(node.inputs[0])
    target = cx.const_array(node.input(1), "the target shape") if cx.opset >= 5 else \
        np.asarray(node.attr("shape"))
    allow_zero = node.attr("allowzero", 0)
    dims = [c.value.shape[i] if d == 0 and not allow_zero else int(d)
            for i, d in enumerate(target.tolist())]
    cx.set_const(node, c.value.reshape(dims))


FOLDERS: dict[str, Callable[[Graph, Node], None]] = {
    "Constant": constant, "Shape": shape, "Gather": gather, "Unsqueeze": unsqueeze,
    "Squeeze": squeeze, "Concat": concat, "Cast": cast, "Slice": slice_, "Identity": identity,
    "Add": _arith(np.add), "Sub": _arith(np.subtract), "Mul": _arith(np.multiply),
    "Div": _arith(_divide), "ConstantOfShape": constant_of_shape, "Reshape": reshape,
}
