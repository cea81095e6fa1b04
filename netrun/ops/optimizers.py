"""Optimizers (Caffe2's update ops): MomentumSGDUpdate, Adam, Adagrad, RmsProp.

The sign convention and in-place rules are optim.py's: lr is negative (LearningRate stores
-base_lr * multiplier) and every op adds lr-scaled steps to its parameter, in place; no
gradient flows through an update.
"""
from __future__ import annotations

import math

from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, register_schema
from netrun.errors import SchemaError
from netrun.ops.solver_ops import (
    SCRATCH,
    host_int,
    outputs_like,
    scalar,
    update_cost,
    update_shapes,
)


def _require(op, args: Args, name: str, ok, rule: str) -> None:
    """SchemaError naming the op and the argument unless ok(value) holds."""
    if not ok(args[name]):
        raise SchemaError(f"op {op.label}: argument '{name}' is {args[name]}; it must be {rule}")


def _check_momentum_sgd(op, args: Args) -> None:
    _require(op, args, "momentum", lambda v: v >= 0, ">= 0")


def _check_adam(op, args: Args) -> None:
    # beta -> 1 makes the bias correction 1/(1 - beta^t) infinite; epsilon 0 gives 0/0.
    for name in ("beta1", "beta2"):
        _require(op, args, name, lambda v: 0 <= v < 1, "in [0, 1)")
    _require(op, args, "epsilon", lambda v: v > 0, "> 0")


def _check_adagrad(op, args: Args) -> None:
    _require(op, args, "epsilon", lambda v: v > 0, "> 0 (a zero history would divide 0 by 0)")
    _require(op, args, "decay", lambda v: 0 <= v <= 1, "in [0, 1]")


# MomentumSGDUpdate ----------------------------------------------------------------------
register_schema(
    "MomentumSGDUpdate", inputs=4, outputs=3, input_names=("grad", "momentum", "lr", "param"),
    output_names=("grad", "momentum", "param"), inplace=((0, 0),),
    enforce_inplace=((1, 1), (3, 2)),
    args=[Arg("momentum", "float", 0.9), Arg("nesterov", "int", 0, allowed=(0, 1))],
    shape_fn=update_shapes(("MomentumSGDUpdate", "grad", "momentum", "lr", "param"),
                           tensors=(0, 1, 3), scalars=(2,), outputs=(0, 1, 3)),
    cost_fn=update_cost(5), check_fn=_check_momentum_sgd, no_gradient=True, family="optimizers",
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
    ng, nm, np_ = outputs_like(ctx, g, m, p)
    # ng <- lr*g (ng may be g, which is not read again)
    xp.multiply(g, scalar(lr), out=ng)
    # m_new = mu*m + lr*g (nm may be m)
    xp.multiply(m, mu, out=nm)
    xp.add(nm, ng, out=nm)
    if ctx.args.nesterov:
        # step = (1+mu)*m_new - mu*m_old = mu*m_new + lr*g, since mu*m_old = m_new - lr*g
        tmp = ctx.scratch(SCRATCH, nm.shape, nm.dtype)
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
    shape_fn=update_shapes(("Adam", "param", "moment1", "moment2", "grad", "lr", "iter"),
                           tensors=(0, 1, 2, 3), scalars=(4, 5), outputs=(0, 1, 2)),
    cost_fn=update_cost(12), check_fn=_check_adam, no_gradient=True, family="optimizers",
    doc="Caffe2's Adam, t = iter + 1: m1 = b1*m1 + (1-b1)*g; m2 = b2*m2 + (1-b2)*g^2; "
        "param += lr * sqrt(1-b2^t)/(1-b1^t) * m1 / (sqrt(m2) + epsilon).")


@register_kernel("Adam")
def adam(ctx, p, m1, m2, g, lr, it):
    """Caffe2's Adam. Its epsilon is added to the uncorrected sqrt(m2), so it equals PyTorch's
    eps * sqrt(1 - beta2^t); with eps = 1e-8 the two agree to float32 rounding.
    """
    xp, a = ctx.xp, ctx.args
    b1, b2 = a.beta1, a.beta2
    t = host_int(ctx, it) + 1
    np_, nm1, nm2 = outputs_like(ctx, p, m1, m2)
    tmp = ctx.scratch(SCRATCH, p.shape, p.dtype)
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
    xp.multiply(tmp, scalar(lr) * correction, out=tmp)
    xp.add(p, tmp, out=np_)


# Adagrad --------------------------------------------------------------------------------
register_schema(
    "Adagrad", inputs=4, outputs=2, input_names=("param", "moment", "grad", "lr"),
    output_names=("param", "moment"), enforce_inplace=((0, 0), (1, 1)),
    args=[Arg("epsilon", "float", 1e-5), Arg("decay", "float", 1.0)],
    shape_fn=update_shapes(("Adagrad", "param", "moment", "grad", "lr"),
                           tensors=(0, 1, 2), scalars=(3,), outputs=(0, 1)),
    cost_fn=update_cost(7), check_fn=_check_adagrad, no_gradient=True, family="optimizers",
    doc="Caffe2's Adagrad: h = decay*h + g^2; param += lr * g / (sqrt(h) + epsilon).")


@register_kernel("Adagrad")
def adagrad(ctx, p, h, g, lr):
    """Caffe2's Adagrad. Epsilon sits outside the square root, as in torch.optim.Adagrad, so
    decay=1 matches PyTorch (initial_accumulator_value=0, lr_decay=0) with the same eps;
    only the defaults differ (Caffe2 1e-5, PyTorch 1e-10). decay < 1 has no PyTorch twin.
    """
    xp, a = ctx.xp, ctx.args
    np_, nh = outputs_like(ctx, p, h)
    tmp = ctx.scratch(SCRATCH, p.shape, p.dtype)
    # h = decay*h + g^2
    xp.multiply(g, g, out=tmp)
    xp.multiply(h, a.decay, out=nh)
    xp.add(nh, tmp, out=nh)
    # param += lr * g / (sqrt(h) + eps)
    xp.sqrt(nh, out=tmp)
    xp.add(tmp, a.epsilon, out=tmp)
    xp.divide(g, tmp, out=tmp)
    xp.multiply(tmp, scalar(lr), out=tmp)
    xp.add(p, tmp, out=np_)


# RmsProp --------------------------------------------------------------------------------
def _rmsprop_check(op, args: Args) -> None:
    if len(op.outputs) != len(op.inputs) - 1:
        raise SchemaError(f"op {op.label}: with {len(op.inputs)} inputs it makes "
                          f"{len(op.inputs) - 1} outputs (the param comes back with it), "
                          f"got {len(op.outputs)}")
    _require(op, args, "decay", lambda v: 0 <= v <= 1, "in [0, 1]")
    _require(op, args, "momentum", lambda v: v >= 0, ">= 0")
    _require(op, args, "epsilon", lambda v: v > 0, "> 0 (sqrt(ms + epsilon) divides)")


register_schema(
    "RmsProp", inputs=(4, 5), outputs=(3, 4),
    input_names=("grad", "mean_squares", "mom", "lr", "param"),
    output_names=("grad", "mean_squares", "mom", "param"), inplace=((0, 0),),
    enforce_inplace=((1, 1), (2, 2), (4, 3)),
    args=[Arg("decay", "float", 0.9), Arg("momentum", "float", 0.0),
          Arg("epsilon", "float", 1e-5)],
    shape_fn=update_shapes(("RmsProp", "grad", "mean_squares", "mom", "lr", "param"),
                           tensors=(0, 1, 2, 4), scalars=(3,), outputs=(0, 1, 2, 4)),
    cost_fn=update_cost(9), check_fn=_rmsprop_check, no_gradient=True, family="optimizers",
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
    ng, nms, nmom = outputs_like(ctx, g, ms, mom)
    tmp = ctx.scratch(SCRATCH, g.shape, g.dtype)
    # ms = decay*ms + (1-decay)*g^2  (Caffe2 writes ms + (1-decay)*(g^2 - ms), the same sum)
    xp.multiply(g, g, out=tmp)
    xp.multiply(tmp, 1.0 - a.decay, out=tmp)
    xp.multiply(ms, a.decay, out=nms)
    xp.add(nms, tmp, out=nms)
    # mom = momentum*mom + lr*g / sqrt(ms + eps)
    xp.add(nms, a.epsilon, out=tmp)
    xp.sqrt(tmp, out=tmp)
    xp.divide(g, tmp, out=tmp)
    xp.multiply(tmp, scalar(lr), out=tmp)
    xp.multiply(mom, a.momentum, out=nmom)
    xp.add(nmom, tmp, out=nmom)
    # output grad = mom (g is no longer read)
    xp.copyto(ng, nmom)
    if p is not None:
        # param += mom
        out = ctx.output(3, p.shape, p.dtype)
        xp.add(p, nmom, out=out)
