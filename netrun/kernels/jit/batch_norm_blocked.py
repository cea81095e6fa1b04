"""Compiled batch normalization on channel-blocked arrays (oneDNN's N × C/B × H × W × B, the
layout a training net keeps between its convolutions: netrun.rewrite.layout).

Arrays are seen as (outer, C/B, P·B): P = H·W positions, each with B consecutive channels;
per-channel vectors as (C/B, B). A call gets one chunk of the outer axis. The loops run
along a block's P·B values as they lie in memory, beside the block's vectors tiled to the
same length (one lane block's worth), so LLVM vectorizes them as it does the NCHW rows.

Per-channel sums are in float64 and ordered as in netrun.kernels.jit.batch_norm: every
(position, channel) lane adds its column over the chunk's rows in row order, a block of
LANE_BLOCK positions at a time, then each channel adds its lanes in position order. Here
that fold runs over the B channels of a position at once (B independent sums), where the
NCHW kernels fold one channel's lanes serially. The bits depend on the chunk only.
"""
from __future__ import annotations

import functools

import numpy as np

import netrun.kernels.jit as jit
from netrun.kernels.jit import kernel, team_kernel

U = np.uint64
# positions per lane block: 2 lanes × 128 positions × 8 channels of float64 = 16 KiB (L1)
LANE_BLOCK = 128


@functools.cache
def prepare(dtype: str = "float32") -> None:
    """Compile (or load from Numba's disk cache) every kernel here for `dtype` arrays."""
    x4, v2, lanes, sums = f"{dtype}[:, :, ::1]", f"{dtype}[:, ::1]", "float64[:, ::1]", \
        "float64[:, :, ::1]"
    stats.prepare(f"void({x4}, float64[:, ::1], {lanes}, {sums})")
    normalize.prepare(f"void({x4}, {v2}, {v2}, {v2}, {x4}, boolean)")
    gradient_sums.prepare(f"void({x4}, {v2}, {x4}, {x4}, boolean, {lanes}, {sums})")
    gradient_input.prepare(f"void({x4}, {v2}, {x4}, {x4}, boolean, {v2}, {v2}, {v2}, "
                           f"boolean, {x4})")


@functools.cache
def prepare_team(dtype: str = "float32") -> None:
    """Compile (or load) the team forms (`*_team`) for `dtype` arrays."""
    x4, v2 = f"{dtype}[:, :, ::1]", f"{dtype}[:, ::1]"
    lanes4, sums4 = "float64[:, :, ::1]", "float64[:, :, :, ::1]"
    team = "int64, int64[::1]"
    stats_team.prepare(f"void({team}, {x4}, float64[:, ::1], {lanes4}, {sums4})")
    normalize_team.prepare(f"void({team}, {x4}, {v2}, {v2}, {v2}, {x4}, boolean)")
    gradient_sums_team.prepare(f"void({team}, {x4}, {v2}, {x4}, {x4}, boolean, {lanes4}, "
                               f"{sums4})")
    gradient_input_team.prepare(f"void({team}, {x4}, {v2}, {x4}, {x4}, boolean, {v2}, {v2}, "
                                f"{v2}, boolean, {x4})")
    f64 = "float64[:, ::1]"
    forward_train.prepare(f"void({team}, {x4}, {f64}, {lanes4}, {sums4}, int64, float64, "
                          f"float64, {v2}, {v2}, {v2}, {v2}, boolean, {x4}, {v2}, {v2}, {v2}, "
                          f"{v2}, {v2}, {v2})")
    backward_train.prepare(f"void({team}, {x4}, {v2}, {x4}, {x4}, boolean, {lanes4}, {sums4}, "
                           f"int64, {v2}, {v2}, {v2}, {v2}, {v2}, {v2}, {v2}, {x4})")


@kernel
def _tile(v, cb, n, out):
    """out[p·B + b] = v[cb, b] for the n // B positions of a lane block: channel cb·B + b's
    value at every position, so the loops below read x and the vector side by side (and
    vectorize). n is the part the block's loops read (a lane block, or P·B when shorter):
    three or four tiles per channel block made whole, with a division per value, cost more
    than the pass itself on ResNet-20's 8×8 layers (60 against 8 µs for a copy)."""
    b_n = U(v.shape[1])
    for p in range(U(n) // b_n):
        for b in range(b_n):
            out[p * b_n + b] = v[cb, b]


@kernel
def _zero(lanes, n):
    """lanes[:, :n] = 0."""
    for j in range(U(n)):
        lanes[0, j] = 0.0
        lanes[1, j] = 0.0


@kernel
def _fold(lanes, n, b_n, cb, sums):
    """sums[:, cb, b] += lanes[:, p·B + b] for p in 0:n, in position order, B channels at a
    time."""
    for p in range(U(n)):
        for b in range(U(b_n)):
            sums[0, cb, b] += lanes[0, p * b_n + b]
            sums[1, cb, b] += lanes[1, p * b_n + b]


@kernel
def stats(x, shift, lanes, sums):
    """sums[0, cb, b] = Σ (x − shift), sums[1, cb, b] = Σ (x − shift)² over the chunk x
    (outer, C/B, P·B), in float64; lanes (2, LANE_BLOCK·B) float64 is scratch; shift is
    (C/B, B)."""
    o_n, cb_n, pb_n, b_n = U(x.shape[0]), U(x.shape[1]), U(x.shape[2]), U(shift.shape[1])
    step = U(LANE_BLOCK) * b_n
    span = min(step, pb_n)
    tile = np.empty(step)
    sums[:] = 0.0
    for cb in range(cb_n):
        _tile(shift, cb, span, tile)
        for j0 in range(U(0), pb_n, step):
            j1 = min(j0 + step, pb_n)
            _zero(lanes, j1 - j0)
            for o in range(o_n):
                for j in range(j0, j1):
                    d = np.float64(x[o, cb, j]) - tile[j - j0]
                    lanes[0, j - j0] += d
                    lanes[1, j - j0] += d * d
            _fold(lanes, (j1 - j0) // b_n, b_n, cb, sums)


@kernel
def normalize(x, mean, k, bias, y, relu):
    """y = (x − mean)·k + bias per channel, then max(y, 0) if relu (x's dtype); x and y
    (outer, C/B, P·B), the vectors (C/B, B)."""
    o_n, cb_n, pb_n, b_n = U(x.shape[0]), U(x.shape[1]), U(x.shape[2]), U(mean.shape[1])
    step = U(LANE_BLOCK) * b_n
    span = min(step, pb_n)
    tm, tk, tb = np.empty(step, x.dtype), np.empty(step, x.dtype), np.empty(step, x.dtype)
    zero = x.dtype.type(0)
    for cb in range(cb_n):
        _tile(mean, cb, span, tm)
        _tile(k, cb, span, tk)
        _tile(bias, cb, span, tb)
        for o in range(o_n):
            for j0 in range(U(0), pb_n, step):
                j1 = min(j0 + step, pb_n)
                if relu:
                    for j in range(j0, j1):
                        v = (x[o, cb, j] - tm[j - j0]) * tk[j - j0] + tb[j - j0]
                        # `not v <= 0` keeps NaN, as np.maximum does
                        y[o, cb, j] = v if not v <= zero else zero
                else:
                    for j in range(j0, j1):
                        y[o, cb, j] = (x[o, cb, j] - tm[j - j0]) * tk[j - j0] + tb[j - j0]


@kernel
def gradient_sums(x, mean, dy, y, relu, lanes, sums):
    """sums[0, cb, b] = Σ g, sums[1, cb, b] = Σ (x − mean)·g in float64, g = dy, or
    dy·(y > 0) if relu; lanes (2, LANE_BLOCK·B) float64 is scratch."""
    o_n, cb_n, pb_n, b_n = U(x.shape[0]), U(x.shape[1]), U(x.shape[2]), U(mean.shape[1])
    step = U(LANE_BLOCK) * b_n
    span = min(step, pb_n)
    tile = np.empty(step, mean.dtype)
    sums[:] = 0.0
    for cb in range(cb_n):
        _tile(mean, cb, span, tile)
        for j0 in range(U(0), pb_n, step):
            j1 = min(j0 + step, pb_n)
            _zero(lanes, j1 - j0)
            for o in range(o_n):
                if relu:
                    for j in range(j0, j1):
                        g = np.float64(dy[o, cb, j]) * (1.0 if y[o, cb, j] > 0 else 0.0)
                        lanes[0, j - j0] += g
                        lanes[1, j - j0] += (np.float64(x[o, cb, j])
                                             - np.float64(tile[j - j0])) * g
                else:
                    for j in range(j0, j1):
                        g = np.float64(dy[o, cb, j])
                        lanes[0, j - j0] += g
                        lanes[1, j - j0] += (np.float64(x[o, cb, j])
                                             - np.float64(tile[j - j0])) * g
            _fold(lanes, (j1 - j0) // b_n, b_n, cb, sums)


@kernel
def gradient_input(x, mean, dy, y, relu, a, b_, k, is_test, dx):
    """dx = ((g − (x − mean)·a) − b)·k per channel, or g·k if is_test; g as in
    gradient_sums (x's dtype)."""
    o_n, cb_n, pb_n, b_n = U(x.shape[0]), U(x.shape[1]), U(x.shape[2]), U(mean.shape[1])
    step = U(LANE_BLOCK) * b_n
    span = min(step, pb_n)
    tm, ta = np.empty(step, x.dtype), np.empty(step, x.dtype)
    tb, tk = np.empty(step, x.dtype), np.empty(step, x.dtype)
    one, zero = x.dtype.type(1), x.dtype.type(0)
    for cb in range(cb_n):
        _tile(mean, cb, span, tm)
        _tile(a, cb, span, ta)
        _tile(b_, cb, span, tb)
        _tile(k, cb, span, tk)
        for o in range(o_n):
            for j0 in range(U(0), pb_n, step):
                j1 = min(j0 + step, pb_n)
                for j in range(j0, j1):
                    g = dy[o, cb, j]
                    if relu:
                        g = g * (one if y[o, cb, j] > zero else zero)
                    t = j - j0
                    if is_test:
                        dx[o, cb, j] = g * tk[t]
                    else:
                        dx[o, cb, j] = ((g - (x[o, cb, j] - tm[t]) * ta[t]) - tb[t]) * tk[t]


# Team forms, as in netrun.kernels.jit.batch_norm: slot w runs chunks w, w + slots, ... with
# slot w's lanes; per-chunk sums go to sums[c] for the caller to add in chunk order.
@team_kernel
def stats_team(slots, starts, x, shift, lanes, sums):
    """`stats` of chunk c into sums[c] (lanes: (slots, 2, LANE_BLOCK·B))."""
    for w in jit.prange(slots):
        for c in range(w, starts.shape[0] - 1, slots):
            stats(x[starts[c]:starts[c + 1]], shift, lanes[w], sums[c])


@team_kernel
def normalize_team(slots, starts, x, mean, k, bias, y, relu):
    """`normalize` chunk by chunk."""
    for w in jit.prange(slots):
        for c in range(w, starts.shape[0] - 1, slots):
            a, b = starts[c], starts[c + 1]
            normalize(x[a:b], mean, k, bias, y[a:b], relu)


@team_kernel
def gradient_sums_team(slots, starts, x, mean, dy, y, relu, lanes, sums):
    """`gradient_sums` of chunk c into sums[c]."""
    for w in jit.prange(slots):
        for c in range(w, starts.shape[0] - 1, slots):
            a, b = starts[c], starts[c + 1]
            gradient_sums(x[a:b], mean, dy[a:b], y[a:b], relu, lanes[w], sums[c])


@team_kernel
def gradient_input_team(slots, starts, x, mean, dy, y, relu, a_, b_, k, is_test, dx):
    """`gradient_input` chunk by chunk."""
    for w in jit.prange(slots):
        for c in range(w, starts.shape[0] - 1, slots):
            a, b = starts[c], starts[c + 1]
            gradient_input(x[a:b], mean, dy[a:b], y[a:b], relu, a_, b_, k, is_test, dx[a:b])


# Whole training passes, one team call each: the statistics' pass, the per-channel terms
# between (what netrun.ops.norm computes in NumPy, the same float64 operations in the same
# order, so the same bits), then the normalizing pass. On ResNet-20's 8×8 and 16×16 layers
# at batch 32, the per-pass Python and per-channel NumPy calls (~30 µs a pass and ~25 µs of
# terms) cost more than the passes' arithmetic.
@team_kernel
def forward_train(slots, starts, x, shift, lanes, parts, m, eps, momentum, scale, bias,
                  running_mean, running_var, relu, y, mean, k, new_mean, new_var, saved_mean,
                  saved_inv_std):
    """SpatialBN's training forward on chunks starts[c]:starts[c+1] of x (outer, C/B, P·B):
    each chunk's sums into parts[c] (slot w's lanes), the terms (`_forward_terms`; new_mean
    and new_var may be the running statistics themselves), then y = (x − mean)·k + bias
    (max(·, 0) if relu). Vectors are (C/B, B); shift, mean and k are scratch."""
    n_chunks = starts.shape[0] - 1
    b_n = shift.shape[1]
    for cb in range(shift.shape[0]):   # any value of each channel: its first (as batch_stats)
        for b in range(b_n):
            shift[cb, b] = np.float64(x[0, cb, b])
    for w in jit.prange(slots):
        for c in range(w, n_chunks, slots):
            stats(x[starts[c]:starts[c + 1]], shift, lanes[w], parts[c])
    _forward_terms(parts, shift, m, eps, momentum, scale, running_mean, running_var, mean, k,
                   new_mean, new_var, saved_mean, saved_inv_std)
    for w in jit.prange(slots):
        for c in range(w, n_chunks, slots):
            a, b = starts[c], starts[c + 1]
            normalize(x[a:b], mean, k, bias, y[a:b], relu)


@kernel
def _chunk_sums(parts, cb, b):
    """Channel (cb, b)'s two sums over the chunks, added in chunk order from 0 (as the
    callers of the separate passes add them)."""
    s0 = 0.0
    s1 = 0.0
    for c in range(parts.shape[0]):
        s0 += parts[c, 0, cb, b]
        s1 += parts[c, 1, cb, b]
    return s0, s1


@kernel
def _forward_terms(parts, shift, m, eps, momentum, scale, running_mean, running_var, mean, k,
                   new_mean, new_var, saved_mean, saved_inv_std):
    """The chunks' sums added in chunk order, then per channel (as netrun.ops.norm does in
    NumPy): μ, σ² (shifted, two terms), inv_std = 1/√(σ² + ε), k = scale·inv_std, and the
    running statistics r ← momentum·r + (1 − momentum)·batch (σ² unbiased); momentum·r is
    a product in r's dtype, as NumPy makes it with a Python float."""
    mom = running_mean.dtype.type(momentum)
    rest = 1.0 - momentum
    unbias = m / (m - 1)
    for cb in range(parts.shape[2]):
        for b in range(parts.shape[3]):
            s0, s1 = _chunk_sums(parts, cb, b)
            shifted = s0 / m
            v = s1 / m - shifted * shifted
            var = v if (v >= 0.0 or v != v) else 0.0   # np.maximum(v, 0): NaN stays
            mu = shifted + shift[cb, b]
            inv_std = 1.0 / np.sqrt(var + eps)
            mean[cb, b] = mu
            k[cb, b] = np.float64(scale[cb, b]) * inv_std
            saved_mean[cb, b] = mu
            saved_inv_std[cb, b] = inv_std
            r_mean = np.float64(mom * running_mean[cb, b]) + rest * mu
            r_var = np.float64(mom * running_var[cb, b]) + rest * var * unbias
            new_mean[cb, b] = r_mean
            new_var[cb, b] = r_var


@team_kernel
def backward_train(slots, starts, x, mean, dy, y, relu, lanes, parts, m, scale, inv_std,
                   dscale, dbias, a_, b_, k, dx):
    """SpatialBNGradient's training pass on chunks of x, dy (and y: the ReLU's mask if relu,
    else dy again): each chunk's gradient sums into parts[c], the terms
    (`_backward_terms`), then dx. Vectors are (C/B, B); a_, b_ and k are scratch."""
    n_chunks = starts.shape[0] - 1
    for w in jit.prange(slots):
        for c in range(w, n_chunks, slots):
            a, b = starts[c], starts[c + 1]
            gradient_sums(x[a:b], mean, dy[a:b], y[a:b], relu, lanes[w], parts[c])
    _backward_terms(parts, m, scale, inv_std, dscale, dbias, a_, b_, k)
    for w in jit.prange(slots):
        for c in range(w, n_chunks, slots):
            a, b = starts[c], starts[c + 1]
            gradient_input(x[a:b], mean, dy[a:b], y[a:b], relu, a_, b_, k, False, dx[a:b])


@kernel
def _backward_terms(parts, m, scale, inv_std, dscale, dbias, a_, b_, k):
    """The chunks' sums added in chunk order, then per channel (as netrun.ops.norm does):
    dbias = Σ g, dscale = Σ (x − μ)·g · inv_std, a = inv_std·dscale/M, b = dbias/M and
    k = scale·inv_std (a product in the vectors' dtype)."""
    for cb in range(parts.shape[2]):
        for b in range(parts.shape[3]):
            s0, s1 = _chunk_sums(parts, cb, b)
            ds = s1 * np.float64(inv_std[cb, b])
            dscale[cb, b] = ds
            dbias[cb, b] = s0
            a_[cb, b] = np.float64(inv_std[cb, b]) * ds / m
            b_[cb, b] = s0 / m
            k[cb, b] = scale[cb, b] * inv_std[cb, b]
