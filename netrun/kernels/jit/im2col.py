"""Compiled im2col / col2im for im2col_gemm: the window copies without NumPy's per-row overhead.

NumPy copies the 6-D strided window view row by row (oW elements at a time, strided by the
width stride), and col2im is one strided add per kernel tap over the whole block. Compiled,
both are single loops over (image, channel) planes with the padding handled by clipping
(no padded copy of the input): each column range is computed once per tap (`columns`).
The results are bitwise those of the NumPy path: im2col is a copy, and col2im adds each
pixel's contributions in the same tap order, starting from zero.

`im2col` and `col2im` have conv_algos._im2col / _col2im's contracts; callers check
`jit.enabled(xp)` first. `prepare()` loads the float32 code they call (at net build time).
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Callable

import numpy as np

from netrun.kernels.jit import kernel

if TYPE_CHECKING:
    from netrun.conv.problem import ConvProblem  # annotations only (conv is above kernels)

_u = np.uint64   # unsigned indices: no negative-index wraparound code in the loops


@lru_cache(maxsize=64)
def columns(w: int, ow: int, kw: int, sw: int, pl: int, dw: int) -> np.ndarray:
    """(kw, 3) int64: per tap j, output columns [s0, s1) inside the image, first input column."""
    table = np.empty((kw, 3), np.int64)
    for j in range(kw):
        lo = pl - j * dw                        # s·sw >= lo  and  s·sw <= W - 1 + lo
        # clipped to oW: a tap wholly in the left padding has no column in the image, and
        # the zero fill `range(s0)` must not run past the row
        s0 = min(ow, max(0, -(-lo // sw)))
        s1 = min(ow, (w - 1 + lo) // sw + 1) if w - 1 + lo >= 0 else 0
        table[j] = s0, max(s0, s1), s0 * sw - lo
    return table


@kernel
def unfold(x, col, cols, sh, sw, pt, dh, batch_inner):
    """col[n, c, i, j, r, s] (batch_inner: col[c, i, j, n, r, s]) = x[n, c, r·sh + i·dh - pt,
    (s - s0)·sw + x0], zero outside x."""
    b, c_all, h = x.shape[0], x.shape[1], x.shape[2]
    kw, oh, ow = cols.shape[0], col.shape[4], col.shape[5]
    kh = col.shape[1] if batch_inner else col.shape[2]
    for n in range(b):
        for c in range(c_all):
            for i in range(kh):
                for j in range(kw):
                    s0, s1, x0 = cols[j, 0], cols[j, 1], cols[j, 2]
                    for r in range(oh):
                        dst = col[c, i, j, n, r] if batch_inner else col[n, c, i, j, r]
                        y = r * sh + i * dh - pt
                        if y < 0 or y >= h:
                            for s in range(ow):
                                dst[_u(s)] = 0
                            continue
                        src = x[n, c, y]
                        for s in range(s0):
                            dst[_u(s)] = 0
                        for s in range(s1 - s0):
                            dst[_u(s0 + s)] = src[_u(x0 + s * sw)]
                        for s in range(s1, ow):
                            dst[_u(s)] = 0


@kernel
def fold(col, out, cols, sh, sw, pt, dh):
    """out[n, c] = Σ over taps (i, j), in order, of col[n, c, i, j] added at its pixels."""
    b, c_all, h, w = out.shape[0], out.shape[1], out.shape[2], out.shape[3]
    kh, kw, oh = col.shape[2], col.shape[3], col.shape[4]
    for n in range(b):
        for c in range(c_all):
            for y in range(h):
                for t in range(w):
                    out[n, c, _u(y), _u(t)] = 0
            for i in range(kh):
                for j in range(kw):
                    s0, s1, x0 = cols[j, 0], cols[j, 1], cols[j, 2]
                    for r in range(oh):
                        y = r * sh + i * dh - pt
                        if y < 0 or y >= h:
                            continue
                        src, dst = col[n, c, i, j, r], out[n, c, y]
                        for s in range(s1 - s0):
                            dst[_u(x0 + s * sw)] += src[_u(s0 + s)]


def im2col(x, p: "ConvProblem", scratch: Callable, batch_inner: bool):
    """Columns of a block of images (b, C, H, W): (b, C, kh, kw, oH, oW), or batch-inner
    (C, kh, kw, b, oH, oW), in scratch "conv.col"."""
    b = x.shape[0]
    x = np.ascontiguousarray(x)
    cols = columns(p.w, p.ow, p.kw, p.sw, p.pl, p.dw)
    shape = (p.c, p.kh, p.kw, b, p.oh, p.ow) if batch_inner else (b, p.c, p.kh, p.kw, p.oh, p.ow)
    col = scratch("conv.col", shape, x.dtype)
    unfold(x, col, cols, p.sh, p.sw, p.pt, p.dh, int(batch_inner))
    return col


def col2im(col, p: "ConvProblem", out) -> None:
    """out (b, C, H, W) = the columns (b, C, kh, kw, oH, oW) added back to their pixels."""
    cols = columns(p.w, p.ow, p.kw, p.sw, p.pl, p.dw)
    fold(np.ascontiguousarray(col), out, cols, p.sh, p.sw, p.pt, p.dh)


# The float32 signatures im2col and col2im call: contiguous blocks and columns, the column
# table, then sh, sw, pt, dh (and unfold's batch_inner).
_TAIL = ", int64[:,::1], int64, int64, int64, int64"
SIGNATURES = {
    "unfold": ("void(float32[:,:,:,::1], float32[:,:,:,:,:,::1]" + _TAIL + ", int64)",),
    "fold": ("void(float32[:,:,:,:,:,::1], float32[:,:,:,::1]" + _TAIL + ")",),
}


def prepare() -> None:
    """Compile (or load from Numba's disk cache) the float32 kernels im2col/col2im call."""
    for name, signatures in SIGNATURES.items():
        globals()[name].prepare(*signatures)
