"""Workspace memory: output buffers planned when a net is bound, scratch shared by every op.

Fresh memory costs a page fault per page on first touch. 2 MiB huge pages cost less per byte
than 4 KiB pages while the host is quiet, but far more while it is busy (the VM hands free
2 MiB blocks back to its host, which must supply them again). A net's first iteration used
to allocate each output on first write and each scratch key on first use (cifar10_quick
training at batch 100: 50 MB of outputs, 96 MB of scratch under 55 keys, 25 MB more as keys
grew), so page faults made it much slower than a steady one, and slower still on a busy
host (measurements: benchmarks/README.md). Here, on host-memory backends:

* Outputs are planned. When a net is bound and the shapes of the blobs it reads are known
  (or as soon as feeding makes them known), shape inference over the net gives every output
  buffer a first run allocates; one block for them all is mapped and faulted in then (in
  huge pages), and the backend's `empty` carves buffers from it in request order. A
  buffer the plan did not foresee, or past its room, comes from NumPy as before.
* Scratch is one arena for the whole workspace. Inside a net's run scratch lives for one
  operator, so every op carves again from the start of one large reservation of address
  space (paid for on first touch): the arena holds the largest op's scratch, not the sum
  over all keys, and nothing is re-allocated when a key grows. Within one op a key gets the
  same region on every request (a new one if it must grow), and different keys, including
  the per-thread keys of `parallel.chunk_scratch`, never overlap. Ops that register a
  scratch estimate let the plan fault the arena in too (in huge pages); the rest is faulted
  in on first use, in 4 KiB pages (backends.cpu.host_block says why). Outside a net's run
  (direct `ws.scratch` calls) a key keeps its own buffer, as before.

Activations share memory by lifetime on every backend that `plans_activations` (the CPU
and the GPU): one arena per workspace (netrun.core.activations). Backends without host
memory (GPU: CuPy's caching pool) keep a buffer per scratch key, and have no first-run
faults to plan away.
"""
from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from netrun.core import budget
from netrun.core.activations import ActivationArena, NetMemory, attach, detach
from netrun.core.lifetimes import Value, external_reads, lifetimes, persistent_names
from netrun.core.planner import place
from netrun.core.schema import TensorSpec, get_schema
from netrun.core.shape_inference import infer_op
from netrun.proto.defs import NetDef
from netrun.util.registry import registrar

ALIGN = 256                  # bytes between buffers: whole cache lines, aligned vector loads
MIN_PLAN_BYTES = 256 << 10   # smaller plans are not worth a mapping: their faults cost little
# Values smaller than this keep their own buffers: sharing them saves nothing worth having,
# and the host reads such scalars (loss, learning rate, accuracy) between runs.
MIN_VALUE_BYTES = 1024
# Address space reserved for scratch at a time: pages cost memory once touched, and every op
# carves from the start, so the memory held is the largest op's scratch (no fragmentation).
SCRATCH_RESERVE = 512 << 20
# Room added to an op's scratch estimate where the plan puts it in the activation arena:
# each key (and each thread's key) starts on an ALIGN boundary.
SCRATCH_SLACK = 64 * ALIGN

# Scratch estimates, registered next to the ops that use scratch (as kernels and preparers
# are): fn(ws, op, args, input_specs) -> the most scratch bytes one run of the OperatorDef
# `op` (its resolved `args`) asks for with inputs of these specs, all threads together. A
# plan faults the arena in up to the largest estimate of its net's ops; ops without one
# fault their scratch in on first use.
ScratchEstimate = Callable[[Any, Any, Any, list[TensorSpec]], int]
_SCRATCH_ESTIMATES: dict[str, ScratchEstimate] = {}


# Decorator: `fn(ws, op, args, input_specs) -> bytes` estimates the scratch of the types named.
register_scratch_estimate = registrar(_SCRATCH_ESTIMATES, "scratch estimate")


# Bind-time warm-ups, registered next to their ops too: fn(ws, op, args, input_specs) runs
# what the op's first iteration would otherwise pay for once (per-shape tables, compiled
# dispatch), as soon as a plan knows the op's input shapes. Kept apart from the estimates,
# which only compute sizes.
BindWarmup = Callable[[Any, Any, Any, list[TensorSpec]], None]
_BIND_WARMUPS: dict[str, BindWarmup] = {}


# Decorator: `fn(ws, op, args, input_specs)` warms the types named up when a net is planned.
register_bind_warmup = registrar(_BIND_WARMUPS, "bind warm-up")


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _size(shape) -> int:
    return int(shape) if isinstance(shape, (int, np.integer)) else math.prod(map(int, shape))


# str(dtype) by dtype (a string or a NumPy dtype): scratch asks on every GPU op, and str() of
# a dtype costs microseconds. A memo of a pure function, so workspaces may share it.
_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(np.dtype(dtype))
    return name


@dataclass
class MemoryStats:
    """What a workspace's memory did, for tests and profiles (bytes and buffer counts)."""

    planned_bytes: int = 0        # output bytes reserved, and faulted in, by plans
    planned_outputs: int = 0      # output buffers foreseen by plans
    outputs_from_plan: int = 0    # output buffers carved from planned blocks
    outputs_unplanned: int = 0    # output buffers left to NumPy (not foreseen, or no room)
    scratch_prefaulted: int = 0   # scratch bytes faulted in by plans (from estimates)


class _Blocks:
    """Blocks, each filled from its start; a request goes to the first with room."""

    def __init__(self):
        self.blocks: list[Any] = []
        self.used: list[int] = []

    def add(self, block: Any) -> None:
        self.blocks.append(block)
        self.used.append(0)

    def remove(self, block: Any) -> None:
        i = next(i for i, b in enumerate(self.blocks) if b is block)
        del self.blocks[i], self.used[i]

    def reset(self) -> None:
        """Every block empty again (its memory is handed out anew)."""
        self.used = [0] * len(self.blocks)

    def carve(self, nbytes: int) -> tuple[Any, int] | None:
        """(block, offset) of nbytes free bytes, or None if no block has room."""
        for i, block in enumerate(self.blocks):
            start = _aligned(self.used[i])
            if start + nbytes <= len(block):
                self.used[i] = start + nbytes
                return block, start
        return None

    @property
    def unused(self) -> int:
        """Bytes not handed out (since the last reset)."""
        return sum(len(b) for b in self.blocks) - sum(self.used)


class ScratchMark:
    """The running op's scratch state (by identity) and how many regions it has carved."""

    __slots__ = ("state", "carved")

    def __init__(self, state: tuple, carved: int):
        self.state, self.carved = state, carved

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ScratchMark) and self.state is other.state
                and self.carved == other.carved)

    __hash__ = None   # compared, never a key


class ScratchArena:
    """Scratch regions for one operator run at a time, carved from reserved address space.

    Every op carves from the start of the arena. An op that runs again (a net's next
    iteration) finds the regions it carved last time, so a steady run carves nothing.
    """

    def __init__(self, new_block: Callable[..., Any]):
        self._new_block = new_block
        self._blocks = _Blocks()
        self._regions: dict[tuple[str, Any], np.ndarray] = {}   # (key, dtype) -> region
        # id(op) -> (its regions, its use of each block), kept while the op lives (a
        # finalizer drops it): a plain dict read per op, where a WeakKeyDictionary made a
        # weak reference on every lookup (per-op overhead shows at batch 1)
        self._ops: dict[int, tuple[dict, list[int]]] = {}
        self._lock = threading.Lock()   # chunk threads ask for their keys concurrently
        # The running op's room in the activation arena (its planned scratch), and how much
        # of it is handed out: [bytes]; carving tries it before the arena's own blocks.
        self._room: np.ndarray | None = None
        self._room_used: list[int] = [0]
        # The running op's state in _ops (None: an op that will not run again): `mark`.
        self._state: tuple | None = None
        self.peak = 0                   # most bytes handed out to one op
        self.prefaulted = 0             # bytes at the start faulted in ahead of use
        # Debugging: a byte to fill the handed-out memory with when an op ends, so that an op
        # reading scratch written by an earlier one reads garbage (NaN for 0xFF).
        self.poison: int | None = None

    def rewind(self, op: Any = None) -> None:
        """Operator `op` (any object; None: one that will not run again) starts: the whole
        arena may be handed out again, and to `op` where it was the last time."""
        if self.poison is not None:
            for block, used in zip(self._blocks.blocks, self._blocks.used):
                np.ndarray((used,), np.uint8, buffer=block)[...] = self.poison
            # The previous op's room: no value live from here on overlaps it (the plan).
            if self._room is not None:
                self._room[:self._room_used[0]] = self.poison
        if op is None:
            self._regions, used, self._room_used = {}, [], [0]
            self._room, self._state = None, None
        else:
            state = self._ops.get(id(op))
            room = getattr(op, "scratch_room", None)
            if state is None or state[3] is not room:   # new op, or a new plan for it
                # (its regions, its use of each block, of its room, the room, [regions carved])
                state = self._ops[id(op)] = ({}, [], [0], room, [0])
                weakref.finalize(op, self._ops.pop, id(op), None).atexit = False
            self._regions, used, self._room_used, self._room, _ = state
            self._state = state
        missing = len(self._blocks.blocks) - len(used)
        if missing:
            used.extend([0] * missing)   # blocks mapped since
        self._blocks.used = used

    def get(self, key: str, shape, dtype) -> np.ndarray:
        """The region of `key`, at least `shape` large, valid until the next rewind."""
        size = _size(shape)
        region = self._regions.get((key, dtype))   # dict reads need no lock under the GIL
        if region is None or region.size < size:
            with self._lock:
                region = self._regions.get((key, dtype))
                if region is None or region.size < size:
                    region = self._carve(size, np.dtype(dtype))
                    self._regions[(key, dtype)] = region
                    if self._state is not None:
                        self._state[4][0] += 1   # regions carved: `mark`
        return region[:size].reshape(shape)

    def mark(self) -> ScratchMark | None:
        """Equal marks: the running op's regions are the ones it had, where they were (calls
        bound to them may run again); None for an op that will not run again."""
        if self._state is None:
            return None
        return ScratchMark(self._state, self._state[4][0])

    def prefault(self, nbytes: int) -> int:
        """Fault the first nbytes of the arena in now; returns the bytes newly faulted."""
        if nbytes <= self.prefaulted:
            return 0
        if not self._blocks.blocks:
            self._blocks.add(self._reserve(nbytes))
        block = self._blocks.blocks[0]   # every op carves from the first block first
        nbytes = min(nbytes, len(block))
        block.populate(nbytes)
        added, self.prefaulted = nbytes - self.prefaulted, nbytes
        return added

    def _carve(self, size: int, dt: np.dtype) -> np.ndarray:
        nbytes = max(size * dt.itemsize, 1)
        room = self._room
        if room is not None:
            start = _aligned(self._room_used[0])
            if start + nbytes <= len(room):
                self._room_used[0] = start + nbytes
                self.peak = max(self.peak, start + nbytes)
                return room[start:start + nbytes].view(dt)
        spot = self._blocks.carve(nbytes)
        if spot is None:
            self._blocks.add(self._reserve(nbytes))
            spot = self._blocks.carve(nbytes)
        self.peak = max(self.peak, sum(self._blocks.used))
        block, start = spot
        return np.ndarray((size,), dt, buffer=block, offset=start)

    def _reserve(self, nbytes: int) -> Any:
        try:
            return self._new_block(max(nbytes, SCRATCH_RESERVE), reserve=True)
        except OSError:   # strict overcommit (vm.overcommit_memory=2): map what is asked
            return self._new_block(nbytes)


class UnknownInput(LookupError):
    """A blob a net reads has no known spec yet (its plan waits until the blob is fed)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


@dataclass
class NetPlan:
    """What a first run of a net allocates: output buffers in order, and scratch at most."""

    outputs: list[TensorSpec] = field(default_factory=list)
    scratch: int = 0
    where: list[tuple[int, int]] = field(default_factory=list)   # (op, output) of each
    # Each op's output specs, None from the op where shape inference stopped.
    specs: list[list[TensorSpec] | None] = field(default_factory=list)
    op_scratch: list[int] = field(default_factory=list)   # each op's scratch estimate


def plan_net(net: NetDef, known: Mapping[str, TensorSpec], buffers: dict[str, TensorSpec],
             ws: Any = None) -> NetPlan:
    """The output buffers a first run of `net` allocates, and its largest scratch estimate.

    `known` holds the spec of every blob the net may read from outside; `buffers` the specs
    of blobs whose arrays an op may write into again (OpContext.output reuses a buffer of the
    same shape and dtype); it is updated with the net's outputs. UnknownInput names the
    first blob read without a known spec. Shape inference stopping at an op (a shape
    function that cannot say) ends the plan there. With `ws`, scratch estimates are asked
    and ops are warmed up (their bind-time warm-ups).
    """
    specs = dict(known)
    plan = NetPlan(specs=[None] * len(net.ops), op_scratch=[0] * len(net.ops))
    for i, op in enumerate(net.ops):
        ins = []
        for name in op.inputs:
            if name not in specs:
                raise UnknownInput(name)
            ins.append(specs[name])
        try:
            outs = infer_op(op, ins).outputs
        except Exception:   # the plan is an optimisation: the op itself reports real errors
            break
        estimate, warm_up = _SCRATCH_ESTIMATES.get(op.type), _BIND_WARMUPS.get(op.type)
        if ws is not None and (estimate or warm_up):
            try:
                args = get_schema(op.type).verify(op)
                if estimate is not None:
                    plan.op_scratch[i] = int(estimate(ws, op, args, ins))
                    plan.scratch = max(plan.scratch, plan.op_scratch[i])
                if warm_up is not None:
                    warm_up(ws, op, args, ins)
            except Exception:   # an optimisation only: the op's own run reports real errors
                pass
        plan.specs[i] = list(outs)
        for j, (name, spec) in enumerate(zip(op.outputs, outs)):
            if buffers.get(name) != spec:
                plan.outputs.append(spec)
                plan.where.append((i, j))
                buffers[name] = spec
            specs[name] = spec
    return plan


class WorkspaceMemory:
    """A workspace's output plans and scratch (see the module doc)."""

    def __init__(self, backend: Any, plan: bool = True, debug: bool = False):
        self.backend = backend
        self.stats = MemoryStats()
        # Lifetime planning of activations (netrun.core.lifetimes), where the backend has it.
        self.enabled = bool(plan and backend.plans_activations)
        self.debug = bool(debug)          # poison each value's memory when it dies
        self.keep: set[str] = set()       # blob names the user reads: never shared
        self.min_bytes = MIN_VALUE_BYTES
        self.activations = (ActivationArena(backend.arena_bytes) if backend.plans_activations
                            else None)
        self.net_plans: dict[str, NetMemory] = {}
        # net name -> its bound net, weakly: the workspace owns nets, and ops let go of
        # their scratch when their net goes
        self._bound: dict[str, weakref.ref] = {}
        self.keyed: dict[tuple[str, str], Any] = {}   # scratch outside net runs: key -> buffer
        self.arena: ScratchArena | None = None
        self._planned: _Blocks | None = None
        if backend.host_memory:
            self.arena = ScratchArena(backend.new_block)
            self._planned = _Blocks()
            if self.debug:      # scratch dies with its op: poisoned then too
                self.arena.poison = 0xFF
        self._in_run = False
        self._lock = threading.Lock()
        self._waiting: dict[str, list[NetDef]] = {}   # blob name -> bound nets waiting for it
        self._plan_blocks: dict[str, Any] = {}         # net name -> its planned block
        # blobs that planned nets will have written: their specs, for nets planned after
        self._future: dict[str, TensorSpec] = {}

    # Scratch ----------------------------------------------------------------------------
    def begin_op(self, op: Any = None) -> None:
        """Operator `op` of a net's run starts: scratch from here on lives until the next."""
        if self.arena is not None:
            self.arena.rewind(op)
            self._in_run = True

    def scratch_mark(self) -> ScratchMark | None:
        """The arena's `mark` while a net runs; None outside a run (per-key buffers)."""
        return self.arena.mark() if self._in_run else None

    def end_run(self) -> None:
        """The net's run is over: scratch requests get per-key buffers again."""
        self._in_run = False

    def scratch(self, key: str, shape, dtype="float32") -> Any:
        """A scratch buffer of `shape` for `key` (see the module doc for how long it lives)."""
        if self._in_run:
            return self.arena.get(key, shape, dtype)
        size = _size(shape)
        slot = (key, _dtype_name(dtype))
        buf = self.keyed.get(slot)
        if buf is None or buf.size < size:
            buf = self.backend.empty((size,), dtype)
            self.keyed[slot] = buf
        return buf[:size].reshape(shape)

    def worker_arena(self) -> ScratchArena | None:
        """A scratch arena of its own for one worker of a graph executor (None: no host
        memory, scratch keeps a buffer per key)."""
        if self.arena is None:
            return None
        arena = ScratchArena(self.backend.new_block)
        arena.poison = self.arena.poison
        return arena

    def plan_owner(self, name: str) -> Any:
        """The bound net that net `name`'s plan was attached to, or None."""
        ref = self._bound.get(name)
        return ref() if ref is not None else None

    @property
    def scratch_bytes(self) -> int:
        """The scratch arena's high-water mark: the most bytes one operator was handed."""
        return self.arena.peak if self.arena is not None else 0

    @property
    def reserved_unused(self) -> int:
        """Bytes of planned output memory not handed out (yet)."""
        return self._planned.unused if self._planned is not None else 0

    # Outputs ----------------------------------------------------------------------------
    def output_buffer(self, shape, dtype) -> np.ndarray | None:
        """An output buffer carved from planned memory, or None (the caller allocates)."""
        if self._planned is None:
            return None
        dt = np.dtype(dtype)
        nbytes = _size(shape) * dt.itemsize
        with self._lock:
            spot = self._planned.carve(nbytes) if nbytes and not dt.hasobject else None
            if spot is None:
                self.stats.outputs_unplanned += 1
                return None
            self.stats.outputs_from_plan += 1
        block, start = spot
        return np.ndarray(shape, dt, buffer=block, offset=start)

    # Planning ---------------------------------------------------------------------------
    def check_run(self, net: NetDef, blobs: Mapping[str, Any]) -> None:
        """Refuse a run of `net` (an init net) whose outputs exceed the memory budget, before
        any is allocated; blobs it cannot size yet are left to the run."""
        known = {name: TensorSpec(tuple(v.shape), str(v.dtype)) for name, v in blobs.items()
                 if self.backend.is_array(v)}
        try:
            plan = plan_net(net, known, dict(known))
        except UnknownInput:
            return
        total = sum(s.nbytes for s in plan.outputs)
        budget.check(total, f"net '{net.name}' ({len(plan.outputs)} tensors)")

    @property
    def pending(self) -> list[NetDef]:
        """Bound nets whose plan waits for the shape of a blob not fed yet."""
        return [net for nets in self._waiting.values() for net in nets]

    def plan(self, net: NetDef, blobs: Mapping[str, Any], ws: Any = None,
             keep: tuple = ()) -> None:
        """Reserve and fault in what `net`'s first run allocates given the workspace's
        `blobs` (`ws` is handed to scratch estimates, and holds the bound nets), or wait
        for its inputs. `keep` names blobs the user reads after runs: never shared."""
        if self._planned is None and not self.enabled:
            return
        new_keep = set(keep) - self.keep
        self.keep |= new_keep
        self.net_plans.pop(net.name, None)
        self._plan(net, blobs, ws)
        # Nets planned before may have shared a blob this net reads, or one now kept.
        reads = external_reads(net) | new_keep
        for name, other in list(self.net_plans.items()):
            bound = ws._nets.get(name) if ws is not None else None
            if name != net.name and bound is not None and reads & _planned_names(other):
                self._plan(bound.def_, blobs, ws)

    def fed(self, name: str, blobs: Mapping[str, Any], ws: Any = None) -> None:
        """Blob `name` was fed: plan the bound nets that were waiting for its shape."""
        for net in self._waiting.pop(name, ()):
            self._plan(net, blobs, ws)

    def _plan(self, net: NetDef, blobs: Mapping[str, Any], ws: Any) -> None:
        bound = ws._nets.get(net.name) if ws is not None else None
        if bound is not None and bound.def_ is net:
            # Until this plan is made (it may wait for a feed), the net runs without one.
            self.net_plans.pop(net.name, None)
            detach(bound.ops)
        known = dict(self._future)
        buffers = dict(self._future)
        for name, value in blobs.items():
            if self.backend.is_array(value):
                spec = TensorSpec(tuple(value.shape), str(value.dtype))
                known[name] = spec
                if self.backend.owns_data(value):
                    buffers[name] = spec
                else:
                    buffers.pop(name, None)
        try:
            plan = plan_net(net, known, buffers, ws)
        except UnknownInput as e:
            self._waiting.setdefault(e.name, []).append(net)
            return
        in_arena = self._plan_values(net, plan, ws) if self.enabled else None
        written = {n: s for n, s in buffers.items() if n not in blobs}
        self._future.update(written)
        if self._planned is not None:
            self._plan_first_run(net, plan, in_arena)
        # Nets reading what this one writes (the update net reads the step net's gradients).
        for name in written:
            for waiting in self._waiting.pop(name, ()):
                self._plan(waiting, blobs, ws)

    def _plan_first_run(self, net: NetDef, plan: NetPlan,
                        in_arena: set[tuple[int, int]] | None) -> None:
        """Host memory: one block, faulted in now, for the outputs that the activation arena
        does not hold, and the scratch arena faulted in up to the largest estimate."""
        outputs = [s for s, w in zip(plan.outputs, plan.where) if w not in (in_arena or ())]
        total = sum(_aligned(max(s.nbytes, 1)) for s in outputs)
        budget.check(total + plan.scratch, f"binding net '{net.name}' (its outputs and "
                                           f"scratch)")
        # A net bound again under its name replaces its plan: the old block's unclaimed room
        # goes (the buffers carved from it live on in their blobs).
        old = self._plan_blocks.pop(net.name, None)
        if old is not None:
            self._planned.remove(old)
        if total >= MIN_PLAN_BYTES:
            block = self.backend.new_block(total, populate=True)
            self._planned.add(block)
            self._plan_blocks[net.name] = block
            self.stats.planned_bytes += total
            self.stats.planned_outputs += len(outputs)
        if in_arena is not None:     # estimated scratch has its room in the arena
            plan.scratch = 0
        self.stats.scratch_prefaulted += self.arena.prefault(plan.scratch)

    def _plan_values(self, net: NetDef, plan: NetPlan, ws: Any
                     ) -> set[tuple[int, int]] | None:
        """Share `net`'s activations (and its ops' estimated scratch) by lifetime; returns
        the (op, output) pairs written into the activation arena (None: not planned)."""
        bound = ws._nets.get(net.name) if ws is not None else None
        if bound is None or bound.def_ is not net:   # not bound: run once, unplanned
            return None
        others = [b.def_ for name, b in ws._nets.items() if name != net.name]
        lt = lifetimes(net, plan.specs, persistent_names(net, others, self.keep),
                       self.min_bytes)
        # Each op's estimated scratch is a value living for that op alone: it goes where
        # no value live at the op is (slack: every key is aligned). Only the host's scratch
        # arena carves from that room; a device keeps a buffer per scratch key.
        for i, nbytes in enumerate(plan.op_scratch):
            if nbytes > 0 and self.arena is not None:
                lt.scratch[i] = len(lt.values)
                lt.values.append(Value(nbytes + SCRATCH_SLACK, i, i))
        placed = lt.values
        # A graph executor may run ops out of order: a value is live from the first op
        # that its writer does not wait for, so that no two values touched at the same time
        # share bytes (netrun.core.dag; its ordering edges for shared bytes are then redundant).
        concurrent = getattr(bound, "earliest_concurrent", None)
        if concurrent is not None:
            first = concurrent()
            placed = [Value(v.nbytes, min(first[v.start], v.start), v.end) for v in placed]
        placement = place(placed)
        # Without a plan each name written keeps a buffer (views and state updated in
        # place aside, which exist either way).
        kept: dict[str, int] = {}
        every: dict[str, int] = {}
        before = external_reads(net)
        for i, (op, specs) in enumerate(zip(net.ops, plan.specs)):
            for j, (name, spec) in enumerate(zip(op.outputs, specs or ())):
                if name in before or (i, j) in lt.views:
                    continue
                every[name] = max(every.get(name, 0), _aligned(spec.nbytes))
                if (i, j) not in lt.writes:
                    kept[name] = max(kept.get(name, 0), _aligned(spec.nbytes))
        record = NetMemory(net.name, lt, placement, plan.specs, [o.label for o in net.ops],
                           sum(kept.values()), sum(every.values()) + max(plan.op_scratch,
                                                                          default=0))
        self.net_plans[net.name] = record
        self._bound[net.name] = weakref.ref(bound)
        # The budget is the host's memory; a device arena that does not fit fails CuPy's
        # allocation with its own out-of-memory error.
        if placement.size > self.activations.size and self.backend.host_memory:
            budget.check(placement.size, f"the activation arena of net '{net.name}'")
        if self.activations.ensure(placement.size):
            for name, other in self.net_plans.items():   # a new block: views anew
                owner = self._bound.get(name)
                owner = owner() if owner is not None else None
                if owner is not None:
                    attach(other, self.activations, owner.ops, self.debug)
        else:
            attach(record, self.activations, bound.ops, self.debug)
        return {w for w in lt.writes if w not in lt.views}


def _planned_names(plan: NetMemory) -> set[str]:
    return {name for v in plan.lifetimes.values for name in v.names}
