"""The optional compiled CPU engine: Numba kernels for loops NumPy cannot fuse.

Pooling with argmax routing, depthwise convolution and similar window loops cost NumPy one
full memory pass per kernel tap; compiled, they are one pass in all. The engine is optional
(`pip install 'netrun[fast]'`): without Numba, or with NETRUN_JIT=0 in the environment, every
operator runs its pure NumPy path, which computes the same values.

Kernels are declared with `@kernel` in modules under netrun.kernels.jit. Numba is imported only when
a kernel is first compiled, so `import netrun` stays fast; compiled code is cached on disk
(`cache=True`) and `prepare` loads it when a net is built, not inside its first iteration.
Kernels release the GIL (`nogil=True`): netrun.kernels.parallel runs them on its threads.

What keeps LLVM from vectorizing a loop here: signed indices (Numba checks them for negative
wrap-around; unsigned np.uint64 indices avoid it), float division (checked for zero on every
call; multiply by a reciprocal), and helper calls with constant arguments compile one
specialization per constant.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from netrun.util.progress import activity

ENV = "NETRUN_JIT"
_state = {"forced_off": False}
_available: bool | None = None
_LOCK = threading.Lock()


def available() -> bool:
    """Whether Numba is installed and not switched off by NETRUN_JIT=0."""
    global _available
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return False
    if _available is None:
        try:
            import numba  # noqa: F401
            _available = True
        except ImportError:
            _available = False
    return _available


def enabled(xp: Any) -> bool:
    """Whether compiled kernels should run for arrays of module `xp` (NumPy only)."""
    return xp is np and not _state["forced_off"] and available()


@contextmanager
def disabled() -> Iterator[None]:
    """Run the pure NumPy paths inside the block (tests compare both engines)."""
    before = _state["forced_off"]
    _state["forced_off"] = True
    try:
        yield
    finally:
        _state["forced_off"] = before


class Kernel:
    """A Python function compiled by Numba on first use (nopython, nogil, cached on disk);
    with parallel=True its `prange` loops run on Numba's OpenMP team (see netrun.kernels.omp)."""

    def __init__(self, fn: Callable, parallel: bool = False):
        self.fn = fn
        self.parallel = parallel
        self._compiled: Any = None
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    @property
    def compiled(self) -> Any:
        """The Numba dispatcher (compiles nothing yet; imports Numba on first access)."""
        if self._compiled is None:
            with _LOCK:
                if self._compiled is None:
                    import numba  # optional and heavy: only when a kernel is first used

                    self._compiled = numba.njit(cache=True, nogil=True,
                                                parallel=self.parallel)(self.fn)
        return self._compiled

    def __call__(self, *args):
        return self.compiled(*args)

    @property
    def _numba_type_(self):
        # Numba asks this of globals a kernel calls: another kernel is typed as its
        # dispatcher, so kernels can share compiled helpers.
        from numba.core import types  # optional, as above

        return types.Dispatcher(self.compiled)

    def prepare(self, *signatures: str) -> None:
        """Compile (or load from the disk cache) these Numba signatures now."""
        # A cold cache costs seconds per kernel: say so (the CLI shows it past a moment).
        with activity(f"compiling the {self.__name__} kernel (Numba; cached on disk after "
                      f"the first run)"):
            for sig in signatures:
                self.compiled.compile(sig)


def kernel(fn: Callable) -> Kernel:
    """Decorator: `fn` becomes a lazily compiled Numba kernel (see `Kernel`)."""
    return Kernel(fn)


def team_kernel(fn: Callable) -> Kernel:
    """Decorator: a kernel whose `prange` loop over fixed chunks runs on the OpenMP team
    (netrun.kernels.omp decides when one may be launched)."""
    return Kernel(fn, parallel=True)


def __getattr__(name: str) -> Any:
    # `jit.prange` in a team kernel is Numba's prange, looked up only when Numba compiles
    # the kernel (so that importing the kernel modules does not import Numba)
    if name == "prange":
        import numba

        return numba.prange
    raise AttributeError(name)
