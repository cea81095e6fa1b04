"""CUDA sources of the GPU backend: compiled per device on first use, launched on the stream.

Every custom kernel is a C++ template over its element type, written without headers or the
standard library, so one source compiles under NVRTC (CuPy's RawModule, `name_expressions`
selecting the instances) and, for tests on machines without a GPU, under a host C++ compiler
with a small CUDA shim (tests/gpu/hostcuda.py). Kernels use grid-stride loops and no shared
memory or atomics, so each thread's work is independent and deterministic; reductions across
threads are left to the array module (cupy.sum, cuBLAS), or split into fixed partials that a
second kernel adds in a fixed order (batch norm's statistics: fewer launches per op).

Nothing here imports cupy: the array module comes in as `xp` from the backend.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

THREADS = 256            # threads per block
MAX_BLOCKS = 1 << 16     # grid-stride loops cover the rest

# Macros and helpers every source starts with (valid CUDA C++ and, with the test shim, C++).
PRELUDE = r"""
#define KERNEL_LOOP(i, n) \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)(n); \
       i += (long long)blockDim.x * gridDim.x)

template <typename T> __device__ __forceinline__ T neg_infinity() {
  return (T)(-__longlong_as_double(0x7ff0000000000000LL));
}

template <typename T> __device__ __forceinline__ T quiet_nan() {
  return (T)__longlong_as_double(0x7ff8000000000000LL);
}
"""

_CTYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "long long",
           "bool": "bool", "uint8": "unsigned char"}


# ctype's answers by dtype object: `np.dtype(x).name` costs microseconds, and kernels ask on
# every launch (a pure function of its argument, so sharing it is safe).
_BY_DTYPE: dict[Any, str] = {np.dtype(n): c for n, c in _CTYPES.items()}


def ctype(dtype: Any) -> str:
    """The C type of a NumPy dtype ('float32' -> 'float'); ValueError for others."""
    found = _BY_DTYPE.get(dtype)
    if found is not None:
        return found
    name = np.dtype(dtype).name
    if name not in _CTYPES:
        raise ValueError(f"no GPU kernel instance for dtype {name}")
    return _CTYPES[name]


def instances(kernel: str, *type_lists: Sequence[str]) -> list[str]:
    """Name expressions of a template kernel for every combination of its type arguments."""
    combos: list[tuple[str, ...]] = [()]
    for types in type_lists:
        combos = [c + (t,) for c in combos for t in types]
    return [f"{kernel}<{', '.join(c)}>" for c in combos]


REALS = ("float", "double")
INDICES = ("int", "long long")


# No fused multiply-adds: each kernel then rounds exactly as the NumPy kernel it replaces
# (a*b + c in two steps), so CPU and GPU agree to the bit wherever the operations match.
OPTIONS = ("--fmad=false",)


# Every KernelSource made, by name, so tests can compile them all ahead of a GPU: a source is
# registered where it is written (an op's section, a GPU module), not in a central list.
_SOURCES: dict[str, "KernelSource"] = {}


def all_sources() -> list["KernelSource"]:
    """Every CUDA source netrun has defined so far (all of them once netrun is imported)."""
    return list(_SOURCES.values())


class KernelSource:
    """One CUDA source of template kernels; `function(xp, name)` compiles it once per device."""

    def __init__(self, name: str, code: str, names: Iterable[str]):
        if name in _SOURCES:
            raise ValueError(f"CUDA source {name} defined twice")
        _SOURCES[name] = self
        self.name = name
        self.code = code
        self.names = tuple(names)
        self.options = OPTIONS
        self._modules: dict[tuple, Any] = {}
        self._functions: dict[tuple, Any] = {}

    @property
    def full_code(self) -> str:
        """The source as compiled: the prelude, then the kernels."""
        return PRELUDE + self.code

    def function(self, xp: Any, kernel: str, *types: Any) -> Any:
        """The compiled kernel `kernel<types...>` (dtypes or C type names) on the current device."""
        # Keyed by the arguments as given, so a launch builds no string: kernels ask every time.
        device = device_id(xp)
        key = (id(xp), device, kernel) + types
        fn = self._functions.get(key)
        if fn is None:
            expr = f"{kernel}<{', '.join(_c_name(t) for t in types)}>" if types else kernel
            if expr not in self.names:
                raise ValueError(f"kernel {expr} is not instantiated in {self.name} "
                                 f"(instances: {', '.join(self.names)})")
            module = self._modules.get((id(xp), device))
            if module is None:
                module = self._modules[(id(xp), device)] = xp.RawModule(
                    code=self.full_code, options=self.options, name_expressions=self.names)
            fn = self._functions[key] = module.get_function(expr)
        return fn


_C_NAMES = set(_CTYPES.values())


def _c_name(t: Any) -> str:
    """A template argument: a C type name as given, or the C type of a dtype."""
    return t if isinstance(t, str) and t in _C_NAMES else ctype(t)


def device_id(xp: Any) -> int:
    """The current CUDA device (0 for array modules without one: the test emulator)."""
    cuda = getattr(xp, "cuda", None)
    return int(cuda.runtime.getDevice()) if cuda is not None else 0


def launch(fn: Any, n: int, args: tuple, threads: int = THREADS) -> None:
    """Run a grid-stride kernel over n items on the current stream (nothing for n = 0)."""
    if n <= 0:
        return
    blocks = min((n + threads - 1) // threads, MAX_BLOCKS)
    fn((blocks,), (threads,), args)


def i32(value: int) -> np.int32:
    """A kernel `int` argument (CuPy would pass a Python int as 64 bits)."""
    return np.int32(value)


def i64(value: int) -> np.int64:
    """A kernel `long long` argument."""
    return np.int64(value)


def real(dtype: Any, value: float) -> Any:
    """A kernel argument of the element type T (float or double)."""
    return np.dtype(dtype).type(value)


def contiguous(xp: Any, a: Any) -> Any:
    """`a` itself when C-contiguous, else a contiguous copy (kernels index flat memory)."""
    return a if a.flags.c_contiguous else xp.ascontiguousarray(a)
