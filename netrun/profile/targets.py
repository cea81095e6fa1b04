"""What `netrun profile` times: a model, a train config or a checkpoint, made runnable.

A training profile binds the step and update nets as one net (phases forward, backward,
update) and feeds random inputs of the right shapes; a forward-only profile binds the
predict net. Costs come from shape inference; where that fails the times still stand.
A checkpoint's nets run only after checkpoint.CheckpointInfo.net has checked them (compute
ops only: nothing in a checkpoint may read or write files).
Nets are rewritten as the commands that run them would (netrun.rewrite) unless fuse=False:
the predict net with the inference rules, a model's train net with the training rules before
its backward pass is built. A checkpoint's stored step net already has its backward pass, so
a training profile of a checkpoint runs it as stored.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from netrun.core.net import SimpleNet
from netrun.core.schema import Cost, TensorSpec
from netrun.core.shape_inference import infer_shapes
from netrun.core.workspace import Workspace
from netrun.errors import CheckpointError, NetrunError, ShapeError
from netrun.model import load_model
from netrun.proto.defs import NetDef
from netrun.rewrite import Rewritten, bind_rewrite, training_rewrite, with_train_net
from netrun.train import checkpoint as ckpt
from netrun.train.config import SolverConfig, load_config
from netrun.train.solver import build_training
from netrun.util import safe_yaml

# Random inputs fed for a checkpoint's model: more elements than this is a hostile shape.
_MAX_FEED = 1 << 30


@dataclass
class ProfileTarget:
    """A bound net ready to time, with per-op phases and costs and a feeding function."""

    net: SimpleNet
    phases: list[str]
    costs: list[Cost | None]
    feed: Callable[[], None]
    description: str
    batch: int
    rewritten: list[Rewritten] = field(default_factory=list)   # what the rewrites did

    @property
    def rewrites(self) -> str:
        """The rules that fired, e.g. 'fold_spatial_bn ×21, conv_relu ×10'."""
        merged = Rewritten(NetDef(), [f for r in self.rewritten for f in r.fired])
        return merged.summary()


def kind_of(path: str) -> str:
    """'checkpoint', 'config' or 'model' from the file's suffix and (for YAML) its keys."""
    p = Path(path)
    if p.suffix in (".h5", ".hdf5"):
        return "checkpoint"
    if p.suffix in (".yaml", ".yml") and p.exists():
        try:
            data = safe_yaml.safe_load(safe_yaml.read_text(p), str(p)) or {}
        except NetrunError:
            return "model"  # the model loader reports the syntax error with its position
        if isinstance(data, dict) and "model" in data and ("solver" in data or "data" in data):
            return "config"
    return "model"


def prepare(path: str, batch: int | None, device: str, forward_only: bool,
            input_overrides: dict[str, TensorSpec] | None = None, seed: int = 0,
            fuse: bool = True, memory_plan: bool = True,
            executor: str = "simple") -> ProfileTarget:
    """Load whatever `path` is and bind the net to time (rewritten unless fuse=False;
    activations sharing memory by lifetime unless memory_plan=False)."""
    kind = kind_of(path)
    if kind == "checkpoint":
        return _from_checkpoint(path, batch, device, forward_only, seed, fuse, memory_plan,
                                executor)
    if kind == "config":
        cfg = load_config(path)
        model, solver = load_model(cfg.model), cfg.solver
        batch = batch or int(cfg.data.get("batch_size", 64))
        device = device or cfg.device
    else:
        model, solver = load_model(path), SolverConfig(type="sgd", momentum=0.9)
        batch = batch or 64
    if not model.loss and not forward_only:
        # A deploy net (no loss, no labels) can only be timed forward.
        warnings.warn(f"{path} has no loss: timing the forward pass only")
        forward_only = True
    return _from_model(model, solver, batch, device or "cpu", forward_only,
                       input_overrides or {}, seed, f"{model.name} ({kind} {path})", fuse,
                       memory_plan, executor)


def _from_model(model, solver, batch, device, forward_only, overrides, seed, description,
                fuse=True, memory_plan=True, executor="simple"):
    ws = Workspace(device, seed=seed, memory_plan=memory_plan, executor=executor)
    specs = model.input_specs(batch, overrides)
    rng = np.random.default_rng(seed)
    classes = _num_classes(model, batch, overrides)
    feeds = {}
    for name in model.inputs:
        if name not in specs:
            raise ShapeError(f"the shape of input '{name}' is unknown; "
                             f"pass --input {name}=D1,D2,...")
        spec = specs[name]
        if name in model.labels:
            feeds[name] = rng.integers(0, classes, size=spec.shape).astype(spec.dtype)
        else:
            feeds[name] = rng.standard_normal(spec.shape).astype(spec.dtype)

    def feed():
        for name, value in feeds.items():
            ws.refill_blob(name, value)

    if forward_only:
        ws.run_net_once(model.init_net)
        net = NetDef("profile_predict", list(model.predict_net.ops),
                     list(model.predict_net.external_inputs),
                     list(model.predict_net.external_outputs))
        done = bind_rewrite(net, ws, "inference", enabled=fuse)
        net = done.net
        phases = ["forward"] * len(net.ops)
        init = model.init_net
    else:
        done = training_rewrite(model, ws.backend.name, enabled=fuse)
        nets = build_training(with_train_net(model, done.net), solver)
        ws.run_net_once(nets.init)
        net = NetDef("profile_train", nets.step.ops + nets.update.ops)
        phases = (["forward"] * nets.n_forward
                  + ["backward"] * (len(nets.step.ops) - nets.n_forward)
                  + ["update"] * len(nets.update.ops))
        init = nets.init
        keep = _handed_over(nets.step, nets.update)
    feed()
    costs = _costs(init, net, {**specs, **_derived(done, ws)})
    return ProfileTarget(ws.create_net(net, keep=keep if not forward_only else ()), phases,
                         costs, feed, description, batch, [done])


def _handed_over(step: NetDef, update: NetDef) -> set[str]:
    """Blobs the step net writes for the update net (the gradients): the trainer's step and
    update nets never share them, so neither does the one net profiled for both."""
    from netrun.core.lifetimes import external_reads

    return {n for o in step.ops for n in o.outputs} & external_reads(update)


def _derived(done: Rewritten, ws) -> dict[str, TensorSpec]:
    """Specs of the blobs a rewrite computed (folded weights), for cost inference."""
    return {n: TensorSpec(tuple(ws.get_blob(n).shape), str(ws.get_blob(n).dtype))
            for fold in done.folds for n in (fold.weight, fold.bias)}


def _from_checkpoint(path, batch, device, forward_only, seed, fuse=True, memory_plan=True,
                     executor="simple"):
    info = ckpt.read_info(path)
    meta_model = info.meta.get("model", {})
    inputs = {n: (None if v is None else TensorSpec(tuple(v[0]), v[1]))
              for n, v in meta_model.get("inputs", {}).items()}
    labels = list(meta_model.get("labels", []))
    batch = batch or _stored_batch(info)
    ws = Workspace(device or "cpu", seed=seed, memory_plan=memory_plan, executor=executor)
    done, keep = None, set()
    if forward_only:
        net = info.net("predict")
        ckpt.load_blobs(ws, path, info.params, "params")
        done = bind_rewrite(net, ws, "inference", enabled=fuse)
        net = done.net
        phases = ["forward"] * len(net.ops)
        init = None
    else:
        init, step, update = info.net("init"), info.net("step"), info.net("update")
        ws.run_net_once(init)
        ckpt.load_blobs(ws, path, info.params, "params")
        ckpt.load_blobs(ws, path, info.optimizer, "optimizer")
        # Forward ops come first in the step net (a hostile test net may be longer).
        n_fwd = min(len(info.net("test").ops), len(step.ops))
        net = NetDef("profile_train", step.ops + update.ops)
        keep = _handed_over(step, update)
        phases = (["forward"] * n_fwd + ["backward"] * (len(step.ops) - n_fwd)
                  + ["update"] * len(update.ops))
    rng = np.random.default_rng(seed)
    specs = {n: TensorSpec((batch, *s.shape), s.dtype) for n, s in inputs.items() if s is not None}
    for name, spec in specs.items():
        if int(np.prod(spec.shape, dtype=object)) > _MAX_FEED:
            raise CheckpointError(f"checkpoint '{path}': input '{name}' ({spec} at batch "
                                  f"{batch}) is too large to feed; pass a smaller --batch")
    classes = 10
    feeds = {n: (rng.integers(0, classes, size=s.shape).astype(s.dtype) if n in labels
                 else rng.standard_normal(s.shape).astype(s.dtype)) for n, s in specs.items()
             if not (forward_only and n in labels)}

    def feed():
        for name, value in feeds.items():
            ws.refill_blob(name, value)

    feed()
    for name in info.params:
        specs[name] = TensorSpec(tuple(info.shapes[name]), str(ws.get_blob(name).dtype))
    if done is not None:
        specs.update(_derived(done, ws))
    costs = _costs(init, net, specs)
    return ProfileTarget(ws.create_net(net, keep=keep), phases, costs, feed,
                         f"checkpoint {path}", batch,
                         [done] if done is not None else [])


def _stored_batch(info) -> int:
    """The training batch size a checkpoint's config names, else 64."""
    data = (info.meta.get("config") or {}).get("data")
    batch = data.get("batch_size", 64) if isinstance(data, dict) else 64
    if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= 1 << 20:
        raise CheckpointError(f"checkpoint '{info.path}': config data.batch_size is {batch!r}, "
                              f"not a batch size; pass --batch")
    return batch


def _num_classes(model, batch, overrides) -> int:
    try:
        shapes = model.infer_shapes("predict", batch, overrides)
        out = shapes[model.outputs[0]] if model.outputs else None
        return int(out.shape[-1]) if out is not None and out.shape else 2
    except Exception:
        return 2


def _costs(init: NetDef | None, net: NetDef, specs: dict) -> list[Cost | None]:
    try:
        known = dict(specs)
        if init is not None:
            known.update(infer_shapes(init, known).blobs)
        shapes = infer_shapes(net, known)
        return [o.cost for o in shapes.ops]
    except Exception as e:  # timing does not depend on costs; say why the columns are empty
        warnings.warn(f"cost inference failed, FLOP columns left empty: {e}")
        return [None] * len(net.ops)
