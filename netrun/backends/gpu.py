"""The GPU backend on CuPy (imported lazily: only this module touches cupy)."""
from __future__ import annotations

from typing import Any

import numpy as np

from netrun.backends.base import Backend
from netrun.errors import BackendError


def _import_cupy():
    try:
        import cupy
    except ImportError as e:
        raise BackendError(
            "device 'gpu' needs CuPy, which is not installed: "
            "pip install 'netrun[gpu-cuda12]' (CUDA 12) or 'netrun[gpu-cuda13]' (CUDA 13)") from e
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDA driver missing or broken
        raise BackendError(f"device 'gpu': CuPy is installed but no CUDA device is usable ({e})") from e
    if count == 0:
        raise BackendError("device 'gpu': CuPy is installed but this machine has no CUDA device")
    return cupy, count


class GPUBackend(Backend):
    """Device memory through CuPy's pool, one stream per device, device-side RNG."""

    name = "gpu"

    def __init__(self, index: int = 0):
        cupy, count = _import_cupy()
        if index >= count:
            raise BackendError(f"device 'gpu:{index}' does not exist: this machine has {count} GPU(s)")
        self.xp = cupy
        self.index = index
        self._device = cupy.cuda.Device(index)
        with self._device:
            self.stream = cupy.cuda.Stream(non_blocking=True)
            props = cupy.cuda.runtime.getDeviceProperties(index)
        self._name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])

    @property
    def device(self) -> str:
        return f"gpu:{self.index}"

    @property
    def device_name(self) -> str:
        return self._name

    def activate(self):
        """Make this device and its stream current (a context manager pair)."""
        return self._device, self.stream

    def to_device(self, array: Any) -> Any:
        with self._device, self.stream:
            return self.xp.array(np.asarray(array), copy=True, order="C")

    def to_host(self, array: Any) -> np.ndarray:
        with self._device, self.stream:
            return self.xp.asnumpy(array, stream=self.stream)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def new_rng(self, seed: int | None) -> Any:
        with self._device:
            return self.xp.random.default_rng(seed)

    def peak_memory_bytes(self) -> int:
        """Bytes the CuPy pool holds (its high-water mark is what the pool keeps)."""
        return int(self.xp.get_default_memory_pool().total_bytes())
