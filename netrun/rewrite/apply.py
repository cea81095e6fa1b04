"""Applying the rules: a net in, the rewritten net, the rules that fired and the folds out."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable

from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import infer_shapes
from netrun.errors import InternalError, NetrunError
from netrun.proto.defs import NetDef
from netrun.rewrite import inference, training
from netrun.rewrite.fold import Fold
from netrun.rewrite.graph import Graph
from netrun.rewrite.layout import plan_layouts
from netrun.rewrite.rule import Context, Rule

MODES = ("inference", "training")
RULES: tuple[Rule, ...] = inference.RULES + training.RULES


@dataclass(frozen=True)
class Fired:
    """One application of a rule: the ops it replaced and the op it made (labels)."""

    rule: str
    replaced: tuple[str, ...]
    made: str


@dataclass
class Rewritten:
    """A rewritten net, what fired, and the folded blobs it reads (see `materialize`)."""

    net: NetDef
    fired: list[Fired] = field(default_factory=list)
    folds: list[Fold] = field(default_factory=list)

    def materialize(self, ws) -> None:
        """Compute the folded blobs from the workspace's current parameters (again after
        they change)."""
        for fold in self.folds:
            fold.compute(ws)

    def derived_specs(self, spec_of: Callable[[str], TensorSpec]) -> dict[str, TensorSpec]:
        """Shapes of the blobs the rewrites added, from the specs of the blobs they replace."""
        specs: dict[str, TensorSpec] = {}
        for fold in self.folds:
            specs.update(fold.specs(spec_of))
        return specs

    def counts(self) -> dict[str, int]:
        """Rule name -> times it fired, in rule order."""
        out: dict[str, int] = {}
        for f in self.fired:
            out[f.rule] = out.get(f.rule, 0) + 1
        return out

    def summary(self) -> str:
        """'fold_spatial_bn ×19, conv_relu ×10' or 'no rewrites'."""
        return ", ".join(f"{k} ×{v}" for k, v in self.counts().items()) or "no rewrites"


def rules(mode: str) -> tuple[Rule, ...]:
    """The rules of one mode, in the order they are applied."""
    if mode not in MODES:
        raise InternalError(f"rewrite mode '{mode}' is not one of {', '.join(MODES)}")
    return tuple(r for r in RULES if r.mode == mode)


def rewrite(net: NetDef, mode: str, keep: Iterable[str] = (),
            shape_of: Callable[[str], tuple[int, ...] | None] = lambda name: None,
            enabled: bool = True, block: int = 0,
            dtype_of: Callable[[str], str | None] = lambda name: None) -> Rewritten:
    """Apply the mode's rules to a copy of `net` until none matches, then (with block > 0)
    plan channel-blocked layouts (netrun.rewrite.layout; a training net's forward ops, before
    its backward pass is built).

    keep: blobs the caller reads after the net ran (besides its external outputs); their
    values are never fused away nor blocked. shape_of / dtype_of: a parameter's shape and
    data type, None where unknown (a fold or a blocked conv then does not happen). block:
    oneDNN's channel block on this machine (`layout_block`), 0 for no layout plan.
    enabled=False returns the net as it is (the --no-fuse switch).
    """
    out = net.copy()
    result = Rewritten(out)
    if not enabled:
        return result
    keep = set(keep) | set(net.external_outputs)
    ops = list(out.ops)
    ctx = Context(shape_of, taken={*Graph(ops, ()).names(), *net.external_inputs},
                  dtype_of=dtype_of)
    for rule in rules(mode):
        if not rule.available():
            continue
        while (match := rule.find(Graph(ops, keep), ctx)) is not None:
            at = max(match.remove)
            replaced = tuple(ops[i].label for i in sorted(match.remove))
            ops = [match.op if i == at else o for i, o in enumerate(ops)
                   if i == at or i not in match.remove]
            result.fired.append(Fired(rule.name, replaced, match.op.label))
            result.folds.extend(match.folds)
            for fold in match.folds:
                out.external_inputs.extend([fold.weight, fold.bias])
    if block:
        # a folded conv's filters are new blobs, shaped and typed as the filters they replace
        made = {f.weight: f.conv_w for f in result.folds}
        ctx = Context(lambda n: shape_of(made.get(n, n)), ctx.taken,
                      lambda n: dtype_of(made.get(n, n)))
        planned = plan_layouts(ops, keep, block, ctx, training=mode == "training")
        ops = planned.ops
        result.fired.extend(Fired("blocked_layout", (label,), f"{label} channels-last"
                                  if label in planned.channels_last
                                  else f"{label} on blocks of {block} channels")
                            for label in planned.blocked)
        result.fired.extend(Fired("reorder", (), label) for label in planned.reorders)
    out.ops = ops
    return result


def layout_block(backend: str = "cpu") -> int:
    """The channel block a layout plan on `backend` uses: oneDNN's on the CPU when the
    engine is there and NETRUN_LAYOUTS is not 'off', else 0 (no plan)."""
    from netrun.kernels import onednn
    from netrun.kernels.onednn import conv as onednn_conv

    if (backend != "cpu" or not onednn.available()
            or os.environ.get(LAYOUTS_ENV, "").strip().lower() in ("0", "off", "false", "no")):
        return 0
    return onednn_conv.channel_block()


LAYOUTS_ENV = "NETRUN_LAYOUTS"


def bind_rewrite(net: NetDef, ws, mode: str, keep: Iterable[str] = (),
                 enabled: bool = True) -> Rewritten:
    """Rewrite a net about to be bound to `ws` (parameter shapes from its blobs) and compute
    its folded blobs there."""
    def shape_of(name: str):
        return tuple(ws.get_blob(name).shape) if ws.has_blob(name) else None

    def dtype_of(name: str):
        return str(ws.get_blob(name).dtype) if ws.has_blob(name) else None

    result = rewrite(net, mode, keep, shape_of, enabled, layout_block(ws.backend.name),
                     dtype_of)
    result.materialize(ws)
    return result


def training_rewrite(model, backend: str = "cpu", enabled: bool = True) -> Rewritten:
    """A model's train net (netrun.model.Model) with the training rules and, on a backend
    with a layout block (`layout_block`), the layout plan. Shapes and data types come from
    the model's init net and the train net at batch 2 (a plan needs the filters'; the
    add_relu rule compares a sum's inputs: shapes equal at batch 2 are equal at any)."""
    specs = _init_specs(model.init_net)
    try:
        specs = infer_shapes(model.train_net, {**specs, **model.input_specs(2)}).blobs
    except NetrunError:
        pass
    return rewrite(model.train_net, "training", (),
                   lambda n: specs[n].shape if n in specs else None, enabled,
                   layout_block(backend), lambda n: specs[n].dtype if n in specs else None)


def _init_specs(init: NetDef) -> dict[str, TensorSpec]:
    """Specs of what an init net makes; {} when its shapes cannot be inferred (then no conv
    is planned blocked)."""
    try:
        return infer_shapes(init, {}).blobs
    except NetrunError:
        return {}


def with_train_net(model, net: NetDef):
    """A shallow copy of a model (netrun.model.Model or a subclass) with another train net:
    what the solver builds a rewritten training run from."""
    out = copy.copy(model)
    out.train_net = net
    return out
