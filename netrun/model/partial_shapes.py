"""Shape inference that goes on past blobs of unknown shape (a NetDef inspected without them).

A Caffe2 predict net carries no shapes: its data input gets one at run time, its weights from
the init net. `infer_known_shapes` infers what the given shapes decide and marks the rest
unknown (None) instead of stopping at the first op that reads an unknown blob, so the whole
op graph can be shown with the inputs it still needs. Every op is still checked against its
schema: a bad argument is an error whatever shapes are known.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from netrun.core.schema import TensorSpec, get_schema
from netrun.core.shape_inference import OpShapes, infer_op
from netrun.proto.defs import NetDef


@dataclass
class PartialShapes:
    """Specs of the blobs whose shape is known, one OpShapes per op (None for an unknown
    spec; the cost of an op with an unknown input is None), and the blobs read from outside
    the net whose shapes were not given, in the order the net first reads them."""

    blobs: dict[str, TensorSpec] = field(default_factory=dict)
    ops: list[OpShapes] = field(default_factory=list)
    unknown_inputs: list[str] = field(default_factory=list)

    def __getitem__(self, blob: str) -> TensorSpec:
        return self.blobs[blob]

    def get(self, blob: str) -> TensorSpec | None:
        """The blob's spec, or None when its shape is unknown."""
        return self.blobs.get(blob)

    @property
    def complete(self) -> bool:
        """Whether every op's shapes are known."""
        return not self.unknown_inputs

    @property
    def flops(self) -> int:
        """FLOPs of the ops whose shapes are known."""
        return sum(r.cost.flops for r in self.ops if r.cost is not None)


def infer_known_shapes(net: NetDef, input_specs: Mapping[str, TensorSpec]) -> PartialShapes:
    """Specs of every blob the given specs decide; the others stay unknown."""
    result = PartialShapes(blobs=dict(input_specs))
    blobs, written = result.blobs, set()
    for op in net.ops:
        ins = [blobs.get(n) for n in op.inputs]
        for name, spec in zip(op.inputs, ins):
            if spec is None and name not in written and name not in result.unknown_inputs:
                result.unknown_inputs.append(name)
        if any(spec is None for spec in ins):
            get_schema(op.type).verify(op)           # arguments are checked all the same
            record = OpShapes(op, tuple(ins), (None,) * len(op.outputs), None)
            for name in op.outputs:
                blobs.pop(name, None)
        else:
            record = infer_op(op, ins)
            blobs.update(zip(op.outputs, record.outputs))
        written.update(op.outputs)
        result.ops.append(record)
    return result

