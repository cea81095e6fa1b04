"""Label-reading ops on the GPU: SoftmaxWithLoss, LabelCrossEntropy, Accuracy (+ gradients).

One thread per example computes its row (softmax, −log p[label], the top-k test) in one pass;
a single-thread kernel sums the rows in order (batch-sized loops, deterministic), so a loss
costs two launches and no host round trip. Labels of any integer or float type (Caffe's data
layers write floats) are read as int64, as on the CPU. A label out of range is not checked on
the host, which would stall the device every step: the kernel flags it and the backend
raises the CPU's error at the next fetch (netrun.backends.cuda.checks); the row
itself then counts for nothing.
"""
from __future__ import annotations

import numpy as np

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
from netrun.core.schema import TensorSpec
from netrun.ops.labels import NO_IGNORE, coerce_2d
from netrun.ops.loss import LOG_THRESHOLD

LABELS = ("int", "long long", "float", "double")

SOURCE = KernelSource("softmax_loss", r"""
// The label of row i as an index: `safe` (0 where ignored or bad) and whether it counts.
// A bad label (outside [0, d) and not ignored) is written to the flag buffer.
template <typename L>
__device__ __forceinline__ long long read_label(const L* labels, long long i, int d,
                                                long long ignore, int use_ignore,
                                                long long* flag, int slot, bool* counts) {
  long long lab = (long long)labels[i];
  bool valid = !use_ignore || lab != ignore;
  bool bad = valid && (lab < 0 || lab >= d);
  if (bad) {
    flag[0] = 1;
    flag[1] = lab;
    flag[2] = slot;
  }
  *counts = valid && !bad;
  return *counts ? lab : 0;
}

// Per row: p = softmax(x); nll = w · (log Σ exp(x − max) + max − x[label]); wrow = w.
template <typename T, typename L>
__global__ void softmax_loss_rows(const T* x, const L* labels, const T* weights, T* p, T* nll,
                                  T* wrow, long long n, int d, long long ignore,
                                  int use_ignore, int has_weights, long long* flag, int slot) {
  KERNEL_LOOP(i, n) {
    const T* xi = x + i * d;
    T* pi = p + i * d;
    T m = xi[0];
    for (int j = 1; j < d; ++j) m = xi[j] > m ? xi[j] : m;
    T s = (T)0;
    for (int j = 0; j < d; ++j) {
      T e = exp(xi[j] - m);
      pi[j] = e;
      s += e;
    }
    for (int j = 0; j < d; ++j) pi[j] = pi[j] / s;
    bool counts;
    long long lab = read_label(labels, i, d, ignore, use_ignore, flag, slot, &counts);
    T loss = log(s) + m - xi[lab];
    T w = counts ? (has_weights ? weights[i] : (T)1) : (T)0;
    nll[i] = w * loss;
    wrow[i] = w;
  }
}

// loss = scale · Σ nll / (Σ w, or 1 when nothing counts; n when by_weights = 0). One thread.
template <typename T>
__global__ void softmax_loss_total(const T* nll, const T* wrow, T* loss, long long n, T scale,
                                   int by_weights) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  T total = (T)0;
  for (long long i = 0; i < n; ++i) total += nll[i];
  T norm = (T)n;
  if (by_weights) {
    norm = (T)0;
    for (long long i = 0; i < n; ++i) norm += wrow[i];
    norm = norm > (T)0 ? norm : (T)1;
  }
  loss[0] = scale * total / norm;
}

// norm = Σ w over counted rows (1 when nothing counts; n when by_weights = 0). One thread.
template <typename T, typename L>
__global__ void label_weight_total(const L* labels, const T* weights, T* norm, long long n,
                                   int d, long long ignore, int use_ignore, int has_weights,
                                   int by_weights, long long* flag, int slot) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (!by_weights) {
    norm[0] = (T)n;
    return;
  }
  T total = (T)0;
  for (long long i = 0; i < n; ++i) {
    bool counts;
    read_label(labels, i, d, ignore, use_ignore, flag, slot, &counts);
    if (counts) total += has_weights ? weights[i] : (T)1;
  }
  norm[0] = total > (T)0 ? total : (T)1;
}

// dx = (p − onehot(label)) · w · scale · dloss / norm, one thread per element.
template <typename T, typename L>
__global__ void softmax_loss_grad(const T* p, const L* labels, const T* weights,
                                  const T* dloss, const T* norm, T* dx, long long total, int d,
                                  long long ignore, int use_ignore, int has_weights,
                                  int by_weights, T scale, long long* flag, int slot) {
  KERNEL_LOOP(k, total) {
    long long i = k / d;
    int j = (int)(k % d);
    bool counts;
    long long lab = read_label(labels, i, d, ignore, use_ignore, flag, slot, &counts);
    T coef = scale * dloss[0] / norm[0];
    if (by_weights) coef = (counts ? (has_weights ? weights[i] : (T)1) : (T)0) * coef;
    T v = j == lab ? p[k] - (T)1 : p[k];
    dx[k] = v * coef;
  }
}

// y = −log(max(x[label], threshold)) per row (NaN stays NaN).
template <typename T, typename L>
__global__ void label_xent_forward(const T* x, const L* labels, T* y, long long n, int d,
                                   T threshold, long long* flag, int slot) {
  KERNEL_LOOP(i, n) {
    bool counts;
    long long lab = read_label(labels, i, d, -1, 0, flag, slot, &counts);
    T p = x[i * d + lab];
    p = (p != p || p > threshold) ? p : threshold;
    y[i] = -log(p);
  }
}

// dx = −dy / max(x[label], threshold) at the label, 0 elsewhere.
template <typename T, typename L>
__global__ void label_xent_grad(const T* x, const L* labels, const T* dy, T* dx,
                                long long total, int d, T threshold, long long* flag,
                                int slot) {
  KERNEL_LOOP(k, total) {
    long long i = k / d;
    int j = (int)(k % d);
    bool counts;
    long long lab = read_label(labels, i, d, -1, 0, flag, slot, &counts);
    T p = x[i * d + lab];
    p = (p != p || p > threshold) ? p : threshold;
    dx[k] = j == lab ? -dy[i] / p : (T)0;
  }
}

// Per row: hit = fewer than top_k classes score strictly higher than the label (Caffe).
template <typename T, typename L>
__global__ void accuracy_rows(const T* x, const L* labels, float* hits, float* counted,
                              long long n, int d, int top_k, long long ignore, int use_ignore,
                              long long* flag, int slot) {
  KERNEL_LOOP(i, n) {
    bool counts;
    long long lab = read_label(labels, i, d, ignore, use_ignore, flag, slot, &counts);
    const T* xi = x + i * d;
    T score = xi[lab];
    int better = 0;
    // A row with a NaN or infinite score is a miss, as on the CPU (NaN compares false, so it
    // would otherwise count as a hit). v - v is 0 exactly for finite v and NaN otherwise:
    // no isfinite needed, so NVRTC and the host emulator compile the same code.
    bool finite = true;
    for (int j = 0; j < d; ++j) {
      T v = xi[j];
      better += v > score;
      finite = finite && (v - v == (T)0);
    }
    hits[i] = (counts && finite && better < top_k) ? 1.0f : 0.0f;
    counted[i] = counts ? 1.0f : 0.0f;
  }
}

// accuracy = Σ hits / max(Σ counted, 1) (0 for an empty batch). One thread.
__global__ void accuracy_total(const float* hits, const float* counted, float* out,
                               long long n) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double h = 0.0, c = 0.0;
  for (long long i = 0; i < n; ++i) {
    h += hits[i];
    c += counted[i];
  }
  out[0] = (float)(h / (c > 1.0 ? c : 1.0));
}
""", instances("softmax_loss_rows", REALS, LABELS) + instances("softmax_loss_total", REALS)
     + instances("label_weight_total", REALS, LABELS)
     + instances("softmax_loss_grad", REALS, LABELS)
     + instances("label_xent_forward", REALS, LABELS)
     + instances("label_xent_grad", REALS, LABELS) + instances("accuracy_rows", REALS, LABELS)
     + ["accuracy_total"])


def _labels(xp, labels, n: int):
    """Labels as a contiguous (N,) array of a type the kernels read."""
    lab = contiguous(xp, labels).reshape(n)
    if lab.dtype.name not in ("int32", "int64", "float32", "float64"):
        lab = lab.astype(np.int64)
    return lab


def _flag(ctx, d: int):
    """(flag buffer, slot) of this op's label check for d classes."""
    label = ctx.def_.label
    return ctx.backend.checks.flag(
        (label, d), lambda value: f"op {label}: label {value} is outside [0, {d}) "
                                  f"(X has {d} classes)")


def _ignore(ctx) -> tuple:
    ignore = ctx.args.ignore_label
    return i64(ignore), i32(ignore != NO_IGNORE)


def _weights(xp, weights, n: int, dtype):
    if weights is None:
        return None
    return contiguous(xp, weights).reshape(n).astype(dtype, copy=False)


@register_kernel("SoftmaxWithLoss", backend="gpu")
def softmax_with_loss(ctx, X, labels, weights=None):
    """P = softmax(X); loss = scale · Σ w·nll / Σ w (Caffe's VALID normalization)."""
    xp, a = ctx.xp, ctx.args
    n, d = coerce_2d("SoftmaxWithLoss", TensorSpec(X.shape), a.axis)
    x, lab = contiguous(xp, X), _labels(xp, labels, n)
    w = _weights(xp, weights, n, X.dtype)
    P = ctx.output(0, X.shape, X.dtype)
    nll = ctx.scratch("loss.rows", (2, n), X.dtype)
    flag, slot = _flag(ctx, d)
    ignore, use_ignore = _ignore(ctx)
    launch(SOURCE.function(xp, "softmax_loss_rows", X.dtype, lab.dtype), n,
           (x, lab, x if w is None else w, P, nll[0], nll[1], i64(n), i32(d), ignore,
            use_ignore, i32(w is not None), flag, slot))
    loss = ctx.output(1, (), X.dtype)
    by_weights = w is not None or bool(use_ignore)
    SOURCE.function(xp, "softmax_loss_total", X.dtype)(
        (1,), (1,), (nll[0], nll[1], loss, i64(n), real(X.dtype, a.scale), i32(by_weights)))


@register_kernel("SoftmaxWithLossGradient", backend="gpu")
def softmax_with_loss_gradient(ctx, P, labels, *rest):
    """dX = scale · dloss · w_i (P − onehot(label)) / Σ w."""
    xp, a = ctx.xp, ctx.args
    weights, dloss = rest if len(rest) == 2 else (None, rest[0])
    n, d = coerce_2d("SoftmaxWithLossGradient", TensorSpec(P.shape), a.axis)
    p, lab = contiguous(xp, P), _labels(xp, labels, n)
    w = _weights(xp, weights, n, P.dtype)
    dl = contiguous(xp, dloss).reshape(1).astype(P.dtype, copy=False)
    flag, slot = _flag(ctx, d)
    ignore, use_ignore = _ignore(ctx)
    by_weights = i32(w is not None or bool(use_ignore))
    has_weights = i32(w is not None)
    norm = ctx.scratch("loss.norm", (1,), P.dtype)
    SOURCE.function(xp, "label_weight_total", P.dtype, lab.dtype)(
        (1,), (1,), (lab, p if w is None else w, norm, i64(n), i32(d), ignore, use_ignore,
                     has_weights, by_weights, flag, slot))
    dX = ctx.output(0, P.shape, P.dtype)
    launch(SOURCE.function(xp, "softmax_loss_grad", P.dtype, lab.dtype), P.size,
           (p, lab, p if w is None else w, dl, norm, dX, i64(P.size), i32(d), ignore,
            use_ignore, has_weights, by_weights, real(P.dtype, a.scale), flag, slot))


@register_kernel("LabelCrossEntropy", backend="gpu")
def label_cross_entropy(ctx, X, labels):
    """Y_i = −log(max(X_i[label_i], 1e-20))."""
    xp = ctx.xp
    n, d = X.shape
    lab = _labels(xp, labels, n)
    Y = ctx.output(0, (n,), X.dtype)
    flag, slot = _flag(ctx, d)
    launch(SOURCE.function(xp, "label_xent_forward", X.dtype, lab.dtype), n,
           (contiguous(xp, X), lab, Y, i64(n), i32(d), real(X.dtype, LOG_THRESHOLD), flag, slot))


@register_kernel("LabelCrossEntropyGradient", backend="gpu")
def label_cross_entropy_gradient(ctx, X, labels, dY):
    """dX_i[label_i] = −dY_i / max(X_i[label_i], 1e-20), zero elsewhere."""
    xp = ctx.xp
    n, d = X.shape
    lab = _labels(xp, labels, n)
    dX = ctx.output(0, X.shape, X.dtype)
    flag, slot = _flag(ctx, d)
    launch(SOURCE.function(xp, "label_xent_grad", X.dtype, lab.dtype), X.size,
           (contiguous(xp, X), lab, contiguous(xp, dY).astype(X.dtype, copy=False), dX,
            i64(X.size), i32(d), real(X.dtype, LOG_THRESHOLD), flag, slot))


@register_kernel("Accuracy", backend="gpu")
def accuracy(ctx, X, labels):
    """Fraction of counted examples whose label is among the top_k scores (ties count)."""
    xp, a = ctx.xp, ctx.args
    n, d = coerce_2d("Accuracy", TensorSpec(X.shape), 1)
    if a.top_k > d:
        raise ValueError(f"top_k is {a.top_k} but X has only {d} classes")
    lab = _labels(xp, labels, n)
    rows = ctx.scratch("metrics.rows", (2, max(n, 1)), "float32")
    flag, slot = _flag(ctx, d)
    ignore, use_ignore = _ignore(ctx)
    launch(SOURCE.function(xp, "accuracy_rows", X.dtype, lab.dtype), n,
           (contiguous(xp, X).reshape(n, d), lab, rows[0], rows[1], i64(n), i32(d),
            i32(a.top_k), ignore, use_ignore, flag, slot))
    out = ctx.output(0, (), "float32")
    SOURCE.function(xp, "accuracy_total")((1,), (1,), (rows[0], rows[1], out, i64(n)))
