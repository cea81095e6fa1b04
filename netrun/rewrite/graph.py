"""What the rewrite rules ask of a net: who reads each value, which blobs are constants.

Blob names are not values: an op may write a name in place (Caffe's in-place BatchNorm and
ReLU), so a value is one write, (op index, output slot), and its readers are the ops that
read that name before the next write. A value is observable when it is the last write of a
name the caller keeps (the net's external outputs, the blobs a user fetches): a rule never
removes such a value, nor one with a second reader.
"""
from __future__ import annotations

from typing import Iterable

from netrun.proto.defs import OperatorDef

Value = tuple[int, int]        # (op index, output slot)
Use = tuple[int, int]          # (op index, input slot)


class Graph:
    """Def-use chains of one op list, rebuilt after every rewrite (nets are small)."""

    def __init__(self, ops: list[OperatorDef], keep: Iterable[str]):
        self.ops = ops
        self.readers: dict[Value, list[Use]] = {}
        self.producers: dict[Use, Value] = {}
        self.written: set[str] = set()
        last: dict[str, Value] = {}
        for j, o in enumerate(ops):
            for s, name in enumerate(o.inputs):
                if name in last:
                    self.producers[(j, s)] = last[name]
                    self.readers[last[name]].append((j, s))
            for k, name in enumerate(o.outputs):
                last[name] = (j, k)
                self.readers[(j, k)] = []
                self.written.add(name)
        keep = set(keep)
        self.observable = {v for name, v in last.items() if name in keep}

    def producer(self, j: int, slot: int = 0) -> tuple[int, OperatorDef] | None:
        """(index, op) of the op whose output op j reads at input `slot`, if an op wrote it."""
        value = self.producers.get((j, slot))
        if value is None or value[1] != 0:    # rules fuse through an op's first output only
            return None
        return value[0], self.ops[value[0]]

    def after(self, op_type: str):
        """(i, producer, j, op) for each op j of `op_type` whose first input op i wrote: the
        pairs a fusion of "producer then op_type" looks at."""
        for j, op in enumerate(self.ops):
            if op.type == op_type:
                found = self.producer(j, 0)
                if found is not None:
                    yield found[0], found[1], j, op

    def private(self, i: int, j: int) -> bool:
        """Whether op i's first output is read by op j alone, once, and nobody outside."""
        value = (i, 0)
        return value not in self.observable and [u[0] for u in self.readers[value]] == [j]

    def constant(self, name: str) -> bool:
        """Whether no op of the net writes `name` (a parameter the caller provides)."""
        return name not in self.written

    def clean_between(self, i: int, j: int, names: Iterable[str],
                      fused: Iterable[int] = ()) -> bool:
        """Whether no op strictly between i and j (other than the `fused` ones) reads or
        writes any of `names`: an op moved from i to j then reads and writes the same values."""
        names, fused = set(names), set(fused)
        return not any(names & (set(o.inputs) | set(o.outputs))
                       for k, o in enumerate(self.ops[i + 1:j], start=i + 1) if k not in fused)

    def names(self) -> set[str]:
        """Every blob name the ops mention."""
        return {n for o in self.ops for n in (*o.inputs, *o.outputs)}
