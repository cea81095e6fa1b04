"""PhaseTranslator: the layers of one phase (TRAIN or TEST) -> forward ops, in order.

Blob names follow Caffe's where they can. A layer whose top overwrites its bottom (in place)
writes the same netrun blob only when that is safe for the backward pass: no gradient op may
still need the value being overwritten (ReLU's gradient reads its output, which a following
in-place Dropout would overwrite; BatchNorm's gradient reads its input), no other Caffe name
may share the blob (Split), and the op's schema must allow it. Otherwise the top gets a fresh
name, `<top>_<layer>`, and every later reader of the Caffe name reads the new blob (SSA
renaming).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from netrun.caffe.context import LayerContext
from netrun.caffe.fields import Fields, Skip
from netrun.caffe.layers import LAYERS
from netrun.core.gradient import gradient_ops, has_gradient
from netrun.core.schema import TensorSpec, get_schema
from netrun.errors import NetrunError, suggest
from netrun.proto.defs import OperatorDef
from netrun.proto.defs import op as make_op

if TYPE_CHECKING:
    from netrun.caffe.translate import ModelTranslator

@dataclass
class LayerRecord:
    """A committed layer: its actual bottom and top blobs and where its ops are."""

    name: str
    type: str
    bottoms: list[str]
    tops: list[str]
    ops: list[OperatorDef]
    head: bool          # loss or metric: not part of the predict net
    data: bool          # declares model inputs


class PhaseTranslator:
    """Translates the layers of one phase; `ops`, `losses`, `metrics` are the result."""

    def __init__(self, model: "ModelTranslator", phase: str):
        self.model, self.phase = model, phase
        self.cur: dict[str, str] = {}           # Caffe blob name -> current netrun blob
        self.sharing: Counter = Counter()       # netrun blob -> Caffe names mapping to it
        self.specs: dict[str, TensorSpec] = {}
        self.needed: set[str] = set()           # blob versions some gradient op reads
        self.used: set[str] = set()
        self.poisoned: set[str] = set()         # tops of layers that could not be translated
        self.ops: list[OperatorDef] = []
        self.records: list[LayerRecord] = []
        self.losses: list[tuple[str, float]] = []
        self.metrics: list[str] = []

    # Names ------------------------------------------------------------------------------
    def fresh(self, base: str, top: bool = False) -> str:
        """An unused blob name: `base`, else `base_2`, ... (temps also avoid Caffe names)."""
        taken = self.used | self.model.param_names
        if not top:
            taken = taken | self.model.reserved
        name, k = base, 1
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def _set(self, caffe_name: str, blob: str) -> None:
        old = self.cur.get(caffe_name)
        if old is not None:
            self.sharing[old] -= 1
        self.cur[caffe_name] = blob
        self.sharing[blob] += 1

    def declare_input(self, t: LayerContext, top: str, shape: tuple[int, ...], dtype: str) -> None:
        """A model input (a data layer's top); per-example shapes must agree across phases."""
        spec = self.model.declare_input(t, top, shape[1:], dtype)   # input_shapes may win
        self.specs[top] = TensorSpec((shape[0], *spec.shape), spec.dtype)
        self.used.add(top)

    def class_label(self, blob: str) -> str:
        """Mark `blob` as holding class indices: a model input of that name becomes int32."""
        if blob in self.model.inputs:
            self.model.class_labels.add(blob)
            self.specs[blob] = TensorSpec(self.specs[blob].shape, "int32")
        return blob

    # Layers -----------------------------------------------------------------------------
    def run_layer(self, fields: Fields, type_: str) -> None:
        """Translate one layer of this phase; problems are recorded, never raised."""
        f = fields
        f.ignore("type", "phase")   # phase: set by Caffe itself, never by hand
        name = str(f.msg.get("name", ""))
        tops = [t for t in f.msg.get_all("top") if isinstance(t, str)]
        try:
            name = f.get("name", "", "str")
            bottoms, tops = f.get_all("bottom", "str"), f.get_all("top", "str")
            if type_ not in LAYERS or any(b in self.poisoned for b in bottoms):
                self.poisoned.update(tops)   # unsupported types are reported once, up front
                return
            actual = self._bottoms(f, bottoms, tops)
            t = LayerContext(self, f, name, type_, actual, tops)
            LAYERS[type_](t)
        except Skip as e:
            self.model.problems.add(e.problem.message, e.problem.position)
            self.poisoned.update(tops)
            return
        except NetrunError as e:
            self.model.problems.add(f"layer '{name}' ({type_}): {e}", f.position())
            self.poisoned.update(tops)
            return
        loss_weights = f.get_all("loss_weight", "float")
        for dotted, field in f.unread():
            self.model.problems.add(f"layer '{name}' ({type_}): field '{dotted}' is not "
                                    f"supported", field.position)
        unmade = [top for i, top in enumerate(tops) if i not in t.outputs
                  or t.outputs[i][0] == "op" and t.outputs[i][1] not in t.specs]
        if unmade:  # a translation bug rather than a user error, but say which layer
            self.model.problems.add(f"layer '{name}' ({type_}): top '{unmade[0]}' was not "
                                    f"produced", f.position("top"))
            self.poisoned.update(tops)
            return
        self._commit(t, loss_weights)

    def _bottoms(self, f: Fields, bottoms: list[str], tops: list[str]) -> list[str]:
        """Actual bottom blobs; StopGradient copies where propagate_down is false."""
        missing = [b for b in bottoms if b not in self.cur]
        if missing:
            raise f.skip(f"bottom '{missing[0]}' is not produced by any earlier layer in the "
                         f"{self.phase} phase{suggest(missing[0], self.cur)}", f.position("bottom"))
        for top in tops:
            if top in self.cur and top not in bottoms:
                raise f.skip(f"top '{top}' is already produced by another layer (only an "
                             f"in-place top may reuse a bottom's name)", f.position("top"))
        actual = [self.cur[b] for b in bottoms]
        propagate = f.get_all("propagate_down", "bool")
        if propagate and len(propagate) != len(bottoms):
            raise f.skip(f"propagate_down has {len(propagate)} values for {len(bottoms)} "
                         f"bottoms", f.position("propagate_down"))
        for i, flows in enumerate(propagate):
            if not flows and actual[i] not in self.model.inputs:
                stopped = self.fresh(f"{actual[i]}_nograd")
                self.ops.append(make_op("StopGradient", [actual[i]], [stopped],
                                        name=f.get("name", "", "str")))
                self.specs[stopped] = self.specs[actual[i]]
                actual[i] = stopped
        return actual

    def _commit(self, t: LayerContext, loss_weights: list[float]) -> None:
        renames: dict[str, str] = {}
        final_tops: list[str] = []
        for i, top in enumerate(t.caffe_tops):
            kind, blob = t.outputs[i]
            if kind == "op":
                in_place = top in self.cur and self._may_overwrite(t, blob, self.cur[top])
                renames[blob] = (self.cur[top] if in_place else
                                 self.fresh(f"{top}_{t.name}" if top in self.cur else top,
                                            top=top not in self.cur))
                blob = renames[blob]
            final_tops.append(blob)
        ops = [_rename(o, renames) for o in t.ops]
        for name, spec in t.specs.items():
            self.specs[renames.get(name, name)] = spec
        for o in ops:
            self.needed |= gradient_reads(o)
            self.used.update(o.outputs)
        self.ops += ops
        for top, blob in zip(t.caffe_tops, final_tops):
            self._set(top, blob)
        head = t.head
        for i, blob in enumerate(final_tops):
            weight = loss_weights[i] if i < len(loss_weights) else float(
                i == 0 and t.type.endswith("Loss"))
            if weight:
                head = True
                self.losses.append((self._scalar(t, blob), weight))
        self.metrics += [final_tops[i] for i in t.metrics]
        data = any(kind == "input" for kind, _ in t.outputs.values())
        self.records.append(LayerRecord(t.name, t.type, list(t.bottoms), final_tops, ops,
                                        head, data))

    def _scalar(self, t: LayerContext, blob: str) -> str:
        """The blob itself when it holds one value, else its sum (Caffe's loss of a top)."""
        if self.specs[blob].size == 1 and not self.specs[blob].shape:
            return blob
        total = self.fresh(f"{blob}_sum")
        o = make_op("ReduceSum", [blob], [total], name=t.name, keepdims=0)
        self.ops.append(o)
        self.specs[total] = TensorSpec((), self.specs[blob].dtype)
        return total

    def _may_overwrite(self, t: LayerContext, placeholder: str, blob: str) -> bool:
        """Whether the layer may write its top into `blob` (its bottom's current version)."""
        if self.sharing[blob] > 1 or blob in self.needed:
            return False
        writes = [k for k, o in enumerate(t.ops) if placeholder in o.outputs]
        if not writes or any(blob in o.inputs for o in t.ops[writes[0] + 1:]):
            return False
        if any(blob in gradient_reads(o) for o in t.ops):
            return False    # the layer's own gradient needs the old value
        for o in t.ops:
            try:
                get_schema(o.type).verify(_rename(o, {placeholder: blob}))
            except NetrunError:
                return False
        return True

    # Loss -------------------------------------------------------------------------------
    def total_loss(self) -> str | None:
        """The one loss blob of this phase: Σ loss_weight·loss over the loss tops."""
        if not self.losses:
            return None
        if len(self.losses) == 1 and self.losses[0][1] == 1.0:
            return self.losses[0][0]
        parts = []
        for blob, weight in self.losses:
            if weight != 1.0:
                scaled = self.fresh(f"{blob}_weighted")
                self.ops.append(make_op("Scale", [blob], [scaled], name="loss", scale=weight))
                blob = scaled
            parts.append(blob)
        total = self.fresh("loss" if "loss" not in self.model.reserved else "total_loss")
        self.ops.append(make_op("Sum", parts, [total], name="loss"))
        self.specs[total] = TensorSpec((), "float32")
        return total


def _rename(o: OperatorDef, names: dict[str, str]) -> OperatorDef:
    if not names:
        return o
    return o.with_(inputs=tuple(names.get(n, n) for n in o.inputs),
                   outputs=tuple(names.get(n, n) for n in o.outputs))


def gradient_reads(o: OperatorDef) -> set[str]:
    """The forward blobs of `o` that its gradient ops read (they must survive to backward)."""
    schema = get_schema(o.type)
    if schema.no_gradient or not has_gradient(o.type):
        return set()
    forward = set(o.inputs) | set(o.outputs)
    try:
        grad_ops, _ = gradient_ops(o)
    except NetrunError:
        return forward  # cannot tell: keep everything
    return {n for g in grad_ops for n in g.inputs if n in forward}
