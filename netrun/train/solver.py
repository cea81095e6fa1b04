"""Turns a model plus a solver config into the nets a training run executes.

    init net     model fillers + optimizer state (zeros shaped like each param) + iter + ONE
    step net     forward + loss + metrics + backward (gradients of the params only)
    update net   [iter_size accumulation] + weight decay + clipping + LearningRate
                 + one update op per parameter + Iter
    test net     the forward ops in test mode (is_test=1, training-only outputs dropped)

Keeping step and update apart lets iter_size run the step several times per update, and
lets `profile` attribute time to forward, backward and update.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from netrun.core.gradient import add_gradient_ops
from netrun.core.schema import get_schema
from netrun.errors import ConfigError
from netrun.proto.defs import NetDef, OperatorDef, op
from netrun.train.config import SolverConfig

ITER, LR, ONE = "iter", "lr", "ONE"


@dataclass
class TrainingNets:
    """Everything a trainer runs, plus what a checkpoint must hold."""

    init: NetDef
    step: NetDef
    update: NetDef
    test: NetDef
    params: list[str]                # trainable parameters, in update order
    grads: dict[str, str]
    optimizer_state: list[str] = field(default_factory=list)
    state: list[str] = field(default_factory=lambda: [ITER])
    n_forward: int = 0


def to_test_mode(ops: list[OperatorDef]) -> list[OperatorDef]:
    """The same ops in inference mode: is_test=1 where the schema has it, extra outputs dropped."""
    out = []
    for o in ops:
        schema = get_schema(o.type)
        if schema.arg_spec("is_test") is not None:
            o = o.with_(args={**o.args, "is_test": 1}, outputs=o.outputs[: schema.outputs[0]])
        out.append(o)
    return out


# Gradients travel in buckets of about this many bytes (PyTorch DDP's default, 25 MB): large
# enough that the per-message latency is paid rarely, small enough that the first bucket
# leaves early in the backward pass.
BUCKET_BYTES = 25 << 20


def build_training(model, cfg: SolverConfig, ranks: int = 1,
                   bucket_bytes: int = BUCKET_BYTES) -> TrainingNets:
    """Build init/step/update/test nets for `model` (from netrun.load_model) and `cfg`.

    With `ranks` > 1 (data-parallel training), the gradients are averaged over the ranks
    before the update: in buckets started as soon as backward has produced them.
    """
    if not model.loss:
        raise ConfigError(f"model '{model.name}' has no loss; training needs one")
    params = [p.name for p in model.params if p.trainable]
    meta = {p.name: {"lr_mult": p.lr_mult, "decay_mult": p.decay_mult} for p in model.params}
    init = model.init_net.copy()
    init.name = f"{model.name}_init"
    step = model.train_net.copy()
    step.name = f"{model.name}_step"
    n_forward = len(step.ops)
    if model.test_net is not None:
        test = model.test_net.copy()
    else:
        test = NetDef("", to_test_mode(step.ops), list(step.external_inputs),
                      list(step.external_outputs))
    test.name = f"{model.name}_test"
    grads = add_gradient_ops(step, [model.loss], params=params)
    missing = [p for p in params if p not in grads]
    if missing:
        raise ConfigError(f"no gradient reaches parameter(s) {', '.join(missing)} from loss "
                          f"'{model.loss}'")

    update = NetDef(f"{model.name}_update")
    init.ops.append(op("ConstantFill", [], [ITER], shape=[], value=0, dtype="int64"))
    init.ops.append(op("ConstantFill", [], [ONE], shape=[], value=1.0))
    if cfg.iter_size > 1:
        grads = _accumulate(init, step, update, {p: grads[p] for p in params}, cfg.iter_size)
    if ranks > 1:
        sizes = {p.name: math.prod(p.shape) if p.shape else 0 for p in model.params}
        if cfg.iter_size > 1:          # sums over several passes: one exchange, before updates
            update.ops[:0] = _allreduce_ops([grads[p] for p in params], 0)
        else:
            step.ops = _with_allreduce(step.ops, params, grads, sizes, bucket_bytes)
    _weight_decay(init, update, params, grads, cfg, meta)
    if cfg.clip_gradients > 0:
        update.ops.append(op("ClipGradientsByNorm", [grads[p] for p in params],
                             [grads[p] for p in params], max_norm=cfg.clip_gradients))
    update.ops.append(op("LearningRate", [ITER], [LR], base_lr=cfg.base_lr,
                         **_policy_args(cfg.lr_policy, cfg.max_iter)))
    state = _updates(init, update, params, grads, cfg, meta)
    # As in Caffe, the counter moves after the update: step 0 uses policy(0) and Adam's t=1.
    update.ops.append(op("Iter", [ITER], [ITER]))
    return TrainingNets(init, step, update, test, params, grads, state, [ITER], n_forward)


def _allreduce_ops(names: list[str], k: int) -> list[OperatorDef]:
    """Start and wait of bucket k over the gradient blobs `names`."""
    token = f"__allreduce_{k}"
    return [op("AllreduceStart", names, [token], bucket=f"b{k}"),
            op("AllreduceWait", [token, *names], names, bucket=f"b{k}")]


def _with_allreduce(ops: list[OperatorDef], params: list[str], grads: dict[str, str],
                    sizes: dict[str, int], bucket_bytes: int) -> list[OperatorDef]:
    """`ops` (forward and backward) with the gradients averaged over the ranks: buckets in
    the order backward finishes the gradients, each started right after the op that
    finishes its last one, all waited for at the end."""
    done = {}
    for i, o in enumerate(ops):
        for name in o.outputs:
            done[name] = i                       # the last write of each blob
    order = sorted(params, key=lambda p: done[grads[p]])
    buckets, current, nbytes = [], [], 0
    for p in order:
        current.append(grads[p])
        nbytes += 4 * sizes.get(p, 0)
        if nbytes >= bucket_bytes:
            buckets.append(current)
            current, nbytes = [], 0
    if current:
        buckets.append(current)
    starts: dict[int, list[OperatorDef]] = {}
    waits = []
    for k, names in enumerate(buckets):
        start, wait = _allreduce_ops(names, k)
        starts.setdefault(max(done[n] for n in names), []).append(start)
        waits.append(wait)
    out = []
    for i, o in enumerate(ops):
        out.append(o)
        out += starts.get(i, [])
    return out + waits


def _accumulate(init: NetDef, step: NetDef, update: NetDef, grads: dict[str, str],
                iter_size: int):
    """Sum each gradient over iter_size step runs (the trainer zeroes the sums), then average."""
    acc = {}
    for p, g in grads.items():
        acc[p] = f"{g}_acc"
        init.ops.append(op("ConstantFill", [p], [acc[p]], value=0.0))
        step.ops.append(op("Sum", [acc[p], g], [acc[p]]))
        update.ops.append(op("Scale", [acc[p]], [acc[p]], scale=1.0 / iter_size))
    return acc


def _weight_decay(init, update, params, grads, cfg, meta) -> None:
    """L2: g += wd * decay_mult * p, as WeightedSum(g, ONE, p, wd) in place on g."""
    if cfg.weight_decay <= 0:
        return
    if cfg.regularization_type.upper() != "L2":
        raise ConfigError(f"solver.regularization_type '{cfg.regularization_type}' is not "
                          f"supported yet (L2 is)")
    for p in params:
        mult = float(_info(meta, p).get("decay_mult", 1.0))
        if mult == 0:
            continue
        wd = f"{p}_wd"
        init.ops.append(op("ConstantFill", [], [wd], shape=[], value=cfg.weight_decay * mult))
        update.ops.append(op("WeightedSum", [grads[p], ONE, p, wd], [grads[p]]))


def _updates(init, update, params, grads, cfg, meta) -> list[str]:
    """One update op per parameter; returns the optimizer state blobs a checkpoint keeps."""
    state: list[str] = []

    def zeros_like(p: str, suffix: str) -> str:
        name = f"{p}_{suffix}"
        init.ops.append(op("ConstantFill", [p], [name], value=0.0))
        state.append(name)
        return name

    for p in params:
        g = grads[p]
        lr = LR
        mult = float(_info(meta, p).get("lr_mult", 1.0))
        if mult != 1.0:
            lr = f"{p}_lr"
            update.ops.append(op("Scale", [LR], [lr], scale=mult))
        if cfg.type in ("sgd", "nesterov"):
            if cfg.momentum > 0 or cfg.type == "nesterov":
                m = zeros_like(p, "momentum")
                update.ops.append(op("MomentumSGDUpdate", [g, m, lr, p], [g, m, p],
                                     name=f"{p}_update", momentum=cfg.momentum,
                                     nesterov=int(cfg.type == "nesterov")))
            else:
                update.ops.append(op("WeightedSum", [p, ONE, g, lr], [p], name=f"{p}_update"))
        elif cfg.type == "adam":
            m1, m2 = zeros_like(p, "moment1"), zeros_like(p, "moment2")
            update.ops.append(op("Adam", [p, m1, m2, g, lr, ITER], [p, m1, m2], name=f"{p}_update",
                                 beta1=cfg.momentum,
                                 beta2=cfg.momentum2, epsilon=cfg.delta))
        elif cfg.type == "adagrad":
            h = zeros_like(p, "adagrad")
            update.ops.append(op("Adagrad", [p, h, g, lr], [p, h], name=f"{p}_update",
                                 epsilon=cfg.delta))
        elif cfg.type == "rmsprop":
            ms, mom = zeros_like(p, "mean_squares"), zeros_like(p, "rms_momentum")
            update.ops.append(op("RmsProp", [g, ms, mom, lr], [g, ms, mom], decay=cfg.rms_decay,
                                 momentum=cfg.momentum if cfg.momentum < 1 else 0.0,
                                 epsilon=cfg.delta))
            update.ops.append(op("WeightedSum", [p, ONE, g, ONE], [p], name=f"{p}_update"))
    return state


def _info(meta: dict, p: str) -> dict:
    return meta.get(p, {})


def _policy_args(policy: dict, max_iter: int) -> dict:
    """LearningRate op arguments from the config's lr_policy mapping."""
    policy = dict(policy)
    name = str(policy.pop("type", policy.pop("policy", "fixed")))
    args = {"policy": name}
    if name == "poly":
        args["max_iter"] = int(policy.pop("max_iter", max_iter))
    for key, value in policy.items():
        args[key] = value
    return args
