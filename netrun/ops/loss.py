"""Losses: LabelCrossEntropy, SigmoidCrossEntropyWithLogits, SquaredL2Distance, AveragedLoss.
Each section: schema, kernel, gradient maker, and the gradient op's schema and kernel.
(SoftmaxWithLoss is with the softmax family, in softmax.py.)"""
from __future__ import annotations

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import Args, TensorSpec, register_schema
from netrun.errors import ShapeError
from netrun.ops.common import elementwise_cost, input_cost, require_same_shape, same_as_input
from netrun.ops.labels import check_labels, label_index

# Probabilities are clamped here before log(), as Caffe2's kLOG_THRESHOLD does, so a zero
# probability gives a large finite loss instead of inf.
LOG_THRESHOLD = 1e-20


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
