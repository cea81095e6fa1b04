"""Offsets for values in one arena: greedy by size, best fit (as TVM's and MXNet's planners).

Values are placed largest first; each goes into the smallest gap, among the values already
placed whose lifetimes overlap its own, that holds it, else above the highest of them.
Only lifetimes and sizes go in, offsets come out: mapping the arena is netrun.core.memory's.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from netrun.core.lifetimes import Value

ALIGN = 256   # bytes: whole cache lines, aligned vector loads (as the output blocks)


def aligned(n: int) -> int:
    """n rounded up to a multiple of ALIGN."""
    return -(-n // ALIGN) * ALIGN


@dataclass
class Placement:
    """Where each value lives in the arena, and the numbers the CLI reports."""

    offsets: list[int]
    size: int            # arena bytes
    live_peak: int       # the largest sum of live values' bytes at one op (a lower bound)
    peak_op: int         # the op index where it peaks (-1 for no values)
    unshared: int        # bytes the same values take with a buffer each (no plan)


def place(values: Sequence[Value]) -> Placement:
    """Arena offsets of `values`, no two overlapping in both time and bytes."""
    order = sorted(range(len(values)),
                   key=lambda v: (-values[v].nbytes, values[v].start, v))
    offsets = [0] * len(values)
    placed: list[int] = []
    size = 0
    for v in order:
        val, need = values[v], aligned(values[v].nbytes)
        busy = sorted((offsets[u], offsets[u] + aligned(values[u].nbytes)) for u in placed
                      if values[u].start <= val.end and val.start <= values[u].end)
        best, best_gap, top = None, None, 0
        for lo, hi in busy:
            gap = lo - top
            if gap >= need and (best_gap is None or gap < best_gap):
                best, best_gap = top, gap
            top = max(top, hi)
        offsets[v] = top if best is None else best
        placed.append(v)
        size = max(size, offsets[v] + need)
    live_peak, peak_op = live_set(values)
    return Placement(offsets, size, live_peak, peak_op,
                     sum(aligned(v.nbytes) for v in values))


def live_set(values: Sequence[Value], first: int = 0, last: int | None = None
             ) -> tuple[int, int]:
    """(bytes, op index) of the largest set of values live at one op (of first..last)."""
    if not values:
        return 0, -1
    n = max(v.end for v in values) + 2
    delta = [0] * n
    for v in values:
        delta[v.start] += aligned(v.nbytes)
        delta[v.end + 1] -= aligned(v.nbytes)
    last = n - 2 if last is None else min(last, n - 2)
    best, at, live = 0, -1, 0
    for i in range(last + 1):
        live += delta[i]
        if i >= first and (live > best or at < 0):
            best, at = live, i
    return best, at
