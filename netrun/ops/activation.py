"""Activations: Relu, LeakyRelu, PRelu, Elu, Sigmoid, Tanh, Softplus, HardSigmoid. Each
section: schema, kernel, gradient maker (and a GPU kernel where array code would be slow). Elementwise math (Abs, Exp, Log, Sqrt, Clip, Scale) is in unary.py,
built with the same pointwise_op helper."""
from __future__ import annotations

import numpy as np

from netrun.backends.cuda.source import (
    REALS,
    KernelSource,
    contiguous,
    i64,
    instances,
    launch,
    real,
)
from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Cost, get_schema, register_schema
from netrun.errors import SchemaError, ShapeError
from netrun.kernels import relu as relu_kernels
from netrun.ops.common import elementwise_cost, fmt, same_as_input

# Relu -----------------------------------------------------------------------------------
register_schema("Relu", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                inplace=((0, 0),), shape_fn=same_as_input(0), cost_fn=elementwise_cost(1),
                family="activation", doc="Y = max(X, 0), elementwise.")


@register_kernel("Relu")
def relu(ctx, X):
    Y = ctx.output(0, X.shape, X.dtype)
    relu_kernels.relu(ctx.xp, X, Y)   # compiled and threaded where the engine is there


register_schema("ReluGradient", inputs=2, outputs=1, input_names=("Y", "dY"),
                output_names=("dX",), inplace=((1, 0),), shape_fn=same_as_input(1),
                cost_fn=elementwise_cost(1), family="activation",
                doc="dX = dY where Y > 0, else 0 (uses the output, so Relu may run in place).")


@register_kernel("ReluGradient")
def relu_gradient(ctx, Y, dY):
    dX = ctx.output(0, dY.shape, dY.dtype)
    relu_kernels.relu_gradient(ctx.xp, Y, dY, dX)   # one pass (NumPy: a mask, a product)


@register_gradient("Relu")
def _relu_grad(g):
    return [g.op("ReluGradient", [g.O(0), g.GO(0)], [g.GI(0)])]


# Unary pointwise ops: one table row each --------------------------------------------------
# A forward fn(xp, X, Y, args, scratch) writes Y (which may be X itself when run in place); a
# backward fn(xp, R, dY, dX, args, scratch) writes dX (which may be dY) from R, the forward
# output ("Y" ops, so the forward may run in place) or input ("X" ops). scratch() returns a
# workspace buffer shaped like X, shared by all ops: it saves an allocation per run.
def pointwise_op(type: str, doc: str, forward, backward, reads="Y", flops: int = 1,
                 grad_flops: int = 2, args=(), check_fn=None, grad_doc: str = "",
                 family: str = "activation") -> None:
    """Register `type`, `typeGradient` and the gradient maker of a unary pointwise op.

    `reads` is "Y", "X", or a function of the op's resolved args that returns one of them.
    """
    inplace = ((0, 0),) if reads != "X" else ()
    register_schema(type, inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                    args=args, inplace=inplace, shape_fn=same_as_input(0),
                    cost_fn=elementwise_cost(flops), check_fn=check_fn, family=family,
                    doc=doc)
    register_schema(f"{type}Gradient", inputs=2, outputs=1,
                    input_names=(reads if isinstance(reads, str) else "R", "dY"),
                    output_names=("dX",), args=args, inplace=((1, 0),),
                    shape_fn=same_as_input(1), cost_fn=elementwise_cost(grad_flops),
                    family=family, doc=grad_doc or f"Gradient of {type}, from {reads}.")

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


pointwise_op("LeakyRelu", "Y = X where X > 0, alpha·X elsewhere. In place only with alpha >= 0 "
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


pointwise_op("Elu", "Y = X where X > 0, alpha·(exp(X) - 1) elsewhere.", _elu, _elu_grad,
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


pointwise_op("Sigmoid", "Y = 1 / (1 + exp(-X)), elementwise.", _sigmoid, _sigmoid_grad,
             flops=4, grad_flops=3, grad_doc="dX = dY·Y·(1 - Y).")


# Tanh.
def _tanh(xp, X, Y, args, scratch):
    xp.tanh(X, out=Y)


def _tanh_grad(xp, Y, dY, dX, args, scratch):
    s = scratch()
    xp.multiply(Y, Y, out=s)
    xp.subtract(1, s, out=s)
    xp.multiply(dY, s, out=dX)      # dX = dY·(1 - Y²)


pointwise_op("Tanh", "Y = tanh(X), elementwise.", _tanh, _tanh_grad, grad_flops=3,
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


pointwise_op("Softplus", "Y = log(1 + exp(X)), elementwise.", _softplus, _softplus_grad,
             flops=3, grad_flops=3, grad_doc="dX = dY·sigmoid(X) = dY·(1 - exp(-Y)).")


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


# HardSigmoid: Y = clip(alpha·X + beta, 0, 1) (Caffe2's and ONNX's defaults) ---------------
def _hard_sigmoid(xp, X, Y, args, scratch):
    xp.multiply(X, args.alpha, out=Y)       # Y may be X (in place): X is read first
    Y += args.beta
    xp.clip(Y, 0, 1, out=Y)                 # NaN stays NaN


def _hard_sigmoid_grad(xp, Y, dY, dX, args, scratch):
    # The slope is alpha where 0 < Y < 1, i.e. where Y·(1 - Y) > 0 (exactly, for every real
    # Y: no second mask buffer); 0 on the clipped parts.
    s = scratch()
    xp.subtract(1, Y, out=s)
    s *= Y
    xp.greater(s, 0, out=s)
    xp.multiply(dY, args.alpha, out=dX)     # dX may be dY
    dX *= s


pointwise_op("HardSigmoid", "Y = max(0, min(1, alpha·X + beta)), elementwise.", _hard_sigmoid,
             _hard_sigmoid_grad, flops=3, grad_flops=4,
             args=[Arg("alpha", "float", 0.2, doc="slope"), Arg("beta", "float", 0.5, doc="offset")],
             grad_doc="dX = alpha·dY where 0 < Y < 1, else 0.")

# On a GPU one pass each way instead of three NumPy-style ones; the same operations in the
# same order (no fused multiply-add), so the bits match the CPU's.
HARD_SIGMOID_CUDA = KernelSource("hard_sigmoid", r"""
template <typename T>
__global__ void hard_sigmoid(const T* x, T* y, long long n, T alpha, T beta) {
  KERNEL_LOOP(i, n) {
    T v = x[i] * alpha + beta;
    y[i] = v < (T)0 ? (T)0 : (v > (T)1 ? (T)1 : v);   // comparisons keep NaN
  }
}

template <typename T>
__global__ void hard_sigmoid_gradient(const T* y, const T* dy, T* dx, long long n, T alpha) {
  KERNEL_LOOP(i, n) {
    T inside = (y[i] > (T)0 && y[i] < (T)1) ? (T)1 : (T)0;
    dx[i] = dy[i] * alpha * inside;                  // NaN·0 stays NaN, as on the CPU
  }
}
""", instances("hard_sigmoid", REALS) + instances("hard_sigmoid_gradient", REALS))


@register_kernel("HardSigmoid", backend="gpu")
def hard_sigmoid_gpu(ctx, X):
    """Y = clip(alpha·X + beta, 0, 1) in one kernel."""
    x, a = contiguous(ctx.xp, X), ctx.args
    Y = ctx.output(0, X.shape, X.dtype)
    launch(HARD_SIGMOID_CUDA.function(ctx.xp, "hard_sigmoid", X.dtype), X.size,
           (x, Y, i64(X.size), real(X.dtype, a.alpha), real(X.dtype, a.beta)))


@register_kernel("HardSigmoidGradient", backend="gpu")
def hard_sigmoid_gradient_gpu(ctx, Y, dY):
    """dX = alpha·dY where 0 < Y < 1, in one kernel."""
    xp = ctx.xp
    y, dy = contiguous(xp, Y), contiguous(xp, dY)
    dX = ctx.output(0, dY.shape, dY.dtype)
    launch(HARD_SIGMOID_CUDA.function(xp, "hard_sigmoid_gradient", dY.dtype), dY.size,
           (y, dy, dX, i64(dY.size), real(dY.dtype, ctx.args.alpha)))
