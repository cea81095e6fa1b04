"""Shape and data-movement ops: Concat, Split, Slice, Flatten, Reshape, ResizeLike, Transpose,
Copy, StopGradient, ReduceSum, ReduceMean. Each section: schema, kernel, gradient maker.

Shape inference marks a dim known only at run time (sizes read from an input tensor) as -1.
"""
from __future__ import annotations

import math

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import MANY, Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import GradientError, SchemaError, ShapeError
from netrun.ops.common import elementwise_cost, same_as_input
from netrun.ops.elementwise import fmt, input_grad_names


def _move_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    """No arithmetic; the first input is read and every output written once."""
    return Cost(0, ins[0].nbytes, sum(o.nbytes for o in outs))


def _view_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    """A view of the input: no data moves."""
    return Cost(0, 0, 0)


def _axis(what: str, axis: int, ndim: int, **shapes: tuple) -> int:
    """`axis` in [-ndim, ndim) made non-negative, or a ShapeError naming the blobs' shapes."""
    if not -ndim <= axis < ndim:
        named = ", ".join(f"{role} {fmt(s)}" for role, s in shapes.items())
        raise ShapeError(f"{what}: axis {axis} is out of range for {ndim} dims: {named}")
    return axis % ndim


# Concat ---------------------------------------------------------------------------------
def _concat_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    first = ins[0].shape
    axis = _axis("Concat", args.axis, len(first) + args.add_axis,
                 **{f"input {k}": s.shape for k, s in enumerate(ins)})
    for k, spec in enumerate(ins[1:], start=1):
        s = spec.shape
        if len(s) != len(first) or any(d != f for i, (d, f) in enumerate(zip(s, first))
                                       if args.add_axis or i != axis):
            where = "must match" if args.add_axis else f"may differ only along axis {args.axis}"
            raise ShapeError(f"Concat: input 0 has shape {fmt(first)} but input {k} has shape "
                             f"{fmt(s)}; they {where}")
    if args.add_axis:
        out = first[:axis] + (len(ins),) + first[axis:]
    else:
        out = first[:axis] + (sum(s.shape[axis] for s in ins),) + first[axis + 1:]
    return [TensorSpec(out, ins[0].dtype), TensorSpec((len(ins),), "int32")]


_AXIS_ARGS = [Arg("axis", "int", 1), Arg("add_axis", "int", 0, (0, 1),
                                         "1: stack along a new axis at `axis`")]
register_schema("Concat", inputs=(1, MANY), outputs=(1, 2), output_names=("Y", "split_info"),
                args=_AXIS_ARGS, shape_fn=_concat_shape, cost_fn=_move_cost, family="shape",
                doc="Y = the inputs joined along `axis` (stacked along a new one with add_axis); "
                    "split_info (int32) holds each input's size along it, for the gradient.")


@register_kernel("Concat")
def concat(ctx, *xs):
    xp, a = ctx.xp, ctx.args
    out, info = _concat_shape(a, [TensorSpec(x.shape) for x in xs])
    axis = a.axis % len(out.shape)
    Y = ctx.output(0, out.shape, xs[0].dtype)
    parts = [xp.expand_dims(x, axis) for x in xs] if a.add_axis else xs
    xp.concatenate(parts, axis=axis, out=Y)
    if len(ctx.def_.outputs) == 2:
        sizes = [1] * len(xs) if a.add_axis else [x.shape[axis] for x in xs]
        ctx.output(1, info.shape, "int32")[...] = xp.asarray(sizes, dtype="int32")


@register_gradient("Concat")
def _concat_grad(g):
    if len(g.def_.outputs) < 2:
        raise GradientError(f"op {g.def_.label}: the gradient needs Concat's second output "
                            f"(split_info); add one")
    names, sums = input_grad_names(g, range(len(g.def_.inputs)))
    return [g.op("Split", [g.GO(0), g.O(1)], names, **g.copy_args())] + sums


# Split ----------------------------------------------------------------------------------
def _check_split(op, args: Args) -> None:
    if args.split and len(op.inputs) == 2:
        raise SchemaError(f"op {op.label}: give the sizes either as argument 'split' or as "
                          f"input 1, not both")
    if args.split and len(args.split) != len(op.outputs):
        raise SchemaError(f"op {op.label}: argument 'split' has {len(args.split)} sizes but "
                          f"the op has {len(op.outputs)} outputs")
    if any(s < 0 for s in args.split):
        raise SchemaError(f"op {op.label}: argument 'split' has a negative size: {args.split}")
    # Shape functions see only args and input specs, but equal parts depend on the output
    # count: keep it with the resolved args.
    args["num_outputs"] = len(op.outputs)


def _split_sizes(args: Args, x: tuple, n: int, given=None) -> list[int]:
    axis = _axis("Split", args.axis, len(x), X=x)
    sizes = list(given if given is not None else args.split)
    if not sizes:
        if x[axis] % n:
            raise ShapeError(f"Split: X has {x[axis]} elements along axis {args.axis}, which do "
                             f"not split into {n} equal parts: X {fmt(x)}")
        sizes = [x[axis] // n] * n
    if len(sizes) != n or sum(sizes) != x[axis]:
        raise ShapeError(f"Split: sizes {sizes} do not add up to X's {x[axis]} elements along "
                         f"axis {args.axis} in {n} outputs: X {fmt(x)}")
    if args.add_axis and any(s != 1 for s in sizes):
        raise ShapeError(f"Split: add_axis=1 needs size 1 per output, got {sizes}: X {fmt(x)}")
    return sizes


def _split_out_shape(x: tuple, axis: int, size: int, add_axis: int) -> tuple:
    return x[:axis] + (() if add_axis else (size,)) + x[axis + 1:]


def _split_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    n = args.get("num_outputs")
    if n is None:
        raise ShapeError("Split: the number of outputs is unknown (resolve the args with "
                         "schema.verify first)")
    x = ins[0].shape
    axis = _axis("Split", args.axis, len(x), X=x)
    if len(ins) == 2 and not args.add_axis:
        sizes = [-1] * n        # read from the sizes tensor at run time
    else:
        sizes = _split_sizes(args, x, n, [1] * n if len(ins) == 2 else None)
    return [TensorSpec(_split_out_shape(x, axis, s, args.add_axis), ins[0].dtype) for s in sizes]


register_schema("Split", inputs=(1, 2), outputs=(1, MANY), input_names=("X", "split"),
                args=[Arg("axis", "int", 1), Arg("split", "ints", [], doc="sizes along axis"),
                      Arg("add_axis", "int", 0, (0, 1), "1: drop the axis (inverse of Concat's)")],
                shape_fn=_split_shape, cost_fn=_move_cost, check_fn=_check_split,
                non_differentiable=(1,), family="shape",
                doc="Splits X along `axis` into the outputs: sizes from argument 'split', from "
                    "input 1 (int tensor), or equal parts.")


@register_kernel("Split")
def split(ctx, X, S=None):
    a = ctx.args
    n = len(ctx.def_.outputs)
    given = ctx.backend.to_host(S).reshape(-1).tolist() if S is not None else None
    sizes = _split_sizes(a, X.shape, n, given)
    axis, start = a.axis % X.ndim, 0
    for i, size in enumerate(sizes):
        index = [slice(None)] * X.ndim
        index[axis] = start if a.add_axis else slice(start, start + size)
        out = ctx.output(i, _split_out_shape(X.shape, axis, size, a.add_axis), X.dtype)
        ctx.xp.copyto(out, X[tuple(index)])
        start += size


@register_gradient("Split")
def _split_grad(g):
    dys = [g.GO(i) for i in range(len(g.def_.outputs))]
    return [g.op("Concat", dys, [g.GI(0)], **g.copy_args("axis", "add_axis"))]


# Slice ----------------------------------------------------------------------------------
def _check_slice(op, args: Args) -> None:
    if len(args.starts) != len(args.ends):
        raise SchemaError(f"op {op.label}: arguments 'starts' ({len(args.starts)} values) and "
                          f"'ends' ({len(args.ends)} values) must have the same length")


def _slice_index(args: Args, x: tuple) -> tuple[slice, ...]:
    """Caffe2's rule: a negative start or end v means dim + 1 + v (so -1 is the end)."""
    if len(args.starts) > len(x):
        raise ShapeError(f"Slice: {len(args.starts)} starts/ends for X {fmt(x)} with "
                         f"{len(x)} dims")
    index = []
    for i, (start, end) in enumerate(zip(args.starts, args.ends)):
        lo, hi = (v + x[i] + 1 if v < 0 else min(v, x[i]) for v in (start, end))
        if not 0 <= lo <= hi:
            raise ShapeError(f"Slice: dim {i} of X {fmt(x)}: start {start} and end {end} give "
                             f"the invalid range [{lo}, {hi})")
        index.append(slice(lo, hi))
    return tuple(index)


def _slice_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0].shape
    index = _slice_index(args, x)
    out = tuple(s.stop - s.start for s in index) + x[len(index):]
    return [TensorSpec(out, ins[0].dtype)]


_SLICE_ARGS = [Arg("starts", "ints", [], doc="first index per dim (negative: dim + 1 + v)"),
               Arg("ends", "ints", [], doc="end per dim, exclusive; -1 means the end")]
register_schema("Slice", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                args=_SLICE_ARGS, shape_fn=_slice_shape, cost_fn=_move_cost,
                check_fn=_check_slice, family="shape",
                doc="Y = X[starts[0]:ends[0], starts[1]:ends[1], ...]; dims past the lists are "
                    "kept whole.")


@register_kernel("Slice")
def slice_(ctx, X):
    index = _slice_index(ctx.args, X.shape)
    view = X[index]
    ctx.xp.copyto(ctx.output(0, view.shape, X.dtype), view)


register_schema("SliceGradient", inputs=2, outputs=1, input_names=("X", "dY"),
                output_names=("dX",), args=_SLICE_ARGS, shape_fn=same_as_input(0),
                cost_fn=elementwise_cost(0), family="shape",
                doc="dX = zeros like X with dY written at the slice.")


@register_kernel("SliceGradient")
def slice_gradient(ctx, X, dY):
    dX = ctx.output(0, X.shape, dY.dtype)
    dX.fill(0)
    dX[_slice_index(ctx.args, X.shape)] = dY


@register_gradient("Slice")
def _slice_grad(g):
    return [g.op("SliceGradient", [g.I(0), g.GO(0)], [g.GI(0)], **g.copy_args())]


# Flatten, ResizeLike --------------------------------------------------------------------
def _flatten_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0].shape
    if not -len(x) <= args.axis <= len(x):
        raise ShapeError(f"Flatten: axis {args.axis} is out of range for X {fmt(x)}")
    axis = args.axis + len(x) if args.axis < 0 else args.axis
    return [TensorSpec((math.prod(x[:axis]), math.prod(x[axis:])), ins[0].dtype)]


register_schema("Flatten", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                args=[Arg("axis", "int", 1)], shape_fn=_flatten_shape, cost_fn=_view_cost,
                family="shape",
                doc="Y = X as 2-D: the dims before `axis` times the dims from it on (a view).")


@register_kernel("Flatten")
def flatten(ctx, X):
    return X.reshape(_flatten_shape(ctx.args, [TensorSpec(X.shape)])[0].shape)


@register_gradient("Flatten")
def _flatten_grad(g):
    return [g.op("ResizeLike", [g.GO(0), g.I(0)], [g.GI(0)])]


def _resize_like_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    if ins[0].size != ins[1].size:
        raise ShapeError(f"ResizeLike: X has {ins[0].size} elements but like has "
                         f"{ins[1].size}: X {ins[0]}, like {ins[1]}")
    return [TensorSpec(ins[1].shape, ins[0].dtype)]


register_schema("ResizeLike", inputs=2, outputs=1, input_names=("X", "like"),
                output_names=("Y",), shape_fn=_resize_like_shape, cost_fn=_view_cost,
                non_differentiable=(1,), family="shape",
                doc="Y = X reshaped to the shape of `like` (a view; the sizes must agree).")


@register_kernel("ResizeLike")
def resize_like(ctx, X, like):
    _resize_like_shape(ctx.args, [TensorSpec(X.shape), TensorSpec(like.shape)])
    return X.reshape(like.shape)


@register_gradient("ResizeLike")
def _resize_like_grad(g):
    return [g.op("ResizeLike", [g.GO(0), g.I(0)], [g.GI(0)])]


# Reshape --------------------------------------------------------------------------------
def _check_reshape(op, args: Args) -> None:
    if len(op.inputs) == 2 and "shape" in op.args:
        raise SchemaError(f"op {op.label}: give the new shape either as argument 'shape' or "
                          f"as input 1, not both")
    if len(op.inputs) == 1 and "shape" not in op.args:
        raise SchemaError(f"op {op.label}: missing argument 'shape' (or a shape input)")
    if args.shape.count(-1) > 1 or any(d < -1 for d in args.shape):
        raise SchemaError(f"op {op.label}: argument 'shape' is {args.shape}; use sizes >= 0, "
                          f"0 to copy a dim and at most one -1 to infer a dim")


def _reshape_target(x: tuple, shape) -> tuple[int, ...]:
    """Caffe2's rule: 0 copies X's dim at that index, -1 takes whatever is left."""
    def bad() -> ShapeError:
        return ShapeError(f"Reshape: cannot reshape X {fmt(x)} ({math.prod(x)} elements) to "
                          f"shape {list(shape)}")

    if any(d == 0 and i >= len(x) for i, d in enumerate(shape)):
        raise bad()
    out = [x[i] if d == 0 else int(d) for i, d in enumerate(shape)]
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or math.prod(x) % known:
            raise bad()
        out[out.index(-1)] = math.prod(x) // known
    if math.prod(out) != math.prod(x):
        raise bad()
    return tuple(out)


def _reshape_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0].shape
    if len(ins) == 2:   # the shape comes from a tensor: only its length is known now
        out = (-1,) * (ins[1].shape[0] if ins[1].shape else 0)
    else:
        out = _reshape_target(x, args.shape)
    return [TensorSpec(out, ins[0].dtype), TensorSpec((len(x),), "int64")]


register_schema("Reshape", inputs=(1, 2), outputs=(1, 2), input_names=("X", "new_shape"),
                output_names=("Y", "old_shape"), inplace=((0, 0),),
                args=[Arg("shape", "ints", [], doc="0 copies a dim, -1 infers one")],
                shape_fn=_reshape_shape, cost_fn=_view_cost, check_fn=_check_reshape,
                non_differentiable=(1,), family="shape",
                doc="Y = X with a new shape (a view); old_shape (int64) keeps X's shape for "
                    "the gradient, which reshapes dY back to it.")


@register_kernel("Reshape")
def reshape(ctx, X, S=None):
    xp = ctx.xp
    shape = ctx.backend.to_host(S).reshape(-1).tolist() if S is not None else ctx.args.shape
    Y = X.reshape(_reshape_target(X.shape, shape))
    if len(ctx.def_.outputs) == 1:
        return Y
    old = ctx.output(1, (X.ndim,), "int64")
    old[...] = xp.asarray(X.shape, dtype="int64")
    return Y, None


@register_gradient("Reshape")
def _reshape_grad(g):
    if len(g.def_.outputs) == 2:
        return [g.op("Reshape", [g.GO(0), g.O(1)], [g.GI(0), f"{g.GI(0)}_old_shape"])]
    return [g.op("ResizeLike", [g.GO(0), g.I(0)], [g.GI(0)])]


# Transpose ------------------------------------------------------------------------------
def _check_transpose(op, args: Args) -> None:
    n = len(args.axes)
    if sorted(a % n for a in args.axes if -n <= a < n) != list(range(n)):
        raise SchemaError(f"op {op.label}: argument 'axes' is {args.axes}, not a permutation "
                          f"of the dims 0..{n - 1}")


def _transpose_axes(args: Args, x: tuple) -> tuple[int, ...]:
    if not args.axes:
        return tuple(range(len(x)))[::-1]
    if len(args.axes) != len(x):
        raise ShapeError(f"Transpose: axes {args.axes} has {len(args.axes)} entries but X "
                         f"{fmt(x)} has {len(x)} dims")
    return tuple(a % len(x) for a in args.axes)


def _transpose_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0].shape
    return [TensorSpec(tuple(x[a] for a in _transpose_axes(args, x)), ins[0].dtype)]


register_schema("Transpose", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                args=[Arg("axes", "ints", [], doc="permutation of X's dims; default reverses")],
                shape_fn=_transpose_shape, cost_fn=_move_cost, check_fn=_check_transpose,
                family="shape", doc="Y = X with its dims permuted: Y.shape[i] = X.shape[axes[i]].")


@register_kernel("Transpose")
def transpose(ctx, X):
    axes = _transpose_axes(ctx.args, X.shape)
    view = X.transpose(axes)
    ctx.xp.copyto(ctx.output(0, view.shape, X.dtype), view)


@register_gradient("Transpose")
def _transpose_grad(g):
    axes = g.args.get("axes") or []
    inverse = sorted(range(len(axes)), key=lambda i: axes[i] % len(axes))
    args = {"axes": inverse} if axes else {}
    return [g.op("Transpose", [g.GO(0)], [g.GI(0)], **args)]


# Copy, StopGradient ---------------------------------------------------------------------
register_schema("Copy", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                shape_fn=same_as_input(0), cost_fn=_move_cost, family="shape",
                doc="Y = a copy of X.")
register_schema("StopGradient", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                inplace=((0, 0),), shape_fn=same_as_input(0), cost_fn=_move_cost,
                no_gradient=True, family="shape",
                doc="Y = X; no gradient flows back through it. Usually run in place.")


@register_kernel("Copy")
@register_kernel("StopGradient")
def copy(ctx, X):
    Y = ctx.output(0, X.shape, X.dtype)
    if Y is not X:  # in place there is nothing to do
        ctx.xp.copyto(Y, X)


@register_gradient("Copy")
def _copy_grad(g):
    return [g.op("Copy", [g.GO(0)], [g.GI(0)])]


# ReduceSum, ReduceMean ------------------------------------------------------------------
def _check_reduce(op, args: Args) -> None:
    if len(set(args.axes)) != len(args.axes):
        raise SchemaError(f"op {op.label}: argument 'axes' repeats an axis: {args.axes}")


def _reduce_axes(what: str, args: Args, x: tuple) -> tuple[int, ...]:
    if not args.axes:
        return tuple(range(len(x)))
    axes = tuple(_axis(what, a, len(x), X=x) for a in args.axes)
    if len(set(axes)) != len(axes):
        raise ShapeError(f"{what}: axes {args.axes} name the same dim twice for X {fmt(x)}")
    return axes


def _reduce_shape_fn(what: str):
    def fn(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
        x = ins[0].shape
        axes = _reduce_axes(what, args, x)
        out = tuple(1 if i in axes else d for i, d in enumerate(x)
                    if args.keepdims or i not in axes)
        return [TensorSpec(out, ins[0].dtype)]

    return fn


def _reduce_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    return Cost(ins[0].size, ins[0].nbytes, outs[0].nbytes)


_REDUCE_ARGS = [Arg("axes", "ints", [], doc="dims to reduce; default all"),
                Arg("keepdims", "int", 1, (0, 1), "keep reduced dims as size 1")]

for _type, _what in (("ReduceSum", "sum"), ("ReduceMean", "mean")):
    register_schema(_type, inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                    args=_REDUCE_ARGS, shape_fn=_reduce_shape_fn(_type),
                    cost_fn=_reduce_cost,
                    check_fn=_check_reduce, family="shape",
                    doc=f"Y = the {_what} of X over `axes` (all by default).")
    register_schema(f"{_type}Gradient", inputs=2, outputs=1, input_names=("X", "dY"),
                    output_names=("dX",), args=_REDUCE_ARGS, shape_fn=same_as_input(0),
                    cost_fn=elementwise_cost(1), family="shape",
                    doc=f"dX = dY broadcast back over the reduced dims"
                        f"{', divided by their size' if _what == 'mean' else ''}.")


def _reduce_kernel(type: str):
    def kernel(ctx, X):
        xp, a = ctx.xp, ctx.args
        out = _reduce_shape_fn(type)(a, [TensorSpec(X.shape)])[0].shape
        Y = ctx.output(0, out, X.dtype)
        fn = xp.sum if type == "ReduceSum" else xp.mean
        fn(X, axis=_reduce_axes(type, a, X.shape), keepdims=bool(a.keepdims), out=Y)

    return kernel


def _reduce_grad_kernel(type: str):
    def kernel(ctx, X, dY):
        axes = _reduce_axes(type, ctx.args, X.shape)
        kept = tuple(1 if i in axes else d for i, d in enumerate(X.shape))  # dY with keepdims
        dX = ctx.output(0, X.shape, dY.dtype)
        # mean: each input element contributed 1/count of the output it fed.
        count = math.prod(X.shape[i] for i in axes)
        scale = 1.0 / count if type == "ReduceMean" and count else 1.0
        ctx.xp.multiply(dY.reshape(kept), scale, out=dX)

    return kernel


def _reduce_maker(type: str):
    def maker(g):
        return [g.op(f"{type}Gradient", [g.I(0), g.GO(0)], [g.GI(0)], **g.copy_args())]

    return maker


for _type in ("ReduceSum", "ReduceMean"):
    register_kernel(_type)(_reduce_kernel(_type))
    register_kernel(f"{_type}Gradient")(_reduce_grad_kernel(_type))
    register_gradient(_type)(_reduce_maker(_type))
