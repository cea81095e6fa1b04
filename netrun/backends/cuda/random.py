"""Random numbers on the device: a counter-based generator (its dropout kernel included).

Draw k of a stream is SplitMix64's output for the state key + (k + 1)·φ (φ = 2^64/golden
ratio), so any element can be computed by any thread: a kernel fills n values from a reserved
counter range in one pass, and the generator's whole state is (seed, counter). That makes
the state exact to save and restore in checkpoints (the trainer reads and writes
`rng.bit_generator.state`, as for NumPy's generators), and the numbers never depend on the
launch configuration. SplitMix64 passes BigCrush; dropout masks need far less.
"""
from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any

import numpy as np

from netrun.backends.cuda.source import (
    REALS,
    KernelSource,
    contiguous,
    instances,
    launch,
    real,
)

GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1

SOURCE = KernelSource("random", r"""
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Draw `index` of the stream `key`: 64 random bits.
__device__ __forceinline__ unsigned long long draw(unsigned long long key,
                                                   unsigned long long index) {
  return mix64(key + (index + 1ULL) * 0x9E3779B97F4A7C15ULL);
}

// Uniform in [0, 1): the top 24 (float) or 53 (double) bits, so every value is exact.
template <typename T> __device__ __forceinline__ T to_unit(unsigned long long bits);
template <> __device__ __forceinline__ float to_unit<float>(unsigned long long bits) {
  return (float)(bits >> 40) * 5.9604644775390625e-08f;
}
template <> __device__ __forceinline__ double to_unit<double>(unsigned long long bits) {
  return (double)(bits >> 11) * 1.1102230246251565404e-16;
}

// out[i] = low + (high - low) * u_i
template <typename T>
__global__ void random_uniform(T* out, long long n, unsigned long long key,
                               unsigned long long offset, T low, T high) {
  KERNEL_LOOP(i, n) {
    out[i] = low + (high - low) * to_unit<T>(draw(key, offset + i));
  }
}

// Box-Muller on draws 2i and 2i+1: out[i] = mean + std * sqrt(-2 log(1 - u)) cos(2 pi v).
template <typename T>
__global__ void random_normal(T* out, long long n, unsigned long long key,
                              unsigned long long offset, T mean, T std) {
  KERNEL_LOOP(i, n) {
    double u = to_unit<double>(draw(key, offset + 2 * i));
    double v = to_unit<double>(draw(key, offset + 2 * i + 1));
    double r = sqrt(-2.0 * log(1.0 - u));
    out[i] = (T)(mean + std * (T)(r * cos(6.283185307179586 * v)));
  }
}

// Inverted dropout in one pass: keep where u >= ratio (u a float draw, as on the CPU),
// y = x * keep * scale (x * 0 keeps NaN and inf inputs NaN, like the NumPy kernel). y may be
// x itself (Dropout runs in place), so no pointer is declared __restrict__.
template <typename T>
__global__ void dropout_forward(const T* x, T* y,
                                bool* mask, long long n, unsigned long long key,
                                unsigned long long offset, float ratio, T scale) {
  KERNEL_LOOP(i, n) {
    bool keep = to_unit<float>(draw(key, offset + i)) >= ratio;
    mask[i] = keep;
    y[i] = x[i] * (T)keep * scale;
  }
}
""", instances("random_uniform", REALS) + instances("random_normal", REALS)
     + instances("dropout_forward", REALS))


def mix64(z: int) -> int:
    """SplitMix64's finalizer on the host (Python ints, wrapped to 64 bits)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class DeviceGenerator:
    """xp.random.Generator's methods that netrun uses, on a counter-based stream."""

    NAME = "netrun.SplitMix64Counter"

    def __init__(self, xp: Any, seed: int | None = None):
        self.xp = xp
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self.counter = 0

    # NumPy's generators keep their state on .bit_generator; here it is the generator itself.
    @property
    def bit_generator(self) -> "DeviceGenerator":
        return self

    @property
    def state(self) -> dict:
        """JSON-able: {'bit_generator', 'seed', 'counter'}."""
        return {"bit_generator": self.NAME, "seed": self.seed, "counter": self.counter}

    @state.setter
    def state(self, value: dict) -> None:
        if value.get("bit_generator") == self.NAME:
            self.seed, self.counter = int(value["seed"]), int(value["counter"])
            return
        # Another device's generator (a CPU checkpoint resumed on a GPU): its numbers cannot
        # be reproduced here, so continue with a stream derived from that state, the same
        # one every time it is restored.
        text = json.dumps(value, sort_keys=True, default=str).encode()
        self.seed = int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1
        self.counter = 0

    def reserve(self, count: int) -> tuple[np.uint64, np.uint64]:
        """(key, offset) of the next `count` draws, which are then used up."""
        key = mix64((self.seed * GOLDEN + GOLDEN) & MASK64)
        offset = self.counter
        self.counter = (self.counter + int(count)) & MASK64
        return np.uint64(key), np.uint64(offset)

    def _out(self, size, dtype, out):
        if out is None:
            return self.xp.empty(_shape(size), dtype=dtype)
        if size is not None and _shape(size) != tuple(out.shape):
            raise ValueError(f"size {size} does not match out's shape {tuple(out.shape)}")
        return out

    def uniform(self, low: float = 0.0, high: float = 1.0, size=None, dtype="float64",
                out=None) -> Any:
        """Uniform draws in [low, high)."""
        dtype = np.dtype(dtype) if out is None else out.dtype
        target = self._out(size, dtype, out)
        buf = contiguous(self.xp, target)
        key, offset = self.reserve(buf.size)
        fn = SOURCE.function(self.xp, "random_uniform", dtype)
        launch(fn, buf.size, (buf, np.int64(buf.size), key, offset, real(dtype, low),
                              real(dtype, high)))
        if buf is not target:
            target[...] = buf
        return target

    def random(self, size=None, dtype="float64", out=None) -> Any:
        """Uniform draws in [0, 1), as Generator.random."""
        return self.uniform(0.0, 1.0, size, dtype, out)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size=None, dtype="float64",
               out=None) -> Any:
        """Gaussian draws (Box-Muller, two draws per value)."""
        dtype = np.dtype(dtype) if out is None else out.dtype
        target = self._out(size, dtype, out)
        buf = contiguous(self.xp, target)
        key, offset = self.reserve(2 * buf.size)
        fn = SOURCE.function(self.xp, "random_normal", dtype)
        launch(fn, buf.size, (buf, np.int64(buf.size), key, offset, real(dtype, loc),
                              real(dtype, scale)))
        if buf is not target:
            target[...] = buf
        return target

    def standard_normal(self, size=None, dtype="float64", out=None) -> Any:
        return self.normal(0.0, 1.0, size, dtype, out)


def _shape(size) -> tuple[int, ...]:
    if size is None:
        return ()
    return (int(size),) if isinstance(size, (int, np.integer)) else tuple(int(d) for d in size)
