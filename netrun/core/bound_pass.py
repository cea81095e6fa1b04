"""A net's whole run as its ops' bound calls, checked once for the whole net.

When every op of a run repeated the calls its kernel bound (netrun.core.operator,
`repeat_with`), the next run is the same calls again unless something an op checks has
changed. Each op checking in its turn, and the scratch arena rewinding for it, cost ~5-10 µs
of Python an op: at batch 1 a fifth of ResNet-20's pass (0.2 of ~1.1 ms of oneDNN calls).
A BoundPass makes the same checks for all ops at once, as C-level loops over names and
objects kept from that run, then makes the calls: consecutive deferred ones in one native
loop, as the per-op path does.

What it checks is what each op's `_Repeat.holds` checks, in one go:
- every input and output name still holds the array object it held (the objects are kept,
  so an identity cannot be reused by another array);
- the inputs an op reads a kept copy of (`unchanged`) have not been written, and no op of
  the net writes them (then an earlier op's run would change them mid-pass);
- each op still has that repeat (an op that ran itself since made a new one) and the same
  planned scratch room;
- each kernel's own check without its scratch part (`steady`): the op's scratch regions
  are where they were because no op carved since, as no op ran.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

_IS = operator.is_
_REPEAT_OF = operator.attrgetter("repeat")
_ROOM_OF = operator.attrgetter("scratch_room")


class BoundPass:
    """The calls of a run in which every op repeated its bound calls, to make again while
    `holds`. Build with `of(ops, items)` (None where some op cannot join)."""

    __slots__ = ("ops", "repeats", "rooms", "names", "arrays", "kept", "counts", "steady",
                 "segments", "outputs")

    def __init__(self, ops: list, repeats: list, items: list):
        self.ops, self.repeats = tuple(ops), tuple(repeats)
        self.rooms = tuple(o.scratch_room for o in ops)
        pairs = [pair for r in repeats for pair in r.arrays]
        self.names = tuple(n for n, _ in pairs)
        self.arrays = tuple(a for _, a in pairs)
        kept = [pair for r in repeats for pair in r.versions]
        self.kept = tuple(n for n, _ in kept)
        self.counts = [c for _, c in kept]
        self.steady = tuple(r.check.steady for r in repeats if r.check is not None)
        self.outputs = tuple(n for r in repeats for n in r.outputs)
        self.segments = _segments(ops, repeats, items)

    @classmethod
    def of(cls, ops: list, items: list) -> "BoundPass | None":
        """The pass of a run in which every op repeated: items[i] is what op i deferred in
        that run (Operator.deferred), None where it repeated by itself. None where an op has
        no repeat, has a check that must run in the op's turn, or reads a kept copy of a
        blob the net writes."""
        repeats = [o.repeat for o in ops]
        if not repeats or any(r is None or (r.check is not None
                                            and getattr(r.check, "steady", None) is None)
                              for r in repeats):
            return None
        written = {n for r in repeats for n in r.outputs}
        if any(n in written for r in repeats for n, _ in r.versions):
            return None
        return cls(ops, repeats, items)

    def holds(self, ws: Any) -> bool:
        """Whether the calls still compute a run of the net (see the module doc)."""
        blobs, versions = ws._blobs, ws._versions
        return (all(map(_IS, map(blobs.get, self.names), self.arrays))
                and all(map(_IS, map(_REPEAT_OF, self.ops), self.repeats))
                and all(map(_IS, map(_ROOM_OF, self.ops), self.rooms))
                and [versions.get(n, 0) for n in self.kept] == self.counts
                and all(check() for check in self.steady))

    def run(self, ws: Any) -> None:
        """The calls, in the ops' order, and the outputs' write counts as a run moves them."""
        memory = ws.memory
        for runner, items, op in self.segments:
            if op is not None:   # a repeat the op makes itself: in its own scratch turn
                memory.begin_op(op)
            runner(items)
        versions = ws._versions
        for name in self.outputs:
            versions[name] = versions.get(name, 0) + 1


def _segments(ops: list, repeats: list, items: list) -> list[tuple[Callable, Any, Any]]:
    """(runner, argument, op) in order: deferred calls of consecutive ops with the same
    runner as one runner(items) (op None); other repeats as bound.run() in the op's turn.
    The deferred items are the run's own: asked for again outside the op's turn, a bound
    call would look for its scratch in another op's regions."""
    out: list[tuple[Callable, Any, Any]] = []
    for op, r, deferred in zip(ops, repeats, items):
        if deferred is None:
            out.append((_call, r.bound.run, op))
            continue
        runner, item = deferred
        if out and out[-1][2] is None and out[-1][0] is runner:
            out[-1][1].append(item)
        else:
            out.append((runner, [item], None))
    return out


def _call(fn: Callable[[], None]) -> None:
    fn()
