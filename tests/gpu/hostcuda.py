"""CUDA kernels on the host: a CUDA C++ source compiled with g++ behind a small shim.

`compile_library` builds a shared library from a source and its template instances, with one
trampoline per instance that runs every (block, thread) of a launch in turn and one that
reports the kernel's parameter types. `EmuRawModule` / `EmuKernel` wrap it with CuPy's
RawModule interface and check every launch as strictly as a GPU would fail: argument count,
element types, pointer arguments that are not device arrays or not C-contiguous, NumPy scalars
of the wrong width (CuPy passes Python ints as 64 bits), grid and block limits. Kernels must
not use shared memory, __syncthreads or warp intrinsics (netrun's do not), since threads run
one after another. Libraries are cached on disk by content.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

# C++ definitions that make a CUDA source compile for the host.
SHIM = r"""
#include <cmath>
#include <cstring>
#include <cstddef>
#include <utility>
#include <type_traits>
struct emu_uint3 { unsigned x, y, z; };
static emu_uint3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
using std::exp; using std::log; using std::sqrt; using std::pow; using std::fabs;
using std::floor; using std::ceil; using std::log1p; using std::expm1; using std::tanh;
using std::cos; using std::sin;
inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
"""

# Launch trampolines: run every (block, thread) of a kernel in turn; report its signature.
LAUNCHER = r"""
namespace emu {
template <typename T> struct tc { static const char c = '?'; };
template <> struct tc<float> { static const char c = 'f'; };
template <> struct tc<double> { static const char c = 'd'; };
template <> struct tc<int> { static const char c = 'i'; };
template <> struct tc<long long> { static const char c = 'l'; };
template <> struct tc<unsigned long long> { static const char c = 'q'; };
template <> struct tc<unsigned int> { static const char c = 'u'; };
template <> struct tc<bool> { static const char c = 'b'; };
template <> struct tc<unsigned char> { static const char c = 'c'; };
template <typename T> struct tc<T*> {
  static const char c = tc<typename std::remove_cv<T>::type>::c - 32;
};
template <typename... P> const char* sig(void (*)(P...)) {
  static const char s[] = {tc<typename std::remove_cv<P>::type>::c..., 0};
  return s;
}
template <typename... P, std::size_t... I>
void call(void (*k)(P...), void** a, std::index_sequence<I...>) {
  k(*static_cast<typename std::remove_cv<P>::type*>(a[I])...);
}
template <typename... P> void run(void (*k)(P...), const unsigned* d, void** a) {
  gridDim = {d[0], d[1], d[2]};
  blockDim = {d[3], d[4], d[5]};
  for (unsigned bz = 0; bz < d[2]; ++bz)
    for (unsigned by = 0; by < d[1]; ++by)
      for (unsigned bx = 0; bx < d[0]; ++bx) {
        blockIdx = {bx, by, bz};
        for (unsigned tz = 0; tz < d[5]; ++tz)
          for (unsigned ty = 0; ty < d[4]; ++ty)
            for (unsigned tx = 0; tx < d[3]; ++tx) {
              threadIdx = {tx, ty, tz};
              call(k, a, std::index_sequence_for<P...>{});
            }
      }
}
}  // namespace emu
"""

_POINTER_DTYPES = {"F": np.float32, "D": np.float64, "I": np.int32, "L": np.int64,
                   "Q": np.uint64, "U": np.uint32, "B": np.bool_, "C": np.uint8}
_SCALARS = {"f": (np.float32, ctypes.c_float), "d": (np.float64, ctypes.c_double),
            "i": (np.int32, ctypes.c_int32), "l": (np.int64, ctypes.c_int64),
            "q": (np.uint64, ctypes.c_uint64), "u": (np.uint32, ctypes.c_uint32),
            "b": (np.bool_, ctypes.c_bool), "c": (np.uint8, ctypes.c_uint8)}


def _cache_dir() -> Path:
    path = Path(os.environ.get("NETRUN_EMU_CACHE")
                or Path(tempfile.gettempdir()) / f"netrun-cuda-emu-{os.getuid()}")
    path.mkdir(parents=True, exist_ok=True)
    return path


def compile_library(code: str, names: tuple[str, ...]) -> tuple[ctypes.CDLL, list[str]]:
    """Compile a CUDA source for the host; cached on disk by content."""
    lines = [SHIM, code, LAUNCHER]
    for k, name in enumerate(names):
        lines.append(f'extern "C" void emu_run_{k}(const unsigned* d, void** a) '
                     f'{{ emu::run(&{name}, d, a); }}')
        lines.append(f'extern "C" const char* emu_sig_{k}() {{ return emu::sig(&{name}); }}')
    text = "\n".join(lines)
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    lib_path = _cache_dir() / f"{digest}.so"
    if not lib_path.exists():
        src = _cache_dir() / f"{digest}.{os.getpid()}.cpp"
        src.write_text(text)
        tmp = lib_path.with_suffix(f".{os.getpid()}.tmp")
        result = subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-o",
                                 str(tmp), str(src)], capture_output=True, text=True)
        src.unlink(missing_ok=True)
        if result.returncode:
            raise RuntimeError(f"host compile of a CUDA source failed:\n{result.stderr[-4000:]}")
        os.replace(tmp, lib_path)
    lib = ctypes.CDLL(str(lib_path))
    sigs = []
    for k in range(len(names)):
        fn = getattr(lib, f"emu_sig_{k}")
        fn.restype = ctypes.c_char_p
        sigs.append(fn().decode())
    return lib, sigs


class EmuKernel:
    """A compiled kernel called like cupy.RawKernel: kernel(grid, block, args)."""

    on_launch: Callable[[], None] | None = None     # a hook for counters

    def __init__(self, name: str, run, signature: str):
        self.name, self._run, self.signature = name, run, signature

    def __call__(self, grid, block, args, shared_mem: int = 0):
        grid, block = _dims(grid, "grid"), _dims(block, "block")
        if block[0] * block[1] * block[2] > 1024 or block[2] > 64:
            raise ValueError(f"{self.name}: block {block} exceeds CUDA's limits")
        if grid[0] > 2 ** 31 - 1 or grid[1] > 65535 or grid[2] > 65535:
            raise ValueError(f"{self.name}: grid {grid} exceeds CUDA's limits")
        args = tuple(args)
        if len(args) != len(self.signature):
            raise TypeError(f"{self.name}: takes {len(self.signature)} arguments, got {len(args)}")
        holders = [_holder(self.name, k, code, a) for k, (code, a) in
                   enumerate(zip(self.signature, args))]
        pointers = (ctypes.c_void_p * max(1, len(holders)))(
            *[ctypes.addressof(h) for h in holders])
        dims = (ctypes.c_uint * 6)(*grid, *block)
        if self.on_launch is not None:
            self.on_launch()
        self._run(dims, pointers)


def _dims(value, what: str) -> tuple[int, int, int]:
    value = tuple(int(v) for v in (value if isinstance(value, tuple) else (value,)))
    if not 1 <= len(value) <= 3 or min(value) < 1:
        raise ValueError(f"bad {what} dimensions {value}")
    return value + (1,) * (3 - len(value))


def _holder(kernel: str, k: int, code: str, arg: Any):
    where = f"{kernel} argument {k}"
    if code.isupper():
        if not isinstance(arg, np.ndarray) or not getattr(arg, "on_device", False):
            raise TypeError(f"{where}: expected a device array, got {type(arg).__name__}")
        want = np.dtype(_POINTER_DTYPES[code])
        if arg.dtype != want:
            raise TypeError(f"{where}: expected {want} elements, got {arg.dtype}")
        if not arg.flags.c_contiguous:
            raise TypeError(f"{where}: the array is not C-contiguous (kernels index flat memory)")
        return ctypes.c_void_p(arg.__array_interface__["data"][0])
    if code not in _SCALARS:
        raise TypeError(f"{where}: parameter type code {code!r} is not emulated")
    np_type, c_type = _SCALARS[code]
    if type(arg) is not np_type:
        raise TypeError(f"{where}: expected a {np_type.__name__} scalar, got "
                        f"{type(arg).__name__} (CuPy passes Python ints and floats as 64 bits)")
    return c_type(arg.item())


class EmuRawModule:
    """cupy.RawModule(code=..., name_expressions=...) compiled for the host."""

    def __init__(self, code: str = None, *, name_expressions=(), options=(), **kwargs):
        self.code, self.names = code, tuple(name_expressions)
        self._lib = None

    def get_function(self, name: str) -> EmuKernel:
        if self._lib is None:
            self._lib, self._sigs = compile_library(self.code, self.names)
        k = self.names.index(name)
        fn = getattr(self._lib, f"emu_run_{k}")
        fn.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = None
        return EmuKernel(name, fn, self._sigs[k])


