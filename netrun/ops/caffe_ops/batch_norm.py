"""CaffeBatchNorm: Caffe's BatchNorm (no scale or shift), its statistics kept as Caffe keeps
them, and its gradient op."""
from __future__ import annotations

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, TensorSpec, register_schema
from netrun.errors import SchemaError, ShapeError
from netrun.ops.caffe_ops.common import FAMILY, moved as _moved

# Caffe keeps three blobs: the running sums of means and variances and their weight s, all
# decayed by moving_average_fraction each step; the statistics are blob / s. Keeping Caffe's
# representation makes .caffemodel import a plain copy.
_CBN_ARGS = [Arg("is_test", "int", 0, allowed=(0, 1),
                 doc="1: normalize with the stored statistics (Caffe's use_global_stats)"),
             Arg("moving_average_fraction", "float", 0.999, doc="decay of the running sums"),
             Arg("epsilon", "float", 1e-5, doc="added to the variance before the square root")]


def _cbn_check(op, args: Args) -> None:
    want = 1 if args.is_test else 6
    if len(op.outputs) != want:
        mode = "is_test=1" if args.is_test else "training (is_test=0)"
        raise SchemaError(f"op {op.label}: CaffeBatchNorm in {mode} makes {want} output(s) "
                          f"(argument 'is_test'), got {len(op.outputs)}")
    if args.epsilon <= 0:
        raise SchemaError(f"op {op.label}: argument 'epsilon' is {args.epsilon}; it must be > 0")


def _cbn_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0]
    if len(x.shape) < 2:
        raise ShapeError(f"CaffeBatchNorm: X must be at least N×C, got X {x}")
    c = x.shape[1]
    for role, spec, want in zip(("mean", "variance", "factor"), ins[1:], ((c,), (c,), (1,))):
        if tuple(spec.shape) != want:
            raise ShapeError(f"CaffeBatchNorm: {role} has shape {spec} but X has {c} channels "
                             f"(expected {TensorSpec(want)}): X {x}, {role} {spec}")
    stat = TensorSpec((c,), x.dtype)
    return [x, ins[1], ins[2], ins[3], stat, stat]


register_schema(
    "CaffeBatchNorm", inputs=4, outputs=(1, 6),
    input_names=("X", "mean", "variance", "factor"),
    output_names=("Y", "mean", "variance", "factor", "saved_mean", "saved_inv_std"),
    args=_CBN_ARGS, inplace=((0, 0),), enforce_inplace=((1, 1), (2, 2), (3, 3)),
    shape_fn=_cbn_shape, cost_fn=lambda a, ins, outs: _moved(ins, outs, 6 * ins[0].size),
    check_fn=_cbn_check, non_differentiable=(1, 2, 3), family=FAMILY,
    doc="Y = (X − μ)/√(σ² + ε) per channel (axis 1), no scale or bias (Caffe's BatchNorm). "
        "Training: μ, σ² are the batch's (biased) statistics; mean = maf·mean + μ, "
        "variance = maf·variance + σ²·M/(M−1), factor = maf·factor + 1 (in place, "
        "M = N·H·W), "
        "and saved_mean, saved_inv_std keep the batch statistics for the gradient. is_test=1: "
        "μ = mean/factor, σ² = variance/factor (0 when factor is 0).")


def _cbn_axes(X) -> tuple[tuple[int, ...], tuple[int, ...]]:
    axes = tuple(i for i in range(X.ndim) if i != 1)
    return axes, tuple(X.shape[1] if i == 1 else 1 for i in range(X.ndim))


def _stat_scale(xp, factor):
    """1/factor, the multiplier from Caffe's running sums to statistics (0 when factor is 0)."""
    return (factor != 0) / xp.where(factor == 0, 1, factor)


@register_kernel("CaffeBatchNorm")
def caffe_batch_norm(ctx, X, mean, var, factor):
    xp, a = ctx.xp, ctx.args
    axes, bshape = _cbn_axes(X)
    if a.is_test:
        scale = _stat_scale(xp, factor)
        mu, inv_std = mean * scale, 1.0 / xp.sqrt(var * scale + a.epsilon)
        Y = ctx.output(0, X.shape, X.dtype)   # may be X itself (in place)
        xp.subtract(X, mu.reshape(bshape).astype(X.dtype, copy=False), out=Y)
        Y *= inv_std.reshape(bshape).astype(X.dtype, copy=False)
        return
    m = X.size // X.shape[1]
    mu = X.mean(axis=axes)
    Y = ctx.output(0, X.shape, X.dtype)
    xp.subtract(X, mu.reshape(bshape), out=Y)                    # X − μ
    sq = ctx.scratch("caffe.tmp", X.shape, X.dtype)
    xp.multiply(Y, Y, out=sq)
    batch_var = sq.mean(axis=axes)                               # two-pass: no cancellation
    inv_std = 1.0 / xp.sqrt(batch_var + a.epsilon)
    Y *= inv_std.reshape(bshape)
    maf = a.moving_average_fraction
    correction = m / (m - 1) if m > 1 else 1.0                   # unbiased, as Caffe stores it
    ctx.output(1, mean.shape, mean.dtype)[...] = maf * mean + mu
    ctx.output(2, var.shape, var.dtype)[...] = maf * var + correction * batch_var
    ctx.output(3, factor.shape, factor.dtype)[...] = maf * factor + 1.0
    ctx.output(4, mu.shape, X.dtype)[...] = mu
    ctx.output(5, mu.shape, X.dtype)[...] = inv_std


def _cbn_grad_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    dy = ins[-1]
    if not args.is_test and tuple(ins[0].shape) != tuple(dy.shape):
        raise ShapeError(f"CaffeBatchNormGradient: dY has shape {dy} but X has shape {ins[0]}")
    return [dy]


def _cbn_grad_check(op, args: Args) -> None:
    want = 3 if args.is_test else 4
    if len(op.inputs) != want:
        raise SchemaError(f"op {op.label}: CaffeBatchNormGradient takes {want} inputs with "
                          f"is_test={args.is_test}, got {len(op.inputs)}")


register_schema(
    "CaffeBatchNormGradient", inputs=(3, 4), outputs=1, output_names=("dX",),
    args=_CBN_ARGS, shape_fn=_cbn_grad_shape, check_fn=_cbn_grad_check,
    cost_fn=lambda a, ins, outs: _moved(ins, outs, 8 * outs[0].size), family=FAMILY,
    doc="Training, inputs (X, saved_mean, saved_inv_std, dY): dX = inv_std·(dY − mean(dY) − "
        "x̂·mean(dY·x̂)), x̂ = (X − μ)·inv_std, means per channel. is_test=1, inputs "
        "(variance, factor, dY): dX = dY/√(variance/factor + ε).")


@register_kernel("CaffeBatchNormGradient")
def caffe_batch_norm_gradient(ctx, *ins):
    xp, a = ctx.xp, ctx.args
    dY = ins[-1]
    axes, bshape = _cbn_axes(dY)
    dX = ctx.output(0, dY.shape, dY.dtype)
    if a.is_test:
        var, factor = ins[0], ins[1]
        inv_std = 1.0 / xp.sqrt(var * _stat_scale(xp, factor) + a.epsilon)
        xp.multiply(dY, inv_std.reshape(bshape).astype(dY.dtype, copy=False), out=dX)
        return
    X, mu, inv_std = ins[0], ins[1], ins[2]
    xhat = ctx.scratch("caffe.tmp", X.shape, X.dtype)
    xp.subtract(X, mu.reshape(bshape), out=xhat)
    xhat *= inv_std.reshape(bshape)
    xp.multiply(dY, xhat, out=dX)
    mean_dy_xhat = dX.mean(axis=axes).reshape(bshape)
    xhat *= mean_dy_xhat                                         # x̂·mean(dY·x̂)
    xp.subtract(dY, dY.mean(axis=axes).reshape(bshape), out=dX)
    dX -= xhat
    dX *= inv_std.reshape(bshape)


@register_gradient("CaffeBatchNorm")
def _caffe_batch_norm_grad(g):
    args = g.copy_args()
    if g.args.get("is_test", 0):
        return [g.op("CaffeBatchNormGradient", [g.I(2), g.I(3), g.GO(0)], [g.GI(0)], **args)]
    return [g.op("CaffeBatchNormGradient", [g.I(0), g.O(4), g.O(5), g.GO(0)], [g.GI(0)],
                 **args)]
