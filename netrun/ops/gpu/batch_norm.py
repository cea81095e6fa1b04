"""SpatialBN, SpatialBNRelu and their gradients on the GPU: three kernels a pass.

X is seen as (outer, C, inner): (N, C, H·W) for NCHW, (N·H·W, C, 1) for NHWC. Per-channel
statistics are split into `lanes(M)` partials per channel (M = outer·inner), each a strided
walk over the channel's elements in a fixed order; a one-thread-per-channel kernel then
combines a channel's partials in lane order. No shared memory and no atomics, so the sums are
the same bits on every run and device, and the host emulator runs them too. The forward
partials are Welford moments (mean, M2) combined by Chan's formula, a one-pass variance as
stable as the CPU's two passes; the gradient partials are Σg and Σ(x − μ)·g, where g = dY or,
after a fused ReLU, dY·(Y > 0) computed where it is read (no masked copy is stored). Each
pass is three launches (partials, per-channel finish, the elementwise map): on a GPU the cost
of an op is mostly its launches, and the full-size temporaries of a sum-per-cupy-call design
are gone too.
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

// Where the per-channel partial t of a (C, P) partial grid reads: its channel and its lane.
// NCHW (inner > 1): lanes of one channel are neighbours, so they read neighbouring elements
// of the channel's planes; NHWC (inner = 1): channels are neighbours, for the same reason.
__device__ __forceinline__ void partial_slot(long long t, int c, int parts, long long inner,
                                             int* ch, int* lane) {
  if (inner > 1) { *ch = (int)(t / parts); *lane = (int)(t % parts); }
  else { *ch = (int)(t % c); *lane = (int)(t / c); }
}

// The address of element m (0 ≤ m < outer·inner) of channel ch.
__device__ __forceinline__ long long channel_element(long long m, int ch, int c,
                                                     long long inner) {
  return (m / inner) * c * inner + ch * inner + m % inner;
}

// Forward statistics, one lane of one channel: Welford's mean and M2 over the elements
// lane, lane + parts, lane + 2·parts, ... in that order. partial[(ch·parts + lane)·2 + {0,1}].
template <typename T>
__global__ void bn_partial_moments(const T* x, T* partial, int c, long long inner,
                                   long long m_total, int parts) {
  KERNEL_LOOP(t, (long long)c * parts) {
    int ch, lane;
    partial_slot(t, c, parts, inner, &ch, &lane);
    T mean = (T)0, m2 = (T)0, n = (T)0;
    for (long long m = lane; m < m_total; m += parts) {
      T v = x[channel_element(m, ch, c, inner)];
      n += (T)1;
      T delta = v - mean;
      mean += delta / n;
      m2 += delta * (v - mean);
    }
    long long slot = ((long long)ch * parts + lane) * 2;
    partial[slot] = mean;
    partial[slot + 1] = m2;
  }
}

// Per channel: the lanes' moments combined in lane order (Chan et al.), then mean, var,
// inv_std, the running statistics, the saved outputs and k = scale·inv_std.
template <typename T>
__global__ void bn_finish_moments(const T* partial, const T* scale, const T* running_mean,
                                  const T* running_var, T* new_mean, T* new_var,
                                  T* saved_mean, T* saved_inv_std, T* k, int c, int parts,
                                  long long m_total, T epsilon, T momentum,
                                  T one_minus_momentum, T unbias) {
  KERNEL_LOOP(ch, c) {
    T mu = (T)0, m2 = (T)0, n = (T)0;
    for (int lane = 0; lane < parts; ++lane) {   // parts ≤ m_total: no lane is empty
      long long slot = ((long long)ch * parts + lane) * 2;
      T nb = (T)((m_total - lane + parts - 1) / parts);
      T total = n + nb;
      T delta = partial[slot] - mu;
      mu += delta * (nb / total);
      m2 += partial[slot + 1] + delta * delta * (n * nb / total);
      n = total;
    }
    T var = m2 / (T)m_total;
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

// The gradient reaching the BN: dy, or dy·(y > 0) after a fused ReLU (dy·1 or dy·0, so NaN
// stays NaN as on the CPU). has_y = 0: y is not read.
template <typename T>
__device__ __forceinline__ T bn_incoming(const T* dy, const T* y, long long i, int has_y) {
  return has_y ? dy[i] * (y[i] > (T)0 ? (T)1 : (T)0) : dy[i];
}

// Gradient sums, one lane of one channel: Σ g and Σ (x − μ)·g in element order.
template <typename T>
__global__ void bn_partial_grad(const T* x, const T* mean, const T* dy, const T* y,
                                T* partial, int c, long long inner, long long m_total,
                                int parts, int has_y) {
  KERNEL_LOOP(t, (long long)c * parts) {
    int ch, lane;
    partial_slot(t, c, parts, inner, &ch, &lane);
    T mu = mean[ch], sum = (T)0, dot = (T)0;
    for (long long m = lane; m < m_total; m += parts) {
      long long i = channel_element(m, ch, c, inner);
      T g = bn_incoming(dy, y, i, has_y);
      sum += g;
      dot += (x[i] - mu) * g;
    }
    long long slot = ((long long)ch * parts + lane) * 2;
    partial[slot] = sum;
    partial[slot + 1] = dot;
  }
}

// Per channel, the lanes' sums in lane order: dscale = Σ(x−μ)g · inv_std, dbias = Σ g, and
// the dX coefficients a = inv_std·dscale/M, b = dbias/M, k = scale·inv_std.
// is_test: stat is the running variance, inv_std = 1/√(var + ε).
template <typename T>
__global__ void bn_finish_grad(const T* partial, const T* scale, const T* stat, T* dscale,
                               T* dbias, T* coef, int c, int parts, T m, T epsilon,
                               int is_test) {
  KERNEL_LOOP(ch, c) {
    T sum = (T)0, dot = (T)0;
    for (int lane = 0; lane < parts; ++lane) {
      long long slot = ((long long)ch * parts + lane) * 2;
      sum += partial[slot];
      dot += partial[slot + 1];
    }
    T inv_std = is_test ? (T)1 / sqrt(stat[ch] + epsilon) : stat[ch];
    T ds = dot * inv_std;
    dscale[ch] = ds;
    dbias[ch] = sum;
    coef[ch] = inv_std * ds / m;
    coef[c + ch] = sum / m;
    coef[2 * c + ch] = scale[ch] * inv_std;
  }
}

// Training: dx = ((g − (x − μ)·a) − b)·k.  is_test: dx = g·k.
template <typename T>
__global__ void bn_backward(const T* x, const T* mean, const T* dy, const T* y,
                            const T* coef, T* dx, long long total, int c, long long inner,
                            int is_test, int has_y) {
  KERNEL_LOOP(i, total) {
    int ch = channel(i, c, inner);
    T g = bn_incoming(dy, y, i, has_y);
    if (is_test) {
      dx[i] = g * coef[2 * c + ch];
    } else {
      T v = (x[i] - mean[ch]) * coef[ch];
      v = g - v;
      v = v - coef[c + ch];
      dx[i] = v * coef[2 * c + ch];
    }
  }
}
""", instances("bn_partial_moments", REALS) + instances("bn_finish_moments", REALS)
     + instances("bn_normalize", REALS) + instances("bn_inference", REALS)
     + instances("bn_partial_grad", REALS) + instances("bn_finish_grad", REALS)
     + instances("bn_backward", REALS))

# Lanes per channel for the statistics: at least LANE_ELEMENTS elements each (so a lane's
# loop outweighs its launch share) and at most MAX_LANES (so the per-channel finish stays
# short). A function of the problem alone: the same sums in the same order on every device.
LANE_ELEMENTS = 64
MAX_LANES = 512


def lanes(per_channel: int) -> int:
    """How many partial sums each channel's statistics are split into."""
    return max(1, min(MAX_LANES, per_channel // LANE_ELEMENTS))


def _layout(X, order: str) -> tuple[int, int, int]:
    """(outer, C, inner) of X for its storage order."""
    if order == "NHWC":
        c = X.shape[-1]
        return X.size // max(c, 1), c, 1
    c = X.shape[1]
    outer = X.shape[0]
    return outer, c, X.size // max(outer * c, 1)


def _same_dtype(*arrays) -> bool:
    return len({a.dtype for a in arrays}) == 1


def _syncs(ctx) -> bool:
    """Synchronized BatchNorm over several ranks: the shared kernels (array-module code, the
    sums exchanged through host memory) run it; these fused CUDA kernels do not."""
    return bool(ctx.args.sync) and not ctx.args.is_test and ctx.ws.comm.size > 1


@register_kernel("SpatialBN", backend="gpu")
def spatial_bn(ctx, X, scale, bias, running_mean, running_var):
    """Batch statistics (training) or running ones (is_test) per channel, then the affine map."""
    if not _same_dtype(X, scale, bias, running_mean, running_var) or _syncs(ctx):
        return norm_ops.spatial_bn(ctx, X, scale, bias, running_mean, running_var)
    _forward(ctx, X, scale, bias, running_mean, running_var, 0)


@register_kernel("SpatialBNRelu", backend="gpu")
def spatial_bn_relu(ctx, X, scale, bias, running_mean, running_var):
    """SpatialBN with the ReLU applied as Y is written."""
    if not _same_dtype(X, scale, bias, running_mean, running_var) or _syncs(ctx):
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
    parts = lanes(m)
    partial = ctx.scratch("bn.partial", (c * parts * 2,), t)
    launch(SOURCE.function(xp, "bn_partial_moments", t), c * parts,
           (x, partial, i32(c), i64(inner), i64(m), i32(parts)))
    k = ctx.scratch("bn.k", (c,), t)
    # The running stats share the input blobs (enforce_inplace): read before written.
    new_mean = ctx.output(1, running_mean.shape, t)
    new_var = ctx.output(2, running_var.shape, t)
    saved_mean = ctx.output(3, (c,), t)
    saved_inv_std = ctx.output(4, (c,), t)
    launch(SOURCE.function(xp, "bn_finish_moments", t), c,
           (partial, scale, running_mean, running_var, new_mean, new_var, saved_mean,
            saved_inv_std, k, i32(c), i32(parts), i64(m), real(t, a.epsilon),
            real(t, a.momentum), real(t, 1.0 - a.momentum), real(t, m / (m - 1))))
    launch(SOURCE.function(xp, "bn_normalize", t), X.size,
           (x, saved_mean, k, bias, Y, n) + dims + (i32(relu),))


@register_kernel("SpatialBNGradient", backend="gpu")
def spatial_bn_gradient(ctx, X, scale, mean, inv_std, dY):
    """dX, dscale, dbias (is_test: inputs 2 and 3 are the running mean and variance)."""
    if not _same_dtype(X, scale, mean, inv_std, dY) or _syncs(ctx):
        return norm_ops.spatial_bn_gradient(ctx, X, scale, mean, inv_std, dY)
    _backward(ctx, X, scale, mean, inv_std, dY, None)


@register_kernel("SpatialBNReluGradient", backend="gpu")
def spatial_bn_relu_gradient(ctx, X, scale, mean, inv_std, dY, Y):
    """SpatialBNGradient of g = dY·(Y > 0), g computed where it is read (never stored)."""
    if not _same_dtype(X, scale, mean, inv_std, dY, Y) or _syncs(ctx):
        return norm_ops.spatial_bn_relu_gradient(ctx, X, scale, mean, inv_std, dY, Y)
    _backward(ctx, X, scale, mean, inv_std, dY, Y)


def _backward(ctx, X, scale, mean, inv_std, dY, Y) -> None:
    """dX, dscale, dbias from dY (masked by Y > 0 where Y is given): three kernels."""
    xp, a = ctx.xp, ctx.args
    view = _layout(X, a.order)
    outer, c, inner = view
    x, n, t = contiguous(xp, X), i64(X.size), X.dtype
    dy = contiguous(xp, dY)
    has_y = Y is not None
    y = contiguous(xp, Y) if has_y else dy
    dims = (i32(c), i64(inner))
    m = outer * inner
    parts = lanes(m)
    partial = ctx.scratch("bn.partial", (c * parts * 2,), t)
    launch(SOURCE.function(xp, "bn_partial_grad", t), c * parts,
           (x, mean, dy, y, partial, i32(c), i64(inner), i64(m), i32(parts), i32(has_y)))
    coef = ctx.scratch("bn.coef", (3 * c,), t)
    dscale = ctx.output(1, scale.shape, t)
    dbias = ctx.output(2, scale.shape, t)
    launch(SOURCE.function(xp, "bn_finish_grad", t), c,
           (partial, scale, inv_std, dscale, dbias, coef, i32(c), i32(parts), real(t, m),
            real(t, a.epsilon), i32(a.is_test)))
    dX = ctx.output(0, X.shape, t)
    launch(SOURCE.function(xp, "bn_backward", t), X.size,
           (x, mean, dy, y, coef, dX, n) + dims + (i32(a.is_test), i32(has_y)))
