"""Compiled batch normalization and ReLU: one memory pass per step instead of NumPy's five.

Arrays are seen as (outer, C, inner): (N, C, H·W) for NCHW, (N·H·W, C, 1) for NHWC; a call
gets one chunk of the outer axis (netrun.kernels.parallel cuts it). Per-channel sums are
two-level and in float64: every (channel, inner position) has a lane that adds its column
over the chunk's rows in row order (a loop LLVM vectorizes, since no sum is reassociated),
then each channel adds its lanes in order. The bits therefore depend on the chunk only,
never on the loop order or the thread count. The statistics pass sums x − shift and its
square in one pass; the shift (a value of the channel) keeps the variance
E[(x−s)²] − E[x−s]² free of the cancellation that E[x²] − E[x]² suffers when |mean| ≫ std.

`relu` masks multiply (dy·1 or dy·0, as ReluGradient's dY·(Y > 0)), so a NaN gradient
stays NaN whether or not BN and ReLU are fused.

Indices are unsigned (U) so that LLVM vectorizes the inner loops (see netrun.kernels.jit).
"""
from __future__ import annotations

import functools

import numpy as np

import netrun.kernels.jit as jit
from netrun.kernels.jit import kernel, team_kernel

# Both float dtypes: the kernels are small, and float64 lets gradient checks run them too.
DTYPES = (np.dtype("float32"), np.dtype("float64"))
U = np.uint64


# A memo of what is compiled (never changes once done): Numba parses the signatures again
# on every compile() call, 3 ms each time, which an op bound per run would pay.
@functools.cache
def prepare(dtype: str = "float32") -> None:
    """Compile (or load from Numba's disk cache) every kernel here for `dtype` arrays."""
    x3, v, lanes = f"{dtype}[:, :, ::1]", f"{dtype}[::1]", "float64[:, :, ::1]"
    flat, f64v, sums = f"{dtype}[::1]", "float64[::1]", "float64[:, ::1]"
    stats.prepare(f"void({x3}, {f64v}, {lanes}, {sums})")
    normalize.prepare(f"void({x3}, {v}, {v}, {v}, {x3}, boolean)")
    inference.prepare(f"void({x3}, {v}, {v}, {v}, {v}, float64, {x3}, boolean)")
    gradient_sums.prepare(f"void({x3}, {v}, {x3}, {x3}, boolean, {lanes}, {sums})")
    gradient_input.prepare(f"void({x3}, {v}, {x3}, {x3}, boolean, {v}, {v}, {v}, boolean, "
                           f"{x3})")
    relu.prepare(f"void({flat}, {flat})")
    add_relu.prepare(f"void({flat}, {flat}, {flat})")
    relu_gradient.prepare(f"void({flat}, {flat}, {flat})")


@functools.cache
def prepare_team(dtype: str = "float32") -> None:
    """Compile (or load) the team forms of the kernels (`*_team`) for `dtype` arrays."""
    x3, v, lanes4 = f"{dtype}[:, :, ::1]", f"{dtype}[::1]", "float64[:, :, :, ::1]"
    flat, f64v, sums3 = f"{dtype}[::1]", "float64[::1]", "float64[:, :, ::1]"
    team = "int64, int64[::1]"
    stats_team.prepare(f"void({team}, {x3}, {f64v}, {lanes4}, {sums3})")
    normalize_team.prepare(f"void({team}, {x3}, {v}, {v}, {v}, {x3}, boolean)")
    inference_team.prepare(f"void({team}, {x3}, {v}, {v}, {v}, {v}, float64, {x3}, boolean)")
    gradient_sums_team.prepare(f"void({team}, {x3}, {v}, {x3}, {x3}, boolean, {lanes4}, "
                               f"{sums3})")
    gradient_input_team.prepare(f"void({team}, {x3}, {v}, {x3}, {x3}, boolean, {v}, {v}, "
                                f"{v}, boolean, {x3})")
    relu_team.prepare(f"void({team}, {flat}, {flat})")
    add_relu_team.prepare(f"void({team}, {flat}, {flat}, {flat})")
    relu_gradient_team.prepare(f"void({team}, {flat}, {flat}, {flat})")


# Lanes are filled and folded one block of LANE_BLOCK inner positions at a time, each block
# over all the chunk's rows: its lanes (2 × 2 KiB) stay in L1 instead of streaming the whole
# (2, C, inner) array through L2 once per row (the statistics pass at ResNet-20's 32×32
# layers ran 1.8× faster). The order of every sum is unchanged: a lane still adds its column
# in row order and each channel its lanes in position order, block after block. Rows shorter
# than LANE_BLOCK_MIN (NHWC's are one value) keep the row-major walk: a channel-major one
# would stride through the whole chunk once per channel.
LANE_BLOCK = 256
LANE_BLOCK_MIN = 64


@kernel
def _fold_lanes(lanes, sums):
    """sums[k, c] = Σ_i lanes[k, c, i], in order."""
    for k in range(lanes.shape[0]):
        for c in range(lanes.shape[1]):
            s = 0.0
            for i in range(lanes.shape[2]):
                s += lanes[k, c, i]
            sums[k, c] = s


@kernel
def _zero_block(lanes, c, i0, i1):
    """lanes[:, c, i0:i1] = 0."""
    for i in range(i0, i1):
        lanes[0, c, i] = 0.0
        lanes[1, c, i] = 0.0


@kernel
def _fold_block(lanes, c, i0, i1, t0, t1):
    """(t0, t1) plus lanes[0, c, i] and lanes[1, c, i] for i in i0:i1, in order."""
    for i in range(i0, i1):
        t0 += lanes[0, c, i]
        t1 += lanes[1, c, i]
    return t0, t1


@kernel
def stats(x, shift, lanes, sums):
    """sums[0, c] = Σ (x − shift[c]), sums[1, c] = Σ (x − shift[c])² over the chunk x
    (outer, C, inner), in float64; lanes (2, C, inner) float64 is scratch."""
    o_n, c_n, i_n = U(x.shape[0]), U(x.shape[1]), U(x.shape[2])
    if i_n < U(LANE_BLOCK_MIN):
        lanes[:] = 0.0
        for o in range(o_n):
            for c in range(c_n):
                s = shift[c]
                for i in range(i_n):
                    d = np.float64(x[o, c, i]) - s
                    lanes[0, c, i] += d
                    lanes[1, c, i] += d * d
        _fold_lanes(lanes, sums)
        return
    for c in range(c_n):
        s = shift[c]
        t0, t1 = 0.0, 0.0
        for i0 in range(U(0), i_n, U(LANE_BLOCK)):
            i1 = min(i0 + U(LANE_BLOCK), i_n)
            _zero_block(lanes, c, i0, i1)
            for o in range(o_n):
                for i in range(i0, i1):
                    d = np.float64(x[o, c, i]) - s
                    lanes[0, c, i] += d
                    lanes[1, c, i] += d * d
            t0, t1 = _fold_block(lanes, c, i0, i1, t0, t1)
        sums[0, c] = t0
        sums[1, c] = t1


@kernel
def normalize(x, mean, k, bias, y, relu):
    """y = (x − mean[c])·k[c] + bias[c], then max(y, 0) if relu (x's dtype throughout)."""
    o_n, c_n, i_n = U(x.shape[0]), U(x.shape[1]), U(x.shape[2])
    zero = x.dtype.type(0)
    for o in range(o_n):
        for c in range(c_n):
            m, kc, b = mean[c], k[c], bias[c]
            if relu:
                for i in range(i_n):
                    v = (x[o, c, i] - m) * kc + b
                    # `not v <= 0` keeps NaN, as np.maximum does
                    y[o, c, i] = v if not v <= zero else zero
            else:
                for i in range(i_n):
                    y[o, c, i] = (x[o, c, i] - m) * kc + b


@kernel
def inference(x, scale, bias, mean, var, epsilon, y, relu):
    """y = x·s[c] + (bias[c] − mean[c]·s[c]), s = scale/√(var + ε), then max(y, 0) if relu:
    is_test's map, per-channel terms included, in x's dtype (NumPy's rounding: each
    operation is IEEE-exact in that dtype, so the bits are those of the NumPy path)."""
    o_n, c_n, i_n = U(x.shape[0]), U(x.shape[1]), U(x.shape[2])
    zero, eps = x.dtype.type(0), x.dtype.type(epsilon)
    for c in range(c_n):
        s = scale[c] / np.sqrt(var[c] + eps)
        shift = bias[c] - mean[c] * s
        for o in range(o_n):
            if relu:
                for i in range(i_n):
                    v = x[o, c, i] * s + shift
                    y[o, c, i] = v if not v <= zero else zero
            else:
                for i in range(i_n):
                    y[o, c, i] = x[o, c, i] * s + shift


@kernel
def gradient_sums(x, mean, dy, y, relu, lanes, sums):
    """sums[0, c] = Σ g, sums[1, c] = Σ (x − mean[c])·g in float64, g = dy, or dy·(y > 0)
    if relu; lanes (2, C, inner) float64 is scratch (y is not read without relu)."""
    o_n, c_n, i_n = U(x.shape[0]), U(x.shape[1]), U(x.shape[2])
    if i_n < U(LANE_BLOCK_MIN):
        lanes[:] = 0.0
        for o in range(o_n):
            for c in range(c_n):
                m = np.float64(mean[c])
                for i in range(i_n):
                    g = np.float64(dy[o, c, i])
                    if relu:
                        g *= 1.0 if y[o, c, i] > 0 else 0.0
                    lanes[0, c, i] += g
                    lanes[1, c, i] += (np.float64(x[o, c, i]) - m) * g
        _fold_lanes(lanes, sums)
        return
    for c in range(c_n):
        m = np.float64(mean[c])
        t0, t1 = 0.0, 0.0
        for i0 in range(U(0), i_n, U(LANE_BLOCK)):
            i1 = min(i0 + U(LANE_BLOCK), i_n)
            _zero_block(lanes, c, i0, i1)
            for o in range(o_n):
                if relu:
                    for i in range(i0, i1):
                        g = np.float64(dy[o, c, i]) * (1.0 if y[o, c, i] > 0 else 0.0)
                        lanes[0, c, i] += g
                        lanes[1, c, i] += (np.float64(x[o, c, i]) - m) * g
                else:
                    for i in range(i0, i1):
                        g = np.float64(dy[o, c, i])
                        lanes[0, c, i] += g
                        lanes[1, c, i] += (np.float64(x[o, c, i]) - m) * g
            t0, t1 = _fold_block(lanes, c, i0, i1, t0, t1)
        sums[0, c] = t0
        sums[1, c] = t1


@kernel
def gradient_input(x, mean, dy, y, relu, a, b, k, is_test, dx):
    """dx = ((g − (x − mean[c])·a[c]) − b[c])·k[c], or g·k[c] if is_test; g as in
    gradient_sums (x's dtype throughout)."""
    o_n, c_n, i_n = U(x.shape[0]), U(x.shape[1]), U(x.shape[2])
    one, zero = x.dtype.type(1), x.dtype.type(0)
    for o in range(o_n):
        for c in range(c_n):
            m, ac, bc, kc = mean[c], a[c], b[c], k[c]
            for i in range(i_n):
                g = dy[o, c, i]
                if relu:
                    g = g * (one if y[o, c, i] > zero else zero)
                if is_test:
                    dx[o, c, i] = g * kc
                else:
                    dx[o, c, i] = ((g - (x[o, c, i] - m) * ac) - bc) * kc


# Where the output is an input (ReLU in place, a residual sum into its input, a gradient into
# dY), the loop runs on that one array: with two that overlap, LLVM's runtime alias check
# picks its scalar loop, and a 2 MB in-place sum took 195 µs against 57.
@kernel
def relu(x, y):
    """y = max(x, 0) over flat arrays (NaN stays NaN); y may be x."""
    if y.ctypes.data == x.ctypes.data:
        _relu_into(x)
        return
    zero = x.dtype.type(0)
    for i in range(U(x.shape[0])):
        v = x[i]
        y[i] = v if not v <= zero else zero


@kernel
def _relu_into(x):
    """x = max(x, 0)."""
    zero = x.dtype.type(0)
    for i in range(U(x.shape[0])):
        v = x[i]
        x[i] = v if not v <= zero else zero


@kernel
def add_relu(a, b, y):
    """y = max(a + b, 0) over flat arrays (the sum rounded as NumPy's; NaN stays NaN); y may
    be a or b."""
    if y.ctypes.data == a.ctypes.data:
        _add_relu_into(a, b)
        return
    if y.ctypes.data == b.ctypes.data:
        _add_relu_into(b, a)   # b + a: the same sum (IEEE addition commutes)
        return
    zero = a.dtype.type(0)
    for i in range(U(a.shape[0])):
        v = a[i] + b[i]
        y[i] = v if not v <= zero else zero


@kernel
def _add_relu_into(a, b):
    """a = max(a + b, 0)."""
    zero = a.dtype.type(0)
    for i in range(U(a.shape[0])):
        v = a[i] + b[i]
        a[i] = v if not v <= zero else zero


@kernel
def relu_gradient(y, dy, dx):
    """dx = dy·(y > 0) over flat arrays (NaN·0 stays NaN, as in NumPy); dx may be dy."""
    if dx.ctypes.data == dy.ctypes.data:
        _relu_gradient_into(y, dy)
        return
    one, zero = dy.dtype.type(1), dy.dtype.type(0)
    for i in range(U(y.shape[0])):
        dx[i] = dy[i] * (one if y[i] > zero else zero)


@kernel
def _relu_gradient_into(y, dy):
    """dy = dy·(y > 0)."""
    one, zero = dy.dtype.type(1), dy.dtype.type(0)
    for i in range(U(y.shape[0])):
        dy[i] = dy[i] * (one if y[i] > zero else zero)


# The same kernels over fixed chunks on the OpenMP team (netrun.kernels.omp): the loop's slot
# w runs chunks w, w + slots, ... (rows starts[c]:starts[c+1] of the outer axis) with slot
# w's lanes, as worker w does; per-chunk sums go to sums[c] for the caller to add in chunk
# order. So the bits are those of the worker threads.
@team_kernel
def stats_team(slots, starts, x, shift, lanes, sums):
    """`stats` of chunk c into sums[c] (lanes: (slots, 2, C, inner))."""
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
def inference_team(slots, starts, x, scale, bias, mean, var, epsilon, y, relu):
    """`inference` chunk by chunk."""
    for w in jit.prange(slots):
        for c in range(w, starts.shape[0] - 1, slots):
            a, b = starts[c], starts[c + 1]
            inference(x[a:b], scale, bias, mean, var, epsilon, y[a:b], relu)


@team_kernel
def gradient_sums_team(slots, starts, x, mean, dy, y, relu, lanes, sums):
    """`gradient_sums` of chunk c into sums[c] (lanes: (slots, 2, C, inner))."""
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


@team_kernel
def relu_team(slots, starts, x, y):
    """`relu` chunk by chunk (flat arrays)."""
    for w in jit.prange(slots):
        for c in range(w, starts.shape[0] - 1, slots):
            a, b = starts[c], starts[c + 1]
            relu(x[a:b], y[a:b])


@team_kernel
def add_relu_team(slots, starts, a, b, y):
    """`add_relu` chunk by chunk (flat arrays)."""
    for w in jit.prange(slots):
        for c in range(w, starts.shape[0] - 1, slots):
            i0, i1 = starts[c], starts[c + 1]
            add_relu(a[i0:i1], b[i0:i1], y[i0:i1])


@team_kernel
def relu_gradient_team(slots, starts, y, dy, dx):
    """`relu_gradient` chunk by chunk (flat arrays)."""
    for w in jit.prange(slots):
        for c in range(w, starts.shape[0] - 1, slots):
            a, b = starts[c], starts[c + 1]
            relu_gradient(y[a:b], dy[a:b], dx[a:b])
