"""A batch's fixed chunks of oneDNN calls on the OpenMP team, in one GIL-free call.

Each chunk is a list of primitive calls (reorders in, the convolution, reorders out) that
netrun's worker threads would otherwise run one ctypes call at a time, taking the GIL back
after each. Here every call is bound first (its packed arguments: netrun.kernels.onednn.api),
then one compiled kernel runs them on Numba's OpenMP team (netrun.kernels.omp): slot w of its
`prange` loop takes chunks w, w + slots, ... in order, on its own stream, as worker w would.
The primitives were built for one thread: inside the team's parallel region oneDNN runs them
on the thread that calls them, so each chunk computes exactly what it does on a worker.

dnnl_primitive_execute is reached from the compiled kernel by name: its address is given to
LLVM's symbol table once per process before the kernel is compiled or loaded from Numba's
disk cache.
"""
from __future__ import annotations

import ctypes
import functools
import weakref
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from netrun.kernels import jit, omp
from netrun.kernels.jit import team_kernel
from netrun.kernels.onednn import api
from netrun.kernels.onednn import conv as engine

Step = tuple   # (api.Primitive, [(argument index, MemoryDesc, pointer), ...])


@functools.cache
def prepare() -> None:
    """Make dnnl_primitive_execute known to compiled code and compile (or load) the kernel."""
    import llvmlite.binding as llvm  # comes with Numba
    from numba import types

    lib = api.get()
    address = ctypes.cast(lib.lib.dnnl_primitive_execute, ctypes.c_void_p).value
    llvm.add_symbol("dnnl_primitive_execute", address)
    # the kernel's global: dnnl_status_t (primitive, stream, nargs, const dnnl_exec_arg_t *)
    globals()["_dnnl_primitive_execute"] = types.ExternalFunction(
        "dnnl_primitive_execute", types.int32(types.uint64, types.uint64, types.int32,
                                              types.uint64))
    execute_table.prepare("void(int64, int64[::1], uint64[::1], int32[::1], uint64[::1], "
                          "uint64[::1], int32[::1])")


@team_kernel
def execute_table(slots, starts, primitives, counts, arguments, streams, status):
    """Slot w runs chunks w, w + slots, ... in order on streams[w]; chunk c is rows
    starts[c]:starts[c+1]: status[j] = dnnl_primitive_execute(primitives[j], streams[w],
    counts[j], arguments[j]). A chunk stops at its first failure."""
    for w in jit.prange(slots):
        for c in range(w, starts.shape[0] - 1, slots):
            for j in range(starts[c], starts[c + 1]):
                status[j] = _dnnl_primitive_execute(primitives[j], streams[w],  # noqa: F821
                                                    counts[j], arguments[j])
                if status[j] != 0:
                    break


class BoundTeam:
    """A pass's chunks bound once to their arrays, to run again as they are (`run`) while the
    caller knows that nothing they use has moved: the serial steps `first` (the filters'
    reorder, which every chunk reads) on this thread, the chunks on the team, then `after`
    in order (partial sums added in chunk order). Building and binding ResNet-20's gradient
    chunks again on every pass cost ~0.5 ms an op (~7 ms of a batch-32 training step).
    `close` (or the object's end) releases the memory objects."""

    # what a forward pass's bound calls say about their filters (netrun.ops.conv._repeat):
    # the gradients reorder them among their steps and keep no copy
    reads_kept_filters = reorders_filters = False

    def __init__(self, chunks: Sequence[Sequence[Step]], slots: int,
                 first: Sequence[Step] = (), after: Sequence[Callable[[], None]] = (),
                 held: Sequence = ()):
        prepare()
        self.lib, self.slots = api.get(), slots
        self.after, self.held = list(after), list(held)
        packed, releases = [], []
        for prim, args in [*first, *_rows(chunks)]:
            one, release = prim.bound_once(args)
            packed.append(one)
            releases.append(release)
        self._finalizer = weakref.finalize(self, engine.release_all, releases)
        self._packed = packed   # the argument arrays the table's addresses point into
        self.first = [(prim.handle, len(args), one, prim.impl)
                      for (prim, args), one in zip(first, packed)]
        self.table = _Table(chunks, packed[len(first):])

    def run(self) -> None:
        """The steps again: `first`, the chunks on the team, then `after`."""
        engine.run_bound(self.lib, self.first, 1)
        self.table.launch(self.lib, self.slots, "on the team, bound")
        for step in self.after:
            step()

    def close(self) -> None:
        """Release the memory objects now."""
        self._finalizer()


class _Table:
    """execute_table's arguments for chunks whose calls are bound (`packed`, row by row)."""

    def __init__(self, chunks: Sequence[Sequence[Step]], packed: Sequence):
        rows = _rows(chunks)
        self.impls = [prim.impl for prim, _ in rows]
        self.arrays = (np.cumsum([0] + [len(steps) for steps in chunks], dtype=np.int64),
                       np.array([prim.handle.value for prim, _ in rows], dtype=np.uint64),
                       np.array([len(args) for _, args in rows], dtype=np.int32),
                       np.array([ctypes.addressof(p) for p in packed], dtype=np.uint64))
        self.status = np.zeros(len(rows), dtype=np.int32)

    def launch(self, lib: api.Library, slots: int, where: str) -> None:
        """One team call of every chunk; a failed call is an error naming its kernel."""
        # this thread's streams: a bound op may run on another thread than the one that bound it
        streams = np.array(lib.streams(slots), dtype=np.uint64)
        omp.launch(execute_table, slots, *self.arrays, streams, self.status)
        if self.status.any():
            j = int(np.flatnonzero(self.status)[0])
            code, self.status[:] = int(self.status[j]), 0
            lib.check(code, f"primitive_execute ({self.impls[j]}, {where})")


def _rows(chunks: Sequence[Sequence[Step]]) -> list[Step]:
    return [(prim, args) for steps in chunks for prim, args in steps]


def run(chunks: Sequence[Sequence[Step]], slots: int) -> None:
    """Each chunk's steps in order, on a team of `slots` threads (omp.team_size): chunk c on
    slot c % slots, whose scratch its steps use (netrun.kernels.parallel.chunk_scratch's
    rule), after the slot's chunks before it."""
    prepare()
    rows = _rows(chunks)
    # kept alive until the call returns: a primitive used more often than it keeps bound
    # argument sets would otherwise release the first ones while binding the last
    uses = Counter(id(prim) for prim, _ in rows)
    packed, releases = [], []
    for prim, args in rows:
        if uses[id(prim)] > prim.BOUND:
            one, release = prim.bound_once(args)
            packed.append(one)
            releases.append(release)
        else:
            packed.append(prim.bound(args))
    try:
        _Table(chunks, packed).launch(api.get(), slots, "on the team")
    finally:
        engine.release_all(releases)
