"""Depthwise convolution kernels (group = C, K = C·m): one thread per output, no GEMM.

A depthwise filter has a single input channel, so a GEMM would have a contraction of kh·kw:
direct loops over the taps are faster and simpler. Backward-data gathers (one thread per
input pixel over the outputs that read it); backward-filter writes one partial sum per
image and tap, which cupy.sum reduces over the batch, so nothing needs atomics.
"""
from __future__ import annotations

from typing import Any

from netrun.backends.cuda.source import REALS, KernelSource, i32, i64, instances, launch

SOURCE = KernelSource("conv_depthwise", r"""
// y (N, C*m, oh, ow) from x (N, C, h, w) and w (C*m, kh, kw), + bias[k] if has_bias.
template <typename T>
__global__ void depthwise_forward(const T* x, const T* wt, const T* bias, T* y, long long total,
                                  int c, int m, int h, int w, int kh, int kw, int sh, int sw,
                                  int pt, int pl, int dh, int dw, int oh, int ow, int has_bias) {
  KERNEL_LOOP(i, total) {
    long long t = i;
    int s = (int)(t % ow); t /= ow;
    int r = (int)(t % oh); t /= oh;
    int k = (int)(t % ((long long)c * m));
    long long n = t / ((long long)c * m);
    const T* xi = x + (n * c + k / m) * (long long)h * w;
    const T* wk = wt + (long long)k * kh * kw;
    T acc = (T)0;
    for (int ki = 0; ki < kh; ++ki) {
      int yy = r * sh - pt + ki * dh;
      if (yy < 0 || yy >= h) continue;
      for (int j = 0; j < kw; ++j) {
        int xx = s * sw - pl + j * dw;
        if (xx < 0 || xx >= w) continue;
        acc += xi[(long long)yy * w + xx] * wk[ki * kw + j];
      }
    }
    y[i] = has_bias ? acc + bias[k] : acc;
  }
}

// dx (N, C, h, w): each pixel gathers dy * w over the outputs (and multipliers) that read it.
template <typename T>
__global__ void depthwise_backward_data(const T* dy, const T* wt, T* dx, long long total, int c,
                                        int m, int h, int w, int kh, int kw, int sh, int sw,
                                        int pt, int pl, int dh, int dw, int oh, int ow) {
  KERNEL_LOOP(i, total) {
    long long t = i;
    int xx = (int)(t % w); t /= w;
    int yy = (int)(t % h); t /= h;
    int ch = (int)(t % c);
    long long n = t / c;
    T acc = (T)0;
    for (int q = 0; q < m; ++q) {
      int k = ch * m + q;
      const T* dyk = dy + (n * c * m + k) * (long long)oh * ow;
      const T* wk = wt + (long long)k * kh * kw;
      for (int ki = 0; ki < kh; ++ki) {
        int rs = yy + pt - ki * dh;
        if (rs < 0 || rs % sh != 0 || rs / sh >= oh) continue;
        for (int j = 0; j < kw; ++j) {
          int ss = xx + pl - j * dw;
          if (ss < 0 || ss % sw != 0 || ss / sw >= ow) continue;
          acc += dyk[(long long)(rs / sh) * ow + ss / sw] * wk[ki * kw + j];
        }
      }
    }
    dx[i] = acc;
  }
}

// part (N, C*m, kh, kw): per image, the filter gradient sum over its output pixels.
template <typename T>
__global__ void depthwise_backward_filter(const T* x, const T* dy, T* part, long long total,
                                          int c, int m, int h, int w, int kh, int kw, int sh,
                                          int sw, int pt, int pl, int dh, int dw, int oh,
                                          int ow) {
  KERNEL_LOOP(i, total) {
    long long t = i;
    int j = (int)(t % kw); t /= kw;
    int ki = (int)(t % kh); t /= kh;
    int k = (int)(t % ((long long)c * m));
    long long n = t / ((long long)c * m);
    const T* xi = x + (n * c + k / m) * (long long)h * w;
    const T* dyk = dy + (n * c * m + k) * (long long)oh * ow;
    T acc = (T)0;
    for (int r = 0; r < oh; ++r) {
      int yy = r * sh - pt + ki * dh;
      if (yy < 0 || yy >= h) continue;
      for (int s = 0; s < ow; ++s) {
        int xx = s * sw - pl + j * dw;
        if (xx < 0 || xx >= w) continue;
        acc += dyk[(long long)r * ow + s] * xi[(long long)yy * w + xx];
      }
    }
    part[i] = acc;
  }
}
""", instances("depthwise_forward", REALS) + instances("depthwise_backward_data", REALS)
     + instances("depthwise_backward_filter", REALS))


def _geometry(p) -> tuple:
    return tuple(i32(v) for v in (p.c, p.kg, p.h, p.w, p.kh, p.kw, p.sh, p.sw, p.pt, p.pl,
                                  p.dh, p.dw, p.oh, p.ow))


def forward(xp: Any, x, w, p, out, bias=None) -> None:
    """out (N, K, oH, oW) = depthwise conv of x with w (+ bias)."""
    fn = SOURCE.function(xp, "depthwise_forward", x.dtype)
    launch(fn, out.size, (x, w, w if bias is None else bias, out, i64(out.size))
           + _geometry(p) + (i32(bias is not None),))


def backward_data(xp: Any, dy, w, p, out) -> None:
    """out (N, C, H, W) = gradient of the loss with respect to the input."""
    fn = SOURCE.function(xp, "depthwise_backward_data", dy.dtype)
    launch(fn, out.size, (dy, w, out, i64(out.size)) + _geometry(p))


def backward_filter(xp: Any, x, dy, p, part) -> None:
    """part (N, K, kh, kw) = per-image filter gradients (sum over axis 0 for dW)."""
    fn = SOURCE.function(xp, "depthwise_backward_filter", x.dtype)
    launch(fn, part.size, (x, dy, part, i64(part.size)) + _geometry(p))
