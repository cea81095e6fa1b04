"""GPU convolution algorithms (CuPy): custom kernels, cuBLAS, cuFFT and optionally cuDNN.

Importing this package registers them under the "gpu" backend (netrun.conv.algorithm); it
imports no CuPy, whose arrays they see only when a GPU workspace runs them. cuDNN is always
registered and applies only where its frontend package loads. The order below is the order
searches time them and the rules' last resort (im2col + GEMM first, cuDNN last), so it is not
alphabetical.
"""
# isort: skip_file
from __future__ import annotations

from netrun.conv.gpu import im2col  # noqa: F401
from netrun.conv.gpu import shared  # noqa: F401
from netrun.conv.gpu import depthwise  # noqa: F401
from netrun.conv.gpu import cudnn  # noqa: F401
