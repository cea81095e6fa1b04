"""Convolution data movement on the GPU: im2col, col2im and the batch/channel transposes.

The GPU im2col algorithm (netrun.conv.gpu.im2col) puts a block of b images inside the
columns, so each group's product is one large cuBLAS GEMM instead of b small ones:

    col  (C·kh·kw, b·oH·oW)   col[(c, i, j), (n, r, s)] = x[n, c, r·sh-pt+i·dh, s·sw-pl+j·dw]
    Y'   (K, b·oH·oW)         = W (K, C·kh·kw) @ col, per group
    Y    (b, K, oH·oW)        = Y' with the batch and channel axes swapped, + bias

col2im is the adjoint of im2col, written as a gather (one thread per image pixel summing the
columns that read it) rather than a scatter-add, so it needs no atomics and every run gives
the same bits.
"""
from __future__ import annotations

from typing import Any

from netrun.backends.cuda.source import REALS, KernelSource, i32, i64, instances, launch

SOURCE = KernelSource("conv_im2col", r"""
// col (C, kh, kw, b, oh, ow) from a block of b images x (b, C, h, w), zero outside the image.
template <typename T>
__global__ void im2col(const T* x, T* col, long long total, int c, int b, int h, int w, int kh,
                       int kw, int sh, int sw, int pt, int pl, int dh, int dw, int oh, int ow) {
  KERNEL_LOOP(i, total) {
    long long t = i;
    int s = (int)(t % ow); t /= ow;
    int r = (int)(t % oh); t /= oh;
    int n = (int)(t % b); t /= b;
    int j = (int)(t % kw); t /= kw;
    int ki = (int)(t % kh);
    long long ch = t / kh;
    int y = r * sh - pt + ki * dh;
    int xx = s * sw - pl + j * dw;
    T v = (T)0;
    if (y >= 0 && y < h && xx >= 0 && xx < w) {
      v = x[(((long long)n * c + ch) * h + y) * w + xx];
    }
    col[i] = v;
  }
}

// x (b, C, h, w) = the sum of the columns that read each pixel (the adjoint of im2col).
template <typename T>
__global__ void col2im(const T* col, T* x, long long total, int c, int b, int h, int w, int kh,
                       int kw, int sh, int sw, int pt, int pl, int dh, int dw, int oh, int ow) {
  KERNEL_LOOP(i, total) {
    long long t = i;
    int xx = (int)(t % w); t /= w;
    int y = (int)(t % h); t /= h;
    int ch = (int)(t % c);
    int n = (int)(t / c);
    T acc = (T)0;
    for (int ki = 0; ki < kh; ++ki) {
      int rs = y + pt - ki * dh;             // r·sh for the output row that reads y via ki
      if (rs < 0 || rs % sh != 0) continue;
      int r = rs / sh;
      if (r >= oh) continue;
      for (int j = 0; j < kw; ++j) {
        int ss = xx + pl - j * dw;
        if (ss < 0 || ss % sw != 0) continue;
        int s = ss / sw;
        if (s >= ow) continue;
        long long row = ((long long)ch * kh + ki) * kw + j;     // (c, i, j) of the column
        acc += col[(row * b + n) * oh * ow + (long long)r * ow + s];
      }
    }
    x[i] = acc;
  }
}

// dst (b, K, P) = src (K, b, P) + bias[k] (has_bias = 0: no bias; pass any array).
template <typename T>
__global__ void swap_to_nkp(const T* src, T* dst, const T* bias, long long total, int b, int k,
                            long long p, int has_bias) {
  KERNEL_LOOP(i, total) {
    long long q = i % p;
    long long t = i / p;
    int ch = (int)(t % k);
    int n = (int)(t / k);
    T v = src[((long long)ch * b + n) * p + q];
    dst[i] = has_bias ? v + bias[ch] : v;
  }
}

// dst (K, b, P) = src (b, K, P).
template <typename T>
__global__ void swap_to_knp(const T* src, T* dst, long long total, int b, int k, long long p) {
  KERNEL_LOOP(i, total) {
    long long q = i % p;
    long long t = i / p;
    int n = (int)(t % b);
    int ch = (int)(t / b);
    dst[i] = src[((long long)n * k + ch) * p + q];
  }
}
""", instances("im2col", REALS) + instances("col2im", REALS) + instances("swap_to_nkp", REALS)
     + instances("swap_to_knp", REALS))


def _geometry(p) -> tuple:
    return tuple(i32(v) for v in (p.h, p.w, p.kh, p.kw, p.sh, p.sw, p.pt, p.pl, p.dh, p.dw,
                                  p.oh, p.ow))


def im2col(xp: Any, x, col, p) -> None:
    """col (C·kh·kw, b·oH·oW) from the contiguous block x (b, C, H, W) of problem p."""
    b = x.shape[0]
    total = p.c * p.kh * p.kw * b * p.oh * p.ow
    fn = SOURCE.function(xp, "im2col", x.dtype)
    launch(fn, total, (x, col, i64(total), i32(p.c), i32(b)) + _geometry(p))


def col2im(xp: Any, col, x, p) -> None:
    """x (b, C, H, W) = the adjoint of im2col applied to col (C·kh·kw, b·oH·oW)."""
    b = x.shape[0]
    total = x.size
    fn = SOURCE.function(xp, "col2im", x.dtype)
    launch(fn, total, (col, x, i64(total), i32(p.c), i32(b)) + _geometry(p))


def to_nkp(xp: Any, src, dst, bias=None) -> None:
    """dst (b, K, P) = src (K, b, P) (+ bias (K,) per channel)."""
    b, k = dst.shape[0], dst.shape[1]
    p = dst.size // max(b * k, 1)
    fn = SOURCE.function(xp, "swap_to_nkp", dst.dtype)
    launch(fn, dst.size, (src, dst, src if bias is None else bias, i64(dst.size), i32(b), i32(k),
                          i64(p), i32(bias is not None)))


def to_knp(xp: Any, src, dst) -> None:
    """dst (K, b, P) = src (b, K, P)."""
    b, k = src.shape[0], src.shape[1]
    p = src.size // max(b * k, 1)
    fn = SOURCE.function(xp, "swap_to_knp", src.dtype)
    launch(fn, src.size, (src, dst, i64(src.size), i32(b), i32(k), i64(p)))
