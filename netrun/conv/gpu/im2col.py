"""im2col + cuBLAS GEMM on the GPU: the algorithm that runs every convolution (Caffe's GPU path).

A block of b images is unfolded into one column matrix with the batch inside its columns
(netrun.conv.gpu.im2col_kernels), so each group is a single large GEMM; with
groups the GEMMs are one strided-batched cuBLAS call over G (cupy.matmul on (G, ·, ·)):

    forward          Y'_g (K/G, b·P)    = W_g (K/G, C/G·kh·kw) @ col_g        Y = swap(Y') + bias
    backward_data    dcol_g (C/G·kh·kw, b·P) = W_gᵀ @ swap(dY)_g             dX = col2im(dcol)
    backward_filter  dW_g (K/G, C/G·kh·kw)  = swap(dY)_g @ col_gᵀ            summed over blocks

(P = oH·oW; swap exchanges the batch and channel axes, fusing the bias add.)
"""
from __future__ import annotations

from netrun.backends.cuda.source import contiguous
from netrun.conv.algorithm import register_algorithm
from netrun.conv.gpu.base import BLOCK_BYTES, GPUAlgorithm, blocks
from netrun.conv.gpu.im2col_kernels import col2im, im2col, to_knp, to_nkp


@register_algorithm
class GpuIm2colGemm(GPUAlgorithm):
    """Unfold a block of images into columns, then one (batched over groups) GEMM."""

    name = "gpu_im2col_gemm"
    summary = "im2col kernel, then one cuBLAS GEMM per block (strided-batched over groups)"

    def block(self, p) -> int:
        """Images per column-matrix fill."""
        per_image = (p.c * p.kh * p.kw + p.k) * p.oh * p.ow * p.itemsize
        return max(1, min(p.n, BLOCK_BYTES // max(per_image, 1)))

    def workspace_bytes(self, p) -> int:
        b = self.block(p)
        return ((p.c * p.kh * p.kw + p.k) * b * p.oh * p.ow + p.k * p.cg * p.kh * p.kw) \
            * p.itemsize

    def forward(self, xp, x, w, p, out, scratch, bias=None):
        x, ckk, hw = contiguous(xp, x), p.cg * p.kh * p.kw, p.oh * p.ow
        wg = w.reshape(p.group, p.kg, ckk)                          # (G, K/G, C/G·kh·kw)
        for n0, n1 in blocks(p.n, self.block(p)):
            b = n1 - n0
            col = scratch("gconv.col", (p.group, ckk, b * hw), x.dtype)
            im2col(xp, x[n0:n1], col, p)
            yt = scratch("gconv.kbp", (p.group, p.kg, b * hw), x.dtype)    # (K, b, P)
            xp.matmul(wg, col, out=yt)
            to_nkp(xp, yt, out[n0:n1], bias)

    def backward_data(self, xp, dy, w, p, out, scratch):
        dy, ckk, hw = contiguous(xp, dy), p.cg * p.kh * p.kw, p.oh * p.ow
        wt = w.reshape(p.group, p.kg, ckk).transpose(0, 2, 1)      # (G, C/G·kh·kw, K/G)
        for n0, n1 in blocks(p.n, self.block(p)):
            b = n1 - n0
            dyt = scratch("gconv.kbp", (p.group, p.kg, b * hw), dy.dtype)  # (K, b, P)
            to_knp(xp, dy[n0:n1], dyt)
            col = scratch("gconv.col", (p.group, ckk, b * hw), dy.dtype)
            xp.matmul(wt, dyt, out=col)
            col2im(xp, col, out[n0:n1], p)

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        x, dy = contiguous(xp, x), contiguous(xp, dy)
        ckk, hw = p.cg * p.kh * p.kw, p.oh * p.ow
        dw = out.reshape(p.group, p.kg, ckk)                        # (G, K/G, C/G·kh·kw)
        for n0, n1 in blocks(p.n, self.block(p)):
            b = n1 - n0
            col = scratch("gconv.col", (p.group, ckk, b * hw), x.dtype)
            im2col(xp, x[n0:n1], col, p)
            dyt = scratch("gconv.kbp", (p.group, p.kg, b * hw), dy.dtype)
            to_knp(xp, dy[n0:n1], dyt)
            if n0 == 0:
                xp.matmul(dyt, col.transpose(0, 2, 1), out=dw)
            else:
                part = scratch("gconv.dw", dw.shape, dy.dtype)
                xp.matmul(dyt, col.transpose(0, 2, 1), out=part)
                dw += part
        if dbias is not None:
            xp.sum(dy.reshape(p.n, p.k, hw), axis=(0, 2), out=dbias)
