"""Elementwise math: Abs, Exp, Log, Sqrt, Clip, Scale. Each section: schema, kernel, gradient
maker (the table-driven ones through activation.py's pointwise_op)."""
from __future__ import annotations

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, register_schema
from netrun.errors import SchemaError
from netrun.ops.activation import pointwise_op
from netrun.ops.common import elementwise_cost, same_as_input

# Abs, Exp, Log, Sqrt.
def _abs_grad(xp, X, dY, dX, args, scratch):
    s = scratch()
    xp.sign(X, out=s)
    xp.multiply(dY, s, out=dX)


def _sqrt_grad(xp, Y, dY, dX, args, scratch):
    xp.divide(dY, Y, out=dX)
    dX *= 0.5                   # d sqrt(X)/dX = 1 / (2·Y)


def _abs(xp, X, Y, args, scratch):
    xp.abs(X, out=Y)


def _exp(xp, X, Y, args, scratch):
    xp.exp(X, out=Y)


def _exp_grad(xp, Y, dY, dX, args, scratch):
    xp.multiply(dY, Y, out=dX)


def _log(xp, X, Y, args, scratch):
    xp.log(X, out=Y)


def _log_grad(xp, X, dY, dX, args, scratch):
    xp.divide(dY, X, out=dX)


def _sqrt(xp, X, Y, args, scratch):
    xp.sqrt(X, out=Y)


pointwise_op("Abs", "Y = |X|, elementwise.", _abs, _abs_grad, reads="X",
             grad_doc="dX = dY·sign(X).", family="unary")
pointwise_op("Exp", "Y = exp(X), elementwise.", _exp, _exp_grad, grad_flops=1,
             grad_doc="dX = dY·Y.", family="unary")
pointwise_op("Log", "Y = log(X), elementwise.", _log, _log_grad, reads="X", grad_flops=1,
             grad_doc="dX = dY / X.", family="unary")
pointwise_op("Sqrt", "Y = sqrt(X), elementwise.", _sqrt, _sqrt_grad,
             grad_doc="dX = dY / (2·Y).", family="unary")


# Clip: Y = min(max(X, min), max).
def _clip_grad(xp, Y, dY, dX, args, scratch):
    # Y strictly inside (min, max) exactly where X is; at the bounds the gradient is 0.
    xp.multiply(dY, (Y > args.min) & (Y < args.max), out=dX)


def _check_clip(op, args):
    if args.min > args.max:
        raise SchemaError(f"op {op.label}: argument 'min' ({args.min}) is greater than "
                          f"'max' ({args.max})")


def _clip(xp, X, Y, args, scratch):
    xp.clip(X, args.min, args.max, out=Y)


pointwise_op("Clip", "Y = X limited to [min, max], elementwise.", _clip, _clip_grad, flops=2,
             args=[Arg("min", "float", float("-inf")), Arg("max", "float", float("inf"))],
             check_fn=_check_clip, grad_doc="dX = dY where min < Y < max, else 0.",
             family="unary")


# Scale: Y = scale·X; its gradient is another Scale. ---------------------------------------
register_schema("Scale", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                args=[Arg("scale", "float", 1.0)], inplace=((0, 0),), shape_fn=same_as_input(0),
                cost_fn=elementwise_cost(1), family="unary", doc="Y = scale·X.")


@register_kernel("Scale")
def scale(ctx, X):
    Y = ctx.output(0, X.shape, X.dtype)
    # A Python float is a weak scalar: the product keeps X's dtype.
    ctx.xp.multiply(X, ctx.args.scale, out=Y)


@register_gradient("Scale")
def _scale_grad(g):
    return [g.op("Scale", [g.GO(0)], [g.GI(0)], **g.copy_args("scale"))]
