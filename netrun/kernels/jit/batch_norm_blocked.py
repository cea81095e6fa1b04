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


@kernel
def _tile(v, cb, n, out):
    """out[j] = v[cb, j % B] for j in 0:n: channel cb·B + b's value at every position of a
    lane block, so the loops below read x and the vector side by side (and vectorize)."""
    b_n = U(v.shape[1])
    for j in range(U(n)):
        out[j] = v[cb, j % b_n]


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
    tile = np.empty(step)
    sums[:] = 0.0
    for cb in range(cb_n):
        _tile(shift, cb, step, tile)
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
    tm, tk, tb = np.empty(step, x.dtype), np.empty(step, x.dtype), np.empty(step, x.dtype)
    zero = x.dtype.type(0)
    for cb in range(cb_n):
        _tile(mean, cb, step, tm)
        _tile(k, cb, step, tk)
        _tile(bias, cb, step, tb)
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
    tile = np.empty(step, mean.dtype)
    sums[:] = 0.0
    for cb in range(cb_n):
        _tile(mean, cb, step, tile)
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
    tm, ta = np.empty(step, x.dtype), np.empty(step, x.dtype)
    tb, tk = np.empty(step, x.dtype), np.empty(step, x.dtype)
    one, zero = x.dtype.type(1), x.dtype.type(0)
    for cb in range(cb_n):
        _tile(mean, cb, step, tm)
        _tile(a, cb, step, ta)
        _tile(b_, cb, step, tb)
        _tile(k, cb, step, tk)
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
