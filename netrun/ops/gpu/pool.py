"""MaxPool, AveragePool and their gradients on the GPU (Caffe's pooling kernels, made exact).

One thread per output for the forward passes. The gradients gather, one thread per input
pixel over the windows that contain it, so they need no atomics and give the same bits on
every run. MaxPoolGradient keeps Caffe2's inputs (X, Y, dY): a first kernel finds, per
window, the first tap in window order whose value equals Y (padding counts as -inf, as on
the CPU) and stores its position (Caffe's mask, rebuilt rather than saved by the forward
pass); the gather kernel then adds dY where a window's mask names the pixel. Both layouts
(NCHW, NHWC) are indexed directly. Geometry, Caffe's ceil mode and the average divisor come
from netrun.ops.pool.
"""
from __future__ import annotations

from netrun.backends.cuda.source import REALS, KernelSource, contiguous, i32, i64, instances, launch
from netrun.core.registry import register_kernel
from netrun.ops import pool as pool_ops

SOURCE = KernelSource("pool", r"""
// Offset of element (n, c, y, x) in an NCHW or NHWC array of c channels and h×w pixels.
__device__ __forceinline__ long long pixel(long long n, int ch, int y, int x, int c, int h,
                                           int w, int nhwc) {
  return nhwc ? ((n * h + y) * w + x) * c + ch : ((n * c + ch) * h + y) * w + x;
}

// Splits output index i into (n, channel, row, column) for the output's layout.
__device__ __forceinline__ void split_out(long long i, int c, int oh, int ow, int nhwc,
                                          long long* n, int* ch, int* r, int* s) {
  if (nhwc) {
    *ch = (int)(i % c); i /= c;
    *s = (int)(i % ow); i /= ow;
    *r = (int)(i % oh); *n = i / oh;
  } else {
    *s = (int)(i % ow); i /= ow;
    *r = (int)(i % oh); i /= oh;
    *ch = (int)(i % c); *n = i / c;
  }
}

// y = the maximum of each window of x padded with -inf; NaN wins (as NumPy's maximum).
template <typename T>
__global__ void max_pool_forward(const T* x, T* y, long long total, int c, int h, int w,
                                 int oh, int ow, int kh, int kw, int sh, int sw, int pt, int pl,
                                 int nhwc) {
  KERNEL_LOOP(i, total) {
    long long n; int ch, r, s;
    split_out(i, c, oh, ow, nhwc, &n, &ch, &r, &s);
    T best = neg_infinity<T>();
    bool nan = false;
    for (int ki = 0; ki < kh; ++ki) {
      int yy = r * sh - pt + ki;
      if (yy < 0 || yy >= h) continue;
      for (int j = 0; j < kw; ++j) {
        int xx = s * sw - pl + j;
        if (xx < 0 || xx >= w) continue;
        T v = x[pixel(n, ch, yy, xx, c, h, w, nhwc)];
        if (v != v) nan = true;
        else if (v > best) best = v;
      }
    }
    y[i] = nan ? quiet_nan<T>() : best;
  }
}

// mask[i] = yy*w + xx of the first tap (window order, padding = -inf) equal to y[i]; -1 if
// none is (a NaN maximum, or a padding tap first).
template <typename T>
__global__ void max_pool_mask(const T* x, const T* y, int* mask, long long total, int c, int h,
                              int w, int oh, int ow, int kh, int kw, int sh, int sw, int pt,
                              int pl, int nhwc) {
  KERNEL_LOOP(i, total) {
    long long n; int ch, r, s;
    split_out(i, c, oh, ow, nhwc, &n, &ch, &r, &s);
    T target = y[i];
    int found = -1;
    for (int ki = 0; ki < kh && found == -1; ++ki) {
      int yy = r * sh - pt + ki;
      for (int j = 0; j < kw; ++j) {
        int xx = s * sw - pl + j;
        bool inside = yy >= 0 && yy < h && xx >= 0 && xx < w;
        T v = inside ? x[pixel(n, ch, yy, xx, c, h, w, nhwc)] : neg_infinity<T>();
        if (v == target) {
          found = inside ? yy * w + xx : -2;
          break;
        }
      }
    }
    mask[i] = found;
  }
}

// dx = the sum of dy over the windows whose mask names the pixel (i indexes x's layout).
template <typename T>
__global__ void max_pool_backward(const T* dy, const int* mask, T* dx, long long total, int c,
                                  int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                                  int pt, int pl, int nhwc) {
  KERNEL_LOOP(i, total) {
    long long n; int ch, yy, xx;
    split_out(i, c, h, w, nhwc, &n, &ch, &yy, &xx);
    int r0 = yy + pt < kh ? 0 : (yy + pt - kh) / sh + 1;
    int r1 = (yy + pt) / sh;
    int s0 = xx + pl < kw ? 0 : (xx + pl - kw) / sw + 1;
    int s1 = (xx + pl) / sw;
    int me = yy * w + xx;
    T acc = (T)0;
    for (int r = r0; r <= r1 && r < oh; ++r) {
      for (int s = s0; s <= s1 && s < ow; ++s) {
        long long o = pixel(n, ch, r, s, c, oh, ow, nhwc);
        if (mask[o] == me) acc += dy[o];
      }
    }
    dx[i] = acc;
  }
}

// y = the sum of each window of x (padding 0) over the divisor of its position.
template <typename T>
__global__ void avg_pool_forward(const T* x, const T* divisor, T* y, long long total, int c,
                                 int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                                 int pt, int pl, int nhwc) {
  KERNEL_LOOP(i, total) {
    long long n; int ch, r, s;
    split_out(i, c, oh, ow, nhwc, &n, &ch, &r, &s);
    T acc = (T)0;
    for (int ki = 0; ki < kh; ++ki) {
      int yy = r * sh - pt + ki;
      if (yy < 0 || yy >= h) continue;
      for (int j = 0; j < kw; ++j) {
        int xx = s * sw - pl + j;
        if (xx < 0 || xx >= w) continue;
        acc += x[pixel(n, ch, yy, xx, c, h, w, nhwc)];
      }
    }
    y[i] = acc / divisor[r * ow + s];
  }
}

// dx = the sum over the windows containing the pixel of dy / divisor.
template <typename T>
__global__ void avg_pool_backward(const T* dy, const T* divisor, T* dx, long long total, int c,
                                  int h, int w, int oh, int ow, int kh, int kw, int sh, int sw,
                                  int pt, int pl, int nhwc) {
  KERNEL_LOOP(i, total) {
    long long n; int ch, yy, xx;
    split_out(i, c, h, w, nhwc, &n, &ch, &yy, &xx);
    int r0 = yy + pt < kh ? 0 : (yy + pt - kh) / sh + 1;
    int r1 = (yy + pt) / sh;
    int s0 = xx + pl < kw ? 0 : (xx + pl - kw) / sw + 1;
    int s1 = (xx + pl) / sw;
    T acc = (T)0;
    for (int r = r0; r <= r1 && r < oh; ++r) {
      for (int s = s0; s <= s1 && s < ow; ++s) {
        acc += dy[pixel(n, ch, r, s, c, oh, ow, nhwc)] / divisor[r * ow + s];
      }
    }
    dx[i] = acc;
  }
}
""", instances("max_pool_forward", REALS) + instances("max_pool_mask", REALS)
     + instances("max_pool_backward", REALS) + instances("avg_pool_forward", REALS)
     + instances("avg_pool_backward", REALS))


def _dims(ctx, X, g, oh: int, ow: int) -> tuple:
    """(c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, nhwc) as kernel ints."""
    nhwc = ctx.args.order == "NHWC"
    c, h, w = (X.shape[3], X.shape[1], X.shape[2]) if nhwc else X.shape[1:]
    return tuple(i32(v) for v in (c, h, w, oh, ow, g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, nhwc))


def _divisor(xp, divisor):
    return contiguous(xp, divisor).reshape(-1)


@register_kernel("MaxPool", backend="gpu")
def max_pool(ctx, X):
    """Y = the maximum over each window (padding never wins)."""
    g, oh, ow, _ = pool_ops.pool_setup(ctx, X)
    Y = ctx.output(0, pool_ops.pooled_shape(ctx.args, X.shape, oh, ow), X.dtype)
    fn = SOURCE.function(ctx.xp, "max_pool_forward", X.dtype)
    launch(fn, Y.size, (contiguous(ctx.xp, X), Y, i64(Y.size)) + _dims(ctx, X, g, oh, ow))


@register_kernel("MaxPoolGradient", backend="gpu")
def max_pool_gradient(ctx, X, Y, dY):
    """dX: dY routed to the first maximum of each window, in window order."""
    xp = ctx.xp
    g, oh, ow, _ = pool_ops.pool_setup(ctx, X)
    pooled = pool_ops.pooled_shape(ctx.args, X.shape, oh, ow)
    pool_ops.check_pooled(ctx, "dY", dY, pooled)
    pool_ops.check_pooled(ctx, "Y", Y, pooled)
    dims = _dims(ctx, X, g, oh, ow)
    x = contiguous(xp, X)
    mask = ctx.scratch("pool.mask", Y.shape, "int32")
    launch(SOURCE.function(xp, "max_pool_mask", X.dtype), Y.size,
           (x, contiguous(xp, Y), mask, i64(Y.size)) + dims)
    dX = ctx.output(0, X.shape, X.dtype)
    launch(SOURCE.function(xp, "max_pool_backward", X.dtype), dX.size,
           (contiguous(xp, dY), mask, dX, i64(dX.size)) + dims)


@register_kernel("AveragePool", backend="gpu")
def average_pool(ctx, X):
    """Y = the window sums over Caffe's window sizes."""
    g, oh, ow, divisor = pool_ops.pool_setup(ctx, X)
    Y = ctx.output(0, pool_ops.pooled_shape(ctx.args, X.shape, oh, ow), X.dtype)
    fn = SOURCE.function(ctx.xp, "avg_pool_forward", X.dtype)
    launch(fn, Y.size, (contiguous(ctx.xp, X), _divisor(ctx.xp, divisor), Y, i64(Y.size))
           + _dims(ctx, X, g, oh, ow))


@register_kernel("AveragePoolGradient", backend="gpu")
def average_pool_gradient(ctx, X, *rest):
    """dX: each dY spread over its window by the forward divisor; the last input is dY."""
    dY = rest[-1]
    g, oh, ow, divisor = pool_ops.pool_setup(ctx, X)
    pool_ops.check_pooled(ctx, "dY", dY, pool_ops.pooled_shape(ctx.args, X.shape, oh, ow))
    dX = ctx.output(0, X.shape, X.dtype)
    fn = SOURCE.function(ctx.xp, "avg_pool_backward", X.dtype)
    launch(fn, dX.size, (contiguous(ctx.xp, dY), _divisor(ctx.xp, divisor), dX, i64(dX.size))
           + _dims(ctx, X, g, oh, ow))
