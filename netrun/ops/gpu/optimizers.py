"""Update ops on the GPU, each fused into one kernel; LearningRate computed on the device.

The array-module kernels take 4–12 passes over memory per update and read the iteration on
the host (a device sync per step). Here every update is one pass, one thread per element,
evaluating the NumPy kernel's expression in its order (no fused multiply-adds), and
LearningRate and Adam read the iteration counter where it lives, on the device, so a
training step never waits for the GPU. In-place outputs may alias their inputs: each
thread reads its element before writing it. Mixed dtypes fall back to the array-module
kernels.
"""
from __future__ import annotations

import numpy as np

from netrun.backends.cuda.source import (
    INDICES,
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
from netrun.ops import optimizers
from netrun.ops import solver_ops as optim_ops
from netrun.ops.lr_policy import POLICIES

SOURCE = KernelSource("optim", r"""
// The positive rate base_lr · policy(it) · warmup(it) (netrun.ops.lr_policy), negated.
template <typename I>
__global__ void learning_rate(const I* iteration, float* out, int policy, double base_lr,
                              double gamma, long long stepsize, const long long* stepvalues,
                              int n_steps, double power, long long max_iter,
                              long long warmup_iters, double warmup_start) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  long long k = (long long)iteration[0];
  double t = (double)k;
  double f = 1.0;
  if (policy == 1) {                    // step: gamma^floor(it / stepsize)
    long long q = k / stepsize;
    if (k % stepsize != 0 && ((k < 0) != (stepsize < 0))) q -= 1;
    f = pow(gamma, (double)q);
  } else if (policy == 2) {             // multistep: gamma^#(stepvalues <= it)
    int count = 0;
    for (int j = 0; j < n_steps; ++j) count += stepvalues[j] <= k;
    f = pow(gamma, (double)count);
  } else if (policy == 3) {             // exp
    f = pow(gamma, t);
  } else if (policy == 4) {             // inv
    f = pow(1.0 + gamma * t, -power);
  } else if (policy == 5) {             // poly, clamped at 0 past max_iter
    double base = 1.0 - t / (double)max_iter;
    f = pow(base > 0.0 ? base : 0.0, power);
  } else if (policy == 6) {             // sigmoid, without overflow
    double z = -gamma * (double)(k - stepsize);
    if (z > 0.0) {
      double e = exp(-z);
      f = e / (1.0 + e);
    } else {
      f = 1.0 / (1.0 + exp(z));
    }
  }
  double warm = 1.0;
  if (k < warmup_iters) warm = warmup_start + (1.0 - warmup_start) * t / (double)warmup_iters;
  out[0] = (float)(-(base_lr * (f * warm)));
}

// m = mu·m + lr·g; step = m (Nesterov: lr·g + mu·m); p += step; g = step.
template <typename T>
__global__ void momentum_sgd(const T* g, const T* m, const T* lr, const T* p, T* ng, T* nm,
                             T* np, long long n, T mu, int nesterov) {
  KERNEL_LOOP(i, n) {
    T step = g[i] * lr[0];
    T mom = m[i] * mu;
    mom = mom + step;
    T out = nesterov ? step + mom * mu : mom;
    nm[i] = mom;
    ng[i] = out;
    np[i] = p[i] + out;
  }
}

// Caffe2's Adam, t = it + 1: m1, m2 moving moments; p += lr·corr(t)·m1 / (√m2 + eps).
template <typename T, typename I>
__global__ void adam(const T* p, const T* m1, const T* m2, const T* g, const T* lr,
                     const I* iteration, T* np, T* nm1, T* nm2, long long n, T b1,
                     T one_minus_b1, T b2, T one_minus_b2, T eps, double b1d, double b2d) {
  double t = (double)((long long)iteration[0] + 1);
  T lrc = lr[0] * (T)(sqrt(1.0 - pow(b2d, t)) / (1.0 - pow(b1d, t)));
  KERNEL_LOOP(i, n) {
    T gi = g[i];
    T v1 = m1[i] * b1;
    v1 = v1 + gi * one_minus_b1;
    T sq = gi * gi;
    sq = sq * one_minus_b2;
    T v2 = m2[i] * b2;
    v2 = v2 + sq;
    T d = sqrt(v2) + eps;
    d = v1 / d;
    nm1[i] = v1;
    nm2[i] = v2;
    np[i] = p[i] + d * lrc;
  }
}

// h = decay·h + g²; p += lr·g / (√h + eps).
template <typename T>
__global__ void adagrad(const T* p, const T* h, const T* g, const T* lr, T* np, T* nh,
                        long long n, T eps, T decay) {
  KERNEL_LOOP(i, n) {
    T gi = g[i];
    T acc = h[i] * decay;
    acc = acc + gi * gi;
    T d = sqrt(acc) + eps;
    d = gi / d;
    nh[i] = acc;
    np[i] = p[i] + d * lr[0];
  }
}

// ms = decay·ms + (1−decay)·g²; mom = momentum·mom + lr·g/√(ms + eps); g = mom; p += mom.
template <typename T>
__global__ void rmsprop(const T* g, const T* ms, const T* mom, const T* lr, const T* p, T* ng,
                        T* nms, T* nmom, T* np, long long n, T decay, T one_minus_decay,
                        T momentum, T eps, int has_param) {
  KERNEL_LOOP(i, n) {
    T gi = g[i];
    T sq = gi * gi;
    sq = sq * one_minus_decay;
    T s = ms[i] * decay;
    s = s + sq;
    T d = sqrt(s + eps);
    d = gi / d;
    d = d * lr[0];
    T v = mom[i] * momentum;
    v = v + d;
    nms[i] = s;
    nmom[i] = v;
    ng[i] = v;
    if (has_param) np[i] = p[i] + v;
  }
}

// y = x0·w0 + x1·w1 (y may be x0).
template <typename T>
__global__ void weighted_sum2(const T* x0, const T* w0, const T* x1, const T* w1, T* y,
                              long long n) {
  KERNEL_LOOP(i, n) {
    T a = x0[i] * w0[0];
    y[i] = a + x1[i] * w1[0];
  }
}
""", instances("learning_rate", INDICES) + instances("momentum_sgd", REALS)
     + instances("adam", REALS, INDICES) + instances("adagrad", REALS)
     + instances("rmsprop", REALS) + instances("weighted_sum2", REALS))


def _flat(xp, a):
    return contiguous(xp, a).reshape(-1)


_REALS = (np.dtype("float32"), np.dtype("float64"))


def _uniform(*arrays) -> bool:
    """All arrays share one float dtype (else the array-module kernel runs)."""
    first = arrays[0].dtype
    return first in _REALS and all(a.dtype == first for a in arrays)


@register_kernel("LearningRate", backend="gpu")
def learning_rate(ctx, it):
    """lr = -base_lr · policy(iter) · warmup(iter) as a float32 scalar, from the device iter."""
    xp = ctx.xp
    policy = ctx.state.get("policy")
    if policy is None:
        policy = ctx.state["policy"] = optim_ops.lr_policy_of(ctx.args)
        steps = np.asarray(policy.stepvalues or (0,), dtype=np.int64)
        ctx.state["stepvalues"] = ctx.backend.to_device(steps)   # once, at the first run
    if it.dtype.name not in ("int32", "int64"):
        return optim_ops.learning_rate(ctx, it)
    out = ctx.output(0, (), "float32")

    def number(value, default=0.0):
        return np.float64(default if value is None else value)

    SOURCE.function(xp, "learning_rate", it.dtype)(
        (1,), (1,), (_flat(xp, it), out, i32(POLICIES.index(policy.type)),
                     np.float64(policy.base_lr), number(policy.gamma),
                     i64(policy.stepsize or 1), ctx.state["stepvalues"],
                     i32(len(policy.stepvalues)), number(policy.power),
                     i64(policy.max_iter or 1), i64(policy.warmup_iters),
                     np.float64(policy.warmup_start)))


@register_kernel("MomentumSGDUpdate", backend="gpu")
def momentum_sgd_update(ctx, g, m, lr, p):
    """Caffe2's momentum SGD (lr folded into the velocity) in one pass."""
    if not _uniform(g, m, lr, p):
        return optimizers.momentum_sgd_update(ctx, g, m, lr, p)
    xp, a, t = ctx.xp, ctx.args, g.dtype
    ng, nm, np_ = optim_ops.outputs_like(ctx, g, m, p)
    launch(SOURCE.function(xp, "momentum_sgd", t), g.size,
           (_flat(xp, g), _flat(xp, m), _flat(xp, lr), _flat(xp, p), ng.reshape(-1),
            nm.reshape(-1), np_.reshape(-1), i64(g.size), real(t, a.momentum),
            i32(a.nesterov)))


@register_kernel("Adam", backend="gpu")
def adam(ctx, p, m1, m2, g, lr, it):
    """Caffe2's Adam in one pass; the bias correction from the device iteration."""
    if not _uniform(p, m1, m2, g, lr) or it.dtype.name not in ("int32", "int64"):
        return optimizers.adam(ctx, p, m1, m2, g, lr, it)
    xp, a, t = ctx.xp, ctx.args, p.dtype
    np_, nm1, nm2 = optim_ops.outputs_like(ctx, p, m1, m2)
    launch(SOURCE.function(xp, "adam", t, it.dtype), p.size,
           (_flat(xp, p), _flat(xp, m1), _flat(xp, m2), _flat(xp, g), _flat(xp, lr),
            _flat(xp, it), np_.reshape(-1), nm1.reshape(-1), nm2.reshape(-1), i64(p.size),
            real(t, a.beta1), real(t, 1.0 - a.beta1), real(t, a.beta2), real(t, 1.0 - a.beta2),
            real(t, a.epsilon), np.float64(a.beta1), np.float64(a.beta2)))


@register_kernel("Adagrad", backend="gpu")
def adagrad(ctx, p, h, g, lr):
    """Caffe2's Adagrad in one pass."""
    if not _uniform(p, h, g, lr):
        return optimizers.adagrad(ctx, p, h, g, lr)
    xp, a, t = ctx.xp, ctx.args, p.dtype
    np_, nh = optim_ops.outputs_like(ctx, p, h)
    launch(SOURCE.function(xp, "adagrad", t), p.size,
           (_flat(xp, p), _flat(xp, h), _flat(xp, g), _flat(xp, lr), np_.reshape(-1),
            nh.reshape(-1), i64(p.size), real(t, a.epsilon), real(t, a.decay)))


@register_kernel("RmsProp", backend="gpu")
def rmsprop(ctx, g, ms, mom, lr, p=None):
    """Caffe2's RmsProp in one pass (param updated too when given)."""
    if not _uniform(g, ms, mom, lr, *(() if p is None else (p,))):
        return optimizers.rmsprop(ctx, g, ms, mom, lr, p)
    xp, a, t = ctx.xp, ctx.args, g.dtype
    ng, nms, nmom = optim_ops.outputs_like(ctx, g, ms, mom)
    np_ = ctx.output(3, p.shape, t).reshape(-1) if p is not None else nmom.reshape(-1)
    launch(SOURCE.function(xp, "rmsprop", t), g.size,
           (_flat(xp, g), _flat(xp, ms), _flat(xp, mom), _flat(xp, lr),
            _flat(xp, mom if p is None else p), ng.reshape(-1), nms.reshape(-1),
            nmom.reshape(-1), np_, i64(g.size), real(t, a.decay), real(t, 1.0 - a.decay),
            real(t, a.momentum), real(t, a.epsilon), i32(p is not None)))


@register_kernel("WeightedSum", backend="gpu")
def weighted_sum(ctx, *inputs):
    """Y = w0·X0 + w1·X1 in one pass (plain SGD); other arities use the array-module kernel."""
    if len(inputs) != 4 or not _uniform(*inputs):
        return optim_ops.weighted_sum(ctx, *inputs)
    xp = ctx.xp
    x0, w0, x1, w1 = inputs
    (Y,) = optim_ops.outputs_like(ctx, x0)
    launch(SOURCE.function(xp, "weighted_sum2", x0.dtype), x0.size,
           (_flat(xp, x0), _flat(xp, w0), _flat(xp, x1), _flat(xp, w1), Y.reshape(-1),
            i64(x0.size)))
