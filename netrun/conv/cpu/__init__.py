"""CPU convolution algorithms (NumPy, and the compiled engine where it is installed).

Importing this package registers them under the "cpu" backend (netrun.conv.algorithm), one
module each. The order below is the order searches time them and the rules' last resort.
"""
from __future__ import annotations

from netrun.conv.cpu import (  # noqa: F401,I001  # noqa: F401,I001
    depthwise,
    dft_gemm,
    fft,
    gemm1x1,
    im2col,
    jit_depthwise,
    jit_winograd,
    shift,
    winograd,
)
