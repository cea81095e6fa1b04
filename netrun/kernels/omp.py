"""Fixed chunks on one OpenMP team: oneDNN's batch chunks as one GIL-free call per op.

netrun.kernels.parallel hands a batch's fixed chunks to Python worker threads. Each hand-off
wakes a sleeping thread and every ctypes call of a chunk takes the GIL back: on the 2-core VM
a wake costs ~0.1 ms, and ResNet-20's training step ran only 1.02-1.11× faster on 2 threads
than on one. A team kernel (netrun.kernels.jit.team_kernel) runs the same chunks instead as
the iterations of one compiled `prange` loop on Numba's OpenMP threading layer, on the
libgomp that oneDNN uses too (netrun.kernels.onednn.team runs oneDNN's convolution chunks
that way, and batch norm and ReLU theirs: netrun.kernels.batch_norm): slot w of the loop
takes chunks w, w + slots, ... with slot w's scratch, as worker w would. The bits stay
those of the worker threads: a chunk is the same slice on any thread, and the chunks'
partial sums are added by the caller in chunk order after the call.

Used only where it is safe: Numba's OpenMP layer (safe for launches from several Python
threads at once; its `workqueue` fallback is not), asked for ahead of TBB unless the user chose
a layer (NUMBA_THREADING_LAYER). NETRUN_OMP=off turns it off, and work nested in a worker
thread's chunk runs on that thread alone.

The team's idle threads spin before they sleep: libgomp's default is 300,000 rounds (~3 ms
by its own estimate; 7 ms of CPU per call measured here), during which they hold the cores
that netrun's worker threads need for the ops that still run there (compiled Winograd, the
GEMM algorithms, pooling). With 10,000 (`SPIN_COUNT`, ~0.5 ms measured) ResNet-20's
training step at batch 128 ran ~10% faster, while a batch-1 pass, whose convolutions start
the team again every ~50 µs, still finds it spinning (with no spin it took 2-3× as long).
libgomp reads its settings once, when it is loaded, so `load_runtime` loads it first with
that count where nothing in the process has loaded it yet and the user set neither
OMP_WAIT_POLICY nor GOMP_SPINCOUNT; the environment is put back at once. Where another
library loaded it first (PyTorch), its settings stand.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from typing import Any

import numpy as np

from netrun.kernels import jit, parallel

ENV = "NETRUN_OMP"

# Whether Numba's OpenMP layer runs team kernels here: a fact about the process, found once.
_LAYER: dict[str, bool] = {}
# Whether libgomp's idle threads spin briefly (`short_spin`): also a fact about the process.
_SPIN: dict[str, bool] = {}
_SPIN_LOCK = threading.Lock()
_LOCK = threading.Lock()
LIBGOMP = "libgomp.so.1"
SPIN_COUNT = "10000"


@jit.team_kernel
def _probe(out):
    """out[i] = i on the team (the first launch: Numba then loads its threading layer)."""
    for i in jit.prange(out.shape[0]):
        out[i] = i


def switched_off() -> bool:
    """Whether NETRUN_OMP turns the team off (the worker threads take the chunks)."""
    return os.environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no")


def usable(xp: Any) -> bool:
    """Whether chunks of arrays of `xp` may run on the OpenMP team (see the module doc)."""
    if xp is not np or switched_off() or not jit.enabled(xp):
        return False
    found = _LAYER.get("omp")
    if found is None:
        with _LOCK:
            if "omp" not in _LAYER:
                _LAYER["omp"] = _load_layer()
            found = _LAYER["omp"]
    return found


def load_runtime() -> None:
    """Load GNU OpenMP with netrun's spin count, unless the process has it already or the
    user configured it (see the module doc); a missing libgomp is left to its users."""
    with _SPIN_LOCK:
        if "short" not in _SPIN:   # the first answer is the process's: record it
            _SPIN["short"] = _load_with_spin()


def _load_with_spin() -> bool:
    """Load libgomp as `load_runtime` says; whether its idle threads stop spinning soon (see
    `short_spin`)."""
    policy = os.environ.get("OMP_WAIT_POLICY", "").strip().lower()
    count = os.environ.get("GOMP_SPINCOUNT", "").strip()
    if policy or count:   # the user's choice stands
        return policy == "passive" or (count.isdigit() and int(count) <= int(SPIN_COUNT))
    try:
        ctypes.CDLL(LIBGOMP, mode=os.RTLD_NOLOAD)   # loaded already: its settings stand
        return False
    except OSError:
        pass
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    try:
        ctypes.CDLL(LIBGOMP)   # its constructor reads the environment now
    except OSError:
        pass
    finally:
        del os.environ["GOMP_SPINCOUNT"]
    return True


def short_spin() -> bool:
    """Whether the team's idle threads stop spinning within netrun's SPIN_COUNT rounds:
    libgomp loaded by netrun, or the user's settings say so. Not where another library
    loaded it first with its default (PyTorch): ~3 ms of spin after every launch."""
    found = _SPIN.get("short")
    if found is None:
        load_runtime()
        found = _SPIN["short"]
    return found


def _load_layer() -> bool:
    import numba  # optional and heavy: only once a team kernel is about to run

    load_runtime()

    if numba.config.THREADING_LAYER == "default":   # the user chose none: prefer OpenMP
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]
    try:
        _probe(np.zeros(2, np.int64))
        return numba.threading_layer() == "omp"
    except (ValueError, ImportError, RuntimeError):   # no threading layer loads here
        return False


def team_size(chunks: int) -> int:
    """The threads a team kernel gets for `chunks` chunks: min(netrun's thread count, chunks),
    and one inside a worker thread's chunk, where nested work runs inline."""
    import numba  # loaded already: `usable` was asked first

    threads = 1 if parallel.in_chunk() else min(parallel.thread_count(), chunks)
    return max(1, min(threads, numba.config.NUMBA_NUM_THREADS))


def launch(kernel: jit.Kernel, slots: int, *args) -> Any:
    """kernel(slots, *args) on a team of `slots` threads (`team_size`): the kernel's prange
    runs over the slots, slot w taking chunks w, w + slots, ... in order with slot w's
    scratch, as worker w does (netrun.kernels.parallel), so no more scratch is in use at once
    than on the worker threads."""
    import numba

    if numba.get_num_threads() != slots:   # Numba keeps the count per calling thread
        numba.set_num_threads(slots)
    return kernel(slots, *args)


def team(xp: Any, n: int, work: int = 0, block: int = 1) -> tuple[int, np.ndarray] | None:
    """(slots, `bounds`) where parallel.chunks' chunks of range(n) for these arguments, an
    elementwise pass's (batch norm, ReLU), run on the team: more than one chunk, `usable`,
    not nested in a chunk, and a `short_spin`. Under a long spin the worker threads that run
    the next ops (GEMM and Winograd convolutions) compete with the spinning team: ResNet-50's
    training step ran 1.14-1.18× as long with these passes on the team, its forward
    convolutions 1.24×, while ResNet-20's ran 0.89× as long. None: the workers' way."""
    if parallel.in_chunk() or not usable(xp) or not short_spin():
        return None
    starts = bounds(n, work, block)
    if starts.shape[0] < 3:
        return None
    return team_size(starts.shape[0] - 1), starts


def bounds(n: int, work: int = 0, block: int = 1) -> np.ndarray:
    """parallel.chunk_bounds as a read-only (chunks + 1,) int64 array of starts and the end."""
    # batch norm asks once per pass: building the array cost ~6 µs (the limits are in the
    # key so that a test changing them gets its own)
    return _bounds(n, work, block, parallel.MAX_CHUNKS, parallel.MIN_ELEMENTS,
                   parallel.CHUNK_ELEMENTS)


@functools.lru_cache(maxsize=4096)
def _bounds(n: int, work: int, block: int, *_limits) -> np.ndarray:
    spans = parallel.chunk_bounds(n, work, block)
    starts = np.array([s for s, _ in spans] + [spans[-1][1]], dtype=np.int64)
    starts.flags.writeable = False
    return starts
