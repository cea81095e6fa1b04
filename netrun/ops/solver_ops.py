"""Update plumbing (Caffe2's): Iter, LearningRate, WeightedSum, ClipGradientsByNorm, and the
helpers the optimizers (optimizers.py: MomentumSGDUpdate, Adam, Adagrad, RmsProp) share.

Sign convention (Caffe2's): `LearningRate` stores lr = -base_lr * multiplier, a negative
number, and every update *adds* lr-scaled steps to the parameter. Plain SGD is
WeightedSum([param, one, grad, lr], [param]); L2 weight decay is folded into the gradient
first with WeightedSum([grad, one, param, decay], [grad]) (decay a one-element blob).

Every op updates its parameter and state blobs in place (enforced by the schema), writes with
`out=` into the blobs or one shared scratch buffer, and has no gradient. Scalars (lr, iter,
weights) are one-element blobs of any shape; the iteration is read on the host. Put `Iter`
after the updates, so the first step sees iter = 0: LearningRate then gives Caffe's
base_lr * policy(0) and Adam uses t = 1, as PyTorch does.
"""
from __future__ import annotations

import numpy as np

from netrun.core.registry import register_kernel
from netrun.core.schema import MANY, REQUIRED, Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import ConfigError, SchemaError, ShapeError
from netrun.ops.common import require_same_shape
from netrun.ops.lr_policy import POLICIES, LRPolicy, lr_at

SCRATCH = "optim"


def scalar(x):
    """A one-element blob as a 0-d array on its device (broadcasts against any shape)."""
    return x.reshape(())


def host_int(ctx, x) -> int:
    """A one-element integer blob as a host int (the iteration counter)."""
    return int(ctx.backend.to_host(x).reshape(-1)[0])


def outputs_like(ctx, *likes):
    """Output buffers shaped like `likes`: the input arrays themselves when run in place."""
    return [ctx.output(i, x.shape, x.dtype) for i, x in enumerate(likes)]


def update_shapes(roles: tuple[str, ...], tensors: tuple[int, ...], scalars: tuple[int, ...],
                  outputs: tuple[int, ...]):
    """Shape function: `tensors` share one shape, `scalars` have one element, and output j
    has the spec of input outputs[j] (present inputs only: optional trailing ones may be absent).
    """

    def fn(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
        op = roles[0]
        first = tensors[0]
        for i in tensors[1:]:
            if i < len(ins):
                require_same_shape(op, (roles[first + 1], roles[i + 1]), ins[first], ins[i])
        for i in scalars:
            if i < len(ins) and ins[i].size != 1:
                raise ShapeError(f"{op}: '{roles[i + 1]}' must be a one-element blob, "
                                 f"got shape {ins[i]}")
        return [ins[i] for i in outputs if i < len(ins)]

    return fn


def update_cost(flops_per_element: int, tensor: int = 0):
    """Cost function: `flops_per_element` per element of input `tensor`; all I/O once."""

    def fn(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
        return Cost(flops_per_element * ins[tensor].size, sum(i.nbytes for i in ins),
                    sum(o.nbytes for o in outs))

    return fn


# Iter -----------------------------------------------------------------------------------
def _iter_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    it = ins[0]
    if it.size != 1 or not np.issubdtype(np.dtype(it.dtype), np.integer):
        raise ShapeError(f"Iter: 'iter' must be a one-element integer blob (int64), "
                         f"got {it.dtype} of shape {it}")
    return [it]


register_schema("Iter", inputs=1, outputs=1, input_names=("iter",), output_names=("iter",),
                enforce_inplace=((0, 0),), shape_fn=_iter_shape, no_gradient=True,
                family="solver_ops", doc="iter += 1, in place on the int64 iteration counter.")


@register_kernel("Iter")
def iter_(ctx, it):
    out = ctx.output(0, it.shape, it.dtype)
    ctx.xp.add(it, 1, out=out)


# LearningRate ---------------------------------------------------------------------------
def lr_policy_of(args: Args) -> LRPolicy:
    keys = ("base_lr", "policy", "gamma", "stepsize", "stepvalues", "power", "max_iter",
            "warmup_iters", "warmup_start")
    return LRPolicy.from_dict({k: args[k] for k in keys})


def _lr_check(op, args: Args) -> None:
    try:
        lr_policy_of(args)
    except ConfigError as e:
        raise SchemaError(f"op {op.label}: {e}") from None


def _lr_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    _iter_shape(args, ins)
    return [TensorSpec((), "float32")]


register_schema(
    "LearningRate", inputs=1, outputs=1, input_names=("iter",), output_names=("lr",),
    args=[Arg("base_lr", "float", REQUIRED, doc="the positive base rate (stored negated)"),
          Arg("policy", "str", "fixed", allowed=POLICIES),
          Arg("gamma", "float"), Arg("stepsize", "int"), Arg("stepvalues", "ints", ()),
          Arg("power", "float"), Arg("max_iter", "int"),
          Arg("warmup_iters", "int", 0, doc="linear warm-up length (0: none)"),
          Arg("warmup_start", "float", 0.0, doc="warm-up multiplier at iteration 0")],
    shape_fn=_lr_shape, cost_fn=lambda a, i, o: Cost(10, 8, 4), check_fn=_lr_check,
    no_gradient=True, family="solver_ops",
    doc="lr = -base_lr * policy(iter) * warmup(iter), a float32 scalar. Negative, as in "
        "Caffe2, so update ops add lr * step. Policies (Caffe's): fixed; step "
        "gamma^floor(it/stepsize); multistep gamma^#(stepvalues <= it); exp gamma^it; inv "
        "(1+gamma*it)^-power; poly (1-it/max_iter)^power; sigmoid 1/(1+exp(-gamma*(it-stepsize)))."
        " Warm-up: warmup_start + (1-warmup_start)*it/warmup_iters while it < warmup_iters.")


@register_kernel("LearningRate")
def learning_rate(ctx, it):
    policy = ctx.state.get("policy")
    if policy is None:
        policy = ctx.state["policy"] = lr_policy_of(ctx.args)
    out = ctx.output(0, (), "float32")
    # Host scalar math: the iteration is one number; only the result goes to the device.
    out.fill(-lr_at(policy, host_int(ctx, it)))


# WeightedSum ----------------------------------------------------------------------------
def _weighted_sum_check(op, args: Args) -> None:
    if len(op.inputs) % 2:
        raise SchemaError(f"op {op.label}: takes pairs X0, w0, X1, w1, ...; got "
                          f"{len(op.inputs)} inputs")


def _weighted_sum_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    for i in range(0, len(ins), 2):
        require_same_shape("WeightedSum", ("X0", f"X{i // 2}"), ins[0], ins[i])
        if ins[i + 1].size != 1:
            raise ShapeError(f"WeightedSum: weight 'w{i // 2}' must be a one-element blob, "
                             f"got shape {ins[i + 1]}")
    return [ins[0]]


register_schema("WeightedSum", inputs=(2, MANY), outputs=1, input_names=("X0", "w0"),
                output_names=("Y",), inplace=((0, 0),), shape_fn=_weighted_sum_shape,
                cost_fn=lambda a, ins, outs: Cost((len(ins) - 1) * ins[0].size,
                                                  sum(i.nbytes for i in ins), outs[0].nbytes),
                check_fn=_weighted_sum_check, no_gradient=True, family="solver_ops",
                doc="Y = sum_i w_i * X_i (w_i one-element blobs); may run in place on X0. "
                    "SGD: WeightedSum([param, one, grad, lr], [param]).")


@register_kernel("WeightedSum")
def weighted_sum(ctx, *inputs):
    xp, X0 = ctx.xp, inputs[0]
    (Y,) = outputs_like(ctx, X0)
    tmp = ctx.scratch(SCRATCH, X0.shape, X0.dtype) if len(inputs) > 2 else None
    # Y = w0 * X0 first: Y may be X0 itself, which no later term reads.
    xp.multiply(X0, scalar(inputs[1]), out=Y)
    for X, w in zip(inputs[2::2], inputs[3::2]):
        # Y += w_i * X_i
        xp.multiply(X, scalar(w), out=tmp)
        xp.add(Y, tmp, out=Y)


# ClipGradientsByNorm --------------------------------------------------------------------
_MAX_GRADS = 4096  # in-place pairs are declared per index, so the count needs a bound


def _clip_check(op, args: Args) -> None:
    if len(op.outputs) != len(op.inputs):
        raise SchemaError(f"op {op.label}: clips in place, so it needs one output per input; "
                          f"got {len(op.inputs)} inputs and {len(op.outputs)} outputs")
    if args.max_norm <= 0:
        raise SchemaError(f"op {op.label}: argument 'max_norm' must be > 0, got {args.max_norm}")


register_schema(
    "ClipGradientsByNorm", inputs=(1, _MAX_GRADS), outputs=(1, _MAX_GRADS),
    input_names=("grads...",), output_names=("grads...",),
    enforce_inplace=tuple((i, i) for i in range(_MAX_GRADS)),
    args=[Arg("max_norm", "float", REQUIRED, doc="largest allowed global L2 norm")],
    shape_fn=lambda args, ins: list(ins),
    cost_fn=lambda a, ins, outs: Cost(3 * sum(i.size for i in ins), sum(i.nbytes for i in ins),
                                      sum(o.nbytes for o in outs)),
    check_fn=_clip_check, no_gradient=True, family="solver_ops",
    doc="Caffe's clip_gradients: norm = sqrt(sum of every grad's squares); when norm > "
        "max_norm, every grad is scaled by max_norm / norm. In place.")


@register_kernel("ClipGradientsByNorm")
def clip_gradients_by_norm(ctx, *grads):
    xp, max_norm = ctx.xp, ctx.args.max_norm
    # norm^2 = sum_i <g_i, g_i>; vdot on the flat views allocates nothing per element
    sumsq = sum(xp.vdot(g.reshape(-1), g.reshape(-1)) for g in grads)
    # scale = max_norm / max(norm, max_norm): exactly 1 when no clipping is needed, and it
    # stays on the device (no host round trip to decide whether to clip).
    scale = max_norm / xp.maximum(xp.sqrt(sumsq), max_norm)
    for i, g in enumerate(grads):
        out = ctx.output(i, g.shape, g.dtype)
        xp.multiply(g, scale.astype(g.dtype), out=out)
