"""Softmax family: Softmax, LogSoftmax, SoftmaxWithLoss. Each section: schema, kernel,
gradient maker, and the gradient op's schema and kernel."""
from __future__ import annotations

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, TensorSpec, register_schema
from netrun.errors import ShapeError
from netrun.ops.common import elementwise_cost, input_cost, same_as_input
from netrun.ops.labels import NO_IGNORE, check_labels, coerce_2d, label_index


def _softmax_2d(ctx, X2, out, log: bool):
    """Row-wise (log-)softmax of X2 (N, D) into out; returns the row max and Σ exp(X − max).

    Subtracting the row max first keeps exp() from overflowing.
    """
    xp = ctx.xp
    m = X2.max(axis=1, keepdims=True)
    xp.subtract(X2, m, out=out)
    if log:
        e = ctx.scratch("loss.tmp", out.shape, out.dtype)
        xp.exp(out, out=e)
        s = e.sum(axis=1, keepdims=True)
        out -= xp.log(s)
    else:
        xp.exp(out, out=out)
        s = out.sum(axis=1, keepdims=True)
        out /= s
    return m, s


AXIS = Arg("axis", "int", 1, doc="first axis of the class dimension; X is seen as N×D there")


def _softmax_shape(type_: str):
    def fn(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
        coerce_2d(type_, ins[0], args.axis)
        return [ins[0]]

    return fn


# Softmax, LogSoftmax ---------------------------------------------------------------------
for _type, _log in (("Softmax", False), ("LogSoftmax", True)):
    register_schema(_type, inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                    args=[AXIS], inplace=((0, 0),), shape_fn=_softmax_shape(_type),
                    cost_fn=elementwise_cost(5), family="softmax",
                    doc=f"{'log(softmax(X))' if _log else 'softmax(X)'} over the axes from "
                        f"`axis` on (X coerced to N×D as in Caffe2), numerically stable.")
    register_schema(f"{_type}Gradient", inputs=2, outputs=1, input_names=("Y", "dY"),
                    output_names=("dX",), args=[AXIS], inplace=((1, 0),),
                    shape_fn=same_as_input(1), cost_fn=elementwise_cost(4), family="softmax",
                    doc=f"Gradient of {_type} from its output Y and dY.")


@register_kernel("Softmax")
def softmax(ctx, X):
    n, d = coerce_2d("Softmax", TensorSpec(X.shape), ctx.args.axis)
    Y = ctx.output(0, X.shape, X.dtype)
    _softmax_2d(ctx, X.reshape(n, d), Y.reshape(n, d), log=False)


@register_kernel("LogSoftmax")
def log_softmax(ctx, X):
    n, d = coerce_2d("LogSoftmax", TensorSpec(X.shape), ctx.args.axis)
    Y = ctx.output(0, X.shape, X.dtype)
    _softmax_2d(ctx, X.reshape(n, d), Y.reshape(n, d), log=True)


@register_kernel("SoftmaxGradient")
def softmax_gradient(ctx, Y, dY):
    # dX = Y * (dY - sum_j dY_j Y_j), row-wise; the row sum is taken before dX is written,
    # so dX may share dY's buffer.
    xp = ctx.xp
    n, d = coerce_2d("SoftmaxGradient", TensorSpec(Y.shape), ctx.args.axis)
    Y2, dY2 = Y.reshape(n, d), dY.reshape(n, d)
    tmp = ctx.scratch("loss.tmp", (n, d), Y.dtype)
    xp.multiply(dY2, Y2, out=tmp)
    s = tmp.sum(axis=1, keepdims=True)
    dX = ctx.output(0, Y.shape, Y.dtype)
    dX2 = dX.reshape(n, d)
    xp.subtract(dY2, s, out=dX2)
    dX2 *= Y2


@register_kernel("LogSoftmaxGradient")
def log_softmax_gradient(ctx, Y, dY):
    # dX = dY - exp(Y) * sum_j dY_j, row-wise.
    xp = ctx.xp
    n, d = coerce_2d("LogSoftmaxGradient", TensorSpec(Y.shape), ctx.args.axis)
    Y2, dY2 = Y.reshape(n, d), dY.reshape(n, d)
    s = dY2.sum(axis=1, keepdims=True)
    tmp = ctx.scratch("loss.tmp", (n, d), Y.dtype)
    xp.exp(Y2, out=tmp)
    tmp *= s
    dX = ctx.output(0, Y.shape, Y.dtype)
    xp.subtract(dY2, tmp, out=dX.reshape(n, d))


@register_gradient("Softmax")
def _softmax_grad(g):
    return [g.op("SoftmaxGradient", [g.O(0), g.GO(0)], [g.GI(0)], **g.copy_args("axis"))]


@register_gradient("LogSoftmax")
def _log_softmax_grad(g):
    return [g.op("LogSoftmaxGradient", [g.O(0), g.GO(0)], [g.GI(0)], **g.copy_args("axis"))]


# SoftmaxWithLoss -------------------------------------------------------------------------
_SWL_ARGS = [AXIS,
             Arg("scale", "float", 1.0, doc="multiplies the loss (and so its gradient)"),
             Arg("ignore_label", "int", NO_IGNORE,
                 doc="examples with this label count for nothing; -1: none ignored")]


def _swl_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x, labels = ins[0], ins[1]
    n, _ = coerce_2d("SoftmaxWithLoss", x, args.axis)
    check_labels("SoftmaxWithLoss", n, labels, x)
    if len(ins) == 3 and ins[2].size != n:
        raise ShapeError(f"SoftmaxWithLoss: weights have {ins[2].size} entries but X has {n} "
                         f"examples: X {x}, weights {ins[2]}")
    return [x, TensorSpec((), x.dtype)]


register_schema(
    "SoftmaxWithLoss", inputs=(2, 3), outputs=2, input_names=("X", "labels", "weights"),
    output_names=("P", "loss"), args=_SWL_ARGS, shape_fn=_swl_shape, cost_fn=input_cost(6),
    non_differentiable=(1, 2), family="softmax",
    doc="P = softmax(X); loss = scale · Σ w_i·(−log P_i[label_i]) / Σ w_i over examples whose "
        "label is not ignore_label (Caffe's VALID normalization; w_i = 1 without weights; "
        "0 when nothing counts). As in Caffe2, no gradient flows back through P: use Softmax "
        "and LabelCrossEntropy when P feeds a differentiable op.")


def _example_weights(weights, valid, n: int, dtype):
    """Per-example weights (N,) with ignored rows zeroed, or None when all weigh 1."""
    w = None if weights is None else weights.reshape(n).astype(dtype, copy=False)
    if valid is not None:
        w = valid.astype(dtype) if w is None else w * valid
    return w


def _normalizer(xp, w, n: int):
    """Σ w over counted rows, or 1 when nothing counts (the loss is then 0, not NaN)."""
    if w is None:
        return n
    total = w.sum()
    return xp.where(total > 0, total, xp.ones_like(total))


@register_kernel("SoftmaxWithLoss")
def softmax_with_loss(ctx, X, labels, weights=None):
    xp, a = ctx.xp, ctx.args
    n, d = coerce_2d("SoftmaxWithLoss", TensorSpec(X.shape), a.axis)
    lab, valid = label_index(ctx, labels, n, d, a.ignore_label)
    X2 = X.reshape(n, d)
    P = ctx.output(0, X.shape, X.dtype)
    m, s = _softmax_2d(ctx, X2, P.reshape(n, d), log=False)
    # -log P[label] = log Σ exp(X − max) + max − X[label]: finite even where P underflows.
    picked = xp.take_along_axis(X2, lab[:, None], axis=1)
    nll = (xp.log(s) + m - picked)[:, 0]
    w = _example_weights(weights, valid, n, X.dtype)
    total = nll.sum() if w is None else (w * nll).sum()
    loss = ctx.output(1, (), X.dtype)
    loss[...] = a.scale * total / _normalizer(xp, w, n)


register_schema(
    "SoftmaxWithLossGradient", inputs=(3, 4), outputs=1,
    input_names=("P", "labels", "weights", "dloss"), output_names=("dX",), args=_SWL_ARGS,
    shape_fn=same_as_input(0), cost_fn=input_cost(3), family="softmax",
    doc="dX = scale · dloss · w_i (P − onehot(label)) / Σ w; inputs (P, labels, [weights], dloss).")


@register_kernel("SoftmaxWithLossGradient")
def softmax_with_loss_gradient(ctx, P, labels, *rest):
    xp, a = ctx.xp, ctx.args
    weights, dloss = rest if len(rest) == 2 else (None, rest[0])
    n, d = coerce_2d("SoftmaxWithLossGradient", TensorSpec(P.shape), a.axis)
    lab, valid = label_index(ctx, labels, n, d, a.ignore_label)
    dX = ctx.output(0, P.shape, P.dtype)
    dX2 = dX.reshape(n, d)
    xp.copyto(dX2, P.reshape(n, d))
    dX2[xp.arange(n), lab] -= 1
    w = _example_weights(weights, valid, n, P.dtype)
    coef = (a.scale * dloss / _normalizer(xp, w, n)).astype(P.dtype)
    dX2 *= coef if w is None else (w * coef)[:, None]


@register_gradient("SoftmaxWithLoss")
def _softmax_with_loss_grad(g):
    weights = [g.I(2)] if len(g.def_.inputs) == 3 else []
    return [g.op("SoftmaxWithLossGradient", [g.O(0), g.I(1), *weights, g.GO(1)], [g.GI(0)],
                 **g.copy_args())]
