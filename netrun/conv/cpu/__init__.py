"""CPU convolution algorithms (NumPy, and the compiled engine where it is installed).

Importing this package registers them under the "cpu" backend (netrun.conv.algorithm), one
module each. The order below is the order searches time them and the rules' last resort
(im2col + GEMM, which runs every problem, first), so it is not alphabetical.
"""
# isort: skip_file
from __future__ import annotations

from netrun.conv.cpu import im2col  # noqa: F401
from netrun.conv.cpu import shift  # noqa: F401
from netrun.conv.cpu import depthwise  # noqa: F401
from netrun.conv.cpu import dft_gemm  # noqa: F401
from netrun.conv.cpu import fft  # noqa: F401
from netrun.conv.cpu import gemm1x1  # noqa: F401
from netrun.conv.cpu import winograd  # noqa: F401
from netrun.conv.cpu import jit_depthwise  # noqa: F401
from netrun.conv.cpu import jit_winograd  # noqa: F401
from netrun.conv.cpu import onednn  # noqa: F401
