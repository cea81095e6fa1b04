"""Data movement: Concat, Split, Slice, Pad, Transpose, Copy, StopGradient. Each section: schema,
kernel, gradient maker. Views and reshapes are in reshape.py, reductions in reduce.py.

Shape inference marks a dim known only at run time (sizes read from an input tensor) as -1.
"""
from __future__ import annotations

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import MANY, Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import GradientError, SchemaError, ShapeError
from netrun.ops.common import elementwise_cost, fmt, normalize_axis, same_as_input


def _move_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    """No arithmetic; the first input is read and every output written once."""
    return Cost(0, ins[0].nbytes, sum(o.nbytes for o in outs))


# Concat ---------------------------------------------------------------------------------
def _concat_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    first = ins[0].shape
    axis = normalize_axis("Concat", args.axis, len(first) + args.add_axis,
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
                args=_AXIS_ARGS, shape_fn=_concat_shape, cost_fn=_move_cost, family="movement",
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
    # Concat(X, X) names X_grad twice; the backward builder sums the two slices.
    names = [g.GI(i) for i in range(len(g.def_.inputs))]
    return [g.op("Split", [g.GO(0), g.O(1)], names, **g.copy_args())]


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
    axis = normalize_axis("Split", args.axis, len(x), X=x)
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
    axis = normalize_axis("Split", args.axis, len(x), X=x)
    if len(ins) == 2 and not args.add_axis:
        sizes = [-1] * n        # read from the sizes tensor at run time
    else:
        sizes = _split_sizes(args, x, n, [1] * n if len(ins) == 2 else None)
    return [TensorSpec(_split_out_shape(x, axis, s, args.add_axis), ins[0].dtype) for s in sizes]


register_schema("Split", inputs=(1, 2), outputs=(1, MANY), input_names=("X", "split"),
                args=[Arg("axis", "int", 1), Arg("split", "ints", [], doc="sizes along axis"),
                      Arg("add_axis", "int", 0, (0, 1), "1: drop the axis (inverse of Concat's)")],
                shape_fn=_split_shape, cost_fn=_move_cost, check_fn=_check_split,
                non_differentiable=(1,), family="movement",
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
                check_fn=_check_slice, family="movement",
                doc="Y = X[starts[0]:ends[0], starts[1]:ends[1], ...]; dims past the lists are "
                    "kept whole.")


@register_kernel("Slice")
def slice_(ctx, X):
    index = _slice_index(ctx.args, X.shape)
    view = X[index]
    ctx.xp.copyto(ctx.output(0, view.shape, X.dtype), view)


register_schema("SliceGradient", inputs=2, outputs=1, input_names=("X", "dY"),
                output_names=("dX",), args=_SLICE_ARGS, shape_fn=same_as_input(0),
                cost_fn=elementwise_cost(0), family="movement",
                doc="dX = zeros like X with dY written at the slice.")


@register_kernel("SliceGradient")
def slice_gradient(ctx, X, dY):
    dX = ctx.output(0, X.shape, dY.dtype)
    dX.fill(0)
    dX[_slice_index(ctx.args, X.shape)] = dY


@register_gradient("Slice")
def _slice_grad(g):
    return [g.op("SliceGradient", [g.I(0), g.GO(0)], [g.GI(0)], **g.copy_args())]


# Pad ------------------------------------------------------------------------------------
def _check_pad(op, args: Args) -> None:
    if len(args.pads) % 2:
        raise SchemaError(f"op {op.label}: argument 'pads' needs a begin and an end per dim "
                          f"(an even count), got {len(args.pads)}: {args.pads}")
    if any(p < 0 for p in args.pads):
        raise SchemaError(f"op {op.label}: argument 'pads' must not be negative, got "
                          f"{args.pads}")


def _pad_index(args: Args, x: tuple) -> tuple[slice, ...]:
    """Where X sits inside Y: dims past the pads' are not padded."""
    n = len(args.pads) // 2
    if n > len(x):
        raise ShapeError(f"Pad: {len(args.pads)} pads for X {fmt(x)} with {len(x)} dims")
    return tuple(slice(b, b + d) for b, d in zip(args.pads[:n], x)) + \
        tuple(slice(None) for _ in x[n:])


def _pad_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0].shape
    n = len(args.pads) // 2
    _pad_index(args, x)
    out = tuple(d + args.pads[i] + args.pads[n + i] for i, d in enumerate(x[:n])) + x[n:]
    return [TensorSpec(out, ins[0].dtype)]


register_schema("Pad", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                args=[Arg("pads", "ints", [], doc="[begin of dim 0, begin of dim 1, ..., end of "
                                                  "dim 0, end of dim 1, ...] (ONNX's order)"),
                      Arg("value", "float", 0.0, doc="what the padding holds")],
                shape_fn=_pad_shape, cost_fn=_move_cost, check_fn=_check_pad, family="movement",
                doc="Y = X with `value` added before and after each dim (constant padding); "
                    "dims past the pads' are not padded.")


@register_kernel("Pad")
def pad(ctx, X):
    (out,) = _pad_shape(ctx.args, [TensorSpec(X.shape)])
    Y = ctx.output(0, out.shape, X.dtype)
    Y.fill(ctx.args.value)
    Y[_pad_index(ctx.args, X.shape)] = X


@register_gradient("Pad")
def _pad_grad(g):
    # dX is dY where X sits: a Slice, whose negative end -(e + 1) stops e before the end.
    pads = list(g.args.get("pads", []))
    n = len(pads) // 2
    return [g.op("Slice", [g.GO(0)], [g.GI(0)], starts=pads[:n],
                 ends=[-(e + 1) for e in pads[n:]])]


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
                family="movement",
                doc="Y = X with its dims permuted: Y.shape[i] = X.shape[axes[i]].")


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
                shape_fn=same_as_input(0), cost_fn=_move_cost, family="movement",
                doc="Y = a copy of X.")
register_schema("StopGradient", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                inplace=((0, 0),), shape_fn=same_as_input(0), cost_fn=_move_cost,
                no_gradient=True, family="movement",
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
