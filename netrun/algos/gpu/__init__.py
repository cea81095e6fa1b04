"""GPU convolution algorithms (CuPy): custom kernels, cuBLAS, cuFFT and optionally cuDNN.

`register()` adds them to `netrun.ops.conv_algos.ALGORITHMS` (the GPU backend calls it when
it is created, so CPU-only processes never see them). They apply only to `GPUConvProblem`s,
which the GPU conv kernels (netrun.backends.gpu_kernels.conv) bind, and `search.choose`
picks among them with the CPU's modes and algorithm cache.
"""
from __future__ import annotations

from netrun.algos.gpu.base import GPUAlgorithm, GPUConvProblem

__all__ = ["GPUAlgorithm", "GPUConvProblem", "register", "classes"]


def classes() -> list[type[GPUAlgorithm]]:
    """The GPU algorithm classes, in preference-neutral registration order (cuDNN last, and
    only when its frontend package loads)."""
    from netrun.algos.gpu.cudnn import CudnnConv, cudnn_module
    from netrun.algos.gpu.depthwise import GpuDepthwise
    from netrun.algos.gpu.im2col import GpuIm2colGemm
    from netrun.algos.gpu.shared import (GpuFFT, GpuGemm1x1, GpuWinogradF2,
                                         GpuWinogradF4)

    found = [GpuIm2colGemm, GpuGemm1x1, GpuDepthwise, GpuWinogradF2, GpuWinogradF4, GpuFFT]
    if cudnn_module() is not None:
        found.append(CudnnConv)
    return found


def register() -> None:
    """Add one instance of each GPU algorithm to ALGORITHMS (idempotent)."""
    from netrun.ops.conv_algos import ALGORITHMS

    for cls in classes():
        if cls.name not in ALGORITHMS:
            ALGORITHMS[cls.name] = cls()
