"""Softmax and losses: Softmax, LogSoftmax, SoftmaxWithLoss, LabelCrossEntropy,
SigmoidCrossEntropyWithLogits, SquaredL2Distance, AveragedLoss. Each section: schema, kernel,
gradient maker, and the gradient op's schema and kernel."""
from __future__ import annotations

import math

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import NetrunError, ShapeError
from netrun.ops.common import elementwise_cost, require_same_shape, same_as_input

# Probabilities are clamped here before log(), as Caffe2's kLOG_THRESHOLD does, so a zero
# probability gives a large finite loss instead of inf.
LOG_THRESHOLD = 1e-20
NO_IGNORE = -1  # ignore_label's default: every label counts


def input_cost(flops_per_element: int):
    """Cost function: `flops_per_element` per element of input 0; all inputs and outputs moved."""

    def fn(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
        return Cost(flops_per_element * ins[0].size, sum(i.nbytes for i in ins),
                    sum(o.nbytes for o in outs))

    return fn


def coerce_2d(what: str, x: TensorSpec, axis: int) -> tuple[int, int]:
    """(N, D) of X flattened to 2-D at `axis`, as Caffe2's softmax family coerces its input."""
    nd = len(x.shape)
    a = axis + nd if axis < 0 else axis
    if not 0 <= a < nd:
        raise ShapeError(f"{what}: axis {axis} is out of range for X {x} ({nd} axes)")
    return math.prod(x.shape[:a]), math.prod(x.shape[a:])


def check_labels(what: str, n: int, labels: TensorSpec, x: TensorSpec) -> None:
    """Raise a ShapeError unless `labels` holds one integer per example of X."""
    if labels.size != n or len(labels.shape) > 2:
        raise ShapeError(f"{what}: labels have {labels.size} entries but X has {n} examples: "
                         f"X {x}, labels {labels}")


def label_index(ctx, labels, n: int, d: int, ignore_label: int = NO_IGNORE):
    """Labels as an (N,) index safe for gathering, and a bool mask of counted rows (or None).

    A label outside [0, D) that is not ignored raises: NumPy would wrap negative ones
    silently. (On a GPU this check waits for the device once per run.)
    """
    xp = ctx.xp
    lab = labels.reshape(n)
    if lab.dtype.kind not in "iu":
        lab = lab.astype(xp.int64)  # Caffe data layers write labels as floats
    valid = None if ignore_label == NO_IGNORE else lab != ignore_label
    bad = (lab < 0) | (lab >= d)
    if valid is not None:
        bad &= valid
    if bool(bad.any()):
        first = int(lab[bad][0])
        raise NetrunError(f"op {ctx.def_.label}: label {first} is outside [0, {d}) "
                          f"(X has {d} classes)")
    if valid is not None:
        lab = xp.where(valid, lab, 0)
    return lab, valid


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
                    cost_fn=elementwise_cost(5), family="loss",
                    doc=f"{'log(softmax(X))' if _log else 'softmax(X)'} over the axes from "
                        f"`axis` on (X coerced to N×D as in Caffe2), numerically stable.")
    register_schema(f"{_type}Gradient", inputs=2, outputs=1, input_names=("Y", "dY"),
                    output_names=("dX",), args=[AXIS], inplace=((1, 0),),
                    shape_fn=same_as_input(1), cost_fn=elementwise_cost(4), family="loss",
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
    non_differentiable=(1, 2), family="loss",
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
    shape_fn=same_as_input(0), cost_fn=input_cost(3), family="loss",
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


# LabelCrossEntropy -----------------------------------------------------------------------
def _lce_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0]
    if len(x.shape) != 2:
        raise ShapeError(f"LabelCrossEntropy: X must be N×D probabilities, got X {x}")
    check_labels("LabelCrossEntropy", x.shape[0], ins[1], x)
    return [TensorSpec((x.shape[0],), x.dtype)]


register_schema("LabelCrossEntropy", inputs=2, outputs=1, input_names=("X", "labels"),
                output_names=("Y",), shape_fn=_lce_shape, cost_fn=input_cost(1),
                non_differentiable=(1,), family="loss",
                doc="Y_i = −log(max(X_i[label_i], 1e-20)) for probabilities X (N×D).")
register_schema("LabelCrossEntropyGradient", inputs=3, outputs=1,
                input_names=("X", "labels", "dY"), output_names=("dX",),
                shape_fn=same_as_input(0), cost_fn=input_cost(1), family="loss",
                doc="dX_i[label_i] = −dY_i / max(X_i[label_i], 1e-20), zero elsewhere.")


def _picked_probability(ctx, X, labels):
    n, d = X.shape
    lab, _ = label_index(ctx, labels, n, d)
    p = ctx.xp.take_along_axis(X, lab[:, None], axis=1)[:, 0]
    return lab, ctx.xp.maximum(p, LOG_THRESHOLD)


@register_kernel("LabelCrossEntropy")
def label_cross_entropy(ctx, X, labels):
    _, p = _picked_probability(ctx, X, labels)
    Y = ctx.output(0, (X.shape[0],), X.dtype)
    ctx.xp.log(p, out=Y)
    ctx.xp.negative(Y, out=Y)


@register_kernel("LabelCrossEntropyGradient")
def label_cross_entropy_gradient(ctx, X, labels, dY):
    lab, p = _picked_probability(ctx, X, labels)
    dX = ctx.output(0, X.shape, X.dtype)
    dX.fill(0)
    dX[ctx.xp.arange(X.shape[0]), lab] = -dY / p


@register_gradient("LabelCrossEntropy")
def _label_cross_entropy_grad(g):
    return [g.op("LabelCrossEntropyGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])]


# SigmoidCrossEntropyWithLogits ------------------------------------------------------------
def _sce_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    require_same_shape("SigmoidCrossEntropyWithLogits", ("logits", "targets"), ins[0], ins[1])
    return [TensorSpec(ins[0].shape[:-1], ins[0].dtype)]


register_schema(
    "SigmoidCrossEntropyWithLogits", inputs=2, outputs=1, input_names=("logits", "targets"),
    output_names=("Y",), shape_fn=_sce_shape, cost_fn=input_cost(7), non_differentiable=(1,),
    family="loss",
    doc="Y = mean over the last axis of max(x,0) − x·t + log(1 + exp(−|x|)): binary cross "
        "entropy of sigmoid(x) against targets t, without overflow for large |x|.")
register_schema(
    "SigmoidCrossEntropyWithLogitsGradient", inputs=3, outputs=1,
    input_names=("logits", "targets", "dY"), output_names=("dX",), shape_fn=same_as_input(0),
    cost_fn=input_cost(6), family="loss", doc="dX = (sigmoid(x) − t) · dY / D.")


@register_kernel("SigmoidCrossEntropyWithLogits")
def sigmoid_cross_entropy_with_logits(ctx, X, T):
    xp = ctx.xp
    e = ctx.scratch("loss.tmp", X.shape, X.dtype)
    xp.abs(X, out=e)
    xp.negative(e, out=e)
    xp.exp(e, out=e)
    xp.log1p(e, out=e)                       # log(1 + exp(-|x|)) never overflows
    e += xp.maximum(X, 0)
    e -= X * T
    Y = ctx.output(0, X.shape[:-1], X.dtype)
    xp.mean(e, axis=-1, out=Y)


@register_kernel("SigmoidCrossEntropyWithLogitsGradient")
def sigmoid_cross_entropy_with_logits_gradient(ctx, X, T, dY):
    xp = ctx.xp
    dX = ctx.output(0, X.shape, X.dtype)
    # sigmoid(x) = (1 + tanh(x/2)) / 2: no exp() to overflow for either sign of x.
    xp.multiply(X, 0.5, out=dX)
    xp.tanh(dX, out=dX)
    dX *= 0.5
    dX += 0.5
    dX -= T
    dX *= dY[..., None] / X.shape[-1]


@register_gradient("SigmoidCrossEntropyWithLogits")
def _sigmoid_cross_entropy_grad(g):
    return [g.op("SigmoidCrossEntropyWithLogitsGradient", [g.I(0), g.I(1), g.GO(0)],
                 [g.GI(0)])]


# SquaredL2Distance -----------------------------------------------------------------------
def _l2_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    require_same_shape("SquaredL2Distance", ("X", "Y"), ins[0], ins[1])
    if not ins[0].shape:
        raise ShapeError(f"SquaredL2Distance: X must have an example axis, got X {ins[0]}")
    return [TensorSpec((ins[0].shape[0],), ins[0].dtype)]


register_schema("SquaredL2Distance", inputs=2, outputs=1, input_names=("X", "Y"),
                output_names=("dist",), shape_fn=_l2_shape, cost_fn=input_cost(3),
                family="loss", doc="dist_i = ½·‖X_i − Y_i‖² over all axes but the first.")
register_schema("SquaredL2DistanceGradient", inputs=3, outputs=2,
                input_names=("X", "Y", "ddist"), output_names=("dX", "dY"),
                shape_fn=lambda args, ins: [ins[0], ins[1]], cost_fn=input_cost(3),
                family="loss", doc="dX = (X − Y)·ddist_i, dY = −dX.")


@register_kernel("SquaredL2Distance")
def squared_l2_distance(ctx, X, Y):
    xp = ctx.xp
    n = X.shape[0]
    diff = ctx.scratch("loss.tmp", (n, X.size // max(n, 1)), X.dtype)  # (N, D)
    xp.subtract(X.reshape(diff.shape), Y.reshape(diff.shape), out=diff)
    diff *= diff
    dist = ctx.output(0, (n,), X.dtype)
    xp.sum(diff, axis=1, out=dist)
    dist *= 0.5


@register_kernel("SquaredL2DistanceGradient")
def squared_l2_distance_gradient(ctx, X, Y, ddist):
    xp = ctx.xp
    dX = ctx.output(0, X.shape, X.dtype)
    xp.subtract(X, Y, out=dX)
    dX *= ddist.reshape((-1,) + (1,) * (X.ndim - 1))
    xp.negative(dX, out=ctx.output(1, Y.shape, Y.dtype))


@register_gradient("SquaredL2Distance")
def _squared_l2_distance_grad(g):
    return [g.op("SquaredL2DistanceGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)])]


# AveragedLoss ----------------------------------------------------------------------------
register_schema("AveragedLoss", inputs=1, outputs=1, input_names=("X",), output_names=("loss",),
                shape_fn=lambda args, ins: [TensorSpec((), ins[0].dtype)],
                cost_fn=input_cost(1), family="loss",
                doc="loss = mean of all elements of X (a 0-d scalar).")
register_schema("AveragedLossGradient", inputs=2, outputs=1, input_names=("X", "dloss"),
                output_names=("dX",), shape_fn=same_as_input(0), cost_fn=elementwise_cost(1),
                family="loss", doc="dX = dloss / X.size everywhere (X gives the shape only).")


@register_kernel("AveragedLoss")
def averaged_loss(ctx, X):
    loss = ctx.output(0, (), X.dtype)
    ctx.xp.mean(X, out=loss)


@register_kernel("AveragedLossGradient")
def averaged_loss_gradient(ctx, X, dloss):
    dX = ctx.output(0, X.shape, X.dtype)
    dX[...] = dloss / max(X.size, 1)


@register_gradient("AveragedLoss")
def _averaged_loss_grad(g):
    return [g.op("AveragedLossGradient", [g.I(0), g.GO(0)], [g.GI(0)])]
