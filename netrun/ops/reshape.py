"""Reshapes (views of their input): Flatten, ResizeLike, Reshape. Each section: schema, kernel,
gradient maker.

Shape inference marks a dim known only at run time (sizes read from an input tensor) as -1.
"""
from __future__ import annotations

import math

from netrun.core.gradient import register_gradient
from netrun.core.lifetimes import register_shape_reads, register_view
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import SchemaError, ShapeError
from netrun.ops.common import fmt


def _view_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    """A view of the input: no data moves."""
    return Cost(0, 0, 0)


# Flatten, ResizeLike --------------------------------------------------------------------
def _flatten_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0].shape
    if not -len(x) <= args.axis <= len(x):
        raise ShapeError(f"Flatten: axis {args.axis} is out of range for X {fmt(x)}")
    axis = args.axis + len(x) if args.axis < 0 else args.axis
    return [TensorSpec((math.prod(x[:axis]), math.prod(x[axis:])), ins[0].dtype)]


register_schema("Flatten", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                args=[Arg("axis", "int", 1)], shape_fn=_flatten_shape, cost_fn=_view_cost,
                family="reshape",
                doc="Y = X as 2-D: the dims before `axis` times the dims from it on (a view).")


# The kernel returns a view of X: the memory plan lets Y share X's lifetime.
register_view("Flatten", (0, 0))


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
                non_differentiable=(1,), family="reshape",
                doc="Y = X reshaped to the shape of `like` (a view; the sizes must agree).")


# The kernel returns a view of X: the memory plan lets Y share X's lifetime. It reads only
# the shape of `like` (a gradient's forward input): that read keeps nothing alive.
register_view("ResizeLike", (0, 0))
register_shape_reads("ResizeLike", 1)


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
                non_differentiable=(1,), family="reshape",
                doc="Y = X with a new shape (a view); old_shape (int64) keeps X's shape for "
                    "the gradient, which reshapes dY back to it.")


# The kernel returns a view of X: the memory plan lets Y share X's lifetime.
register_view("Reshape", (0, 0))


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
