"""GPU algorithms that are the CPU algorithms' array-module code run on CuPy.

The 1×1 GEMM, Winograd and FFT algorithms of netrun.conv are written against `xp` and spend
their time in matmul (cuBLAS, strided-batched over groups and transform points) and the FFT
(cuFFT): on a GPU they need only bigger blocks and device-aware constant caches. They keep
their names with a `gpu_` prefix so the algorithm cache and `netrun profile` tell them apart.
"""
from __future__ import annotations

import numpy as np

from netrun.backends.cuda.source import device_id
from netrun.conv.algorithm import register_algorithm
from netrun.conv.cpu.fft import FFTConv
from netrun.conv.cpu.gemm1x1 import Gemm1x1
from netrun.conv.cpu.winograd import _MATRICES, WinogradF2, WinogradF4
from netrun.conv.gpu.base import BLOCK_BYTES, GPUAlgorithm


@register_algorithm
class GpuGemm1x1(GPUAlgorithm, Gemm1x1):
    """1×1 kernels without padding: batched cuBLAS GEMMs over channels."""

    name = "gpu_gemm_1x1"
    summary = "1×1 kernels without padding: strided-batched cuBLAS GEMMs over channels"

    def fits(self, p) -> bool:
        return Gemm1x1.applicable(self, p)


class _GpuWinograd(GPUAlgorithm):
    """Winograd with the transforms as Kronecker GEMMs and α² batched channel GEMMs."""

    def fits(self, p) -> bool:
        return (p.kh, p.kw, p.sh, p.sw, p.dh, p.dw) == (3, 3, 1, 1, 1, 1)

    def block(self, p) -> int:
        th, tw = self._tiles(p)
        per_image = (self.m + 2) ** 2 * max(p.c, p.k) * th * tw * p.itemsize
        return max(1, min(p.n, BLOCK_BYTES // 4 // max(per_image, 1)))

    def _kron(self, xp, dtype):
        """(Bᵀ⊗Bᵀ, G⊗G, Aᵀ⊗Aᵀ) on the current device (uploaded once per device, dtype)."""
        key = (id(xp), device_id(xp), str(dtype))
        cache = self.__dict__.setdefault("_kron_cache", {})
        if key not in cache:
            bt, g, at = _MATRICES[self.m]
            cache[key] = tuple(xp.asarray(np.kron(a, a).astype(dtype)) for a in (bt, g, at))
        return cache[key]


@register_algorithm
class GpuWinogradF2(_GpuWinograd, WinogradF2):
    name = "gpu_winograd_f2x2"
    summary = "3×3 stride 1: Winograd F(2×2,3×3), transforms and channel sums as cuBLAS GEMMs"


@register_algorithm
class GpuWinogradF4(_GpuWinograd, WinogradF4):
    name = "gpu_winograd_f4x4"
    summary = "3×3 stride 1: Winograd F(4×4,3×3), 4× fewer multiplications, more rounding"


@register_algorithm
class GpuFFT(GPUAlgorithm, FFTConv):
    """cuFFT transforms and one complex batched GEMM per frequency."""

    name = "gpu_fft"
    summary = "stride 1: cuFFT rfft2, complex batched cuBLAS GEMMs per frequency, irfft2"

    def fits(self, p) -> bool:
        return FFTConv.applicable(self, p)
