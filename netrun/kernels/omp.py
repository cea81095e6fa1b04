"""Fixed chunks on one OpenMP team: compiled kernels and oneDNN's primitives share its threads.

netrun.kernels.parallel hands a batch's fixed chunks to Python worker threads. Each hand-off
wakes a sleeping thread, and every step of a chunk takes the GIL again: on a small VM a wake
costs ~0.1 ms, and ResNet-20's training step on 2 cores ran only 1.02-1.11× faster than on
one. Worse, oneDNN's OpenMP threads spin for milliseconds after each call and take the core
that the next op's Python worker needs. Here the same fixed chunks run instead as the
iterations of one `prange` loop in a compiled kernel (netrun.kernels.jit.team_kernel), on
Numba's OpenMP threading layer: one GIL-free call per op, on the team of the libgomp that
oneDNN uses too, whose threads are already spinning when the next op starts.

The bits stay those of the worker-thread path: a chunk is the same slice whichever thread
runs it, and the chunks' partial sums are added by the caller in chunk order after the call.

Used only where it is safe: Numba's OpenMP layer (shared with oneDNN's libgomp, and safe for
launches from several Python threads at once; its `workqueue` fallback is neither), asked for
ahead of TBB unless the user chose a layer (NUMBA_THREADING_LAYER). NETRUN_OMP=off turns it
off, and work nested in a worker thread's chunk runs on that thread alone.

The team's idle threads spin before they sleep: libgomp's default is 300,000 rounds (~3 ms),
during which they hold cores that netrun's worker threads need for the ops that still run
there (compiled Winograd, the GEMM algorithms): ResNet-20's training step at batch 128 ran
~10% faster with 10,000 (`SPIN_COUNT`). libgomp reads its settings once, when it is loaded,
so `load_runtime` loads it first, with that count, where nothing in the process has loaded
it yet and the user set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT; the environment is put
back at once. Where another library loaded it first (PyTorch), its settings stand.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import numpy as np

from netrun.kernels import jit, parallel

ENV = "NETRUN_OMP"

# Whether Numba's OpenMP layer runs team kernels here: a fact about the process, found once.
_LAYER: dict[str, bool] = {}
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
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    try:
        ctypes.CDLL(LIBGOMP, mode=os.RTLD_NOLOAD)   # loaded already: its settings stand
        return
    except OSError:
        pass
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    try:
        ctypes.CDLL(LIBGOMP)   # its constructor reads the environment now
    except OSError:
        pass
    finally:
        del os.environ["GOMP_SPINCOUNT"]


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


def launch(kernel: jit.Kernel, chunks: int, *args) -> Any:
    """kernel(*args) on a team of min(netrun's thread count, chunks) threads (one thread
    inside a worker's chunk, where nested work runs inline)."""
    import numba  # loaded already: `usable` was asked first

    threads = 1 if parallel.in_chunk() else min(parallel.thread_count(), chunks)
    threads = max(1, min(threads, numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != threads:   # Numba keeps the count per calling thread
        numba.set_num_threads(threads)
    return kernel(*args)


def bounds(n: int, work: int = 0, block: int = 1) -> np.ndarray:
    """parallel.chunk_bounds as a (chunks + 1,) int64 array of starts and the end."""
    spans = parallel.chunk_bounds(n, work, block)
    return np.array([s for s, _ in spans] + [spans[-1][1]], dtype=np.int64)
