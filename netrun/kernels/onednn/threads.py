"""oneDNN's threads: GNU OpenMP, told netrun's thread count per calling thread.

oneDNN (the gomp build) runs a primitive on `omp_get_max_threads()` threads of the calling
thread's OpenMP team. netrun sets that number before every call (`use`), from the thread
count its caller passes (netrun.kernels.parallel's), so NETRUN_THREADS limits oneDNN too.

The conv algorithm calls with a count of 1 from each of netrun's workers (its results must
not depend on the thread count; netrun.conv.cpu.onednn), so no OpenMP team starts at all.
For callers that ask for more: idle OpenMP threads would spin on the cores for a while
(libgomp's default spins 300,000 times before sleeping) while netrun's own workers need
them, so unless the user chose OMP_WAIT_POLICY or GOMP_SPINCOUNT, a short spin is set
before libgomp starts (it reads them once, when it loads).
"""
from __future__ import annotations

import ctypes
import os
import threading

# Spins before an idle OpenMP thread sleeps. 0 (passive) costs a futex wake-up per parallel
# region; a short spin keeps back-to-back primitives cheap without holding a core long.
SPINCOUNT = "10000"

_LOCAL = threading.local()        # .count: what this thread last told OpenMP
_GOMP: dict[str, object] = {}     # the libgomp handle, loaded with libdnnl (process-wide)


def configure_environment() -> None:
    """Set OpenMP's waiting policy for oneDNN's threads, unless the user chose one."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = SPINCOUNT


def _omp_set_num_threads():
    if "set" not in _GOMP:
        try:
            fn = ctypes.CDLL("libgomp.so.1").omp_set_num_threads
            fn.argtypes, fn.restype = [ctypes.c_int], None
        except (OSError, AttributeError):
            fn = None    # another OpenMP: oneDNN then runs on that runtime's default
        _GOMP["set"] = fn
    return _GOMP["set"]


def use(count: int) -> None:
    """Make oneDNN calls from this thread run on `count` OpenMP threads."""
    count = max(1, int(count))
    if getattr(_LOCAL, "count", None) == count:
        return
    fn = _omp_set_num_threads()
    if fn is not None:
        fn(count)
    _LOCAL.count = count
