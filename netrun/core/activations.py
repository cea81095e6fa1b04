"""The activation arena: one mapped block per workspace, each net's planned values carved
from it at the offsets netrun.core.planner chose, and handed to the ops that write them.

Nets of a workspace run one after another and no planned value outlives its net's run
(netrun.core.lifetimes), so every net plans from offset 0 of the same arena, which is as
large as the largest net's plan. An arena that must grow is mapped anew and every planned
net gets its views again.

The views are slices of one byte array (the backend's `arena_bytes`: a NumPy array over a
mapped block on the CPU, a CuPy array on a GPU), so the backend does not count them as owned
buffers: an op whose planned view does not fit a run's shapes (a smaller last batch)
allocates its own rather than reuse another value's memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from netrun.core.lifetimes import Lifetimes
from netrun.core.planner import Placement, live_set
from netrun.core.schema import TensorSpec

POISON = 0xFF   # bytes of a dead value in debug mode: NaN as float32/64, -1 as integers


@dataclass
class NetMemory:
    """One net's plan: its values, their offsets, and the numbers `inspect` shows."""

    name: str
    lifetimes: Lifetimes
    placement: Placement
    specs: list[list[TensorSpec] | None]
    op_labels: list[str]
    persistent_bytes: int     # bytes of outputs that keep their own buffers
    # Without a plan: a buffer per output name, and the scratch arena's largest estimate
    unplanned_bytes: int

    @property
    def planned_peak(self) -> int:
        """Activation bytes with the plan: the arena (values and estimated scratch) plus the
        buffers not shared."""
        return self.placement.size + self.persistent_bytes

    @property
    def unplanned_peak(self) -> int:
        """Activation bytes without a plan: every output name its own buffer, plus the
        scratch arena's largest estimate."""
        return self.unplanned_bytes

    @property
    def peak_op(self) -> str:
        """The op at which the largest live set peaks."""
        i = self.placement.peak_op
        return self.op_labels[i] if 0 <= i < len(self.op_labels) else "-"


    def summary(self, phases: list[str] | None = None) -> dict:
        """The plan in numbers (bytes), with the largest live set of each phase if given."""
        out = {"net": self.name, "planned_peak": self.planned_peak,
               "unplanned_peak": self.unplanned_peak, "arena": self.placement.size,
               "unshared": self.persistent_bytes, "shared_values": len(self.lifetimes.values),
               "live_peak": self.placement.live_peak, "peak_op": self.peak_op}
        if phases:
            out["phases"] = {}
            for phase in dict.fromkeys(phases):
                ops = [i for i, p in enumerate(phases) if p == phase]
                live, at = live_set(self.lifetimes.values, ops[0], ops[-1])
                out["phases"][phase] = {"live_peak": live, "peak_op": self.op_labels[at]
                                        if 0 <= at < len(self.op_labels) else "-"}
        return out


class ActivationArena:
    """The byte array that every planned net of one workspace carves its values from."""

    def __init__(self, new_bytes: Callable[[int], Any]):
        self._new_bytes = new_bytes   # nbytes -> a uint8 array on the workspace's device
        self.array: Any = None        # None until the first plan
        self.size = 0

    def ensure(self, nbytes: int) -> bool:
        """Hold an array of at least nbytes (faulted in now on the host); True if a new one
        was made."""
        if nbytes <= self.size:
            return False
        self.array = None             # the old one goes first: both at once may not fit
        self.array = self._new_bytes(nbytes)
        self.size = len(self.array)
        return True

    def region(self, offset: int, nbytes: int) -> Any:
        """nbytes of the arena from offset, as bytes."""
        return self.array[offset:offset + nbytes]

    def view(self, offset: int, spec: TensorSpec) -> Any:
        """The array of `spec` at offset."""
        dt = np.dtype(spec.dtype)
        return self.region(offset, spec.size * dt.itemsize).view(dt).reshape(spec.shape)


def attach(plan: NetMemory, arena: ActivationArena, ops: list, debug: bool) -> None:
    """Hand every bound op of the net its planned output views (and, in debug mode, the
    regions to poison after it runs)."""
    lt, offsets = plan.lifetimes, plan.placement.offsets
    for i, op in enumerate(ops):
        n_out = len(op.def_.outputs)
        planned: list[Any] = [None] * n_out
        views: list[bool] = [False] * n_out
        for j in range(n_out):
            v = lt.writes.get((i, j))
            if v is None:
                continue
            if (i, j) in lt.views:
                views[j] = True
            else:
                planned[j] = arena.view(offsets[v], plan.specs[i][j])
        v = lt.scratch.get(i)
        op.scratch_room = (None if v is None
                           else arena.region(offsets[v], lt.values[v].nbytes))
        poison = ()
        if debug:
            poison = tuple(arena.region(offsets[v], lt.values[v].nbytes)
                           for v in lt.ends.get(i, ()))
        op.attach_plan(tuple(planned), tuple(views), arena, poison)


def detach(ops: list) -> None:
    """The net runs without a plan: every op allocates its outputs as before."""
    for op in ops:
        op.attach_plan(None, (), None, ())
        op.scratch_room = None
