"""Update operators (Caffe2's): Iter, LearningRate, WeightedSum, MomentumSGDUpdate, Adam,
Adagrad, RmsProp and ClipGradientsByNorm.

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

import math

import numpy as np

from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, Cost, MANY, REQUIRED, TensorSpec, register_schema
from netrun.errors import ConfigError, SchemaError, ShapeError
from netrun.ops.common import require_same_shape
from netrun.train.lr_policy import POLICIES, LRPolicy, lr_at

_SCRATCH = "optim"


def _scalar(x):
    """A one-element blob as a 0-d array on its device (broadcasts against any shape)."""
    return x.reshape(())


def _host_int(ctx, x) -> int:
    return int(ctx.backend.to_host(x).reshape(-1)[0])


def _outputs(ctx, *likes):
    """Output buffers shaped like `likes`: the input arrays themselves when run in place."""
    return [ctx.output(i, x.shape, x.dtype) for i, x in enumerate(likes)]


def _update_shapes(roles: tuple[str, ...], tensors: tuple[int, ...], scalars: tuple[int, ...],
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


def _update_cost(flops_per_element: int, tensor: int = 0):
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
                family="optim", doc="iter += 1, in place on the int64 iteration counter.")


@register_kernel("Iter")
def iter_(ctx, it):
    out = ctx.output(0, it.shape, it.dtype)
    ctx.xp.add(it, 1, out=out)


# LearningRate ---------------------------------------------------------------------------
def _lr_policy(args: Args) -> LRPolicy:
    keys = ("base_lr", "policy", "gamma", "stepsize", "stepvalues", "power", "max_iter",
            "warmup_iters", "warmup_start")
    return LRPolicy.from_dict({k: args[k] for k in keys})


def _lr_check(op, args: Args) -> None:
    try:
        _lr_policy(args)
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
    no_gradient=True, family="optim",
    doc="lr = -base_lr * policy(iter) * warmup(iter), a float32 scalar. Negative, as in "
        "Caffe2, so update ops add lr * step. Policies (Caffe's): fixed; step "
        "gamma^floor(it/stepsize); multistep gamma^#(stepvalues <= it); exp gamma^it; inv "
        "(1+gamma*it)^-power; poly (1-it/max_iter)^power; sigmoid 1/(1+exp(-gamma*(it-stepsize)))."
        " Warm-up: warmup_start + (1-warmup_start)*it/warmup_iters while it < warmup_iters.")


@register_kernel("LearningRate")
def learning_rate(ctx, it):
    policy = ctx.state.get("policy")
    if policy is None:
        policy = ctx.state["policy"] = _lr_policy(ctx.args)
    out = ctx.output(0, (), "float32")
    # Host scalar math: the iteration is one number; only the result goes to the device.
    out.fill(-lr_at(policy, _host_int(ctx, it)))


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
                check_fn=_weighted_sum_check, no_gradient=True, family="optim",
                doc="Y = sum_i w_i * X_i (w_i one-element blobs); may run in place on X0. "
                    "SGD: WeightedSum([param, one, grad, lr], [param]).")


@register_kernel("WeightedSum")
def weighted_sum(ctx, *inputs):
    xp, X0 = ctx.xp, inputs[0]
    (Y,) = _outputs(ctx, X0)
    tmp = ctx.scratch(_SCRATCH, X0.shape, X0.dtype) if len(inputs) > 2 else None
    # Y = w0 * X0 first: Y may be X0 itself, which no later term reads.
    xp.multiply(X0, _scalar(inputs[1]), out=Y)
    for X, w in zip(inputs[2::2], inputs[3::2]):
        # Y += w_i * X_i
        xp.multiply(X, _scalar(w), out=tmp)
        xp.add(Y, tmp, out=Y)


# MomentumSGDUpdate ----------------------------------------------------------------------
register_schema(
    "MomentumSGDUpdate", inputs=4, outputs=3, input_names=("grad", "momentum", "lr", "param"),
    output_names=("grad", "momentum", "param"), inplace=((0, 0),),
    enforce_inplace=((1, 1), (3, 2)),
    args=[Arg("momentum", "float", 0.9), Arg("nesterov", "int", 0, allowed=(0, 1))],
    shape_fn=_update_shapes(("MomentumSGDUpdate", "grad", "momentum", "lr", "param"),
                            tensors=(0, 1, 3), scalars=(2,), outputs=(0, 1, 3)),
    cost_fn=_update_cost(5), no_gradient=True, family="optim",
    doc="Caffe2's momentum SGD with lr folded into the velocity (lr < 0): m = mu*m + lr*g; "
        "param += m (Nesterov: param += (1+mu)*m_new - mu*m_old). Output grad = the step.")


@register_kernel("MomentumSGDUpdate")
def momentum_sgd_update(ctx, g, m, lr, p):
    """Caffe/Caffe2 momentum: the velocity holds lr, PyTorch's does not.

    Caffe2 (lr < 0 here, so m is the negative of Caffe's v = mu*v - lr*g; w -= v):
        m <- mu*m + lr*g;   w <- w + m
    PyTorch SGD (eta > 0):
        b <- mu*b + g;      w <- w - eta*b
    With m = -eta*b the two agree step for step while lr is constant. When lr changes, Caffe's
    velocity keeps the old rates' steps (m remembers lr_t-1 * g_t-1) while PyTorch rescales
    all of the remembered gradient by the new rate: they differ from the first change on.
    Nesterov (Caffe2's form): m_new = mu*m + lr*g; step = (1+mu)*m_new - mu*m, which equals
    PyTorch's -eta*(g + mu*b_new) for constant lr.
    """
    xp, mu = ctx.xp, ctx.args.momentum
    ng, nm, np_ = _outputs(ctx, g, m, p)
    # ng <- lr*g (ng may be g, which is not read again)
    xp.multiply(g, _scalar(lr), out=ng)
    # m_new = mu*m + lr*g (nm may be m)
    xp.multiply(m, mu, out=nm)
    xp.add(nm, ng, out=nm)
    if ctx.args.nesterov:
        # step = (1+mu)*m_new - mu*m_old = mu*m_new + lr*g, since mu*m_old = m_new - lr*g
        tmp = ctx.scratch(_SCRATCH, nm.shape, nm.dtype)
        xp.multiply(nm, mu, out=tmp)
        xp.add(ng, tmp, out=ng)
    else:
        # step = m_new
        xp.copyto(ng, nm)
    # param += step (lr < 0, so this descends)
    xp.add(p, ng, out=np_)


# Adam -----------------------------------------------------------------------------------
register_schema(
    "Adam", inputs=6, outputs=3,
    input_names=("param", "moment1", "moment2", "grad", "lr", "iter"),
    output_names=("param", "moment1", "moment2"), enforce_inplace=((0, 0), (1, 1), (2, 2)),
    args=[Arg("beta1", "float", 0.9), Arg("beta2", "float", 0.999),
          Arg("epsilon", "float", 1e-8)],
    shape_fn=_update_shapes(("Adam", "param", "moment1", "moment2", "grad", "lr", "iter"),
                            tensors=(0, 1, 2, 3), scalars=(4, 5), outputs=(0, 1, 2)),
    cost_fn=_update_cost(12), no_gradient=True, family="optim",
    doc="Caffe2's Adam, t = iter + 1: m1 = b1*m1 + (1-b1)*g; m2 = b2*m2 + (1-b2)*g^2; "
        "param += lr * sqrt(1-b2^t)/(1-b1^t) * m1 / (sqrt(m2) + epsilon).")


@register_kernel("Adam")
def adam(ctx, p, m1, m2, g, lr, it):
    """Caffe2's Adam. Its epsilon is added to the uncorrected sqrt(m2), so it equals PyTorch's
    eps * sqrt(1 - beta2^t); with eps = 1e-8 the two agree to float32 rounding.
    """
    xp, a = ctx.xp, ctx.args
    b1, b2 = a.beta1, a.beta2
    t = _host_int(ctx, it) + 1
    np_, nm1, nm2 = _outputs(ctx, p, m1, m2)
    tmp = ctx.scratch(_SCRATCH, p.shape, p.dtype)
    # m1 = b1*m1 + (1-b1)*g
    xp.multiply(g, 1.0 - b1, out=tmp)
    xp.multiply(m1, b1, out=nm1)
    xp.add(nm1, tmp, out=nm1)
    # m2 = b2*m2 + (1-b2)*g^2
    xp.multiply(g, g, out=tmp)
    xp.multiply(tmp, 1.0 - b2, out=tmp)
    xp.multiply(m2, b2, out=nm2)
    xp.add(nm2, tmp, out=nm2)
    # param += lr * correction * m1 / (sqrt(m2) + eps), correction = sqrt(1-b2^t) / (1-b1^t)
    correction = math.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)
    xp.sqrt(nm2, out=tmp)
    xp.add(tmp, a.epsilon, out=tmp)
    xp.divide(nm1, tmp, out=tmp)
    xp.multiply(tmp, _scalar(lr) * correction, out=tmp)
    xp.add(p, tmp, out=np_)


# Adagrad --------------------------------------------------------------------------------
register_schema(
    "Adagrad", inputs=4, outputs=2, input_names=("param", "moment", "grad", "lr"),
    output_names=("param", "moment"), enforce_inplace=((0, 0), (1, 1)),
    args=[Arg("epsilon", "float", 1e-5), Arg("decay", "float", 1.0)],
    shape_fn=_update_shapes(("Adagrad", "param", "moment", "grad", "lr"),
                            tensors=(0, 1, 2), scalars=(3,), outputs=(0, 1)),
    cost_fn=_update_cost(7), no_gradient=True, family="optim",
    doc="Caffe2's Adagrad: h = decay*h + g^2; param += lr * g / (sqrt(h) + epsilon).")


@register_kernel("Adagrad")
def adagrad(ctx, p, h, g, lr):
    """Caffe2's Adagrad. Epsilon sits outside the square root, as in torch.optim.Adagrad, so
    decay=1 matches PyTorch (initial_accumulator_value=0, lr_decay=0) with the same eps;
    only the defaults differ (Caffe2 1e-5, PyTorch 1e-10). decay < 1 has no PyTorch twin.
    """
    xp, a = ctx.xp, ctx.args
    np_, nh = _outputs(ctx, p, h)
    tmp = ctx.scratch(_SCRATCH, p.shape, p.dtype)
    # h = decay*h + g^2
    xp.multiply(g, g, out=tmp)
    xp.multiply(h, a.decay, out=nh)
    xp.add(nh, tmp, out=nh)
    # param += lr * g / (sqrt(h) + eps)
    xp.sqrt(nh, out=tmp)
    xp.add(tmp, a.epsilon, out=tmp)
    xp.divide(g, tmp, out=tmp)
    xp.multiply(tmp, _scalar(lr), out=tmp)
    xp.add(p, tmp, out=np_)


# RmsProp --------------------------------------------------------------------------------
def _rmsprop_check(op, args: Args) -> None:
    if len(op.outputs) != len(op.inputs) - 1:
        raise SchemaError(f"op {op.label}: with {len(op.inputs)} inputs it makes "
                          f"{len(op.inputs) - 1} outputs (the param comes back with it), "
                          f"got {len(op.outputs)}")


register_schema(
    "RmsProp", inputs=(4, 5), outputs=(3, 4),
    input_names=("grad", "mean_squares", "mom", "lr", "param"),
    output_names=("grad", "mean_squares", "mom", "param"), inplace=((0, 0),),
    enforce_inplace=((1, 1), (2, 2), (4, 3)),
    args=[Arg("decay", "float", 0.9), Arg("momentum", "float", 0.0),
          Arg("epsilon", "float", 1e-5)],
    shape_fn=_update_shapes(("RmsProp", "grad", "mean_squares", "mom", "lr", "param"),
                            tensors=(0, 1, 2, 4), scalars=(3,), outputs=(0, 1, 2, 4)),
    cost_fn=_update_cost(9), check_fn=_rmsprop_check, no_gradient=True, family="optim",
    doc="Caffe2's RmsProp: ms = decay*ms + (1-decay)*g^2; mom = momentum*mom + "
        "lr*g/sqrt(ms + epsilon); output grad = mom. With a 5th input param (output 3), "
        "also param += mom; otherwise add the output grad to param (WeightedSum).")


@register_kernel("RmsProp")
def rmsprop(ctx, g, ms, mom, lr, p=None):
    """Caffe2's RmsProp. Epsilon sits inside the root, sqrt(ms + eps); torch.optim.RMSprop
    uses sqrt(ms) + eps. Momentum folds lr into the buffer (as MomentumSGDUpdate does), so it
    matches PyTorch's buf = mu*buf + g/avg; p -= lr*buf only while lr is constant.
    """
    xp, a = ctx.xp, ctx.args
    ng, nms, nmom = _outputs(ctx, g, ms, mom)
    tmp = ctx.scratch(_SCRATCH, g.shape, g.dtype)
    # ms = decay*ms + (1-decay)*g^2  (Caffe2 writes ms + (1-decay)*(g^2 - ms), the same sum)
    xp.multiply(g, g, out=tmp)
    xp.multiply(tmp, 1.0 - a.decay, out=tmp)
    xp.multiply(ms, a.decay, out=nms)
    xp.add(nms, tmp, out=nms)
    # mom = momentum*mom + lr*g / sqrt(ms + eps)
    xp.add(nms, a.epsilon, out=tmp)
    xp.sqrt(tmp, out=tmp)
    xp.divide(g, tmp, out=tmp)
    xp.multiply(tmp, _scalar(lr), out=tmp)
    xp.multiply(mom, a.momentum, out=nmom)
    xp.add(nmom, tmp, out=nmom)
    # output grad = mom (g is no longer read)
    xp.copyto(ng, nmom)
    if p is not None:
        # param += mom
        out = ctx.output(3, p.shape, p.dtype)
        xp.add(p, nmom, out=out)


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
    check_fn=_clip_check, no_gradient=True, family="optim",
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
