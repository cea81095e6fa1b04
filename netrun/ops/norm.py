"""Normalization: SpatialBN (batch normalization), SpatialBNRelu (SpatialBN then ReLU, fused)
and LRN. Each section: schema, kernel, gradient maker, and the gradient op's schema and
kernel. SpatialBN's passes over memory are in netrun.kernels.batch_norm."""
from __future__ import annotations

import numpy as np

import netrun.kernels.jit as jit
import netrun.kernels.jit.batch_norm as jit_bn
import netrun.kernels.jit.batch_norm_blocked as jit_bnb
from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel, register_preparer
from netrun.core.schema import Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import SchemaError, ShapeError
from netrun.kernels import batch_norm as bn
from netrun.kernels import omp
from netrun.ops.common import input_cost, repeat_team_call, same_as_input
from netrun.proto.defs import NetDef

ORDER = Arg("order", "str", "NCHW", allowed=("NCHW", "NHWC"), doc="layout of X")
SYNC = Arg("sync", "int", 0, allowed=(0, 1),
           doc="1: training-mode statistics (forward) and gradient sums (backward) are summed "
               "over the ranks of a data-parallel job (synchronized BatchNorm); nothing "
               "changes on one process or with is_test")


def channel_axis(order: str, ndim: int) -> int:
    """The channel axis of an N×C×… (NCHW) or N×…×C (NHWC) tensor."""
    return 1 if order == "NCHW" else ndim - 1


BLOCKED = Arg("blocked", "int", 0, allowed=(0, 8, 16),
              doc="B > 0: X is channel-blocked, N×C/B×H×W×B (a training net's layout plan "
                  "sets it; the blocked kernels are loaded at bind)")

# SpatialBN -------------------------------------------------------------------------------
_BN_ARGS = [Arg("is_test", "int", 0, allowed=(0, 1), doc="1: normalize with the running stats"),
            Arg("epsilon", "float", 1e-5, doc="added to the variance before the square root"),
            Arg("momentum", "float", 0.9, doc="running = momentum·running + (1−momentum)·batch"),
            ORDER, SYNC, BLOCKED]


def _bn_check(op, args: Args) -> None:
    want = 1 if args.is_test else 5
    if len(op.outputs) != want:
        mode = "is_test=1" if args.is_test else "training (is_test=0)"
        raise SchemaError(f"op {op.label}: SpatialBN in {mode} makes {want} output(s) "
                          f"(argument 'is_test'), got {len(op.outputs)}")
    if not 0.0 <= args.momentum <= 1.0:
        raise SchemaError(f"op {op.label}: argument 'momentum' is {args.momentum}; "
                          f"it must lie in [0, 1]")
    if args.epsilon <= 0:
        raise SchemaError(f"op {op.label}: argument 'epsilon' is {args.epsilon}; it must be > 0")


def channels(shape, order: str) -> int:
    """C of an X in `order`; a 5-D X in order NCHW is channel-blocked (N × C/B × H × W × B,
    whole blocks: the layout plan of a training net keeps it so between convolutions)."""
    if len(shape) == 5 and order == "NCHW":
        return shape[1] * shape[4]
    return shape[channel_axis(order, len(shape))]


def _check_channels(what: str, x: TensorSpec, order: str, vectors, names,
                    blocked: int = 0) -> int:
    if len(x.shape) < 2:
        raise ShapeError(f"{what}: X must be at least N×C, got X {x}")
    if blocked and (len(x.shape) != 5 or x.shape[4] != blocked):
        raise ShapeError(f"{what}: argument 'blocked' is {blocked} but X {x} is not in blocks "
                         f"of {blocked} channels (N×C/B×H×W×B)")
    c = channels(x.shape, order)
    for name, v in zip(names, vectors):
        if tuple(v.shape) != (c,):
            raise ShapeError(f"{what}: {name} has shape {v} but X has {c} channels ({order}): "
                             f"X {x}, {name} {v}")
    return c


def _bn_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0]
    c = _check_channels("SpatialBN", x, args.order, ins[1:],
                        ("scale", "bias", "running_mean", "running_var"), args.blocked)
    if args.is_test:
        return [x]
    if x.size // max(c, 1) < 2:
        raise ShapeError(f"SpatialBN: training needs more than one value per channel to "
                         f"estimate a variance, got X {x}")
    return [x, ins[3], ins[4], TensorSpec((c,), x.dtype), TensorSpec((c,), x.dtype)]


# What SpatialBN and SpatialBNRelu share: inputs, outputs, arguments and checks.
_BN_SCHEMA = dict(
    inputs=5, outputs=(1, 5), input_names=("X", "scale", "bias", "running_mean", "running_var"),
    output_names=("Y", "running_mean", "running_var", "saved_mean", "saved_inv_std"),
    args=_BN_ARGS, enforce_inplace=((3, 1), (4, 2)), shape_fn=_bn_shape, check_fn=_bn_check,
    non_differentiable=(3, 4), family="norm")

register_schema(
    "SpatialBN", **_BN_SCHEMA, cost_fn=input_cost(7),
    doc="Y = (X − μ)/√(σ² + ε)·scale + bias per channel. Training: μ, σ² are the batch's "
        "(biased) statistics, saved as saved_mean and saved_inv_std = 1/√(σ² + ε), and the "
        "running stats are updated in place: running = momentum·running + (1−momentum)·batch, "
        "where the running variance takes the unbiased batch variance σ²·M/(M−1), M = N·H·W "
        "(as Caffe2, Caffe and PyTorch do). is_test=1: μ, σ² are the running stats. sync=1 "
        "(training, several ranks): μ, σ² and M are the whole batch's over all ranks.")


@register_kernel("SpatialBN")
def spatial_bn(ctx, X, scale, bias, running_mean, running_var):
    _bn_forward(ctx, X, scale, bias, running_mean, running_var, relu=False)


def _bn_forward(ctx, X, scale, bias, running_mean, running_var, relu: bool) -> None:
    """SpatialBN's outputs, Y = max(BN(X), 0) if relu (netrun.kernels.batch_norm passes)."""
    xp, a = ctx.xp, ctx.args
    dt = X.dtype
    Y = ctx.output(0, X.shape, dt)
    if a.is_test:
        if bn.inference(xp, X, a.order, scale, bias, running_mean, running_var, a.epsilon, Y,
                        relu):
            return
        # Y = X·s + (bias − μ·s) with s = scale/√(var + ε): one pass over X.
        s = scale / xp.sqrt(running_var + a.epsilon)
        bn.normalize(xp, X, a.order, None, _vec(xp, s, dt),
                     _vec(xp, bias - running_mean * s, dt), Y, relu)
        return
    syncs = _syncs(ctx)
    # the running statistics' outputs are their inputs (enforce_inplace): written last
    outs = (ctx.output(1, running_mean.shape, running_mean.dtype),
            ctx.output(2, running_var.shape, running_var.dtype),
            ctx.output(3, (scale.size,), dt), ctx.output(4, (scale.size,), dt))
    call = None if syncs else bn.train_forward(
        xp, X, a.order, scale, bias, running_mean, running_var, a.momentum, a.epsilon, Y,
        relu, *outs, ctx.scratch)
    if call is not None:   # blocked: the passes below and the terms between them in one call
        repeat_team_call(ctx, call)
        return
    stats = bn.batch_stats(xp, X, a.order, ctx.scratch)
    if syncs:
        stats = _global_stats(ctx, stats)
    m = stats.m
    inv_std = 1.0 / xp.sqrt(stats.var + a.epsilon)
    mean = _vec(xp, stats.mean, dt)
    bn.normalize(xp, X, a.order, mean, _vec(xp, scale * inv_std, dt), _vec(xp, bias, dt), Y,
                 relu)
    # The running stats share the input blobs (enforce_inplace), so compute before writing.
    new_mean = a.momentum * running_mean + (1.0 - a.momentum) * stats.mean
    new_var = a.momentum * running_var + (1.0 - a.momentum) * stats.var * (m / (m - 1))
    for out, value in zip(outs, (new_mean, new_var, mean, inv_std)):
        out[...] = value


def _syncs(ctx) -> bool:
    """Whether this training-mode op sums its statistics over the ranks (sync=1, ranks > 1)."""
    return bool(ctx.args.sync) and not ctx.args.is_test and ctx.ws.comm.size > 1


def _allreduce(ctx, v):
    """v (a float64 array of ctx.xp) summed over the ranks, as a new array of ctx.xp."""
    host = np.ascontiguousarray(ctx.backend.to_host(v), dtype=np.float64).copy()
    ctx.ws.comm.allreduce_sum(host)
    return host if ctx.xp is np else ctx.backend.to_device(host)


def _global_stats(ctx, stats: bn.Stats) -> bn.Stats:
    """The statistics of the whole batch over all ranks from each rank's (float64, two
    exchanges so the variance has no cancellation): M = Σ m, μ = Σ m·μᵣ / M, and
    σ² = Σ m·(σᵣ² + (μᵣ − μ)²) / M. Every rank gets the same bits."""
    xp = ctx.xp
    c = stats.mean.shape[0]
    first = xp.empty((c + 1,), dtype="float64")
    first[0] = stats.m
    first[1:] = stats.mean * stats.m
    first = _allreduce(ctx, first)
    total = round(float(first[0]))
    mean = first[1:] / total
    d = stats.mean - mean
    var = _allreduce(ctx, (stats.var + d * d) * stats.m) / total
    return bn.Stats(mean, var, total)


def _vec(xp, v, dtype):
    """A per-channel vector as a contiguous array of `dtype` (what the kernels take)."""
    return xp.ascontiguousarray(v.astype(dtype, copy=False))


def _bn_grad_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0]
    _check_channels("SpatialBNGradient", x, args.order, ins[1:4],
                    ("scale", "mean", "inv_std" if not args.is_test else "var"), args.blocked)
    if tuple(ins[4].shape) != tuple(x.shape):
        raise ShapeError(f"SpatialBNGradient: dY has shape {ins[4]} but X has shape {x}")
    return [x, ins[1], ins[1]]


register_schema(
    "SpatialBNGradient", inputs=5, outputs=3,
    input_names=("X", "scale", "saved_mean", "saved_inv_std", "dY"),
    output_names=("dX", "dscale", "dbias"), args=_BN_ARGS[:3] + [ORDER, SYNC, BLOCKED],
    shape_fn=_bn_grad_shape, cost_fn=input_cost(8), family="norm",
    doc="dbias = Σ dY, dscale = Σ dY·x̂, dX = scale·inv_std·(dY − dbias/M − x̂·dscale/M) with "
        "x̂ = (X − μ)·inv_std. is_test=1: inputs 2 and 3 are running_mean and running_var, "
        "and dX = dY·scale/√(var + ε) (the statistics are constants).")


@register_kernel("SpatialBNGradient")
def spatial_bn_gradient(ctx, X, scale, mean, inv_std, dY):
    _bn_backward(ctx, X, scale, mean, inv_std, dY, None)


def _bn_backward(ctx, X, scale, mean, inv_std, dY, Y) -> None:
    """SpatialBNGradient's outputs; given Y (BN + ReLU's output) dY is first masked by Y > 0."""
    xp, a = ctx.xp, ctx.args
    dt = X.dtype
    m = X.size // scale.size
    dX, dscale_out, dbias_out = (ctx.output(0, X.shape, dt),
                                 ctx.output(1, scale.shape, scale.dtype),
                                 ctx.output(2, scale.shape, scale.dtype))
    call = None if a.is_test or _syncs(ctx) else bn.train_backward(
        xp, X, a.order, scale, mean, inv_std, dY, Y, dX, dscale_out, dbias_out, ctx.scratch)
    if call is not None:   # blocked: the passes below and the terms between them in one call
        repeat_team_call(ctx, call)
        return
    if a.is_test:
        inv_std = 1.0 / xp.sqrt(inv_std.astype("float64") + a.epsilon)  # input 3 is the var
    mean = _vec(xp, mean, dt)
    sums = bn.gradient_sums(xp, X, mean, dY, Y, a.order, ctx.scratch)   # Σ g, Σ (x − μ)·g
    dbias, dscale = sums[0], sums[1] * inv_std
    # dscale and dbias stay this rank's sums: the gradient exchange averages them like any
    # parameter's. dX needs the whole batch's sums (its statistics were the whole batch's).
    dscale_out[...] = dscale
    dbias_out[...] = dbias
    if _syncs(ctx):
        c = scale.size
        both = xp.empty((2 * c + 1,), dtype="float64")
        both[0], both[1:c + 1], both[c + 1:] = m, sums[0], sums[1]
        both = _allreduce(ctx, both)
        m = round(float(both[0]))
        dbias, dscale = both[1:c + 1], both[c + 1:] * inv_std
    # dX = scale·inv_std · (g − dbias/M − (X − μ)·inv_std·dscale/M)  (is_test: g·scale·inv_std)
    bn.gradient_input(xp, X, mean, dY, Y, a.order, _vec(xp, inv_std * dscale / m, dt),
                      _vec(xp, dbias / m, dt), _vec(xp, scale * inv_std, dt), bool(a.is_test),
                      dX, ctx.scratch)


def _bn_grad_op(g, relu: bool):
    """SpatialBN(Relu)Gradient: X, scale, the statistics used (running ones in test mode),
    dY, and for the fused op its output Y (the ReLU's mask)."""
    args = g.copy_args("is_test", "epsilon", "order", "sync", "blocked")
    stats = [g.I(3), g.I(4)] if g.args.get("is_test", 0) else [g.O(3), g.O(4)]
    return [g.op("SpatialBNReluGradient" if relu else "SpatialBNGradient",
                 [g.I(0), g.I(1), *stats, g.GO(0), *([g.O(0)] if relu else [])],
                 [g.GI(0), g.GI(1), g.GI(2)], **args)]


@register_gradient("SpatialBN")
def _spatial_bn_grad(g):
    return _bn_grad_op(g, relu=False)


# SpatialBNRelu: SpatialBN then ReLU in the same passes (a bind-time fusion's target) ------
register_schema(
    "SpatialBNRelu", **_BN_SCHEMA, cost_fn=input_cost(8),
    doc="Y = max(SpatialBN(X), 0): SpatialBN (same arguments, inputs and outputs, training "
        "and is_test) followed by Relu, the ReLU applied as Y is written.")


@register_kernel("SpatialBNRelu")
def spatial_bn_relu(ctx, X, scale, bias, running_mean, running_var):
    _bn_forward(ctx, X, scale, bias, running_mean, running_var, relu=True)


def _bn_relu_grad_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    if tuple(ins[5].shape) != tuple(ins[0].shape):
        raise ShapeError(f"SpatialBNReluGradient: Y has shape {ins[5]} but X has shape "
                         f"{ins[0]}")
    return _bn_grad_shape(args, ins[:5])


register_schema(
    "SpatialBNReluGradient", inputs=6, outputs=3,
    input_names=("X", "scale", "saved_mean", "saved_inv_std", "dY", "Y"),
    output_names=("dX", "dscale", "dbias"), args=_BN_ARGS[:3] + [ORDER, SYNC, BLOCKED],
    shape_fn=_bn_relu_grad_shape, cost_fn=input_cost(10), family="norm",
    doc="SpatialBNGradient of dY·(Y > 0), Y being SpatialBNRelu's output (the ReLU's mask): "
        "the inputs of SpatialBNGradient, then Y; the same outputs.")


@register_kernel("SpatialBNReluGradient")
def spatial_bn_relu_gradient(ctx, X, scale, mean, inv_std, dY, Y):
    _bn_backward(ctx, X, scale, mean, inv_std, dY, Y)


@register_gradient("SpatialBNRelu")
def _spatial_bn_relu_grad(g):
    return _bn_grad_op(g, relu=True)


def synchronized(net: NetDef) -> NetDef:
    """A copy of `net` whose training-mode SpatialBN(Relu) ops have sync=1 (their gradient
    ops inherit it): what a data-parallel trainer binds when synchronized BatchNorm is on."""
    out = net.copy()
    out.ops = [o.with_(args={**o.args, "sync": 1})
               if o.type in ("SpatialBN", "SpatialBNRelu") and not o.args.get("is_test", 0)
               else o for o in net.ops]
    return out


@register_preparer("SpatialBN", "SpatialBNGradient", "SpatialBNRelu", "SpatialBNReluGradient")
def _prepare(ctx) -> None:
    """Load the compiled float32 kernels at bind time (not in the first iteration), their
    team forms too where chunks run on the OpenMP team."""
    if jit.enabled(ctx.xp):
        kernels = (jit_bn, jit_bnb) if ctx.args.blocked else (jit_bn,)
        for module in kernels:
            module.prepare("float32")
            if omp.usable(ctx.xp):
                module.prepare_team("float32")


# LRN -------------------------------------------------------------------------------------
ACROSS, WITHIN = "ACROSS_CHANNELS", "WITHIN_CHANNEL"
_LRN_ARGS = [Arg("size", "int", 5, doc="window: channels (across) or size×size pixels (within)"),
             Arg("alpha", "float", 1e-4), Arg("beta", "float", 0.75),
             Arg("bias", "float", 1.0, doc="k, added to the scaled window sum"),
             Arg("norm_region", "str", ACROSS, allowed=(ACROSS, WITHIN),
                 doc="Caffe's norm_region: across channels (Caffe2's LRN) or within each one"),
             ORDER]


def _lrn_check(op, args: Args) -> None:
    if args.size < 1 or args.size % 2 == 0:
        raise SchemaError(f"op {op.label}: argument 'size' is {args.size}; LRN needs an odd "
                          f"size ≥ 1 so the window is centred (as Caffe requires)")
    if args.norm_region == WITHIN and args.bias != 1.0:
        raise SchemaError(f"op {op.label}: argument 'bias' is {args.bias}, but norm_region "
                          f"WITHIN_CHANNEL fixes k at 1 as Caffe does; leave 'bias' unset")


def _lrn_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0]
    need = 2 if args.norm_region == ACROSS else 3
    if len(x.shape) < need:
        raise ShapeError(f"LRN: {args.norm_region} needs X with at least {need} axes, got X {x}")
    return [x, x]


def _lrn_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    window = args.size if args.norm_region == ACROSS else 2 * args.size  # separable box sum
    return input_cost(window + 5)(args, ins, outs)


def _window_axes(X, args: Args) -> list[int]:
    """Axes the LRN window spans: the channel axis, or every spatial axis."""
    c = channel_axis(args.order, X.ndim)
    return [c] if args.norm_region == ACROSS else [i for i in range(1, X.ndim) if i != c]


def window_sum(src, axis: int, size: int, out) -> None:
    """out = Σ src over a centred window of `size` along `axis`, zero padded (size is odd)."""
    n, pad = src.shape[axis], (size - 1) // 2
    out.fill(0)
    for d in range(-pad, pad + 1):  # `size` shifted adds, not a loop over elements
        lo, hi = max(0, -d), n - max(0, d)
        if lo >= hi:
            continue
        dst = [slice(None)] * src.ndim
        s = list(dst)
        dst[axis], s[axis] = slice(lo, hi), slice(lo + d, hi + d)
        out[tuple(dst)] += src[tuple(s)]


def lrn_scale(ctx, X, out) -> None:
    """out = k + alpha/n · Σ_window x², n = size (across) or size² (within, k = 1): Caffe's."""
    xp, a = ctx.xp, ctx.args
    axes = _window_axes(X, a)
    sq = ctx.scratch("norm.tmp", X.shape, X.dtype)
    xp.multiply(X, X, out=sq)
    _box_sum(ctx, sq, axes, out)
    out *= a.alpha / a.size ** len(axes)
    out += a.bias


def _box_sum(ctx, src, axes: list[int], out) -> None:
    """Separable box sum of `src` over `axes` into out, one window_sum per axis."""
    for i, axis in enumerate(axes):
        dst = out if (len(axes) - i) % 2 == 1 else ctx.scratch("norm.box", src.shape, src.dtype)
        window_sum(src, axis, ctx.args.size, dst)
        src = dst


register_schema(
    "LRN", inputs=1, outputs=(1, 2), input_names=("X",), output_names=("Y", "scale"),
    args=_LRN_ARGS, shape_fn=_lrn_shape, cost_fn=_lrn_cost, check_fn=_lrn_check, family="norm",
    doc="Local response normalization (Caffe/Caffe2): scale = k + alpha/size · Σ x² over "
        "`size` neighbouring channels (ACROSS_CHANNELS), or 1 + alpha/size² · Σ x² over a "
        "size×size window zero-padded by (size−1)/2 (WITHIN_CHANNEL); Y = X · scale^−beta. "
        "The optional second output keeps scale for the gradient.")


@register_kernel("LRN")
def lrn(ctx, X):
    xp, a = ctx.xp, ctx.args
    keep = len(ctx.def_.outputs) == 2
    scale = ctx.output(1, X.shape, X.dtype) if keep else ctx.scratch("norm.scale", X.shape,
                                                                     X.dtype)
    lrn_scale(ctx, X, scale)
    Y = ctx.output(0, X.shape, X.dtype)
    xp.power(scale, -a.beta, out=Y)
    Y *= X


register_schema(
    "LRNGradient", inputs=(2, 3), outputs=1, input_names=("X", "scale", "dY"),
    output_names=("dX",), args=_LRN_ARGS, shape_fn=same_as_input(0), cost_fn=_lrn_cost,
    check_fn=_lrn_check, family="norm",
    doc="dX = dY·scale^−beta − 2·alpha·beta/n · X · Σ_window(dY·X·scale^(−beta−1)); inputs "
        "(X, [scale], dY): without scale it is recomputed from X. Y is not read (Caffe2 reads "
        "it), so an in-place op may overwrite LRN's output.")


@register_kernel("LRNGradient")
def lrn_gradient(ctx, X, *rest):
    xp, a = ctx.xp, ctx.args
    if len(rest) == 2:
        scale, dY = rest
    else:
        dY = rest[0]
        scale = ctx.scratch("norm.scale", X.shape, X.dtype)
        lrn_scale(ctx, X, scale)
    axes = _window_axes(X, a)
    # first = dY·scale^−beta is dX's direct term; dY·Y/scale = first·X/scale feeds the window.
    first = ctx.scratch("norm.tmp", X.shape, X.dtype)
    xp.power(scale, -a.beta, out=first)
    first *= dY
    through = ctx.scratch("norm.through", X.shape, X.dtype)
    xp.multiply(first, X, out=through)
    through /= scale
    dX = ctx.output(0, X.shape, X.dtype)
    # The window is symmetric, so the transposed window sum of the chain rule is the same sum.
    _box_sum(ctx, through, axes, dX)
    dX *= X
    dX *= -2.0 * a.alpha * a.beta / a.size ** len(axes)
    dX += first


@register_gradient("LRN")
def _lrn_grad(g):
    scale = [g.O(1)] if len(g.def_.outputs) == 2 else []
    return [g.op("LRNGradient", [g.I(0), *scale, g.GO(0)], [g.GI(0)], **g.copy_args())]
