"""GPU convolution algorithms (CuPy): custom kernels, cuBLAS, cuFFT and optionally cuDNN.

Importing this package registers them under the "gpu" backend (netrun.conv.algorithm); it
imports no CuPy, whose arrays they see only when a GPU workspace runs them. cuDNN is always
registered and applies only where its frontend package loads.
"""
from __future__ import annotations

# Registration order is the order searches time them and the rules' last resort (the first).
from netrun.conv.gpu import cudnn, depthwise, im2col, shared  # noqa: F401,I001

__all__ = ["im2col", "shared", "depthwise", "cudnn"]
