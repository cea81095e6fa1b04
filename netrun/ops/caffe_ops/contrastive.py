"""ContrastiveLoss (Caffe's siamese-network loss) and its gradient op."""
from __future__ import annotations

import math

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, TensorSpec, register_schema
from netrun.errors import ShapeError
from netrun.ops.caffe_ops.common import FAMILY, moved as _moved


_CONTRASTIVE_ARGS = [Arg("margin", "float", 1.0),
                     Arg("legacy_version", "int", 0, allowed=(0, 1),
                         doc="1: max(margin − d², 0) for dissimilar pairs (Caffe's first form)")]


def _contrastive_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    a, b, y = ins
    if tuple(a.shape) != tuple(b.shape) or not a.shape:
        raise ShapeError(f"ContrastiveLoss: A and B must have the same N×… shape: A {a}, B {b}")
    if math.prod(y.shape) != a.shape[0]:
        raise ShapeError(f"ContrastiveLoss: the similarity labels need one value per pair "
                         f"(N = {a.shape[0]}): A {a}, labels {y}")
    return [TensorSpec((), a.dtype)]


register_schema("ContrastiveLoss", inputs=3, outputs=1, input_names=("A", "B", "similar"),
                output_names=("loss",), args=_CONTRASTIVE_ARGS, shape_fn=_contrastive_shape,
                cost_fn=lambda a, ins, outs: _moved(ins, outs, 3 * ins[0].size),
                non_differentiable=(2,), family=FAMILY,
                doc="loss = 1/(2N)·Σ_i [s_i·d_i² + (1 − s_i)·max(margin − d_i, 0)²], "
                    "d_i = "
                    "‖A_i − B_i‖, s_i = (similar_i ≠ 0) (Caffe's ContrastiveLoss).")


def _contrastive_parts(xp, A, B, similar, args: Args):
    """(A − B as N×D, d², similar mask) of a batch of pairs."""
    n = A.shape[0]
    diff = (A - B).reshape(n, -1)                                # (N, D)
    d2 = (diff * diff).sum(axis=1)
    return diff, d2, similar.reshape(n) != 0


@register_kernel("ContrastiveLoss")
def contrastive_loss(ctx, A, B, similar):
    xp, a = ctx.xp, ctx.args
    _, d2, sim = _contrastive_parts(xp, A, B, similar, a)
    if a.legacy_version:
        apart = xp.maximum(a.margin - d2, 0)
    else:
        apart = xp.maximum(a.margin - xp.sqrt(d2), 0) ** 2
    loss = xp.where(sim, d2, apart).sum() / (2 * A.shape[0])
    ctx.output(0, (), A.dtype)[...] = loss


register_schema("ContrastiveLossGradient", inputs=4, outputs=2,
                input_names=("A", "B", "similar", "dloss"), output_names=("dA", "dB"),
                args=_CONTRASTIVE_ARGS, shape_fn=lambda a, ins: [ins[0], ins[1]],
                cost_fn=lambda a, ins, outs: _moved(ins, outs, 5 * ins[0].size), family=FAMILY,
                doc="dA = −dB = dloss/N·c_i·(A_i − B_i), c_i = 1 for similar pairs, "
                    "−max(margin − d_i, 0)/d_i otherwise (−[d_i² < margin] in the legacy "
                    "form).")


@register_kernel("ContrastiveLossGradient")
def contrastive_loss_gradient(ctx, A, B, similar, dloss):
    xp, a = ctx.xp, ctx.args
    diff, d2, sim = _contrastive_parts(xp, A, B, similar, a)
    if a.legacy_version:
        apart = -(a.margin - d2 > 0).astype(A.dtype)
    else:
        # Exact derivative; Caffe divides by d + 1e-4 instead of d. A pair at distance 0
        # has no direction to move apart in and gets no gradient.
        d = xp.sqrt(d2)
        apart = -xp.maximum(a.margin - d, 0) / xp.where(d > 0, d, 1) * (d > 0)
    coef = xp.where(sim, 1.0, apart).astype(A.dtype) * (dloss / A.shape[0])
    dA = ctx.output(0, A.shape, A.dtype)
    xp.multiply(diff, coef[:, None], out=dA.reshape(diff.shape))
    xp.negative(dA, out=ctx.output(1, B.shape, B.dtype))


@register_gradient("ContrastiveLoss")
def _contrastive_grad(g):
    return [g.op("ContrastiveLossGradient", [g.I(0), g.I(1), g.I(2), g.GO(0)],
                 [g.GI(0), g.GI(1)], **g.copy_args())]
