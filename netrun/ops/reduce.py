"""Reductions: ReduceSum, ReduceMean, and their gradients (dY broadcast back over X)."""
from __future__ import annotations

import math

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import SchemaError, ShapeError
from netrun.ops.common import elementwise_cost, fmt, normalize_axis, same_as_input


# ReduceSum, ReduceMean ------------------------------------------------------------------
def _check_reduce(op, args: Args) -> None:
    if len(set(args.axes)) != len(args.axes):
        raise SchemaError(f"op {op.label}: argument 'axes' repeats an axis: {args.axes}")


def _reduce_axes(what: str, args: Args, x: tuple) -> tuple[int, ...]:
    if not args.axes:
        return tuple(range(len(x)))
    axes = tuple(normalize_axis(what, a, len(x), X=x) for a in args.axes)
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
                    check_fn=_check_reduce, family="reduce",
                    doc=f"Y = the {_what} of X over `axes` (all by default).")
    register_schema(f"{_type}Gradient", inputs=2, outputs=1, input_names=("X", "dY"),
                    output_names=("dX",), args=_REDUCE_ARGS, shape_fn=same_as_input(0),
                    cost_fn=elementwise_cost(1), family="reduce",
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
