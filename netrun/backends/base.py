"""The Backend interface every device implements."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np


class Backend:
    """Array module, allocation, host<->device copies, synchronization, RNG and timing."""

    name = "base"          # registry key for kernels: "cpu" or "gpu"
    xp: Any = np           # numpy or cupy

    @property
    def device(self) -> str:
        """The device string, such as 'cpu' or 'gpu:0'."""
        raise NotImplementedError

    @property
    def device_name(self) -> str:
        """The hardware's name (CPU model, GPU name): part of algorithm-cache keys."""
        raise NotImplementedError

    def empty(self, shape, dtype) -> Any:
        return self.xp.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype) -> Any:
        return self.xp.zeros(shape, dtype=dtype)

    def to_device(self, array: Any) -> Any:
        """Copy a host (NumPy) array into a new array owned by this backend."""
        raise NotImplementedError

    def to_host(self, array: Any) -> np.ndarray:
        """Copy an array of this backend to a new host NumPy array."""
        raise NotImplementedError

    def is_array(self, value: Any) -> bool:
        return isinstance(value, self.xp.ndarray)

    def owns_data(self, array: Any) -> bool:
        """True when the array is not a view of another (so it may be written in place)."""
        return array.base is None

    def synchronize(self) -> None:
        """Wait until queued device work is done (FinishDeviceComputation)."""

    def new_rng(self, seed: int | None) -> Any:
        """A random generator on this device (xp.random.Generator)."""
        raise NotImplementedError

    def now(self) -> float:
        """A timestamp in seconds, taken after pending device work has finished."""
        self.synchronize()
        return time.perf_counter()

    @contextmanager
    def timer(self) -> Iterator[list[float]]:
        """`with backend.timer() as t: ...` leaves the elapsed seconds in t[0]."""
        out = [0.0]
        start = self.now()
        try:
            yield out
        finally:
            out[0] = self.now() - start
