"""LayerContext: what one Caffe layer's translation sees and does.

A layer function reads its fields through `t.f` (tracked, so unread fields get reported),
reads bottom blobs by index, adds ops whose outputs are `t.top(i)` placeholders, and asks for
parameters with `t.param(...)`. The phase translator later decides the real top names (in
place or renamed, see translate.py) and commits the ops.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from netrun.caffe.fields import Fields, Skip
from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import infer_op
from netrun.proto.defs import OperatorDef, op as make_op

if TYPE_CHECKING:
    from netrun.caffe.translate import PhaseTranslator


class LayerContext:
    """One layer being translated in one phase (TRAIN or TEST)."""

    def __init__(self, phase: "PhaseTranslator", fields: Fields, name: str, type: str,
                 bottoms: list[str], tops: list[str]):
        self.net = phase
        self.f = fields
        self.name, self.type = name, type
        self.phase = phase.phase
        self.train = phase.phase == "TRAIN"
        self.bottoms = bottoms                 # actual blob names
        self.caffe_tops = tops                 # top names as the prototxt spells them
        self.ops: list[OperatorDef] = []
        self.specs: dict[str, TensorSpec] = {}
        self.outputs: dict[int, tuple[str, str]] = {}   # top -> ("op"|"alias"|"input", blob)
        self.head = False                      # a loss or metric: left out of the predict net
        self.metrics: list[int] = []           # tops that are metrics of the model

    # Blobs ------------------------------------------------------------------------------
    @property
    def nbottom(self) -> int:
        """Number of bottoms."""
        return len(self.bottoms)

    @property
    def ntop(self) -> int:
        """Number of tops."""
        return len(self.caffe_tops)

    def spec(self, blob: str | int) -> TensorSpec:
        """Spec (batch included) of a blob, or of bottom i when given an int."""
        name = self.bottoms[blob] if isinstance(blob, int) else blob
        return self.specs[name] if name in self.specs else self.net.specs[name]

    def shape(self, blob: str | int) -> tuple[int, ...]:
        """Shape (batch included) of a blob, or of bottom i when given an int."""
        return tuple(self.spec(blob).shape)

    def counts(self, bottoms: int | tuple[int, int], tops: int | tuple[int, int]) -> None:
        """Check the numbers of bottoms and tops (exact, or an inclusive (min, max) range)."""
        for what, have, want in (("bottom", self.nbottom, bottoms), ("top", self.ntop, tops)):
            lo, hi = (want, want) if isinstance(want, int) else want
            if not lo <= have <= hi:
                count = str(lo) if lo == hi else (f"at least {lo}" if hi >= 99 else f"{lo} to {hi}")
                raise self.skip(f"takes {count} {what}(s), got {have}")

    def top(self, i: int = 0) -> str:
        """The placeholder name of top i (renamed when the layer is committed)."""
        name = f"__{self.name}__top{i}"
        self.outputs[i] = ("op", name)
        return name

    def tmp(self, suffix: str) -> str:
        """A fresh internal blob name, `<layer>_<suffix>` unless that is taken."""
        return self.net.fresh(f"{self.name}_{suffix}")

    def alias(self, i: int, blob: str) -> None:
        """Top i is the existing blob `blob` (Caffe's Split layer: no copy)."""
        self.outputs[i] = ("alias", blob)

    def input(self, i: int, shape: Sequence[int], dtype: str = "float32") -> None:
        """Top i is a data input of the model; `shape` includes the batch."""
        self.net.declare_input(self, self.caffe_tops[i], tuple(int(d) for d in shape), dtype)
        self.outputs[i] = ("input", self.caffe_tops[i])

    def class_label(self, i: int) -> str:
        """Bottom i holds class indices: a model input of that name becomes int32."""
        return self.net.class_label(self.bottoms[i])

    # Ops and parameters -----------------------------------------------------------------
    def add(self, type: str, inputs: Sequence[str], outputs: Sequence[str] | str,
            **args: Any) -> OperatorDef:
        """Add one op (named after the layer) and infer its output shapes."""
        op = make_op(type, list(inputs), outputs, name=self.name, **args)
        record = infer_op(op, [self.spec(b) for b in op.inputs])
        self.specs.update(zip(op.outputs, record.outputs))
        self.ops.append(op)
        return op

    def param(self, i: int, suffix: str, shape: Sequence[int], role: str = "weight",
              filler: Fields | None = None, default: dict | None = None,
              trainable: bool = True) -> str:
        """Parameter blob i of this layer (created with its filler on first use, shared by
        `param { name }` or by a layer of the same name in the other phase)."""
        name = self.net.model.param(self, i, suffix, tuple(int(d) for d in shape), role,
                                    filler, default, trainable)
        self.net.specs[name] = TensorSpec(tuple(self.net.model.params[name].shape))
        return name

    def skip(self, message: str, field: str | None = None) -> Skip:
        """A Skip (raise it) for a problem with this layer, at `field` when given."""
        return self.f.skip(message, self.f.position(field) if field else None)
