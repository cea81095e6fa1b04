"""Nets: a NetDef bound to a workspace. The sequential executor runs ops in order."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from netrun.core.activations import POISON
from netrun.core.bound_pass import BoundPass
from netrun.core.operator import Operator
from netrun.errors import NetrunError, SchemaError, UnknownOpError
from netrun.kernels import parallel
from netrun.proto.defs import NetDef

if TYPE_CHECKING:
    from netrun.core.workspace import Workspace


class SimpleNet:
    """Runs its operators one after another (Caffe2's SimpleNet)."""

    def __init__(self, net: NetDef, ws: "Workspace"):
        self.def_ = net
        self.name = net.name
        self.ws = ws
        problems, ops = [], []
        for o in net.ops:
            try:
                ops.append(Operator(o, ws))
            except (SchemaError, UnknownOpError) as e:
                problems.append(str(e))
        if problems:
            where = f"net '{net.name}'" if net.name else "the net"
            if len(problems) == 1:
                raise type_of(problems)(f"{where}: {problems[0]}")
            raise SchemaError(f"{where} has {len(problems)} invalid ops:\n  - "
                              + "\n  - ".join(problems))
        self.ops = ops
        # The calls of the last run, where every op repeated its bound calls (core.bound_pass)
        self._bound: BoundPass | None = None

    def run(self, hook: Callable[[int, Operator], None] | None = None) -> None:
        """Run every op once; `hook(i, op)`, if given, runs after each op (profiling)."""
        # Each op starts a new scratch lifetime: ops share one scratch arena in turn.
        memory = self.ws.memory
        try:
            with parallel.steady_thread_count():   # the environment read once per run
                self._run_ops(memory, hook)
        finally:
            memory.end_run()

    def _run_ops(self, memory, hook) -> None:
        if memory.debug:
            for i, o in enumerate(self.ops):
                memory.begin_op(o)
                o.run()
                # Values whose lifetime ends here are poisoned: a later reader fails.
                for region in o.poison:
                    region[...] = POISON
                if hook is not None:
                    hook(i, o)
        elif hook is None:
            bound = self._bound
            if bound is not None:
                if bound.holds(self.ws):
                    bound.run(self.ws)
                    return
                self._bound = None
            # Ops repeating bound calls hand them over (Operator.deferred); consecutive ones
            # with the same runner go out in one native loop: at batch 1 the per-op Python
            # of a call made alone (~2 µs) is a twentieth of a small convolution. Their order
            # is the ops' order, and an op that runs itself waits for the calls before it.
            # A run in which every op repeated becomes the net's BoundPass for the next.
            runner, items, trail, repeated = None, [], [], True
            for o in self.ops:
                memory.begin_op(o)
                item = o.deferred()
                trail.append(item)
                if item is not None and item[0] is runner:
                    items.append(item[1])
                    continue
                if items:
                    runner(items)
                    items = []
                if item is not None:
                    runner, items = item[0], [item[1]]
                    continue
                repeated = o.run() and repeated
            if items:
                runner(items)
            if repeated:
                self._bound = BoundPass.of(self.ops, trail)
        else:
            for i, o in enumerate(self.ops):
                memory.begin_op(o)
                o.run()
                hook(i, o)


def type_of(problems: list[str]) -> type[NetrunError]:
    return UnknownOpError if problems[0].startswith("unknown op type") else SchemaError
