"""oneDNN's threads: GNU OpenMP, told netrun's thread count around each call, then restored.

oneDNN (the gomp build) runs a primitive on `omp_get_max_threads()` threads of the calling
thread's OpenMP team. `running(count)` sets that number for the duration of a call and puts
the caller's value back afterwards: libgomp is shared by everything in the process (PyTorch
links the same libgomp.so.1), so a count left behind on the main thread would quietly run
the user's other OpenMP code on one thread.

The conv algorithm mostly calls with a count of 1 from each of netrun's workers (its results
must not depend on the thread count; netrun.conv.cpu.onednn); only one image's forward pass
runs on a team of netrun's thread count, on kernels that split no sums. netrun leaves
OpenMP's environment alone (OMP_WAIT_POLICY, GOMP_SPINCOUNT): the variables are process-wide
and read by every OpenMP runtime that starts later (PyTorch's, in the same process).
"""
from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

_GOMP: dict[str, object] = {}     # libgomp's two functions, loaded with libdnnl (process-wide)


def _gomp() -> tuple | None:
    """(omp_get_max_threads, omp_set_num_threads), or None under another OpenMP."""
    if "fns" not in _GOMP:
        try:
            lib = ctypes.CDLL("libgomp.so.1")
            get, set_ = lib.omp_get_max_threads, lib.omp_set_num_threads
            get.argtypes, get.restype = [], ctypes.c_int
            set_.argtypes, set_.restype = [ctypes.c_int], None
            _GOMP["fns"] = (get, set_)
        except (OSError, AttributeError):
            _GOMP["fns"] = None   # oneDNN then runs on that runtime's default
    return _GOMP["fns"]


@contextmanager
def running(count: int) -> Iterator[None]:
    """oneDNN calls from this thread inside the block run on `count` OpenMP threads."""
    before = set_count(count)
    try:
        yield
    finally:
        restore(before)


def set_count(count: int) -> int | None:
    """oneDNN calls from this thread run on `count` OpenMP threads from now on; returns what
    `restore` puts back (None: nothing changed). `running` without a generator's cost, for
    calls repeated at batch 1 (~2 µs a call)."""
    fns = _gomp()
    if fns is None:
        return None
    get, set_ = fns
    count, before = max(1, int(count)), get()
    if before == count:
        return None
    set_(count)
    return before


def restore(before: int | None) -> None:
    """Put back the count that `set_count` replaced."""
    if before is not None:
        _gomp()[1](before)
