"""LRN and its gradient on the GPU: one thread per element sums its window directly.

The window sums add the terms in the CPU kernel's order (across channels: offsets -pad..pad;
within a channel: a column sum over rows per column offset, as netrun.ops.norm's separable
box sum does), so the scale matches the CPU's bits; only pow differs by an ulp or so between
libraries. The gradient writes the window term dY·X·scale^(−β−1) once, then each element
gathers it over the same (symmetric) window. 4-D inputs in either layout; other ranks fall
back to the array-module kernel.
"""
from __future__ import annotations

from netrun.backends.cuda.source import (
    REALS,
    KernelSource,
    contiguous,
    i32,
    i64,
    instances,
    launch,
    real,
)
from netrun.core.registry import register_kernel
from netrun.ops import norm as norm_ops

SOURCE = KernelSource("lrn", r"""
__device__ __forceinline__ long long at(long long n, int ch, int y, int x, int c, int h, int w,
                                        int nhwc) {
  return nhwc ? ((n * h + y) * w + x) * c + ch : ((n * c + ch) * h + y) * w + x;
}

__device__ __forceinline__ void split(long long i, int c, int h, int w, int nhwc, long long* n,
                                      int* ch, int* y, int* x) {
  if (nhwc) {
    *ch = (int)(i % c); i /= c; *x = (int)(i % w); i /= w; *y = (int)(i % h); *n = i / h;
  } else {
    *x = (int)(i % w); i /= w; *y = (int)(i % h); i /= h; *ch = (int)(i % c); *n = i / c;
  }
}

// The window sum of src (squared when square = 1) around element i: across channels
// (within = 0) or over a size×size pixel box (within = 1), zero outside.
template <typename T>
__device__ T window_sum(const T* src, long long i, int c, int h, int w, int size, int within,
                        int nhwc, int square) {
  long long n; int ch, y, x;
  split(i, c, h, w, nhwc, &n, &ch, &y, &x);
  int pad = (size - 1) / 2;
  T acc = (T)0;
  if (!within) {
    for (int d = -pad; d <= pad; ++d) {
      int k = ch + d;
      if (k < 0 || k >= c) continue;
      T v = src[at(n, k, y, x, c, h, w, nhwc)];
      acc += square ? v * v : v;
    }
    return acc;
  }
  for (int dx = -pad; dx <= pad; ++dx) {
    int xx = x + dx;
    if (xx < 0 || xx >= w) continue;
    T column = (T)0;
    for (int dy = -pad; dy <= pad; ++dy) {
      int yy = y + dy;
      if (yy < 0 || yy >= h) continue;
      T v = src[at(n, ch, yy, xx, c, h, w, nhwc)];
      column += square ? v * v : v;
    }
    acc += column;
  }
  return acc;
}

// scale = k + alpha/n · Σ_window x²;  y = x · scale^−beta  (keep = 0: scale not stored).
template <typename T>
__global__ void lrn_forward(const T* x, T* y, T* scale, long long total, int c, int h, int w,
                            int size, int within, int nhwc, T coef, T bias, T neg_beta,
                            int keep) {
  KERNEL_LOOP(i, total) {
    T s = window_sum(x, i, c, h, w, size, within, nhwc, 1) * coef + bias;
    if (keep) scale[i] = s;
    y[i] = pow(s, neg_beta) * x[i];
  }
}

// scale only (the gradient without a stored scale).
template <typename T>
__global__ void lrn_scale(const T* x, T* scale, long long total, int c, int h, int w, int size,
                          int within, int nhwc, T coef, T bias) {
  KERNEL_LOOP(i, total) {
    scale[i] = window_sum(x, i, c, h, w, size, within, nhwc, 1) * coef + bias;
  }
}

// through = dY·scale^−beta · X / scale, the term every window gathers.
template <typename T>
__global__ void lrn_through(const T* x, const T* scale, const T* dy, T* through,
                            long long total, T neg_beta) {
  KERNEL_LOOP(i, total) {
    T first = pow(scale[i], neg_beta) * dy[i];
    through[i] = first * x[i] / scale[i];
  }
}

// dx = Σ_window(through) · x · (−2·alpha·beta/n) + dY·scale^−beta.
template <typename T>
__global__ void lrn_backward(const T* x, const T* scale, const T* dy, const T* through, T* dx,
                             long long total, int c, int h, int w, int size, int within,
                             int nhwc, T coef, T neg_beta) {
  KERNEL_LOOP(i, total) {
    T first = pow(scale[i], neg_beta) * dy[i];
    dx[i] = window_sum(through, i, c, h, w, size, within, nhwc, 0) * x[i] * coef + first;
  }
}
""", instances("lrn_forward", REALS) + instances("lrn_scale", REALS)
     + instances("lrn_through", REALS) + instances("lrn_backward", REALS))


def _dims(ctx, X) -> tuple:
    a = ctx.args
    nhwc = a.order == "NHWC"
    c, h, w = (X.shape[3], X.shape[1], X.shape[2]) if nhwc else X.shape[1:]
    within = a.norm_region == norm_ops.WITHIN
    return tuple(i32(v) for v in (c, h, w, a.size, within, nhwc))


def _coef(ctx, dtype):
    """alpha / n with n = size (across) or size² (within), as the CPU kernel rounds it."""
    a = ctx.args
    return real(dtype, a.alpha / a.size ** (2 if a.norm_region == norm_ops.WITHIN else 1))


@register_kernel("LRN", backend="gpu")
def lrn(ctx, X):
    """Y = X · scale^−beta, scale = k + alpha/n · Σ_window X² (kept as output 1 if asked)."""
    if X.ndim != 4:
        return norm_ops.lrn(ctx, X)
    a, x = ctx.args, contiguous(ctx.xp, X)
    keep = len(ctx.def_.outputs) == 2
    Y = ctx.output(0, X.shape, X.dtype)
    scale = ctx.output(1, X.shape, X.dtype) if keep else Y
    fn = SOURCE.function(ctx.xp, "lrn_forward", X.dtype)
    launch(fn, X.size, (x, Y, scale, i64(X.size)) + _dims(ctx, X)
           + (_coef(ctx, X.dtype), real(X.dtype, a.bias), real(X.dtype, -a.beta), i32(keep)))


@register_kernel("LRNGradient", backend="gpu")
def lrn_gradient(ctx, X, *rest):
    """dX from (X, [scale], dY); without scale it is recomputed from X."""
    if X.ndim != 4:
        return norm_ops.lrn_gradient(ctx, X, *rest)
    xp, a = ctx.xp, ctx.args
    x, dims, n = contiguous(xp, X), _dims(ctx, X), i64(X.size)
    if len(rest) == 2:
        scale, dY = contiguous(xp, rest[0]), rest[1]
    else:
        dY = rest[0]
        scale = ctx.scratch("norm.scale", X.shape, X.dtype)
        launch(SOURCE.function(xp, "lrn_scale", X.dtype), X.size,
               (x, scale, n) + dims + (_coef(ctx, X.dtype), real(X.dtype, a.bias)))
    dy = contiguous(xp, dY)
    neg_beta = real(X.dtype, -a.beta)
    through = ctx.scratch("norm.through", X.shape, X.dtype)
    launch(SOURCE.function(xp, "lrn_through", X.dtype), X.size,
           (x, scale, dy, through, n, neg_beta))
    dX = ctx.output(0, X.shape, X.dtype)
    coef = real(X.dtype, -2.0 * a.alpha * a.beta / a.size ** (2 if dims[4] else 1))
    launch(SOURCE.function(xp, "lrn_backward", X.dtype), X.size,
           (x, scale, dy, through, dX, n) + dims + (coef, neg_beta))
