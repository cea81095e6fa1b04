"""Compiled passes out of oneDNN's channel-blocked layouts (aBcd8b, aBcd16b: N × ⌈C/B⌉ × H·W
× B, channels padded to whole blocks) into NCHW, fused with what follows a convolution: the
residual sum and its ReLU. One pass reads the blocked output and the residual and writes the
result, where a reorder and then an AddRelu op made two passes and one more read.

Indices are unsigned (U) so that LLVM vectorizes the inner loops (see netrun.kernels.jit).
"""
from __future__ import annotations

import functools

import numpy as np

import netrun.kernels.jit as jit
from netrun.kernels.jit import kernel, team_kernel

U = np.uint64


@functools.cache
def prepare() -> None:
    """Compile (or load from Numba's disk cache) the float32 kernels now."""
    unblock_add.prepare("void(float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], "
                        "boolean)")
    block.prepare("void(float32[:, :, ::1], float32[:, :, :, ::1])")
    unblock.prepare("void(float32[:, :, :, ::1], float32[:, :, ::1])")
    global_pool.prepare("void(float32[:, :, :, ::1], float32[:, :, ::1], boolean)")


@functools.cache
def prepare_team() -> None:
    """Compile (or load) the team forms (`*_team`) of the float32 kernels."""
    global_pool_team.prepare("void(int64, int64[::1], float32[:, :, :, ::1], "
                             "float32[:, :, ::1], boolean)")


@kernel
def unblock_add(blocked, residual, y, relu):
    """y[n, c, p] = blocked[n, c // B, p, c % B] + residual[n, c, p], then max(·, 0) when
    relu (NaN stays NaN, as NumPy's maximum); y may be residual."""
    zero = y.dtype.type(0)
    block = U(blocked.shape[3])
    channels = U(y.shape[1])
    for n in range(U(blocked.shape[0])):
        for cb in range(U(blocked.shape[1])):
            c0 = cb * block
            width = min(block, channels - c0)
            for p in range(U(blocked.shape[2])):
                for j in range(width):
                    v = blocked[n, cb, p, j] + residual[n, c0 + j, p]
                    y[n, c0 + j, p] = zero if relu and v <= zero else v


@kernel
def block(x, out):
    """out[n, c // B, p, c % B] = x[n, c, p], the padding channels of the last block 0."""
    zero = out.dtype.type(0)
    width = U(out.shape[3])
    channels = U(x.shape[1])
    for n in range(U(out.shape[0])):
        for cb in range(U(out.shape[1])):
            c0 = cb * width
            for p in range(U(out.shape[2])):
                for j in range(width):
                    out[n, cb, p, j] = x[n, c0 + j, p] if c0 + j < channels else zero


@kernel
def unblock(blocked, y):
    """y[n, c, p] = blocked[n, c // B, p, c % B] (the padding channels dropped)."""
    width = U(blocked.shape[3])
    channels = U(y.shape[1])
    for n in range(U(blocked.shape[0])):
        for cb in range(U(blocked.shape[1])):
            c0 = cb * width
            for j in range(min(width, channels - c0)):
                for p in range(U(blocked.shape[2])):
                    y[n, c0 + j, p] = blocked[n, cb, p, j]


@kernel
def global_pool(x, y, average):
    """y[n, cb, j] = the mean (average) or the maximum of x[n, cb, :, j] over the pixels."""
    block = U(x.shape[3])
    pixels = U(x.shape[2])
    scale = y.dtype.type(1) / y.dtype.type(x.shape[2])
    for n in range(U(x.shape[0])):
        for cb in range(U(x.shape[1])):
            for j in range(block):
                y[n, cb, j] = x[n, cb, 0, j]
            for p in range(U(1), pixels):
                for j in range(block):
                    v = x[n, cb, p, j]
                    if average:
                        y[n, cb, j] += v
                    elif v > y[n, cb, j] or v != v:
                        y[n, cb, j] = v
            if average:
                for j in range(block):
                    y[n, cb, j] *= scale


@team_kernel
def global_pool_team(slots, starts, x, y, average):
    """`global_pool` image chunk by image chunk (netrun.kernels.omp)."""
    for w in jit.prange(slots):
        for c in range(w, starts.shape[0] - 1, slots):
            a, b = starts[c], starts[c + 1]
            global_pool(x[a:b], y[a:b], average)
