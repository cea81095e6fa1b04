"""SpatialBN, SpatialBNRelu and their gradients on the GPU: fused elementwise kernels around
per-channel sums.

X is seen as (outer, C, inner): (N, C, H·W) for NCHW, (N·H·W, C, 1) for NHWC. Per-channel
sums reduce the inner axis, then the outer one (two cupy.sum calls into scratch: long
contiguous reductions, deterministic). The variance is two-pass, Σ(x − μ)² / M, as on the
CPU. Everything per element is one kernel: the centred square, the normalization
(y = (x − μ)·(scale·inv_std) + bias), the inference affine map and the input gradient; the
per-channel finishing (inv_std, running statistics, saved outputs, gradient coefficients)
is one small kernel. Each kernel evaluates the CPU kernel's expression in the CPU's order.
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

SOURCE = KernelSource("bn", r"""
// The channel of element i of an (outer, C, inner) array.
__device__ __forceinline__ int channel(long long i, int c, long long inner) {
  return (int)((i / inner) % c);
}

// out = (x − mean[c])², or (x − mean[c])·dy when dy is given (has_dy = 1).
template <typename T>
__global__ void bn_centered(const T* x, const T* mean, const T* dy, T* out, long long total,
                            int c, long long inner, int has_dy) {
  KERNEL_LOOP(i, total) {
    T centered = x[i] - mean[channel(i, c, inner)];
    out[i] = has_dy ? centered * dy[i] : centered * centered;
  }
}

// Per channel, from the batch sums: mean, var, inv_std, the running statistics (in place),
// the saved outputs and k = scale·inv_std for the normalization.
template <typename T>
__global__ void bn_finish_stats(const T* mean, const T* sqsum, const T* scale,
                                const T* running_mean, const T* running_var, T* new_mean,
                                T* new_var, T* saved_mean, T* saved_inv_std, T* k, int c,
                                T m, T epsilon, T momentum, T one_minus_momentum,
                                T unbias) {
  KERNEL_LOOP(ch, c) {
    T mu = mean[ch];
    T var = sqsum[ch] / m;
    T inv_std = (T)1 / sqrt(var + epsilon);
    T rm = momentum * running_mean[ch] + one_minus_momentum * mu;
    T rv = momentum * running_var[ch] + one_minus_momentum * var * unbias;
    new_mean[ch] = rm;
    new_var[ch] = rv;
    saved_mean[ch] = mu;
    saved_inv_std[ch] = inv_std;
    k[ch] = scale[ch] * inv_std;
  }
}

// max(v, 0) when relu (SpatialBNRelu); NaN stays NaN, as on the CPU.
template <typename T>
__device__ __forceinline__ T bn_relu(T v, int relu) {
  return (relu && v <= (T)0) ? (T)0 : v;
}

// y = (x − mean[c])·k[c] + bias[c]
template <typename T>
__global__ void bn_normalize(const T* x, const T* mean, const T* k, const T* bias, T* y,
                             long long total, int c, long long inner, int relu) {
  KERNEL_LOOP(i, total) {
    int ch = channel(i, c, inner);
    T v = x[i] - mean[ch];
    v = v * k[ch];
    y[i] = bn_relu(v + bias[ch], relu);
  }
}

// Inference: s = scale/√(var + ε); y = x·s + (bias − mean·s).
template <typename T>
__global__ void bn_inference(const T* x, const T* scale, const T* bias, const T* mean,
                             const T* var, T* y, long long total, int c, long long inner,
                             T epsilon, int relu) {
  KERNEL_LOOP(i, total) {
    int ch = channel(i, c, inner);
    T s = scale[ch] / sqrt(var[ch] + epsilon);
    T v = x[i] * s;
    y[i] = bn_relu(v + (bias[ch] - mean[ch] * s), relu);
  }
}

// SpatialBNReluGradient's g = dy·(y > 0): dy·1 or dy·0, so NaN stays NaN as on the CPU.
template <typename T>
__global__ void bn_relu_mask(const T* dy, const T* y, T* g, long long total) {
  KERNEL_LOOP(i, total) {
    g[i] = dy[i] * (y[i] > (T)0 ? (T)1 : (T)0);
  }
}

// Per channel: dscale = Σ(x−μ)dy · inv_std, dbias = Σ dy, and the dX coefficients
// a = inv_std·dscale/M, b = dbias/M, k = scale·inv_std (divisions, as NumPy computes them).
// is_test: stat is the running variance, inv_std = 1/√(var + ε).
template <typename T>
__global__ void bn_finish_grad(const T* dysum, const T* xdysum, const T* scale, const T* stat,
                               T* dscale, T* dbias, T* coef, int c, T m, T epsilon,
                               int is_test) {
  KERNEL_LOOP(ch, c) {
    T inv_std = is_test ? (T)1 / sqrt(stat[ch] + epsilon) : stat[ch];
    T ds = xdysum[ch] * inv_std;
    T db = dysum[ch];
    dscale[ch] = ds;
    dbias[ch] = db;
    coef[ch] = inv_std * ds / m;
    coef[c + ch] = db / m;
    coef[2 * c + ch] = scale[ch] * inv_std;
  }
}

// Training: dx = ((dy − (x − μ)·a) − b)·k.  is_test: dx = dy·k.
template <typename T>
__global__ void bn_backward(const T* x, const T* mean, const T* dy, const T* coef, T* dx,
                            long long total, int c, long long inner, int is_test) {
  KERNEL_LOOP(i, total) {
    int ch = channel(i, c, inner);
    if (is_test) {
      dx[i] = dy[i] * coef[2 * c + ch];
    } else {
      T v = (x[i] - mean[ch]) * coef[ch];
      v = dy[i] - v;
      v = v - coef[c + ch];
      dx[i] = v * coef[2 * c + ch];
    }
  }
}
""", instances("bn_centered", REALS) + instances("bn_finish_stats", REALS)
     + instances("bn_normalize", REALS) + instances("bn_inference", REALS)
     + instances("bn_finish_grad", REALS) + instances("bn_backward", REALS)
     + instances("bn_relu_mask", REALS))


def _layout(X, order: str) -> tuple[int, int, int]:
    """(outer, C, inner) of X for its storage order."""
    if order == "NHWC":
        c = X.shape[-1]
        return X.size // max(c, 1), c, 1
    c = X.shape[1]
    outer = X.shape[0]
    return outer, c, X.size // max(outer * c, 1)


def _channel_sum(ctx, a, view: tuple[int, int, int], out, key: str) -> None:
    """out (C,) = Σ of a (outer, C, inner) over outer and inner: inner first, then outer."""
    xp = ctx.xp
    outer, c, inner = view
    a3 = a.reshape(view)
    if inner == 1:
        xp.sum(a3.reshape(outer, c), axis=0, out=out)
        return
    partial = ctx.scratch(f"bn.{key}", (outer, c), a.dtype)
    xp.sum(a3, axis=2, out=partial)
    xp.sum(partial, axis=0, out=out)


def _same_dtype(*arrays) -> bool:
    return len({a.dtype for a in arrays}) == 1


@register_kernel("SpatialBN", backend="gpu")
def spatial_bn(ctx, X, scale, bias, running_mean, running_var):
    """Batch statistics (training) or running ones (is_test) per channel, then the affine map."""
    if not _same_dtype(X, scale, bias, running_mean, running_var):
        return norm_ops.spatial_bn(ctx, X, scale, bias, running_mean, running_var)
    _forward(ctx, X, scale, bias, running_mean, running_var, 0)


@register_kernel("SpatialBNRelu", backend="gpu")
def spatial_bn_relu(ctx, X, scale, bias, running_mean, running_var):
    """SpatialBN with the ReLU applied as Y is written."""
    if not _same_dtype(X, scale, bias, running_mean, running_var):
        return norm_ops.spatial_bn_relu(ctx, X, scale, bias, running_mean, running_var)
    _forward(ctx, X, scale, bias, running_mean, running_var, 1)


def _forward(ctx, X, scale, bias, running_mean, running_var, relu: int) -> None:
    xp, a = ctx.xp, ctx.args
    view = _layout(X, a.order)
    outer, c, inner = view
    x, n, t = contiguous(xp, X), i64(X.size), X.dtype
    dims = (i32(c), i64(inner))
    Y = ctx.output(0, X.shape, t)
    if a.is_test:
        launch(SOURCE.function(xp, "bn_inference", t), X.size,
               (x, scale, bias, running_mean, running_var, Y, n) + dims
               + (real(t, a.epsilon), i32(relu)))
        return
    m = outer * inner
    stats = ctx.scratch("bn.stats", (3, c), t)          # mean, Σ(x − μ)², k
    _channel_sum(ctx, x, view, stats[0], "partial")
    xp.divide(stats[0], real(t, m), out=stats[0])        # the mean, divided as NumPy does
    sq = ctx.scratch("norm.tmp", X.shape, t)
    launch(SOURCE.function(xp, "bn_centered", t), X.size,
           (x, stats[0], x, sq, n) + dims + (i32(0),))
    _channel_sum(ctx, sq, view, stats[1], "partial")
    # The running stats share the input blobs (enforce_inplace): read before written.
    new_mean = ctx.output(1, running_mean.shape, t)
    new_var = ctx.output(2, running_var.shape, t)
    saved_mean = ctx.output(3, (c,), t)
    saved_inv_std = ctx.output(4, (c,), t)
    launch(SOURCE.function(xp, "bn_finish_stats", t), c,
           (stats[0], stats[1], scale, running_mean, running_var, new_mean, new_var,
            saved_mean, saved_inv_std, stats[2], i32(c), real(t, m),
            real(t, a.epsilon), real(t, a.momentum), real(t, 1.0 - a.momentum),
            real(t, m / (m - 1))))
    launch(SOURCE.function(xp, "bn_normalize", t), X.size,
           (x, saved_mean, stats[2], bias, Y, n) + dims + (i32(relu),))


@register_kernel("SpatialBNGradient", backend="gpu")
def spatial_bn_gradient(ctx, X, scale, mean, inv_std, dY):
    """dX, dscale, dbias (is_test: inputs 2 and 3 are the running mean and variance)."""
    if not _same_dtype(X, scale, mean, inv_std, dY):
        return norm_ops.spatial_bn_gradient(ctx, X, scale, mean, inv_std, dY)
    _backward(ctx, X, scale, mean, inv_std, contiguous(ctx.xp, dY))


@register_kernel("SpatialBNReluGradient", backend="gpu")
def spatial_bn_relu_gradient(ctx, X, scale, mean, inv_std, dY, Y):
    """SpatialBNGradient of g = dY·(Y > 0), g made by one kernel first."""
    if not _same_dtype(X, scale, mean, inv_std, dY, Y):
        return norm_ops.spatial_bn_relu_gradient(ctx, X, scale, mean, inv_std, dY, Y)
    xp = ctx.xp
    g = ctx.scratch("bn.masked", X.shape, X.dtype)
    launch(SOURCE.function(xp, "bn_relu_mask", X.dtype), X.size,
           (contiguous(xp, dY), contiguous(xp, Y), g, i64(X.size)))
    _backward(ctx, X, scale, mean, inv_std, g)


def _backward(ctx, X, scale, mean, inv_std, dy) -> None:
    """dX, dscale, dbias from a contiguous dy (SpatialBNGradient's kernels)."""
    xp, a = ctx.xp, ctx.args
    view = _layout(X, a.order)
    outer, c, inner = view
    x, n, t = contiguous(xp, X), i64(X.size), X.dtype
    dims = (i32(c), i64(inner))
    sums = ctx.scratch("bn.grad_sums", (2, c), t)       # Σ dy, Σ (x − μ)·dy
    _channel_sum(ctx, dy, view, sums[0], "partial")
    prod = ctx.scratch("norm.tmp", X.shape, t)
    launch(SOURCE.function(xp, "bn_centered", t), X.size,
           (x, mean, dy, prod, n) + dims + (i32(1),))
    _channel_sum(ctx, prod, view, sums[1], "partial")
    coef = ctx.scratch("bn.coef", (3 * c,), t)
    dscale = ctx.output(1, scale.shape, t)
    dbias = ctx.output(2, scale.shape, t)
    m = outer * inner
    launch(SOURCE.function(xp, "bn_finish_grad", t), c,
           (sums[0], sums[1], scale, inv_std, dscale, dbias, coef, i32(c), real(t, m),
            real(t, a.epsilon), i32(a.is_test)))
    dX = ctx.output(0, X.shape, t)
    launch(SOURCE.function(xp, "bn_backward", t), X.size,
           (x, mean, dy, coef, dX, n) + dims + (i32(a.is_test),))
