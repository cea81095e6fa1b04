"""Compiled NCHW pooling: max and average, forward and gradient, in flat vectorized passes.

The kernels take a batch slice as planes, x (P, H, W) with P = n·C, and work on groups of
planes that fit in L2. LLVM vectorizes long, flat, unit-stride loops, so a group is first
copied into its sw column phases, each plane a block of Rb padded rows of Wm columns,

    ph[b][(g·Rb + pt + r)·Wm + q] = x[g, r, q·sw + b]      (pad rows: -inf for max, 0 for sums)

and tap (i, j) of output (g, u, v) is then ph[b_j][k + i·Wm + q_j] with k = g·Rb·Wm + u·F + v,
F = sh·Wm and (q_j, b_j) = divmod(j - pl, sw): a contiguous run at a fixed offset from k,
across the whole group. Each pass is one loop over k of shifted runs (three taps per loop),
and pooling is separable:

    columns    M[k] = max_j ph[b_j][k + q_j]     every padded row, every column v < Wm
    rows       V[k] = max_i M[k + i·Wm]          k = g·Rb·Wm + u·F + v

then Y[g, u, v] = V[g·Rb·Wm + u·F + v]. The pad rows take care of windows that overhang the
top or bottom. Windows that overhang the left or right (border columns) would read the next
or previous row in the columns pass, so those columns of M are recomputed clipped; values at
junk positions (v ≥ oW, or past Wm in an F row) are computed but never read.

The max gradient finds each window's first maximum in row-major order with the same passes,
keeping the first column j of each row's maximum, then the first row i: the tap t = i·kw + j.
A window whose maximum is not Y (a NaN, a Y of -inf, or a Y that is not this X's maximum)
takes an exact scan instead: the first in-image tap equal to Y, no route if there is none.
dY then goes into padded gradient phases in kh·kw passes, one per tap in tap order, which are
interleaved back into dX: every pixel receives its terms in the NumPy path's order (by tap
index), so the sums have the same bits. The average gradient runs the two passes transposed
(rows, then columns, border columns clipped). Averages multiply by 1 / divisor and sum in
another order than the NumPy path: the same values within rounding. Max forward is exact in
any order (NaN propagates as in np.maximum).

Indices are unsigned (U): Numba checks signed indices for negative wraparound, which keeps
LLVM from vectorizing the loops.
"""
from __future__ import annotations

import numpy as np

from netrun.kernels.jit import kernel

# float64 (gradient checks) keeps the NumPy path: each dtype is a long compile of its own
DTYPES = (np.dtype("float32"),)
GROUP_ELEMENTS = 1 << 12   # padded plane elements per group: its buffers stay in L1/L2
U = np.uint64


def prepare(op_type: str, dtype: str = "float32") -> None:
    """Compile (or load from Numba's disk cache) the kernel of a pooling op type."""
    planes, divisor, ints = f"{dtype}[:, :, ::1]", f"{dtype}[:, ::1]", ", ".join(["int64"] * 6)
    fn, arrays = {
        "MaxPool": (forward, [planes] * 2 + [divisor, "boolean"]),
        "AveragePool": (forward, [planes] * 2 + [divisor, "boolean"]),
        "MaxPoolGradient": (max_backward, [planes] * 4),
        "AveragePoolGradient": (avg_backward, [planes] * 2 + [divisor]),
    }[op_type]
    fn.prepare(f"void({', '.join(arrays)}, {ints})")
    if op_type == "MaxPool":
        max_2x2.prepare(f"void({planes}, {planes})")


# Layout ------------------------------------------------------------------------------------
@kernel
def _layout(planes, h, w, oh, ow, kh, kw, sh, sw, pt, pl):
    """(Wm, Rb, G, borders, column offsets, klo, n, row offsets, row codes, column codes)
    for planes of h×w. G planes form a group; borders holds (v, first column) of the windows
    that overhang left or right. The columns pass reads ph at column offsets[j] + k for
    k < n into M[klo + k]: the range where every tap's run stays inside its phase."""
    wm = max(-(-w // sw), ow)
    rb = max(pt + h, (oh - 1) * sh + kh)           # padded rows that real windows read
    groups = max(1, min(planes, GROUP_ELEMENTS // (rb * wm * sw)))
    v0 = min(ow, -(-pl // sw))
    v1 = max(v0, min(ow, (w - kw + pl) // sw + 1))
    borders = np.empty((v0 + ow - v1, 2), np.int64)
    for t in range(borders.shape[0]):
        v = t if t < v0 else v1 + t - v0
        borders[t, 0], borders[t, 1] = v, v * sw - pl
    size = groups * rb * wm
    coffs, ccodes = np.empty(kw, np.int64), np.empty(kw, np.int64)
    lo, hi = 0, 0
    for j in range(kw):
        coffs[j], ccodes[j] = (j - pl) % sw * size + (j - pl) // sw, j
        lo, hi = min(lo, coffs[j]), max(hi, coffs[j])
    klo = -lo
    khi = size - max(0, hi - (sw - 1) * size)
    for j in range(kw):
        coffs[j] += klo
    roffs, rcodes = np.empty(kh, np.int64), np.empty(kh, np.int64)
    for i in range(kh):
        roffs[i], rcodes[i] = i * wm, i * kw
    return wm, rb, groups, borders, coffs, klo, max(0, khi - klo), roffs, rcodes, ccodes


@kernel
def _crop(full, y, g0, g1, rb, wm, sh, scale):
    """y[g0 + g, u, v] = full[g·Rb·Wm + u·F + v] · scale[u, v] (ones for max: exact)."""
    oh, ow = y.shape[1], y.shape[2]
    yf, d = y.reshape(-1), scale.reshape(-1)
    for g in range(g1 - g0):
        for u in range(oh):
            k0, q0, d0 = U(g * rb * wm + u * sh * wm), U(((g0 + g) * oh + u) * ow), U(u * ow)
            for v in range(U(ow)):
                yf[q0 + v] = full[k0 + v] * d[d0 + v]


@kernel
def _reciprocals(divisor):
    """1 / divisor: averages multiply by it, as a Numba division checks for zero each time
    (which keeps its loops from vectorizing); within rounding of the NumPy path's divide."""
    out = np.empty_like(divisor)
    for u in range(divisor.shape[0]):
        for v in range(divisor.shape[1]):
            out[u, v] = 1 / divisor[u, v]
    return out


@kernel
def _tap_offsets(kh, kw, sw, pl, wm, stride, margin):
    """Per tap t = i·kw + j: its run's start in phase-split buffers (phase b at b·stride)."""
    offs = np.empty(kh * kw, np.int64)
    for i in range(kh):
        for j in range(kw):
            b, q = (j - pl) % sw, (j - pl) // sw
            offs[i * kw + j] = b * stride + margin + i * wm + q
    return offs


@kernel
def _split_columns(x, g0, g1, ph, stride, rb, wm, pt):
    """ph[b·stride + (g·Rb + pt + r)·Wm + q] = x[g0 + g, r, q·sw + b] (sw = len(ph)/stride)."""
    h, w = x.shape[1], x.shape[2]
    sw = ph.size // stride
    n, stride = U(h * wm), U(stride)
    for g in range(g1 - g0):
        src = x[g0 + g].reshape(-1)
        at = U((g * rb + pt) * wm)
        if sw == 1 and w == wm:
            for k in range(n):
                ph[at + k] = src[k]
        elif sw == 2 and w == 2 * wm:
            # one flat loop: LLVM turns the pair of stride-2 loads into shuffles
            for k in range(n):
                ph[at + k] = src[U(2) * k]
                ph[stride + at + k] = src[U(2) * k + U(1)]
        else:
            for r in range(h):
                for c in range(w):
                    ph[U((c % sw) * stride) + at + U(r * wm + c // sw)] = src[U(r * w + c)]


@kernel
def _merge_columns(ph, stride, margin, dx, g0, g1, rb, wm, pt):
    """dx[g0 + g, r, c] = ph[(c mod sw)·stride + margin + (g·Rb + pt + r)·Wm + c div sw]."""
    h, w = dx.shape[1], dx.shape[2]
    sw = ph.size // stride
    n, stride = U(h * wm), U(stride)
    for g in range(g1 - g0):
        dst = dx[g0 + g].reshape(-1)
        at = U(margin + (g * rb + pt) * wm)
        if sw == 1 and w == wm:
            for k in range(n):
                dst[k] = ph[at + k]
        elif sw == 2 and w == 2 * wm:
            for k in range(n):
                dst[U(2) * k] = ph[at + k]
                dst[U(2) * k + U(1)] = ph[stride + at + k]
        else:
            for r in range(h):
                for c in range(w):
                    dst[U(r * w + c)] = ph[U((c % sw) * stride) + at + U(r * wm + c // sw)]


# Reductions over taps ----------------------------------------------------------------------
@kernel
def _max2(a, b):
    """np.maximum of a pair: the larger, NaN if either is NaN."""
    return b if (b > a) | (b != b) else a


@kernel
def _max_taps(src, offs, out, n):
    """out[k] = max over taps t of src[offs[t] + k] (k < n), NaN propagating."""
    taps, n = offs.size, U(n)
    for g in range(0, taps, 3):
        # three taps per loop; a missing one repeats the last (max is idempotent)
        o0, o1, o2 = U(offs[g]), U(offs[min(g + 1, taps - 1)]), U(offs[min(g + 2, taps - 1)])
        if g == 0:
            for k in range(n):
                out[k] = _max2(_max2(src[o0 + k], src[o1 + k]), src[o2 + k])
        else:
            for k in range(n):
                m = _max2(_max2(out[k], src[o0 + k]), src[o1 + k])
                out[k] = _max2(m, src[o2 + k])


@kernel
def _sum_taps(src, offs, out, n):
    """out[k] = the sum over taps t of src[offs[t] + k] (k < n)."""
    taps, n = offs.size, U(n)
    for k in range(n):
        out[k] = 0
    for g in range(0, taps, 3):
        o0, o1, o2 = U(offs[g]), U(offs[min(g + 1, taps - 1)]), U(offs[min(g + 2, taps - 1)])
        if taps - g >= 3:
            for k in range(n):
                out[k] += src[o0 + k] + src[o1 + k] + src[o2 + k]
        elif taps - g == 2:
            for k in range(n):
                out[k] += src[o0 + k] + src[o1 + k]
        else:
            for k in range(n):
                out[k] += src[o0 + k]


@kernel
def _argmax_taps(src, codes, offs, adds, out, out_codes, n):
    """out[k] = max over taps t of src[offs[t] + k], the first tap winning ties, and
    out_codes[k] its code, adds[t] + codes[offs[t] + k] (k < n)."""
    taps, n = offs.size, U(n)
    for g in range(0, taps, 3):
        t1, t2 = min(g + 1, taps - 1), min(g + 2, taps - 1)
        o0, o1, o2 = U(offs[g]), U(offs[t1]), U(offs[t2])
        a0, a1, a2 = np.int32(adds[g]), np.int32(adds[t1]), np.int32(adds[t2])
        for k in range(n):
            m0, c0 = src[o0 + k], a0 + codes[o0 + k]
            m1, c1 = src[o1 + k], a1 + codes[o1 + k]
            m2, c2 = src[o2 + k], a2 + codes[o2 + k]
            if g > 0:
                # strictly greater: a later tap never takes a tie from an earlier one
                m, c = out[k], out_codes[k]
                better = m0 > m
                m0, c0 = (m0 if better else m), (c0 if better else c)
            better = m1 > m0
            m0, c0 = (m1 if better else m0), (c1 if better else c0)
            better = m2 > m0
            out[k] = m2 if better else m0
            out_codes[k] = np.int32(c2 if better else c0)


@kernel
def _border_columns(ph, stride, rows, w, wm, kw, borders, out, codes, mode):
    """out[r·Wm + v] for every padded row r and border column v, clipped to the image:
    mode 0 max (NaN propagating), 1 sum, 2 first maximum with its column tap in codes."""
    sw = ph.size // stride
    rows, wm = U(rows), U(wm)
    for t in range(borders.shape[0]):
        v, start = U(borders[t, 0]), borders[t, 1]
        c0 = max(start, 0)
        src = U((c0 % sw) * stride + c0 // sw)
        for r in range(rows):
            out[r * wm + v] = ph[src + r * wm]
        if mode == 2:
            for r in range(rows):
                codes[r * wm + v] = np.int32(c0 - start)
        for c in range(c0 + 1, min(start + kw, w)):
            src, j = U((c % sw) * stride + c // sw), np.int32(c - start)
            if mode == 0:
                for r in range(rows):
                    out[r * wm + v] = _max2(out[r * wm + v], ph[src + r * wm])
            elif mode == 1:
                for r in range(rows):
                    out[r * wm + v] += ph[src + r * wm]
            else:
                for r in range(rows):
                    e = ph[src + r * wm]
                    better = e > out[r * wm + v]
                    out[r * wm + v] = e if better else out[r * wm + v]
                    codes[r * wm + v] = j if better else codes[r * wm + v]


# Kernels ------------------------------------------------------------------------------------
def max_forward(x, y, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int) -> None:
    """y (P, oH, oW) = the maximum of each window of x (P, H, W); NaN propagates."""
    if disjoint_2x2((kh, kw, sh, sw, pt, pl), x.shape[1:], y.shape[1:]):
        max_2x2(x, y)
        return
    forward(x, y, np.ones(y.shape[1:], x.dtype), False, kh, kw, sh, sw, pt, pl)


def disjoint_2x2(window: tuple[int, ...], size: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether (kh, kw, sh, sw, pt, pl) cut planes of `size` (H, W) into `out` (oH, oW)
    whole 2×2 windows, the case max pooling runs in one pass (`max_2x2`)."""
    return (tuple(window) == (2, 2, 2, 2, 0, 0) and size[0] == 2 * out[0]
            and size[1] == 2 * out[1])


@kernel
def max_2x2(x, y):
    """y (P, oH, oW) = the maximum of each of x's (P, 2·oH, 2·oW) disjoint 2×2 windows; NaN
    propagates. LeNet's pooling: one pass over x, where the separable passes of `forward`
    copy and sweep it four times (its 64×50×8×8 pooling: 0.06 against 0.18 ms)."""
    for p in range(U(y.shape[0])):
        for i in range(U(y.shape[1])):
            top, bottom, out = x[p, U(2) * i], x[p, U(2) * i + U(1)], y[p, i]
            for j in range(U(y.shape[2])):
                a, b = top[U(2) * j], top[U(2) * j + U(1)]
                c, d = bottom[U(2) * j], bottom[U(2) * j + U(1)]
                m = a if (a > b or a != a) else b
                n = c if (c > d or c != c) else d
                out[j] = m if (m > n or m != m) else n


def avg_forward(x, y, divisor, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int) -> None:
    """y (P, oH, oW) = the sum of each window of x (P, H, W) divided by divisor (oH, oW)."""
    forward(x, y, divisor, True, kh, kw, sh, sw, pt, pl)


@kernel
def forward(x, y, divisor, average, kh, kw, sh, sw, pt, pl):
    """y (P, oH, oW) = the window sums of x (P, H, W) / divisor if average, else the window
    maxima (NaN propagating) times divisor (ones: exact). One kernel: half the compiling."""
    planes, h, w = x.shape
    oh, ow = y.shape[1], y.shape[2]
    wm, rb, groups, borders, coffs, klo, n, roffs, _, _ = _layout(planes, h, w, oh, ow, kh,
                                                                  kw, sh, sw, pt, pl)
    size = groups * rb * wm
    pad = x.dtype.type(0) if average else x.dtype.type(-np.inf)
    ph = np.full(sw * size, pad, x.dtype)          # pad rows stay 0 or -inf
    cm = np.full(size + kh * wm, pad, x.dtype)     # column results (+ rows read as junk)
    rm = np.empty(size, x.dtype)
    no_codes, scale = np.empty(0, np.int32), _reciprocals(divisor) if average else divisor
    for g0 in range(0, planes, groups):
        g1 = min(planes, g0 + groups)
        _split_columns(x, g0, g1, ph, size, rb, wm, pt)
        if average:
            _sum_taps(ph, coffs, cm[klo:], n)
        else:
            _max_taps(ph, coffs, cm[klo:], n)
        _border_columns(ph, size, (g1 - g0) * rb, w, wm, kw, borders, cm, no_codes,
                        1 if average else 0)
        if average:
            _sum_taps(cm, roffs, rm, size)
        else:
            _max_taps(cm, roffs, rm, size)
        _crop(rm, y, g0, g1, rb, wm, sh, scale)


@kernel
def _max_routes(x, y, dy, g0, g1, rb, wm, sh, rm, code, out, kh, kw, sw, pt, pl):
    """out[g·Rb·Wm + u·F + v] = dY of the windows of planes g0..g1 whose first maximum
    (code) holds Y > -inf; the others get the exact scan: the first in-image tap equal to Y
    (its tap into code), no route (out = 0) if there is none."""
    h, w = x.shape[1], x.shape[2]
    oh, ow = y.shape[1], y.shape[2]
    yf, gf = y.reshape(-1), dy.reshape(-1)
    zero, low, misses = out.dtype.type(0), out.dtype.type(-np.inf), 0
    for g in range(g1 - g0):
        for u in range(oh):
            k0, q0 = U(g * rb * wm + u * sh * wm), U(((g0 + g) * oh + u) * ow)
            for v in range(U(ow)):
                target = yf[q0 + v]
                hit = (rm[k0 + v] == target) & (target > low)
                out[k0 + v] = gf[q0 + v] if hit else zero
                misses += not hit
    if misses == 0:
        return
    for g in range(g1 - g0):
        for u in range(oh):
            for v in range(ow):
                k, target = U(g * rb * wm + u * sh * wm + v), y[g0 + g, u, v]
                if (rm[k] == target) & (target > low):
                    continue
                for t in range(kh * kw):
                    r, c = u * sh - pt + t // kw, v * sw - pl + t % kw
                    if 0 <= r < h and 0 <= c < w and x[g0 + g, r, c] == target:
                        out[k], code[k] = dy[g0 + g, u, v], np.int32(t)
                        break


@kernel
def _add_taps(g, codes, offs, dst, n):
    """For each tap t in order: dst[offs[t] + k] += g[k] where codes[k] = t (k < n)."""
    n, zero = U(n), g.dtype.type(0)
    for t in range(offs.size):
        o, tt = U(offs[t]), np.int32(t)
        for k in range(n):
            dst[o + k] += g[k] if codes[k] == tt else zero


@kernel
def max_backward(x, y, dy, dx, kh, kw, sh, sw, pt, pl):
    """dx (P, H, W): each dy added at the first tap (row-major) of its window equal to y."""
    planes, h, w = x.shape
    oh, ow = y.shape[1], y.shape[2]
    wm, rb, groups, borders, coffs, klo, n, roffs, rcodes, ccodes = _layout(
        planes, h, w, oh, ow, kh, kw, sh, sw, pt, pl)
    size = groups * rb * wm
    ph = np.full(sw * size, -np.inf, x.dtype)
    no_codes = np.zeros(sw * size, np.int32)       # the columns pass adds j alone
    cm = np.full(size + kh * wm, -np.inf, x.dtype)
    cj = np.zeros(size + kh * wm, np.int32)        # column tap j of each row's maximum
    rm = np.empty(size, x.dtype)
    code = np.empty(size, np.int32)                # tap i·kw + j of each window's maximum
    gr = np.zeros(size, x.dtype)                   # dY by window; junk positions stay 0
    margin = kw + 1
    stride = size + kh * wm + 2 * margin
    dph = np.empty(sw * stride, x.dtype)           # gradient phases, laid out like ph
    toffs = _tap_offsets(kh, kw, sw, pl, wm, stride, margin)
    for g0 in range(0, planes, groups):
        g1 = min(planes, g0 + groups)
        _split_columns(x, g0, g1, ph, size, rb, wm, pt)
        _argmax_taps(ph, no_codes, coffs, ccodes, cm[klo:], cj[klo:], n)
        _border_columns(ph, size, (g1 - g0) * rb, w, wm, kw, borders, cm, cj, 2)
        _argmax_taps(cm, cj, roffs, rcodes, rm, code, size)
        if g1 - g0 < groups:
            gr[:] = 0                              # no stale windows in the unused blocks
        _max_routes(x, y, dy, g0, g1, rb, wm, sh, rm, code, gr, kh, kw, sw, pt, pl)
        dph[:] = 0
        _add_taps(gr, code, toffs, dph, size)
        _merge_columns(dph, stride, margin, dx, g0, g1, rb, wm, pt)


@kernel
def _add_runs(src, offs, dst, n):
    """dst[offs[t] + k] += src[k] for each t (k < n)."""
    n = U(n)
    for t in range(offs.size):
        o = U(offs[t])
        for k in range(n):
            dst[o + k] += src[k]


@kernel
def avg_backward(dy, dx, divisor, kh, kw, sh, sw, pt, pl):
    """dx (P, H, W): each dy / divisor added at every in-image tap of its window."""
    planes, h, w = dx.shape
    oh, ow = dy.shape[1], dy.shape[2]
    wm, rb, groups, borders, _, _, _, roffs, _, _ = _layout(planes, h, w, oh, ow, kh, kw, sh,
                                                            sw, pt, pl)
    size = groups * rb * wm
    share = np.zeros(size, dx.dtype)               # dY / divisor by window; junk stays 0
    cg = np.empty(size + kh * wm, dx.dtype)        # gradient of the column sums
    margin = kw + 1
    stride = size + kh * wm + 2 * margin
    dph = np.empty(sw * stride, dx.dtype)          # gradient phases, laid out like ph
    toffs = _tap_offsets(kh, kw, sw, pl, wm, stride, margin)[:kw].copy()   # row 0: columns
    scale = _reciprocals(divisor)
    for g0 in range(0, planes, groups):
        g1 = min(planes, g0 + groups)
        if g1 - g0 < groups:
            share[:] = 0                           # no stale windows in the unused blocks
        _spread(dy, scale, share, g0, g1, rb, wm, sh)
        cg[:] = 0
        _add_runs(share, roffs, cg, size)          # the rows pass, transposed
        dph[:] = 0
        _spread_borders(cg, dph, stride, margin, (g1 - g0) * rb, w, wm, kw, borders)
        _add_runs(cg, toffs, dph, size)            # the columns pass, transposed
        _merge_columns(dph, stride, margin, dx, g0, g1, rb, wm, pt)


@kernel
def _spread(dy, scale, share, g0, g1, rb, wm, sh):
    """share[g·Rb·Wm + u·F + v] = dy[g0 + g, u, v] · scale[u, v] (1 / divisor)."""
    oh, ow = dy.shape[1], dy.shape[2]
    gf, d = dy.reshape(-1), scale.reshape(-1)
    for g in range(g1 - g0):
        for u in range(oh):
            k0, q0, d0 = U(g * rb * wm + u * sh * wm), U(((g0 + g) * oh + u) * ow), U(u * ow)
            for v in range(U(ow)):
                share[k0 + v] = gf[q0 + v] * d[d0 + v]


@kernel
def _spread_borders(cg, dph, stride, margin, rows, w, wm, kw, borders):
    """Add the border columns of cg to their clipped windows' in-image columns of dph, and
    zero them there: the flat columns pass would add them to a neighbouring row."""
    sw = dph.size // stride
    for t in range(borders.shape[0]):
        v, start = U(borders[t, 0]), borders[t, 1]
        for c in range(max(start, 0), min(start + kw, w)):
            dst = U((c % sw) * stride + margin + c // sw)
            for r in range(U(rows)):
                dph[dst + r * U(wm)] += cg[r * U(wm) + v]
        for r in range(U(rows)):
            cg[r * U(wm) + v] = 0
