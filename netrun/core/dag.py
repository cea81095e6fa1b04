"""The dependency-graph executor (Caffe2's DAGNet): ops whose inputs are ready run on a small
pool of worker threads, with results bitwise equal to the sequential SimpleNet.

Edges, all from an earlier op to a later one in the net's order (so the graph has no cycle
and the sequential order is one of its schedules):

* blobs: read-after-write, write-after-read and write-after-write on *storage*, not names:
  a view (Reshape, Flatten: `register_view`) is the storage of its source, so a later
  in-place write of the source waits for the view's readers;
* the random generators: ops that draw random numbers (Dropout, the random fills) keep
  their sequential order, so every draw sees the same generator state;
* the memory plan: two values (or an op's planned scratch) that share arena bytes never
  live together in the sequential order; every op that touches the earlier one comes
  before the op that first writes the later one. An op that writes in place over a value
  it reads under another name (the plan chose it as the value's last reader) comes after
  every other op touching the value.

Each worker has its own scratch arena (netrun.core.memory.ScratchArena): ops running at the
same time never share scratch. The intra-op pool (netrun.kernels.parallel) is left as it is.
"""
from __future__ import annotations

import contextvars
import heapq
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from netrun.core.activations import POISON
from netrun.core.lifetimes import view_pairs
from netrun.core.net import SimpleNet
from netrun.core.operator import Operator
from netrun.errors import InternalError
from netrun.proto.defs import NetDef

if TYPE_CHECKING:
    from netrun.core.activations import NetMemory
    from netrun.core.workspace import Workspace

EXECUTORS = ("simple", "dag")
WORKERS = 2     # one per core of the machines measured (docs/executors.md)
# How far back (ops) the memory plan keeps a value apart from unordered ops' values
# (earliest_concurrent): wider keeps more ops free to overlap, at more arena bytes.
WINDOW = 8
# Op types whose kernels draw from the workspace's generators (ctx.rng, ctx.host_rng).
RANDOM_OPS = frozenset({"Dropout", "UniformFill", "GaussianFill", "XavierFill", "MSRAFill",
                        "BilinearFill", "SparseGaussianFill", "PositiveUnitballFill"})


def draws_random(type: str) -> bool:
    """Whether ops of `type` may draw random numbers (kept in sequential order)."""
    return type in RANDOM_OPS


def blob_edges(net: NetDef) -> list[set[int]]:
    """For each op, the earlier ops it must wait for because of blobs and random draws."""
    deps: list[set[int]] = [set() for _ in net.ops]
    # Two kinds of resource: a name (its entry in the workspace) and a storage (the bytes
    # its current value is in, named after the blob that owns them).
    storage: dict[str, str] = {}          # name -> the storage its current value is in
    writer: dict[tuple, int] = {}         # resource -> its last writer
    readers: dict[tuple, set[int]] = {}   # resource -> its readers since that write
    last_random = -1

    def read(i: int, r: tuple) -> None:
        if r in writer:
            deps[i].add(writer[r])
        readers.setdefault(r, set()).add(i)

    def write(i: int, r: tuple) -> None:
        if r in writer:
            deps[i].add(writer[r])
        deps[i].update(readers.get(r, ()))
        writer[r] = i
        readers[r] = set()

    for i, op in enumerate(net.ops):
        ins = [storage.get(n, n) for n in op.inputs]
        for name, s in zip(op.inputs, ins):
            read(i, ("name", name))
            read(i, ("storage", s))
        view_of = {j: k for k, j in view_pairs(op.type)}
        for j, name in enumerate(op.outputs):
            write(i, ("name", name))
            if j in view_of and view_of[j] < len(ins):
                storage[name] = ins[view_of[j]]   # no bytes written: a view of an input
                continue
            # Written through OpContext.output: a name that was a view gets its own buffer.
            storage[name] = name
            write(i, ("storage", name))
        if draws_random(op.type):
            if last_random >= 0:
                deps[i].add(last_random)
            last_random = i
        deps[i].discard(i)
    return deps


def earliest_concurrent(deps: list[set[int]], window: int | None = None) -> list[int]:
    """For each op i, the lowest index, at least i - window, of an op that is not among its
    ancestors (so may run at the same time or later). The memory plan counts a value live
    from there: it shares no bytes with what the unordered ops near its writer touch. Ops
    further back that are still unordered (a weight gradient no later op reads) are ordered
    by the plan's edges instead (plan_edges), rather than keep everything after them apart."""
    window = WINDOW if window is None else window
    ancestors: list[int] = []
    first = []
    for i, d in enumerate(deps):
        anc = 0
        for j in d:
            anc |= ancestors[j] | (1 << j)
        ancestors.append(anc)
        lo = max(0, i - window)
        free = (~anc & ((1 << i) - 1)) >> lo << lo    # unordered earlier ops from lo on
        first.append((free & -free).bit_length() - 1 if free else i)
    return first


def value_accessors(net: NetDef, plan: NetMemory) -> list[set[int]]:
    """For each planned value, the ops that write or read it (as lifetimes() assigns them)."""
    lt = plan.lifetimes
    access: list[set[int]] = [set() for _ in lt.values]
    current: dict[str, int] = {}
    for i, op in enumerate(net.ops):
        for name in op.inputs:
            v = current.get(name)
            if v is not None:
                access[v].add(i)
        for j, name in enumerate(op.outputs):
            current.pop(name, None)
            v = lt.writes.get((i, j))
            if v is not None:
                access[v].add(i)
                current[name] = v
    for i, v in lt.scratch.items():
        access[v].add(i)
    return access


def plan_edges(net: NetDef, plan: NetMemory, deps: list[set[int]]) -> list[set[int]]:
    """Add to `deps` the edges that keep values sharing arena bytes apart in time; returns,
    for debug poisoning, the ops touching each value up to its end."""
    lt, offsets = plan.lifetimes, plan.placement.offsets
    access = value_accessors(net, plan)
    values = lt.values
    order = sorted(range(len(values)), key=lambda v: offsets[v])
    for a, u in enumerate(order):
        hi = offsets[u] + max(values[u].nbytes, 1)
        for v in order[a + 1:]:
            if offsets[v] >= hi:
                break
            first, second = (u, v) if values[u].start < values[v].start else (v, u)
            if values[first].end >= values[second].start:
                raise InternalError(f"net '{net.name}': planned values {first} and {second} "
                                    f"share bytes and live together")
            start = values[second].start
            deps[start].update(x for x in access[first] if x < start)
    for d, i in zip(deps, range(len(deps))):
        d.discard(i)
    return [{x for x in acc if x <= values[v].end} for v, acc in enumerate(access)]


def inplace_edges(net: NetDef, plan: NetMemory, deps: list[set[int]]) -> None:
    """Add to `deps` the edges for writes the plan puts into a live value: an output written
    over an input under another name (in place where the schema allows, when the writer is
    the input's last reader in the net's order) waits for every earlier op touching it,
    readers that the blob edges leave unordered included."""
    access = value_accessors(net, plan)
    for (i, _), v in plan.lifetimes.writes.items():
        deps[i].update(x for x in access[v] if x < i)


class _Schedule:
    """The graph of one bound net under one memory plan."""

    def __init__(self, net: NetDef, plan: NetMemory | None, debug: bool):
        deps = blob_edges(net)
        # op -> the values it is one of the last to touch (debug poisoning counts them down)
        self.poison_after: list[list[int]] = [[] for _ in net.ops]
        self.plan = plan
        self.counts: list[int] = []
        self.regions: list = []
        if plan is not None:
            inplace_edges(net, plan, deps)
            touching = plan_edges(net, plan, deps)
            if debug:
                self.counts = [len(t) for t in touching]
                for v, t in enumerate(touching):
                    for i in t:
                        self.poison_after[i].append(v)
        self.deps = [len(d) for d in deps]
        # A chain (every op waits for the one before it, as in most batch-1 inference
        # nets after the fusions) runs on the calling thread: waking workers costs more.
        ancestors: list[int] = []
        for d in deps:
            anc = 0
            for j in d:
                anc |= ancestors[j] | (1 << j)
            ancestors.append(anc)
        self.chain = all(anc >> (i - 1) & 1 for i, anc in enumerate(ancestors) if i)
        self.succ: list[list[int]] = [[] for _ in net.ops]
        for i, d in enumerate(deps):
            for j in d:
                self.succ[j].append(i)


class _Run:
    """The state of one run: ready ops, what is running, the first error."""

    def __init__(self, sched: _Schedule, ops: list[Operator], hook, regions, priority=None):
        self.sched, self.ops, self.hook = sched, ops, hook
        self.priority = priority or range(len(ops))
        self.cond = threading.Condition()
        self.waiting = list(sched.deps)
        self.ready = [(self.priority[i], i) for i, n in enumerate(self.waiting) if n == 0]
        heapq.heapify(self.ready)
        self.left = len(ops)
        self.running = 0
        self.errors: list[tuple[int, BaseException]] = []
        self.counts = list(sched.counts)
        self.regions = regions
        self.done = [False] * len(ops)
        self.next_hook = 0
        # The caller's context variables (a trace recorder, a progress reporter), which the
        # pool's threads would otherwise not see: each worker runs the job inside a copy.
        self.context = contextvars.copy_context()

    def work(self, arena) -> None:
        """Take ready ops (lowest index first) until none is left or one failed."""
        cond = self.cond
        while True:
            with cond:
                while not self.ready and self.left and not self.errors:
                    cond.wait()
                if self.errors or not self.left:
                    cond.notify_all()
                    return
                _, i = heapq.heappop(self.ready)
                self.running += 1
            op = self.ops[i]
            try:
                arena.rewind(op)
                op.ctx._scratch = arena
                try:
                    op.run()
                finally:
                    op.ctx._scratch = None
                if arena.poison is not None:
                    arena.rewind(None)      # this op's scratch dies now, not at the next op
                for v in self.sched.poison_after[i]:
                    with cond:
                        self.counts[v] -= 1
                        last = self.counts[v] == 0
                    if last:
                        self.regions[v][...] = POISON
            # Anything (an interrupt included) goes to run(), which raises it in the caller.
            except BaseException as e:  # noqa: BLE001
                with cond:
                    self.errors.append((i, e))
                    self.running -= 1
                    cond.notify_all()
                return
            with cond:
                self.running -= 1
                self.left -= 1
                self.done[i] = True
                for j in self.sched.succ[i]:
                    self.waiting[j] -= 1
                    if self.waiting[j] == 0:
                        heapq.heappush(self.ready, (self.priority[j], j))
                # Hooks in the net's order, one at a time (the profiler's marks).
                try:
                    while (self.hook is not None and self.next_hook < len(self.done)
                           and self.done[self.next_hook]):
                        self.next_hook += 1
                        self.hook(self.next_hook - 1, self.ops[self.next_hook - 1])
                except BaseException as e:  # noqa: BLE001 (raised by run(), as above)
                    self.errors.append((i, e))
                if self.errors or not self.left:
                    cond.notify_all()
                elif len(self.ready) > 1:
                    # This thread takes one ready op itself: wake others only for the rest
                    # (a chain wakes nobody, which is what batch-1 inference mostly is).
                    cond.notify(len(self.ready) - 1)

    def wait(self) -> None:
        """Until every worker has stopped taking ops and none is running."""
        with self.cond:
            while self.running or (self.left and not self.errors):
                self.cond.wait()


class _Workers:
    """Threads that join each run of one net (the calling thread is worker 0)."""

    def __init__(self, count: int, arenas: list):
        self.cond = threading.Condition()
        self.job: _Run | None = None
        self.generation = 0
        self.stopped = False
        self.finished = 0
        self.threads = []
        for w in range(1, count):
            t = threading.Thread(target=self._loop, args=(arenas[w],), daemon=True,
                                 name=f"netrun-dag-{w}")
            t.start()
            self.threads.append(t)

    def _loop(self, arena) -> None:
        seen = 0
        while True:
            with self.cond:
                while self.generation == seen and not self.stopped:
                    self.cond.wait()
                if self.stopped:
                    return
                seen, job = self.generation, self.job
            if job is not None:
                job.context.copy().run(job.work, arena)
            job = None      # a thread's frame must not keep the workspace alive
            with self.cond:
                self.finished += 1
                self.cond.notify_all()

    def start(self, job: _Run) -> None:
        """Hand `job` to every thread."""
        with self.cond:
            self.job = job
            self.finished = 0
            self.generation += 1
            self.cond.notify_all()

    def join(self) -> None:
        """Until every thread is done with the job and holds no reference to it."""
        with self.cond:
            self.job = None
            while self.finished < len(self.threads):
                self.cond.wait()

    def stop(self) -> None:
        """End the threads (they hold no op: runs wait for their workers)."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        # The finalizer may run on one of these threads (a collection it triggered).
        me = threading.current_thread()
        for t in self.threads:
            if t is not me:
                t.join()


class DagNet(SimpleNet):
    """Runs its operators as a dependency graph on `workers` threads (Caffe2's DAGNet)."""

    def __init__(self, net: NetDef, ws: Workspace, workers: int = WORKERS):
        super().__init__(net, ws)
        for o in self.ops:
            o.ctx._rng_ok = draws_random(o.def_.type)
        self.workers = max(1, int(workers))
        self._sched: _Schedule | None = None
        self._block = None
        self._first: list[int] | None = None
        # Tests: which ready op goes first (lowest first; None: the net's order). With one
        # worker, a random priority runs the net in a random order the graph allows.
        self.priority: list | None = None
        self._pool: _Workers | None = None
        self._arenas: list = []

    def earliest_concurrent(self) -> list[int]:
        """earliest_concurrent() of this net's blob edges (the memory plan widens lifetimes
        by it, netrun.core.memory)."""
        if self._first is None:
            self._first = earliest_concurrent(blob_edges(self.def_))
        return self._first

    def schedule(self) -> _Schedule:
        """The graph for the current memory plan (made again when the plan changes)."""
        memory = self.ws.memory
        plan = memory.net_plans.get(self.name) if memory.enabled else None
        attached = plan is not None and memory.plan_owner(self.name) is self
        plan = plan if attached else None
        block = memory.activations.array if plan is not None else None
        if self._sched is None or self._sched.plan is not plan or self._block is not block:
            self._block = block      # a new arena block: the same plan, new regions
            self._sched = _Schedule(self.def_, plan, memory.debug)
            if plan is not None and memory.debug:
                arena, offsets = memory.activations, plan.placement.offsets
                self._sched.regions = [arena.region(offsets[v], val.nbytes)
                                       for v, val in enumerate(plan.lifetimes.values)]
        return self._sched

    def run(self, hook: Callable[[int, Operator], None] | None = None) -> None:
        """Run every op once, each as soon as the ops it depends on are done; `hook(i, op)`,
        if given, runs for the ops in the net's order, one call at a time."""
        if not self.ops:
            return
        if self.ws.memory.arena is None:   # device memory (GPU): one stream, run in order
            return super().run(hook)
        sched = self.schedule()
        if not self._arenas:
            self._arenas = [self.ws.memory.worker_arena() for _ in range(self.workers)]
            if self.workers > 1:
                self._pool = _Workers(self.workers, self._arenas)
                weakref.finalize(self, self._pool.stop)
        job = _Run(sched, self.ops, hook, sched.regions, self.priority)
        pool = None if sched.chain else self._pool
        if pool is not None:
            pool.start(job)
        try:
            job.work(self._arenas[0])
        finally:
            job.wait()
            if pool is not None:
                pool.join()
        if job.errors:
            # The earliest failing op in the net's order: the error a sequential run gives
            # when only one op fails.
            _, error = min(job.errors, key=lambda e: e[0])
            raise error

    def close(self) -> None:
        """Stop the worker threads now (they stop by themselves when the net is dropped)."""
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
            self._arenas = []


def make_net(net: NetDef, ws: Workspace, executor: str = "simple") -> SimpleNet:
    """A bound net run by `executor` ('simple': in order; 'dag': as a dependency graph)."""
    if executor == "dag":
        return DagNet(net, ws)
    if executor == "simple":
        return SimpleNet(net, ws)
    from netrun.errors import NetrunError
    raise NetrunError(f"unknown executor '{executor}' (choose from: {', '.join(EXECUTORS)})")
