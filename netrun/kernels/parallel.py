"""Batch-parallel NumPy work: image chunks on threads, each with a single-threaded BLAS.

NumPy's ufuncs, copies and BLAS calls release the GIL, so T Python threads working on T
chunks of a batch run on T cores: the copies and elementwise passes that a single NumPy call
runs on one core, and the many small GEMMs (one per image) that a multithreaded BLAS would
split across cores with a synchronization each, which costs more than it saves at that size.
Each worker sets OpenBLAS's per-thread count to 1 (`openblas_set_num_threads_local`), so the
workers never oversubscribe the cores; big single GEMMs outside `chunks` keep the BLAS's
threads. On other array modules (CuPy) or with one core, `chunks` just calls fn(0, n).
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

MIN_ELEMENTS = 1 << 18     # below this much work per thread the hand-off costs more than it saves
_POOL: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()
_SETTER: Any = False       # openblas_set_num_threads_local, None where unavailable


def blas_thread_count() -> int:
    """Threads the BLAS (and so every GEMM-based algorithm) runs with."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def thread_count() -> int:
    """Worker threads: the BLAS thread count (environment), else the usable cores."""
    return max(1, min(blas_thread_count(), 16))


def chunks(xp: Any, n: int, fn: Callable[[int, int, int], None], work: int = 0) -> None:
    """fn(index, n0, n1) over T contiguous chunks of range(n), concurrently (T threads).

    `work` (elements touched) below MIN_ELEMENTS, a single image, a non-NumPy array module
    or a single core run fn(0, 0, n) on the calling thread. Chunk `index` lets callers keep
    per-chunk scratch buffers and partial results apart.
    """
    t = min(thread_count(), n)
    if t <= 1 or xp is not np or (work and work < MIN_ELEMENTS * t):
        fn(0, 0, n)
        return
    bounds = [(i, n * i // t, n * (i + 1) // t) for i in range(t)]
    pool = _pool(t)
    futures = [pool.submit(_single_blas, fn, *b) for b in bounds[1:]]
    try:
        _single_blas(fn, *bounds[0])
    finally:
        for f in futures:
            f.result()


def per_thread(n: int, block: int) -> tuple[int, int]:
    """(threads, images per thread's block) when `chunks` splits n images in blocks of at
    most `block`: what an algorithm's scratch estimate multiplies out."""
    t = max(1, min(thread_count(), n))
    return t, max(1, min(block, -(-n // t)))


def start() -> None:
    """Start the worker threads and find the BLAS thread setter now (a one-time cost that
    shows in a short iteration), so that a net's first iteration does not pay for it."""
    t = thread_count()
    if t <= 1:
        return
    pool = _pool(t)
    for f in [pool.submit(_single_blas, lambda *a: None, i, 0, 0) for i in range(t - 1)]:
        f.result()


def chunk_scratch(scratch: Callable, index: int) -> Callable:
    """A scratch function whose buffers are private to chunk `index`."""
    if index == 0:
        return scratch
    return lambda key, shape, dtype="float32": scratch(f"{key}#{index}", shape, dtype)


def _pool(t: int) -> ThreadPoolExecutor:
    global _POOL
    with _LOCK:
        if _POOL is None or _POOL._max_workers < t - 1:
            _POOL = ThreadPoolExecutor(max_workers=max(1, t - 1), thread_name_prefix="netrun")
        return _POOL


def _single_blas(fn, index: int, n0: int, n1: int) -> None:
    with blas_threads(1):
        fn(index, n0, n1)


@contextmanager
def blas_threads(count: int) -> Iterator[None]:
    """OpenBLAS uses `count` threads for calls from this thread inside the block."""
    setter = _setter()
    if setter is None:
        yield
        return
    previous = setter(count)
    try:
        yield
    finally:
        setter(previous)


def _setter():
    """openblas_set_num_threads_local from NumPy's bundled OpenBLAS (None if not found)."""
    global _SETTER
    if _SETTER is False:
        _SETTER = None
        folder = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
        for path in sorted(glob.glob(os.path.join(folder, "*openblas*"))):
            try:
                fn = ctypes.CDLL(path).openblas_set_num_threads_local
            except (OSError, AttributeError):
                continue
            fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
            _SETTER = fn
            break
    return _SETTER
