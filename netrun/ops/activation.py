"""Pointwise activations: Relu, LeakyRelu, PRelu, Elu, Sigmoid, Tanh, Softplus, Abs, Exp, Log,
Sqrt, Clip, Scale. Each section: schema, kernel, gradient maker."""
from __future__ import annotations

import numpy as np

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Cost, get_schema, register_schema
from netrun.errors import SchemaError, ShapeError
from netrun.ops.common import elementwise_cost, fmt, same_as_input

# Relu -----------------------------------------------------------------------------------
register_schema("Relu", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                inplace=((0, 0),), shape_fn=same_as_input(0), cost_fn=elementwise_cost(1),
                family="activation", doc="Y = max(X, 0), elementwise.")


@register_kernel("Relu")
def relu(ctx, X):
    Y = ctx.output(0, X.shape, X.dtype)
    ctx.xp.maximum(X, 0, out=Y)


register_schema("ReluGradient", inputs=2, outputs=1, input_names=("Y", "dY"),
                output_names=("dX",), inplace=((1, 0),), shape_fn=same_as_input(1),
                cost_fn=elementwise_cost(1), family="activation",
                doc="dX = dY where Y > 0, else 0 (uses the output, so Relu may run in place).")


@register_kernel("ReluGradient")
def relu_gradient(ctx, Y, dY):
    dX = ctx.output(0, dY.shape, dY.dtype)
    ctx.xp.multiply(dY, Y > 0, out=dX)


@register_gradient("Relu")
def _relu_grad(g):
    return [g.op("ReluGradient", [g.O(0), g.GO(0)], [g.GI(0)])]


# Unary pointwise ops: one table row each --------------------------------------------------
# A forward fn(xp, X, Y, args, scratch) writes Y (which may be X itself when run in place); a
# backward fn(xp, R, dY, dX, args, scratch) writes dX (which may be dY) from R, the forward
# output ("Y" ops, so the forward may run in place) or input ("X" ops). scratch() returns a
# workspace buffer shaped like X, shared by all ops: it saves an allocation per run.
def _pointwise(type: str, doc: str, forward, backward, reads="Y", flops: int = 1,
               grad_flops: int = 2, args=(), check_fn=None, grad_doc: str = "") -> None:
    """Register `type`, `typeGradient` and the gradient maker of a unary pointwise op.

    `reads` is "Y", "X", or a function of the op's resolved args that returns one of them.
    """
    inplace = ((0, 0),) if reads != "X" else ()
    register_schema(type, inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                    args=args, inplace=inplace, shape_fn=same_as_input(0),
                    cost_fn=elementwise_cost(flops), check_fn=check_fn, family="activation",
                    doc=doc)
    register_schema(f"{type}Gradient", inputs=2, outputs=1,
                    input_names=(reads if isinstance(reads, str) else "R", "dY"),
                    output_names=("dX",), args=args, inplace=((1, 0),),
                    shape_fn=same_as_input(1), cost_fn=elementwise_cost(grad_flops),
                    family="activation", doc=grad_doc or f"Gradient of {type}, from {reads}.")

    @register_kernel(type)
    def kernel(ctx, X):
        Y = ctx.output(0, X.shape, X.dtype)
        forward(ctx.xp, X, Y, ctx.args, lambda: ctx.scratch("pointwise", X.shape, X.dtype))

    @register_kernel(f"{type}Gradient")
    def grad_kernel(ctx, R, dY):
        dX = ctx.output(0, dY.shape, dY.dtype)
        backward(ctx.xp, R, dY, dX, ctx.args, lambda: ctx.scratch("pointwise", R.shape, R.dtype))

    @register_gradient(type)
    def maker(g):
        r = reads(get_schema(type).resolve_args(g.def_)) if callable(reads) else reads
        source = g.O(0) if r == "Y" else g.I(0)
        return [g.op(f"{type}Gradient", [source, g.GO(0)], [g.GI(0)], **g.copy_args())]


# LeakyRelu: Y = X if X > 0 else alpha·X.
def _leaky_relu(xp, X, Y, args, scratch):
    s = scratch()
    xp.multiply(X, args.alpha, out=s)
    # max(X, alpha·X) picks X for X > 0 when alpha <= 1, min(...) when alpha > 1.
    (xp.maximum if args.alpha <= 1 else xp.minimum)(X, s, out=Y)


def _leaky_relu_grad(xp, R, dY, dX, args, scratch):
    # R is Y when alpha >= 0 (Y > 0 exactly where X > 0), else X (_leaky_relu_reads).
    s = scratch()
    xp.greater(R, 0, out=s)
    s *= 1.0 - args.alpha
    s += args.alpha
    xp.multiply(dY, s, out=dX)


def _leaky_relu_reads(args) -> str:
    # A negative alpha flips the sign of Y for X < 0, so the mask must come from X then.
    return "Y" if args.alpha >= 0 else "X"


_pointwise("LeakyRelu", "Y = X where X > 0, alpha·X elsewhere. In place only with alpha >= 0 "
           "(the gradient then reads Y).", _leaky_relu, _leaky_relu_grad,
           reads=_leaky_relu_reads, flops=2, grad_flops=3,
           args=[Arg("alpha", "float", 0.01, doc="slope for X <= 0")],
           grad_doc="dX = dY where Y > 0 (X > 0 when alpha < 0), alpha·dY elsewhere.")


# Elu: Y = X if X > 0 else alpha·(exp(X) - 1).
def _elu(xp, X, Y, args, scratch):
    s = scratch()
    xp.minimum(X, 0, out=s)
    xp.expm1(s, out=s)          # expm1 keeps precision for X near 0
    s *= args.alpha
    xp.maximum(X, 0, out=Y)     # X may be Y: its negative part is already in s
    Y += s


def _elu_grad(xp, Y, dY, dX, args, scratch):
    # For X <= 0, dY/dX = alpha·exp(X) = Y + alpha.
    s = scratch()
    xp.add(Y, args.alpha, out=s)
    xp.copyto(s, 1, where=Y > 0)
    xp.multiply(dY, s, out=dX)


def _check_elu(op, args):
    if args.alpha < 0:
        raise SchemaError(f"op {op.label}: argument 'alpha' is {args.alpha}; it must be >= 0 "
                          f"(the gradient recovers the sign of X from Y)")


_pointwise("Elu", "Y = X where X > 0, alpha·(exp(X) - 1) elsewhere.", _elu, _elu_grad,
           flops=3, grad_flops=3, args=[Arg("alpha", "float", 1.0)], check_fn=_check_elu,
           grad_doc="dX = dY where Y > 0, dY·(Y + alpha) elsewhere.")


# Sigmoid: Y = 1 / (1 + exp(-X)).
def _sigmoid(xp, X, Y, args, scratch):
    # exp(-softplus(-X)) never overflows and keeps relative precision for very negative X.
    xp.negative(X, out=Y)
    xp.logaddexp(Y, 0, out=Y)
    xp.negative(Y, out=Y)
    xp.exp(Y, out=Y)


def _sigmoid_grad(xp, Y, dY, dX, args, scratch):
    s = scratch()
    xp.subtract(1, Y, out=s)
    s *= Y
    xp.multiply(dY, s, out=dX)      # dX = dY·Y·(1 - Y)


_pointwise("Sigmoid", "Y = 1 / (1 + exp(-X)), elementwise.", _sigmoid, _sigmoid_grad,
           flops=4, grad_flops=3, grad_doc="dX = dY·Y·(1 - Y).")


# Tanh.
def _tanh(xp, X, Y, args, scratch):
    xp.tanh(X, out=Y)


def _tanh_grad(xp, Y, dY, dX, args, scratch):
    s = scratch()
    xp.multiply(Y, Y, out=s)
    xp.subtract(1, s, out=s)
    xp.multiply(dY, s, out=dX)      # dX = dY·(1 - Y²)


_pointwise("Tanh", "Y = tanh(X), elementwise.", _tanh, _tanh_grad, grad_flops=3,
           grad_doc="dX = dY·(1 - Y²).")


# Softplus: Y = log(1 + exp(X)).
def _softplus(xp, X, Y, args, scratch):
    xp.logaddexp(X, 0, out=Y)   # log(exp(X) + exp(0)) without overflow


def _softplus_grad(xp, Y, dY, dX, args, scratch):
    # sigmoid(X) = 1 - exp(-Y); -expm1(-Y) keeps precision where Y is tiny (X very negative).
    s = scratch()
    xp.negative(Y, out=s)
    xp.expm1(s, out=s)
    xp.negative(s, out=s)
    xp.multiply(dY, s, out=dX)


_pointwise("Softplus", "Y = log(1 + exp(X)), elementwise.", _softplus, _softplus_grad,
           flops=3, grad_flops=3, grad_doc="dX = dY·sigmoid(X) = dY·(1 - exp(-Y)).")


# Abs, Exp, Log, Sqrt.
def _abs_grad(xp, X, dY, dX, args, scratch):
    s = scratch()
    xp.sign(X, out=s)
    xp.multiply(dY, s, out=dX)


def _sqrt_grad(xp, Y, dY, dX, args, scratch):
    xp.divide(dY, Y, out=dX)
    dX *= 0.5                   # d sqrt(X)/dX = 1 / (2·Y)


_pointwise("Abs", "Y = |X|, elementwise.", lambda xp, X, Y, a, scratch: xp.abs(X, out=Y), _abs_grad,
           reads="X", grad_doc="dX = dY·sign(X).")
_pointwise("Exp", "Y = exp(X), elementwise.", lambda xp, X, Y, a, scratch: xp.exp(X, out=Y),
           lambda xp, Y, dY, dX, a, scratch: xp.multiply(dY, Y, out=dX), grad_flops=1,
           grad_doc="dX = dY·Y.")
_pointwise("Log", "Y = log(X), elementwise.", lambda xp, X, Y, a, scratch: xp.log(X, out=Y),
           lambda xp, X, dY, dX, a, scratch: xp.divide(dY, X, out=dX), reads="X", grad_flops=1,
           grad_doc="dX = dY / X.")
_pointwise("Sqrt", "Y = sqrt(X), elementwise.", lambda xp, X, Y, a, scratch: xp.sqrt(X, out=Y),
           _sqrt_grad, grad_doc="dX = dY / (2·Y).")


# Clip: Y = min(max(X, min), max).
def _clip_grad(xp, Y, dY, dX, args, scratch):
    # Y strictly inside (min, max) exactly where X is; at the bounds the gradient is 0.
    xp.multiply(dY, (Y > args.min) & (Y < args.max), out=dX)


def _check_clip(op, args):
    if args.min > args.max:
        raise SchemaError(f"op {op.label}: argument 'min' ({args.min}) is greater than "
                          f"'max' ({args.max})")


_pointwise("Clip", "Y = X limited to [min, max], elementwise.",
           lambda xp, X, Y, a, scratch: xp.clip(X, a.min, a.max, out=Y), _clip_grad,
           flops=2, args=[Arg("min", "float", float("-inf")), Arg("max", "float", float("inf"))],
           check_fn=_check_clip, grad_doc="dX = dY where min < Y < max, else 0.")


# Scale: Y = scale·X; its gradient is another Scale. ---------------------------------------
register_schema("Scale", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                args=[Arg("scale", "float", 1.0)], inplace=((0, 0),), shape_fn=same_as_input(0),
                cost_fn=elementwise_cost(1), family="activation", doc="Y = scale·X.")


@register_kernel("Scale")
def scale(ctx, X):
    Y = ctx.output(0, X.shape, X.dtype)
    # A Python float is a weak scalar: the product keeps X's dtype.
    ctx.xp.multiply(X, ctx.args.scale, out=Y)


@register_gradient("Scale")
def _scale_grad(g):
    return [g.op("Scale", [g.GO(0)], [g.GI(0)], **g.copy_args("scale"))]


# PRelu: Y = X if X > 0 else slope·X, one slope per channel or one shared. -----------------
def _prelu_slope_view(what: str, x_shape, s_shape, order: str):
    """Shape that broadcasts the slope over X: (1, C, 1, 1) for NCHW, all 1s for a shared one."""
    size = int(np.prod(s_shape, dtype=np.int64))
    if size == 1:
        return (1,) * len(x_shape)
    axis = 1 if order == "NCHW" else len(x_shape) - 1
    if len(x_shape) < 2 or size != x_shape[axis]:
        c = x_shape[axis] if len(x_shape) >= 2 else "no"
        raise ShapeError(f"{what}: X has {c} channels but slope has {size} values (one per "
                         f"channel, or 1 shared): X {fmt(x_shape)}, slope {fmt(s_shape)}")
    return tuple(size if i == axis else 1 for i in range(len(x_shape)))


def _prelu_shape(args, ins):
    _prelu_slope_view("PRelu", ins[0].shape, ins[1].shape, args.order)
    return [ins[0]]


_ORDER = Arg("order", "str", "NCHW", ("NCHW", "NHWC"), "where the channel axis is")
register_schema("PRelu", inputs=2, outputs=1, input_names=("X", "slope"), output_names=("Y",),
                args=[_ORDER], shape_fn=_prelu_shape, cost_fn=elementwise_cost(2),
                family="activation",
                doc="Y = X where X > 0, slope·X elsewhere; slope has one value per channel "
                    "(axis 1 in NCHW) or a single shared value.")


@register_kernel("PRelu")
def prelu(ctx, X, slope):
    xp = ctx.xp
    view = slope.reshape(_prelu_slope_view("PRelu", X.shape, slope.shape, ctx.args.order))
    Y = ctx.output(0, X.shape, X.dtype)
    s = ctx.scratch("pointwise", X.shape, X.dtype)
    xp.minimum(X, 0, out=s)
    s *= view
    xp.maximum(X, 0, out=Y)
    Y += s                      # max(X, 0) + slope·min(X, 0)


def _prelu_grad_shape(args, ins):
    return [ins[0], ins[1]]


def _prelu_grad_cost(args, ins, outs):
    return Cost(4 * ins[0].size, sum(i.nbytes for i in ins), sum(o.nbytes for o in outs))


register_schema("PReluGradient", inputs=3, outputs=2, input_names=("X", "slope", "dY"),
                output_names=("dX", "dslope"), args=[_ORDER], shape_fn=_prelu_grad_shape,
                cost_fn=_prelu_grad_cost, family="activation",
                doc="dX = dY where X > 0, slope·dY elsewhere; dslope = sum of dY·X over X <= 0, "
                    "per channel.")


@register_kernel("PReluGradient")
def prelu_gradient(ctx, X, slope, dY):
    xp = ctx.xp
    shape = _prelu_slope_view("PRelu", X.shape, slope.shape, ctx.args.order)
    view = slope.reshape(shape)
    s = ctx.scratch("pointwise", X.shape, X.dtype)
    # dslope = Σ dY·min(X, 0) over every axis but the channel axis.
    xp.minimum(X, 0, out=s)
    s *= dY
    dslope = ctx.output(1, slope.shape, slope.dtype)
    axes = tuple(i for i, d in enumerate(shape) if d == 1)
    xp.sum(s, axis=axes, keepdims=True, out=dslope.reshape(shape))
    dX = ctx.output(0, X.shape, X.dtype)
    xp.greater(X, 0, out=s)     # 1 where X > 0
    xp.multiply(s, 1 - view, out=s)
    s += view                   # 1 where X > 0, slope elsewhere
    xp.multiply(dY, s, out=dX)


@register_gradient("PRelu")
def _prelu_grad(g):
    return [g.op("PReluGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)],
                 **g.copy_args())]
