"""Gradient registry and the backward-pass builder (Caffe2's GetBackwardPass).

A gradient maker receives a GradientContext for one forward op and returns the gradient
OperatorDefs. Names follow Caffe2: the gradient of blob X is X_grad. The builder walks the
forward net in reverse, versions every blob write so in-place ops are handled, sums the
contributions of blobs read by several ops, and stops where no gradient is wanted.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterable, Sequence

from netrun.core.schema import get_schema
from netrun.errors import GradientError
from netrun.proto.defs import NetDef, OperatorDef
from netrun.proto.defs import op as make_op

GradientMaker = Callable[["GradientContext"], list[OperatorDef]]
_MAKERS: dict[str, GradientMaker] = {}


def register_gradient(type: str) -> Callable[[GradientMaker], GradientMaker]:
    """Decorator: register the gradient maker of forward op `type`."""

    def wrap(fn: GradientMaker) -> GradientMaker:
        if type in _MAKERS:
            raise ValueError(f"gradient maker for {type} registered twice")
        _MAKERS[type] = fn
        return fn

    return wrap


def has_gradient(type: str) -> bool:
    """Whether a gradient maker is registered for `type`."""
    return type in _MAKERS


def grad_name(blob: str) -> str:
    return f"{blob}_grad"


class GradientContext:
    """What a gradient maker sees: the forward op and the gradients of its outputs."""

    def __init__(self, forward: OperatorDef, output_grads: Sequence[str | None],
                 needed: Sequence[bool] | None = None):
        self.def_ = forward
        self.args = forward.args
        self._go = list(output_grads)
        self._needed = list(needed) if needed is not None else [True] * len(forward.inputs)
        self.zero_fills: list[OperatorDef] = []
        self.input_grads: dict[int, str] = {}
        self.read_inputs: set[int] = set()
        self.read_outputs: set[int] = set()

    def I(self, i: int) -> str:  # noqa: E743  (Caffe2's name)
        """Forward input i, read by the gradient op (must still hold its forward value)."""
        self.read_inputs.add(i)
        return self.def_.inputs[i]

    def O(self, i: int) -> str:  # noqa: E743
        """Forward output i, read by the gradient op."""
        self.read_outputs.add(i)
        return self.def_.outputs[i]

    def GO(self, i: int) -> str:
        """Gradient blob of output i; a zero blob shaped like the output if none flows there."""
        g = self._go[i]
        if g is None:
            out = self.def_.outputs[i]
            g = grad_name(out) + "_zero"
            self.zero_fills.append(make_op("ConstantFill", [out], [g], value=0.0))
            self._go[i] = g
        return g

    def has_GO(self, i: int) -> bool:
        return i < len(self._go) and self._go[i] is not None

    def GI(self, i: int) -> str:
        """Name for the gradient of input i (records that the maker produces it)."""
        name = grad_name(self.def_.inputs[i])
        self.input_grads[i] = name
        return name

    def grad_is(self, i: int, blob: str) -> None:
        """Input i's gradient is `blob`, a gradient another op of this maker writes (under a
        name of its own, not GI's): no op copies it. Several inputs may share one (a sum's
        inputs: the same values); the backward builder then never accumulates into it in
        place while it stands for more than one gradient."""
        self.input_grads[i] = blob

    def needs(self, i: int) -> bool:
        """Whether anyone wants the gradient of input i (makers may skip work when not)."""
        return self._needed[i]

    def op(self, type: str, inputs: Iterable[str], outputs: Iterable[str], **args) -> OperatorDef:
        """A gradient op that keeps the forward op's device and engine."""
        return OperatorDef(type, tuple(inputs), tuple(outputs), args,
                           f"{self.def_.name}_grad" if self.def_.name else "",
                           self.def_.device, self.def_.engine)

    def copy_args(self, *names: str) -> dict:
        """The forward op's arguments, all or the named ones, for its gradient op."""
        if not names:
            return dict(self.args)
        return {k: self.args[k] for k in names if k in self.args}


def _run_maker(forward: OperatorDef, output_grads, needed=None, fresh=None):
    ctx = GradientContext(forward, output_grads, needed)
    ops = list(_MAKERS[forward.type](ctx))
    schema = get_schema(forward.type)
    grads = {i: g for i, g in ctx.input_grads.items() if i not in schema.non_differentiable}
    ops = _split_repeated(ops, grads, fresh or _temp_namer())
    return ctx.zero_fills + ops, grads, ctx


def _temp_namer() -> Callable[[str], str]:
    """Fresh names for gradient contributions written aside: X_grad_autosplit_1, _2, ..."""
    counter = itertools.count(1)
    return lambda name: f"{name}_autosplit_{next(counter)}"


def _split_repeated(ops: list[OperatorDef], grads: dict[int, str],
                    fresh: Callable[[str], str]) -> list[OperatorDef]:
    """Give each write of a gradient shared by several inputs (Mul(X, X)) its own blob + a Sum.

    A maker may name the same X_grad for two input indices; written twice, the second write
    would clobber the first. Every write is renamed (a later read or in-place update of it
    follows the rename), and the surviving contributions are summed into X_grad.
    """
    names = list(grads.values())
    shared = {g for g in names if names.count(g) > 1}
    shared = {g for g in shared if sum(o.outputs.count(g) for o in ops) > 1}
    if not shared:
        return ops
    current: dict[str, str] = {}            # shared name -> the blob holding its latest write
    parts: dict[str, list[str]] = {g: [] for g in shared}
    out: list[OperatorDef] = []
    for o in ops:
        inputs = tuple(current.get(n, n) for n in o.inputs)
        outputs = list(o.outputs)
        for j, n in enumerate(o.outputs):
            if n not in shared:
                continue
            if n in o.inputs and current.get(n) in parts[n]:
                parts[n].remove(current[n])     # updated in place: the new write replaces it
            outputs[j] = current[n] = fresh(n)
            parts[n].append(outputs[j])
        out.append(o.with_(inputs=inputs, outputs=tuple(outputs)))
    name, device = ops[0].name, ops[0].device
    for g in sorted(shared):
        out.append(make_op("Sum", parts[g], [g], name=name, device=device))
    return out


def gradient_ops(op: OperatorDef) -> tuple[list[OperatorDef], dict[str, str | None]]:
    """Gradient OperatorDefs for one op, given gradients X_grad for all its outputs."""
    schema = get_schema(op.type)
    if schema.no_gradient:
        return [], {name: None for name in op.inputs}
    if not has_gradient(op.type):
        raise GradientError(f"op {op.label}: no gradient is registered for {op.type}")
    ops, grads, _ = _run_maker(op, [grad_name(o) for o in op.outputs])
    grad_of: dict[str, str | None] = {name: None for name in op.inputs}
    for i, g in grads.items():
        grad_of[op.inputs[i]] = g
    return ops, grad_of


def add_gradient_ops(net: NetDef, losses: Sequence[str], params: Iterable[str] | None = None,
                     ) -> dict[str, str]:
    """Append the backward pass of `net` for `losses` (seeded with ones); return blob -> grad.

    With `params`, only gradients that lead to those blobs are computed (the first conv's
    input gradient is skipped, for example); without, every differentiable input gets one.
    """
    forward = list(net.ops)
    # Versions: each write of a blob bumps its version, so an in-place op's input and
    # output are different versions of the same name.
    version: dict[str, int] = {}
    in_versions, out_versions = [], []
    for fop in forward:
        in_versions.append([version.get(b, 0) for b in fop.inputs])
        outs = []
        for b in fop.outputs:
            version[b] = version.get(b, 0) + 1
            outs.append(version[b])
        out_versions.append(outs)
    final = dict(version)

    params = None if params is None else list(params)
    wanted = _blobs_reaching(forward, set(params)) if params is not None else None

    backward: list[OperatorDef] = []
    grads: dict[tuple[str, int], str] = {}   # (blob, version) -> gradient blob
    for loss in losses:
        if loss not in final and not any(loss in f.inputs for f in forward):
            raise GradientError(f"loss blob '{loss}' is not produced by net '{net.name}'")
        g = grad_name(loss)
        backward.append(make_op("ConstantFill", [loss], [g], value=1.0))
        grads[(loss, final.get(loss, 0))] = g

    missing: list[str] = []
    aliased: set[str] = set()    # gradient blobs that stand for several inputs' gradients
    fresh = _temp_namer()
    for k in range(len(forward) - 1, -1, -1):
        fop = forward[k]
        go = [grads.get((b, v)) for b, v in zip(fop.outputs, out_versions[k])]
        if all(g is None for g in go):
            continue
        schema = get_schema(fop.type)
        if schema.no_gradient:
            continue
        needed = [wanted is None or b in wanted for b in fop.inputs]
        needed = [n and i not in schema.non_differentiable for i, n in enumerate(needed)]
        if not any(needed):
            continue
        if fop.type not in _MAKERS:
            missing.append(f"{fop.label}")
            # Pretend a gradient flows on, so every op lacking a maker is found in one pass.
            for i, b in enumerate(fop.inputs):
                if needed[i]:
                    grads.setdefault((b, in_versions[k][i]), grad_name(b))
            continue
        ops, input_grads, ctx = _run_maker(fop, go, needed, fresh)
        _check_versions(fop, ctx, in_versions[k], out_versions[k], final)
        renames: dict[str, str] = {}
        sums: list[OperatorDef] = []
        # One entry per distinct input blob: Mul(X, X) gives X one (already summed) gradient.
        contributions = {(fop.inputs[i], in_versions[k][i]): g
                         for i, g in sorted(input_grads.items()) if needed[i]}
        # a blob standing for several inputs' gradients (GradientContext.grad_is)
        shared = {g for g in contributions.values()
                  if list(contributions.values()).count(g) > 1}
        for key, g in contributions.items():
            if key not in grads:
                grads[key] = g
                if g in shared:
                    aliased.add(g)
                continue
            # A second contribution to this gradient: accumulate it. In place, unless the
            # blob also stands for another gradient (then into a fresh blob); the op writes
            # its contribution aside, unless that blob is one it shares between inputs.
            part = g
            if g not in shared:
                part = renames[g] = fresh(grads[key])
            before = grads[key]
            target = grads[key] = fresh(grad_name(key[0])) if before in aliased else before
            sums.append(make_op("Sum", [before, part], [target]))
        if renames:
            ops = [o.with_(outputs=tuple(renames.get(n, n) for n in o.outputs)) for o in ops]
        backward.extend(ops)
        backward.extend(sums)

    if missing:
        raise GradientError("no gradient is registered for these ops on the path to the loss: "
                            + "; ".join(missing)
                            + ". Put a StopGradient before them or register a gradient maker.")
    result: dict[str, str] = {}
    for (blob, _v), g in grads.items():
        result.setdefault(blob, g)
    # Update ops may write a parameter's gradient in place (momentum, weight decay): a
    # parameter never shares its gradient blob with another's.
    owned: set[str] = set()
    for blob in params or ():
        g = result.get(blob)
        if g in aliased and g in owned:
            result[blob] = fresh(grad_name(blob))
            backward.append(make_op("Copy", [g], [result[blob]]))
        owned.add(g)
    net.ops.extend(backward)
    return {b: g for b, g in result.items() if b not in losses}


def _blobs_reaching(forward: list[OperatorDef], targets: set[str]) -> set[str]:
    """Blobs computed from any target blob (so a gradient toward the targets flows through them)."""
    reach = set(targets)
    for fop in forward:
        if any(b in reach for b in fop.inputs):
            reach.update(fop.outputs)
    return reach


def _check_versions(fop: OperatorDef, ctx: GradientContext, in_v, out_v, final) -> None:
    """Refuse a gradient that reads a forward blob some in-place op has since overwritten."""
    reads = [(fop.inputs[i], in_v[i]) for i in sorted(ctx.read_inputs)]
    reads += [(fop.outputs[j], out_v[j]) for j in sorted(ctx.read_outputs)]
    for blob, v in reads:
        if v != final.get(blob, 0):
            raise GradientError(
                f"op {fop.label}: its gradient reads '{blob}', which an in-place op overwrites "
                f"before the backward pass runs; give that op a new output blob")
