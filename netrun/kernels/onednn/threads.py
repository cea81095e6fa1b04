"""oneDNN's threads: GNU OpenMP, told netrun's thread count per calling thread.

oneDNN (the gomp build) runs a primitive on `omp_get_max_threads()` threads of the calling
thread's OpenMP team. netrun sets that number before every call (`use`), from the thread
count its caller passes (netrun.kernels.parallel's), so NETRUN_THREADS limits oneDNN too.

The conv algorithm calls with a count of 1 from each of netrun's workers (its results must
not depend on the thread count; netrun.conv.cpu.onednn), so no OpenMP team starts at all.
netrun leaves OpenMP's environment alone (OMP_WAIT_POLICY, GOMP_SPINCOUNT): those
variables are process-wide and read by every OpenMP runtime that starts later in the
process, PyTorch's included. A short spin set here once made PyTorch 25% slower beside
netrun in the benchmarks.
"""
from __future__ import annotations

import ctypes
import threading

_LOCAL = threading.local()        # .count: what this thread last told OpenMP
_GOMP: dict[str, object] = {}     # the libgomp handle, loaded with libdnnl (process-wide)


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
