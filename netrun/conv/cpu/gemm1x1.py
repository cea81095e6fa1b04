"""1×1 convolutions without padding as one batched GEMM over channels (no copies at stride 1).

A 1×1 kernel reads one pixel per output, so the convolution is W (K, C) @ X (C, H·W) per
image and group; stride > 1 only subsamples the input first. Backward-filter puts the batch
inside the GEMM's columns (a transposed copy) so all images are one GEMM.
"""
from __future__ import annotations

from netrun.conv.algorithm import (
    ConvAlgorithm,
    ConvProblem,
    Scratch,
    add_bias,
    register_algorithm,
    sum_bias,
)
from netrun.kernels import parallel
from netrun.kernels.geometry import window_slices


@register_algorithm
class Gemm1x1(ConvAlgorithm):
    """A 1×1 kernel without padding is a GEMM over channels; stride > 1 just subsamples."""

    name = "gemm_1x1"
    summary = "1×1 kernels without padding: one batched GEMM over channels, no copies"

    def applicable(self, p: ConvProblem) -> bool:
        return p.kh == 1 and p.kw == 1 and not p.padded

    def workspace_bytes(self, p: ConvProblem) -> int:
        hw = p.oh * p.ow
        return (p.n * p.c * hw + p.n * p.k * hw) * p.itemsize

    def forward(self, xp, x, w, p, out, scratch, bias=None):
        xs = _subsample(x, p, scratch)
        # (N, G, K/G, oH*oW) = (G, K/G, C/G) @ (N, G, C/G, oH*oW)
        parallel.matmul(xp, w.reshape(p.group, p.kg, p.cg), xs.reshape(p.n, p.group, p.cg, -1),
                        out.reshape(p.n, p.group, p.kg, p.oh * p.ow))
        add_bias(xp, out, bias)

    def backward_data(self, xp, dy, w, p, out, scratch):
        wt = w.reshape(p.group, p.kg, p.cg).transpose(0, 2, 1)          # (G, C/G, K/G)
        dyv = dy.reshape(p.n, p.group, p.kg, p.oh * p.ow)
        if p.sh == 1 and p.sw == 1:
            parallel.matmul(xp, wt, dyv, out.reshape(p.n, p.group, p.cg, p.h * p.w))
            return
        dxs = scratch("conv.col", (p.n, p.group, p.cg, p.oh * p.ow), dy.dtype)
        parallel.matmul(xp, wt, dyv, dxs)
        out.fill(0)   # pixels that no stride step reads get no gradient
        rows, cols = window_slices(p.geometry, 0, 0, p.oh, p.ow)
        out[:, :, rows, cols] = dxs.reshape(p.n, p.c, p.oh, p.ow)

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        hw = p.oh * p.ow
        # Batch inside the columns: dW_g (K/G, C/G) = dY_g (K/G, N*oH*oW) @ X_g^T.
        xt = _subsample(x, p, scratch, batch_inner=True)               # (C, N, oH, oW)
        dyt = scratch("conv.dy_t", (p.k, p.n, hw), dy.dtype)
        dyt[...] = dy.reshape(p.n, p.k, hw).transpose(1, 0, 2)         # (K, N, oH*oW)
        lhs = dyt.reshape(p.group, p.kg, p.n * hw)
        rhs = xt.reshape(p.group, p.cg, p.n * hw).transpose(0, 2, 1)
        dw = out.reshape(p.group, p.kg, p.cg)
        # one big product per group, each split into blocks on the worker threads
        parallel.matmuls(xp, [(lhs[g], rhs[g], dw[g]) for g in range(p.group)])
        sum_bias(xp, dy, dbias, scratch)


def _subsample(x, p: ConvProblem, scratch: Scratch, batch_inner: bool = False):
    """x at the strided output positions: (N, C, oH, oW), or (C, N, oH, oW); no copy if possible."""
    rows, cols = window_slices(p.geometry, 0, 0, p.oh, p.ow)
    picked = x[:, :, rows, cols]
    if batch_inner:
        buf = scratch("conv.col", (p.c, p.n, p.oh, p.ow), x.dtype)
        buf[...] = picked.transpose(1, 0, 2, 3)
        return buf
    if p.sh == 1 and p.sw == 1:
        return x
    buf = scratch("conv.col", (p.n, p.c, p.oh, p.ow), x.dtype)
    buf[...] = picked
    return buf
