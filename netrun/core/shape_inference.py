"""Net-level shape and cost inference: every blob's TensorSpec and every op's Cost.

Generic over op types: each op's schema validates it, infers its output specs from its input
specs and estimates its cost. Nothing here knows about any particular operator.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from netrun.core.schema import Cost, TensorSpec, get_schema
from netrun.errors import ShapeError, suggest
from netrun.proto.defs import NetDef, OperatorDef


@dataclass(frozen=True)
class OpShapes:
    """One op with the specs it reads and writes and what it costs."""

    op: OperatorDef
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    cost: Cost


@dataclass
class NetShapes:
    """Specs of every blob (after the last write) and one OpShapes per op, in net order."""

    blobs: dict[str, TensorSpec] = field(default_factory=dict)
    ops: list[OpShapes] = field(default_factory=list)

    def __getitem__(self, blob: str) -> TensorSpec:
        return self.blobs[blob]

    @property
    def flops(self) -> int:
        return sum(r.cost.flops for r in self.ops)

    @property
    def bytes_moved(self) -> int:
        return sum(r.cost.bytes_read + r.cost.bytes_written for r in self.ops)


def _shapes(names: Iterable[str], specs: Iterable[TensorSpec]) -> str:
    return ", ".join(f"{n} {s}" for n, s in zip(names, specs)) or "none"


def infer_op(op: OperatorDef, in_specs: list[TensorSpec]) -> OpShapes:
    """Validate one op against its schema and infer its output specs and cost."""
    schema = get_schema(op.type)
    args = schema.verify(op)
    try:
        outs = schema.infer_shapes(op, args, in_specs)
    except ShapeError as e:
        raise ShapeError(f"op {op.label}: {e} (inputs: {_shapes(op.inputs, in_specs)})") from e
    except (ValueError, IndexError, TypeError, ZeroDivisionError) as e:
        # A shape function that did not expect these ranks; still name the op and the shapes.
        raise ShapeError(f"op {op.label} cannot take inputs {_shapes(op.inputs, in_specs)}: "
                         f"{e}") from e
    if len(outs) < len(op.outputs):
        raise ShapeError(f"op {op.label}: shape inference gave {len(outs)} output spec(s) for "
                         f"{len(op.outputs)} output(s)")
    outs = outs[:len(op.outputs)]  # optional outputs the op does not write here
    for out in outs:
        if any(d < 0 for d in out.shape):
            raise ShapeError(f"op {op.label}: inputs {_shapes(op.inputs, in_specs)} give an "
                             f"output of negative size {out.shape}")
    return OpShapes(op, tuple(in_specs), tuple(outs), schema.cost(args, in_specs, outs))


def infer_shapes(net: NetDef, input_specs: Mapping[str, TensorSpec]) -> NetShapes:
    """Specs of every blob of `net`, given the specs of the blobs it reads from outside."""
    result = NetShapes(blobs=dict(input_specs))
    blobs = result.blobs
    for op in net.ops:
        for name in op.inputs:
            if name not in blobs:
                raise ShapeError(_missing(net, op, name, blobs))
        record = infer_op(op, [blobs[n] for n in op.inputs])
        blobs.update(zip(op.outputs, record.outputs))
        result.ops.append(record)
    return result


def _missing(net: NetDef, op: OperatorDef, name: str, known: Mapping[str, TensorSpec]) -> str:
    where = f" of net '{net.name}'" if net.name else ""
    return (f"op {op.label}{where} reads blob '{name}', whose shape is unknown: no earlier op "
            f"writes it and no shape was given for it{suggest(name, known) or '.'} Pass "
            f"--input {name}=D1,D2,... (its full shape, batch first).")


def count_params(specs: Mapping[str, TensorSpec] | NetShapes, params: Iterable[str]) -> int:
    """Total number of elements of the named parameter blobs."""
    blobs = specs.blobs if isinstance(specs, NetShapes) else specs
    return sum(blobs[p].size for p in params)
