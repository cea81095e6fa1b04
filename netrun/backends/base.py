"""The Backend interface every device implements."""
from __future__ import annotations

import functools
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np


@dataclass
class TransferCounter:
    """Host↔device copies made through a backend's to_device / to_host (count and bytes).

    Blobs are meant to stay on the device for a whole run; tests read these counters to check
    that copies happen only at feed, fetch and checkpoint boundaries.
    """

    to_device: int = 0
    to_device_bytes: int = 0
    to_host: int = 0
    to_host_bytes: int = 0

    def snapshot(self) -> "TransferCounter":
        return TransferCounter(self.to_device, self.to_device_bytes, self.to_host,
                               self.to_host_bytes)

    def since(self, before: "TransferCounter") -> "TransferCounter":
        """The copies made after `before` (a snapshot) was taken."""
        return TransferCounter(self.to_device - before.to_device,
                               self.to_device_bytes - before.to_device_bytes,
                               self.to_host - before.to_host,
                               self.to_host_bytes - before.to_host_bytes)

    def reset(self) -> None:
        self.to_device = self.to_device_bytes = self.to_host = self.to_host_bytes = 0


def _counted(method, direction: str):
    """Wrap a backend's to_device / to_host so every call is counted in `backend.transfers`."""

    @functools.wraps(method)
    def wrapper(self, array, *args, **kwargs):
        result = method(self, array, *args, **kwargs)
        counter = self.transfers
        setattr(counter, direction, getattr(counter, direction) + 1)
        nbytes = f"{direction}_bytes"
        setattr(counter, nbytes, getattr(counter, nbytes) + int(getattr(result, "nbytes", 0)))
        return result

    wrapper._counted = True
    return wrapper


class Backend:
    """Array module, allocation, host<->device copies, synchronization, RNG and timing."""

    name = "base"          # registry key for kernels: "cpu" or "gpu"
    xp: Any = np           # numpy or cupy

    def __init_subclass__(cls, **kwargs):
        # Every backend's copies are counted without each backend having to remember to.
        super().__init_subclass__(**kwargs)
        for method, direction in (("to_device", "to_device"), ("to_host", "to_host")):
            fn = cls.__dict__.get(method)
            if fn is not None and not getattr(fn, "_counted", False):
                setattr(cls, method, _counted(fn, direction))

    @property
    def transfers(self) -> TransferCounter:
        """Counters of the host↔device copies made through this backend."""
        counter = self.__dict__.get("_transfers")
        if counter is None:
            counter = self.__dict__["_transfers"] = TransferCounter()
        return counter

    @property
    def device(self) -> str:
        """The device string, such as 'cpu' or 'gpu:0'."""
        raise NotImplementedError

    @property
    def device_name(self) -> str:
        """The hardware's name (CPU model, GPU name): part of algorithm-cache keys."""
        raise NotImplementedError

    def activate(self) -> None:
        """Make this device (and its stream) current for the calling thread; CPU: nothing."""

    def empty(self, shape, dtype) -> Any:
        return self.xp.empty(shape, dtype=dtype)

    # Workspace memory (netrun.core.memory). Backends whose arrays live in host memory carve
    # output buffers and scratch out of big blocks planned per workspace; the others (GPU:
    # CuPy's own caching pool) allocate array by array and keep the defaults below.
    host_memory = False

    def bind(self, memory: Any) -> "Backend":
        """This backend as a workspace uses it: CPU, a copy allocating from `memory`."""
        return self

    def new_block(self, nbytes: int, populate: bool = False, reserve: bool = False) -> Any:
        """Raw memory of at least nbytes for a workspace arena (host-memory backends only):
        `populate` faults it in now; `reserve` asks for address space, paid for on touch."""
        raise NotImplementedError

    # Whether a workspace may share activation memory by lifetime in one arena per workspace
    # (netrun.core.lifetimes). On a device this needs every op ordered on one stream, so a
    # value's bytes are rewritten only after the kernels reading them were queued.
    plans_activations = False

    def arena_bytes(self, nbytes: int) -> Any:
        """A new array of at least nbytes uint8 on this device: a workspace's activation
        arena, whose slices (viewed as other dtypes) are the planned blobs."""
        raise NotImplementedError

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

    def library_versions(self) -> dict[str, str]:
        """Versions of the device libraries that change which algorithm is fastest (cache
        keys); the CPU's NumPy and BLAS are read by the cache itself."""
        return {}

    def synchronize(self) -> None:
        """Wait until queued device work is done (FinishDeviceComputation)."""

    def new_rng(self, seed: int | None) -> Any:
        """A random generator on this device (xp.random.Generator)."""
        raise NotImplementedError

    def now(self) -> float:
        """A timestamp in seconds, taken after pending device work has finished."""
        self.synchronize()
        return time.perf_counter()

    # Markers: timing without stalling an asynchronous device between the two points.
    def record_event(self) -> Any:
        """A marker of this point in the device's work queue (CPU: a timestamp)."""
        return time.perf_counter()

    def elapsed_s(self, start: Any, end: Any) -> float:
        """Seconds of device work between two markers from record_event (waits for `end`)."""
        return end - start

    @contextmanager
    def timer(self) -> Iterator[list[float]]:
        """`with backend.timer() as t: ...` leaves the elapsed seconds in t[0]."""
        out = [0.0]
        start = self.now()
        try:
            yield out
        finally:
            out[0] = self.now() - start
