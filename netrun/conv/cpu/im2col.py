"""im2col + GEMM: unfold the windows into a column buffer, one GEMM per group (Caffe's way).

It runs every problem, so it is the fallback of every rule; `im2col`/`col2im` are shared
with the compiled engine (one pass each when it is there) and the GPU's column kernels.
"""
from __future__ import annotations

from netrun.conv.algorithm import ConvAlgorithm, Scratch, add_bias, register_algorithm, sum_bias
from netrun.conv.problem import ConvProblem
from netrun.kernels import jit
from netrun.kernels.geometry import pad_into, window_slices
from netrun.kernels.jit import im2col as jit_im2col
from netrun.kernels.parallel import chunk_scratch, chunks, per_thread

# The im2col column buffer is filled this many bytes at a time (a block of images), which
# keeps it in a moderate, reusable allocation however large the batch. A smaller buffer per
# thread beat a larger one on the benchmark's stride-2 3×3 filter gradient (even blocks per
# thread, and more of each block still in cache for the GEMM) and tied on CIFAR's first
# layer (measurements: benchmarks/README.md).
COL_BUFFER_BYTES = 4 << 20
# backward_filter sums per-image products when a block's worth of filters is this small.
PER_IMAGE_FILTER_ELEMENTS = 1 << 16


@register_algorithm
class Im2colGemm(ConvAlgorithm):
    """Unfold windows into a column buffer, then one GEMM per group (Caffe's default)."""

    name = "im2col_gemm"
    summary = "unfold windows into columns, one GEMM per group; runs every problem"

    def block(self, p: ConvProblem) -> int:
        """Images per column-buffer fill."""
        per_image = p.c * p.kh * p.kw * p.oh * p.ow * p.itemsize
        return max(1, min(p.n, COL_BUFFER_BYTES // max(per_image, 1)))

    def workspace_bytes(self, p: ConvProblem) -> int:
        ckk, hw = p.cg * p.kh * p.kw, p.oh * p.ow
        threads, b = per_thread(p.n, self.block(p), p.n * ckk * p.group * hw)  # each its own
        col = b * p.c * p.kh * p.kw * p.oh * p.ow
        pad = b * p.c * (p.h + p.pt + p.pb) * (p.w + p.pl + p.pr) if p.padded else 0
        dy_t = b * p.k * p.oh * p.ow + p.k * p.cg * p.kh * p.kw   # backward_filter only
        return threads * (col + pad + dy_t) * p.itemsize

    def forward(self, xp, x, w, p, out, scratch, bias=None):
        ckk, hw = p.cg * p.kh * p.kw, p.oh * p.ow
        wg = w.reshape(p.group, p.kg, ckk)                  # (G, K/G, C/G*kh*kw)
        y = out.reshape(p.n, p.group, p.kg, hw)             # (N, G, K/G, oH*oW)

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                col = _im2col(xp, x[n0:n1], p, s, batch_inner=False)
                # (b, G, K/G, oH*oW) = (G, K/G, C/G*kh*kw) @ (b, G, C/G*kh*kw, oH*oW)
                xp.matmul(wg, col.reshape(n1 - n0, p.group, ckk, hw), out=y[n0:n1])
            add_bias(xp, out[c0:c1], bias)

        chunks(xp, p.n, work, work=p.n * ckk * p.group * hw, block=self.block(p))

    def backward_data(self, xp, dy, w, p, out, scratch):
        ckk, hw = p.cg * p.kh * p.kw, p.oh * p.ow
        wt = w.reshape(p.group, p.kg, ckk).transpose(0, 2, 1)    # (G, C/G*kh*kw, K/G)
        dyv = dy.reshape(p.n, p.group, p.kg, hw)                 # (N, G, K/G, oH*oW)

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                b = n1 - n0
                col = s("conv.col", (b, p.group, ckk, hw), dy.dtype)
                xp.matmul(wt, dyv[n0:n1], out=col)
                _col2im(xp, col.reshape(b, p.c, p.kh, p.kw, p.oh, p.ow), p, out[n0:n1], s)

        chunks(xp, p.n, work, work=p.n * ckk * p.group * hw, block=self.block(p))

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        ckk, hw = p.cg * p.kh * p.kw, p.oh * p.ow
        total = out.reshape(p.group, p.kg, ckk)                      # (G, K/G, C/G*kh*kw)

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            # chunk 0 sums into dW itself; the others' partial sums are added in chunk order
            dw = total if index == 0 else s("conv.dw_chunk", total.shape, dy.dtype)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                b = n1 - n0
                if b * dw.size <= PER_IMAGE_FILTER_ELEMENTS:
                    # A small filter (first layers): a GEMM per image straight from dY and
                    # per-image columns, then a sum of b tiny products, beats transposing dY
                    # for one long GEMM: with so small a filter, the copy of dY costs more
                    # than the longer GEMM saves (measurements: benchmarks/README.md).
                    col = _im2col(xp, x[n0:n1], p, s, batch_inner=False)   # (b, C, kh, kw, ·)
                    each = s("conv.dw_each", (b,) + dw.shape, dy.dtype)    # (b, G, K/G, ·)
                    xp.matmul(dy[n0:n1].reshape(b, p.group, p.kg, hw),
                              col.reshape(b, p.group, ckk, hw).transpose(0, 1, 3, 2), out=each)
                    part = dw if n0 == c0 else s("conv.dw_part", dw.shape, dy.dtype)
                    xp.sum(each, axis=0, out=part)
                else:
                    # Batch inside the columns so the whole block is one GEMM per group:
                    # dW_g = dY_g (K/G, b*oH*oW) @ col_g^T (b*oH*oW, C/G*kh*kw).
                    col = _im2col(xp, x[n0:n1], p, s, batch_inner=True)  # (C, kh, kw, b, ·)
                    dyt = s("conv.dy_t", (p.k, b, hw), dy.dtype)
                    dyt[...] = dy[n0:n1].reshape(b, p.k, hw).transpose(1, 0, 2)   # (K, b, ·)
                    lhs = dyt.reshape(p.group, p.kg, b * hw)
                    rhs = col.reshape(p.group, ckk, b * hw).transpose(0, 2, 1)
                    part = dw if n0 == c0 else s("conv.dw_part", dw.shape, dy.dtype)
                    xp.matmul(lhs, rhs, out=part)
                if part is not dw:
                    dw += part
            return None if index == 0 else (lambda: xp.add(total, dw, out=total))

        chunks(xp, p.n, work, work=p.n * ckk * p.group * hw, block=self.block(p))
        sum_bias(xp, dy, dbias, scratch)


def _blocks(start: int, stop: int, size: int):
    return ((n0, min(n0 + size, stop)) for n0 in range(start, stop, size))


def _im2col(xp, x, p: ConvProblem, scratch: Scratch, batch_inner: bool):
    """Columns of a block of images: (b, C, kh, kw, oH, oW), or (C, kh, kw, b, oH, oW)."""
    if jit.enabled(xp):   # one compiled pass, padding included (same values)
        return jit_im2col.im2col(x, p, scratch, batch_inner)
    b = x.shape[0]
    src = x
    if p.padded:
        hp, wp = p.h + p.pt + p.pb, p.w + p.pl + p.pr
        src = pad_into(x, scratch("conv.pad", (b, p.c, hp, wp), x.dtype), p.geometry, (2, 3), 0)
    sn, sc, sy, sx = src.strides
    # A read-only strided view: element (n, c, i, j, r, s) is src[n, c, r*sh + i*dh, s*sw + j*dw].
    windows = xp.lib.stride_tricks.as_strided(
        src, shape=(b, p.c, p.kh, p.kw, p.oh, p.ow),
        strides=(sn, sc, sy * p.dh, sx * p.dw, sy * p.sh, sx * p.sw))
    if batch_inner:
        col = scratch("conv.col", (p.c, p.kh, p.kw, b, p.oh, p.ow), x.dtype)
        col[...] = windows.transpose(1, 2, 3, 0, 4, 5)
    else:
        col = scratch("conv.col", (b, p.c, p.kh, p.kw, p.oh, p.ow), x.dtype)
        col[...] = windows
    return col


def _col2im(xp, col, p: ConvProblem, out, scratch: Scratch) -> None:
    """Scatter-add columns (b, C, kh, kw, oH, oW) back to images: one strided add per tap."""
    if jit.enabled(xp):   # one compiled pass, taps added in the same order (same bits)
        jit_im2col.col2im(col, p, out)
        return
    b = col.shape[0]
    g = p.geometry
    if p.padded:
        acc = scratch("conv.pad", (b, p.c, p.h + p.pt + p.pb, p.w + p.pl + p.pr), col.dtype)
    else:
        acc = out
    acc.fill(0)
    for i in range(p.kh):
        for j in range(p.kw):
            rows, cols = window_slices(g, i, j, p.oh, p.ow)
            acc[:, :, rows, cols] += col[:, :, i, j]
    if p.padded:
        out[...] = acc[:, :, p.pt:p.pt + p.h, p.pl:p.pl + p.w]
