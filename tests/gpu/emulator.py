"""A stand-in for CuPy on machines without a GPU: NumPy arrays plus CUDA kernels run on the host.

`EmuCuPy` imitates the parts of CuPy that netrun's GPU backend touches: array functions
(NumPy's, with results kept as `DeviceArray`), `RawModule` (the CUDA source compiled with the
host C++ compiler behind a small shim, every block and thread run in turn), streams, events,
the memory pool and the runtime queries. Installed as `sys.modules["cupy"]`, it lets the real
`GPUBackend`, the GPU kernels and the GPU convolution algorithms run in tests.

It is strict where CuPy is and NumPy is not, so that bugs which would only show on a GPU show
here: kernel arguments must be device arrays of the declared element type (C-contiguous) or
NumPy scalars of the declared width (CuPy passes a Python int as 64 bits); host arrays mixed
into device operations raise; grid and block sizes are checked against CUDA's limits. It also
counts what would silently synchronize on a GPU: `float()`, `int()`, `bool()`, `.item()` and
`.tolist()` of device arrays, and host data turned into device arrays outside the backend.

What it cannot show: anything about timing, NVRTC-only compile errors, memory-pool or stream
behaviour, and CuPy API differences beyond those imitated here.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any

import numpy as np

from tests.gpu.hostcuda import EmuKernel, EmuRawModule


class Counters:
    """What would have stalled or copied on a real GPU, outside the backend's own copies."""

    def __init__(self):
        self.host_syncs = 0          # float()/int()/bool()/item()/tolist() of device arrays
        self.hidden_to_device = 0    # host data turned into device arrays by array functions
        self.launches = 0
        self.events: list[str] = []  # what each host sync / hidden copy was

    def reset(self) -> None:
        self.__init__()


COUNTERS = Counters()
_STATE = threading.local()


def _count_launch() -> None:
    COUNTERS.launches += 1


EmuKernel.on_launch = staticmethod(_count_launch)


def _depth() -> int:
    return getattr(_STATE, "depth", 0)


@contextmanager
def _inside():
    """Inside an array-module function: its internals are NumPy's business, not checked."""
    _STATE.depth = _depth() + 1
    try:
        yield
    finally:
        _STATE.depth -= 1


# Device arrays -------------------------------------------------------------------------------
def _note_sync(what: str) -> None:
    if _depth() == 0:
        COUNTERS.host_syncs += 1
        COUNTERS.events.append(what)


def _is_host_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) and not isinstance(x, DeviceArray)


def _check_no_host(what: str, values) -> None:
    for v in values:
        if _is_host_array(v):
            raise TypeError(f"{what}: a host NumPy array is mixed with device arrays "
                            f"(CuPy refuses implicit host-to-device conversion)")


class DeviceArray(np.ndarray):
    """An ndarray that stands for GPU memory."""

    on_device = True        # what EmuKernel checks pointer arguments for

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if _depth() == 0:
            _check_no_host(f"{ufunc.__name__}.{method}", inputs + (out or ()))
        args = [x.view(np.ndarray) if isinstance(x, DeviceArray) else x for x in inputs]
        if out is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, DeviceArray) else o
                                  for o in out)
        with _inside():
            result = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return to_device_result(result)

    def __getitem__(self, key):
        result = super().__getitem__(key)
        return to_device_result(result) if isinstance(result, np.generic) else result

    def __setitem__(self, key, value):
        if _depth() == 0 and (_is_host_array(value) or isinstance(value, (list, tuple))):
            raise TypeError("assigning host data into a device array (use the backend's "
                            "to_device)")
        super().__setitem__(key, value)

    def __float__(self):
        _note_sync("float()")
        return float(self.view(np.ndarray))

    def __int__(self):
        _note_sync("int()")
        return int(self.view(np.ndarray))

    def __index__(self):
        _note_sync("index")
        return self.view(np.ndarray).__index__()

    def __bool__(self):
        _note_sync("bool()")
        return bool(self.view(np.ndarray))

    def item(self, *args):
        _note_sync(".item()")
        return self.view(np.ndarray).item(*args)

    def tolist(self):
        _note_sync(".tolist()")
        return self.view(np.ndarray).tolist()

    # CuPy's explicit copies
    def get(self, stream=None, order="C", out=None, blocking=True):
        host = np.array(self.view(np.ndarray), copy=True, order=order)
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, arr, stream=None):
        arr = np.asarray(arr)
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError(f"set: host array {arr.shape} {arr.dtype} does not match the "
                             f"device array {self.shape} {self.dtype}")
        self.view(np.ndarray)[...] = arr


def to_device_result(value: Any) -> Any:
    """NumPy results as CuPy gives them: device arrays, and 0-d arrays instead of scalars."""
    if isinstance(value, DeviceArray):
        return value
    if isinstance(value, np.ndarray):
        return value.view(DeviceArray)
    if isinstance(value, np.generic):
        out = DeviceArray((), value.dtype)
        out.view(np.ndarray)[...] = value
        return out
    if isinstance(value, tuple):
        return tuple(to_device_result(v) for v in value)
    if isinstance(value, list):
        return [to_device_result(v) for v in value]
    return value


_CREATE_FROM_DATA = {"asarray", "array", "asanyarray", "ascontiguousarray", "asfortranarray",
                     "copy"}


# Functions whose CuPy versions take no `out=` (callers must handle the TypeError).
_NO_OUT = {"einsum"}


class _Namespace:
    """NumPy functions (of a module or submodule) with CuPy's device-array results."""

    def __init__(self, module, no_out: bool = False):
        self._module = module
        self._no_out = no_out

    def __getattr__(self, name):
        obj = getattr(self._module, name)
        if isinstance(obj, type) or not callable(obj):
            if hasattr(obj, "__name__") and type(obj).__name__ == "module":
                return _Namespace(obj)
            return obj
        return _wrap_function(name, obj, self._no_out or name in _NO_OUT)


def _wrap_function(name: str, fn, no_out: bool = False):
    def wrapped(*args, **kwargs):
        if no_out and "out" in kwargs:
            raise TypeError(f"{name}() got an unexpected keyword argument 'out' (as in CuPy)")
        if _depth() == 0:
            if name in _CREATE_FROM_DATA:
                if args and not isinstance(args[0], DeviceArray):
                    COUNTERS.hidden_to_device += 1
                    COUNTERS.events.append(f"xp.{name}(host data)")
            else:
                _check_no_host(f"xp.{name}", list(args) + list(kwargs.values()))
        with _inside():
            result = fn(*args, **kwargs)
        if name in ("empty", "zeros", "ones", "full", "empty_like", "zeros_like",
                    "ones_like", "full_like") and isinstance(result, np.ndarray):
            out = DeviceArray(result.shape, result.dtype)
            out.view(np.ndarray)[...] = result
            return out
        return to_device_result(result)

    wrapped.__name__ = name
    return wrapped


# The CUDA runtime pieces GPUBackend uses ----------------------------------------------------
class _Runtime:
    def __init__(self, devices: int):
        self.devices, self.current = devices, 0

    def getDeviceCount(self) -> int:
        return self.devices

    def getDevice(self) -> int:
        return self.current

    def getDeviceProperties(self, index: int) -> dict:
        return {"name": f"Emulated GPU {index} (host C++)".encode(), "major": 9, "minor": 0,
                "totalGlobalMem": 1 << 30, "multiProcessorCount": 1}

    def runtimeGetVersion(self) -> int:
        return 12080

    def driverGetVersion(self) -> int:
        return 12080


class _Device:
    def __init__(self, index: int = 0):
        self.id = index
        self._previous: list[int] = []

    def use(self) -> None:
        CUPY.cuda.runtime.current = self.id

    def __enter__(self):
        self._previous.append(CUPY.cuda.runtime.current)
        self.use()
        return self

    def __exit__(self, *exc):
        CUPY.cuda.runtime.current = self._previous.pop()

    @property
    def mem_info(self) -> tuple[int, int]:
        return (1 << 29, 1 << 30)

    @property
    def compute_capability(self) -> str:
        return "90"

    def synchronize(self) -> None:
        pass


class _Stream:
    _count = 0

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False,
                 priority: int = 0):
        _Stream._count += 1
        self.ptr = 0 if null else _Stream._count
        self.non_blocking = non_blocking
        self._previous: list = []
        self.synchronized = 0

    @property
    def is_non_blocking(self) -> bool:
        return self.non_blocking

    def use(self) -> "_Stream":
        _STATE.stream = self
        return self

    def __enter__(self):
        self._previous.append(getattr(_STATE, "stream", _NULL_STREAM))
        self.use()
        return self

    def __exit__(self, *exc):
        _STATE.stream = self._previous.pop()

    def synchronize(self) -> None:
        self.synchronized += 1

    def record(self, event=None):
        event = event or _Event()
        event.record(self)
        return event


_NULL_STREAM = _Stream(null=True)


class _Event:
    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False):
        self.time = None

    def record(self, stream=None) -> None:
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        if self.time is None:
            raise RuntimeError("event synchronized before it was recorded")

    @property
    def done(self) -> bool:
        return self.time is not None


class _MemoryPool:
    def __init__(self):
        self.used, self.total = 0, 0

    def used_bytes(self) -> int:
        return self.used

    def total_bytes(self) -> int:
        return self.total

    def free_all_blocks(self) -> None:
        self.total = self.used


class _Cuda:
    def __init__(self, devices: int):
        self.runtime = _Runtime(devices)
        self.Device = _Device
        self.Stream = _Stream
        self.Event = _Event

    @staticmethod
    def get_current_stream(device_id: int = -1):
        return getattr(_STATE, "stream", _NULL_STREAM)

    @staticmethod
    def get_elapsed_time(start: _Event, end: _Event) -> float:
        return (end.time - start.time) * 1e3


class EmuCuPy(_Namespace):
    """The `cupy` module as netrun's GPU code sees it."""

    __version__ = "14.0.0-emulated"
    ndarray = DeviceArray
    RawModule = EmuRawModule

    def __init__(self, devices: int = 1):
        super().__init__(np)
        self.cuda = _Cuda(devices)
        self._pool = _MemoryPool()
        self.fft = _Namespace(np.fft, no_out=True)       # cupy.fft has no out=
        self.linalg = _Namespace(np.linalg)
        self.lib = _Namespace(np.lib)

    def get_default_memory_pool(self) -> _MemoryPool:
        return self._pool

    @staticmethod
    def asnumpy(a, stream=None, order="C", out=None, blocking=True):
        if isinstance(a, DeviceArray):
            return a.get(order=order, out=out)
        return np.asarray(a, order=order)


CUPY = EmuCuPy()


@contextmanager
def emulated_gpu():
    """Within the block, device 'gpu' is the real GPUBackend running on EmuCuPy.

    Afterwards `sys.modules['cupy']` and the backend cache are as they were. Nothing else
    needs restoring: the GPU kernels and algorithms are registered whenever netrun is
    imported (their CUDA sources are text), and creating the backend changes no registry.
    """
    import sys

    import pytest

    from netrun import backends

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "cupy", CUPY)
        from netrun.backends.gpu import GPUBackend

        backend = GPUBackend(0)
        mp.setitem(backends._CACHE, "gpu:0", backend)
        yield backend
