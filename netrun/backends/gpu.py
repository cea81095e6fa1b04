"""The GPU backend on CuPy (imported lazily: only this module imports cupy).

One backend per device: its CUDA stream is made current (sticky, per thread) whenever a
workspace on it feeds, fetches or runs, so every kernel — CuPy's, cuBLAS's and netrun's own —
queues on it in order. Host↔device copies go through `to_device` / `to_host` only (counted in
`transfers`); `to_host` and `synchronize` are the points where the host waits for the device,
and where errors that kernels flagged (a label out of range) are raised. The GPU kernels
(`netrun.ops.gpu`) and convolution algorithms (`netrun.conv.gpu`) are registered under the
backend's name "gpu" with everything else; creating a backend changes no shared state.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from netrun.backends.base import Backend
from netrun.backends.cuda.checks import DeviceChecks
from netrun.backends.cuda.cudnn import cudnn_version
from netrun.backends.cuda.random import DeviceGenerator
from netrun.errors import BackendError


def _import_cupy():
    try:
        import cupy  # optional: only a GPU workspace needs it
    except ImportError as e:
        raise BackendError(
            "device 'gpu' needs CuPy, which is not installed: "
            "pip install 'netrun[gpu-cuda12]' (CUDA 12) or 'netrun[gpu-cuda13]' (CUDA 13)") from e
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDA driver missing or broken
        raise BackendError(f"device 'gpu': CuPy is installed but no CUDA device is usable "
                           f"({e})") from e
    if count == 0:
        raise BackendError("device 'gpu': CuPy is installed but this machine has no CUDA device")
    return cupy, count


def describe_cuda() -> str:
    """CuPy's version, the CUDA runtime's and the devices, for `netrun --version`; the reason
    when there is no usable GPU (a BackendError's message)."""
    cupy, count = _import_cupy()
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    names = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(count)]
    return (f"{cupy.__version__}, CUDA {runtime // 1000}.{runtime % 1000 // 10}, "
            f"cuDNN {cudnn_version() or 'not found'}, {count} device(s): {', '.join(names)}")


class GPUBackend(Backend):
    """Device memory through CuPy's pool, one stream per device, device-side RNG."""

    name = "gpu"

    def __init__(self, index: int = 0):
        cupy, count = _import_cupy()
        if index >= count:
            raise BackendError(f"device 'gpu:{index}' does not exist: this machine has "
                               f"{count} GPU(s)")
        self.xp = cupy
        self.index = index
        self._device = cupy.cuda.Device(index)
        with self._device:
            # A blocking stream (not non_blocking=True): it still orders itself against the
            # legacy default stream, so CuPy work issued where this stream is not current
            # (another thread, a library call) cannot race with the work queued here.
            self.stream = cupy.cuda.Stream(non_blocking=False)
            props = cupy.cuda.runtime.getDeviceProperties(index)
        name = props["name"]
        self._name = name.decode() if isinstance(name, bytes) else str(name)
        self.compute_capability = f"{props.get('major', 0)}{props.get('minor', 0)}"
        # The card's PCI address: which physical GPU this is, whatever its index here.
        self.pci_address = (f"{props.get('pciDomainID', 0):04x}:{props.get('pciBusID', index):02x}"
                            f":{props.get('pciDeviceID', 0):02x}")
        self.pool = cupy.get_default_memory_pool()
        self._peak_held = 0
        self._versions: dict[str, str] | None = None
        self.checks = DeviceChecks(self)

    @property
    def device(self) -> str:
        return f"gpu:{self.index}"

    @property
    def device_name(self) -> str:
        return self._name

    def activate(self) -> None:
        """Make this device and its stream current for the calling thread (and keep them)."""
        cuda = self.xp.cuda
        if cuda.runtime.getDevice() != self.index:
            self._device.use()
        if cuda.get_current_stream().ptr != self.stream.ptr:
            self.stream.use()

    # Copies ----------------------------------------------------------------------------------
    def to_device(self, array: Any) -> Any:
        host = np.asarray(array)
        if not host.flags.c_contiguous:
            host = np.ascontiguousarray(host)
        with self._device, self.stream:
            out = self.xp.empty(host.shape, dtype=host.dtype)
            if host.size:
                # Queued on this stream: ordered after the kernels that used the memory before.
                out.set(host, stream=self.stream)
        return out

    def to_host(self, array: Any) -> np.ndarray:
        with self._device, self.stream:
            host = array.get(stream=self.stream)    # blocking: waits for the stream's work
        self._after_sync()
        return host

    def synchronize(self) -> None:
        # The whole device, not this stream: on an H200 (cuDNN 9.14), a deterministic
        # backward-filter plan queued here took 3.5 ms by CUDA events and by a device sync,
        # but cudaStreamSynchronize on this stream returned after 0.05 ms. Some of cuDNN's
        # work is not on the handle's stream (a blocking stream still orders after it), so a
        # stream sync made timings (the exhaustive search, benchmarks) count only launches.
        self._device.synchronize()
        self._after_sync()

    def _after_sync(self) -> None:
        """Bookkeeping where the host has caught up with the device: peak memory, checks."""
        held = self.pool.total_bytes()
        if held > self._peak_held:
            self._peak_held = held
        self.checks.check()

    # Memory ----------------------------------------------------------------------------------
    # Every op runs on this backend's one stream (cuDNN, cuBLAS and NCCL are handed it too;
    # what a library puts on the legacy default stream is ordered with it, as the stream is a
    # blocking one), so a planned value's bytes are written again only after its last reader.
    plans_activations = True

    def arena_bytes(self, nbytes: int) -> Any:
        with self._device, self.stream:
            return self.xp.empty((nbytes,), dtype=self.xp.uint8)

    # Random numbers --------------------------------------------------------------------------
    def new_rng(self, seed: int | None) -> Any:
        """A counter-based device generator whose state is two integers (exact checkpoints)."""
        return DeviceGenerator(self.xp, seed)

    # Timing ----------------------------------------------------------------------------------
    def record_event(self) -> Any:
        """A CUDA event recorded on the stream: timing marks that do not stall the device."""
        event = self.xp.cuda.Event()
        event.record(self.stream)
        return event

    def elapsed_s(self, start: Any, end: Any) -> float:
        """Seconds of device work between two events (waits for `end` to complete)."""
        end.synchronize()
        return self.xp.cuda.get_elapsed_time(start, end) / 1e3

    @contextmanager
    def timer(self) -> Iterator[list[float]]:
        """`with backend.timer() as t: ...`: device seconds of the block's work, from events."""
        out = [0.0]
        start = self.record_event()
        try:
            yield out
        finally:
            out[0] = self.elapsed_s(start, self.record_event())
            self._after_sync()

    # Memory and versions ---------------------------------------------------------------------
    def peak_memory_bytes(self) -> int:
        """The most memory CuPy's pool has held, as seen at sync points.

        The pool keeps freed blocks for reuse, so what it holds only grows: a high-water mark
        of live memory plus the pool's rounding and fragmentation.
        """
        self._peak_held = max(self._peak_held, self.pool.total_bytes())
        return self._peak_held

    def reset_peak_memory(self) -> None:
        """Start the peak over from what the pool holds now (benchmarks: one net at a time)."""
        self._peak_held = self.pool.total_bytes()

    def memory_stats(self) -> dict[str, int]:
        """Bytes in use, held by the pool, the peak held, and the device's free and total."""
        with self._device:
            free, total = self._device.mem_info
            return {"used_bytes": int(self.pool.used_bytes()),
                    "held_bytes": int(self.pool.total_bytes()),
                    "peak_held_bytes": int(self.peak_memory_bytes()),
                    "device_free_bytes": int(free), "device_total_bytes": int(total)}

    def library_versions(self) -> dict[str, str]:
        """What changes which convolution algorithm is fastest: part of algorithm-cache keys."""
        if self._versions is None:
            runtime = self.xp.cuda.runtime
            versions = {"cupy": str(self.xp.__version__),
                        "cuda_runtime": str(runtime.runtimeGetVersion()),
                        "cuda_driver": str(runtime.driverGetVersion()),
                        "compute_capability": self.compute_capability}
            cudnn = cudnn_version()
            if cudnn:
                versions["cudnn"] = cudnn
            self._versions = versions
        return dict(self._versions)
