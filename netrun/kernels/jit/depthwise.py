"""Compiled depthwise convolution (group = C, K = C·m): one pass over memory per direction.

Output channel k = c·m + q reads input channel c = k // m only, so every direction is a loop
over (image, channel) planes, and each plane is worked on in small local buffers (L1/L2).

The local layout makes every kernel tap one contiguous loop over a whole plane. The padded
input plane (Hp = H + pt + pb rows, Wp = W + pl + pr columns) is stored as sh·sw phase planes
of Hq = ceil(Hp / sh) rows × Wq = ceil(Wp / sw) columns, phase (py, px) holding the padded
pixels (yy·sh + py, xx·sw + px); the padding is zeros, written once. Output pixel (r, s) and
tap (i, j) read padded pixel (r·sh + i·dh, s·sw + j·dw), which is flat element

    q + off[i, j],   q = r·Wq + s,   off[i, j] = phase(i·dh % sh, j·dw % sw)·Hq·Wq
                                                 + (i·dh // sh)·Wq + j·dw // sw

so a tap is `acc[q] += w · buf[q + off]` over the oH·Wq outputs of a plane: one long,
contiguous, vectorized loop without bounds checks (a clipped loop per row and tap costs more
in loop overhead than in arithmetic at 56 columns), four taps per pass. Columns s ≥ oW of a
row are computed and dropped, or held at zero where they are read (gradients: exact zeros).
`Layout` (built once per problem, in Python) holds the index tables, so the kernels do no
integer division per row; its `size` includes the slack that keeps every read in bounds.
`prepare()` loads the float32 code the conv ops call (at net build time).

    forward          Y[n, k]      = b[k] + Σ_ij W[k, i, j] · (X[n, c] at tap ij)
    backward_data    dX[n, c]     = Σ_q Σ_ij W[k, i, j] · dY[n, k] shifted back by tap ij:
                                    per phase of dX a gather over the taps that land in it
    backward_filter  dW[k, i, j]  = Σ_n Σ_q dY[n, k][q] · (X[n, c] at tap ij)[q],  db[k] = Σ dY

Backward-filter keeps LANES partial sums per tap and adds them up (pairwise, in a fixed
order) once per channel: its inner loop is an elementwise multiply-add of fixed length, which
vectorizes without letting the compiler reorder a sum (no fastmath), so every run gives the
same bits. Callers split the planes (backward-filter: whole input channels, so that no sum
crosses threads) over their threads.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from netrun.kernels.jit import kernel

# Indices cast to unsigned: Numba then drops its negative-index wraparound, which otherwise
# keeps LLVM from vectorizing the loops.
_u = np.uint64
LANES = 64   # backward-filter's partial sums per tap: a compile-time constant trip count


class Layout(NamedTuple):
    """Index tables of the phase layout for one problem (int64 arrays, see the module doc)."""

    rows: np.ndarray    # (H,) flat start of input row y in its row phase (column phase 0)
    cols: np.ndarray    # (sw, 3) per column phase: first input column, count, flat offset
    taps: np.ndarray    # (kh·kw,) off[i, j] of tap t = i·kw + j
    grid: np.ndarray    # (sh·sw + 1,) backward-data: per phase of dX, where its taps start
    order: np.ndarray   # (kh·kw, 2) backward-data: (tap, dY offset) grouped by dX phase
    size: int           # elements of the padded input buffer (with slack)
    gsize: int          # elements of backward-data's zero-bordered dY buffer
    gstart: int         # where dY's row 0 starts in it
    wq: int             # Wq, the row stride of every local buffer
    hw: int             # Hq·Wq, one phase plane


def layout(h: int, w: int, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int, pb: int,
           pr: int, dh: int, dw: int) -> Layout:
    """The index tables for an H × W input and this kernel geometry."""
    hq, wq = -(-(h + pt + pb) // sh), -(-(w + pl + pr) // sw)
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    plane = hq * wq
    y = np.arange(h) + pt
    rows = ((y % sh) * sw * plane + (y // sh) * wq).astype(np.int64)
    cols = np.empty((sw, 3), np.int64)
    for px in range(sw):
        x0 = (px - pl) % sw                                     # first column of phase px
        cols[px] = x0, max(0, -(-(w - x0) // sw)), px * plane + (x0 + pl) // sw
    i, j = np.divmod(np.arange(kh * kw), kw)
    phase = (i * dh % sh) * sw + j * dw % sw
    taps = (phase * plane + (i * dh // sh) * wq + j * dw // sw).astype(np.int64)
    # backward-data: dX's phase-plane element q takes tap (i, j) from dY's flat element
    # q - (i·dh // sh)·Wq - j·dw // sw; dY sits `gstart` elements into a zero-bordered buffer
    back = (i * dh // sh) * wq + j * dw // sw
    gstart = int(back.max()) + wq
    order = np.argsort(phase, kind="stable")
    grid = np.searchsorted(phase[order], np.arange(sh * sw + 1)).astype(np.int64)
    pairs = np.stack([order, gstart - back[order]], axis=1).astype(np.int64)
    size = sh * sw * plane + wq + LANES
    gsize = gstart + max(oh, hq) * wq + wq + LANES
    return Layout(rows, cols, taps, grid, pairs, size, gsize, gstart, wq, plane)


@kernel
def _load_plane(x, n, c, buf, rows, cols):
    """Copy plane x[n, c] into its zero-padded, stride-phase-split slots of buf."""
    sw = cols.shape[0]
    for y in range(x.shape[2]):
        for px in range(sw):
            x0, count, start = cols[px, 0], cols[px, 1], rows[y] + cols[px, 2]
            if sw == 1:
                for t in range(count):
                    buf[_u(start + t)] = x[_u(n), _u(c), _u(y), _u(t)]
            else:
                for t in range(count):
                    buf[_u(start + t)] = x[_u(n), _u(c), _u(y), _u(x0 + t * sw)]


@kernel
def forward(x, w, bias, out, rows, cols, taps, size, wq, p0, p1):
    """out[n, k] for planes p0..p1 of N·K: the conv of x[n, k // m] with w[k], plus bias[k]."""
    c_all = x.shape[1]
    k_all, oh, ow = out.shape[1], out.shape[2], out.shape[3]
    kw = w.shape[2]
    m, nt = k_all // c_all, taps.shape[0]
    cnt = oh * wq
    buf = np.zeros(size, x.dtype)
    acc = np.empty(cnt, out.dtype)
    loaded = -1
    for plane in range(p0, p1):
        n = plane // k_all
        k = plane - n * k_all
        c = k // m
        if n * c_all + c != loaded:             # m output planes share one input plane
            loaded = n * c_all + c
            _load_plane(x, n, c, buf, rows, cols)
        b = bias[k]
        t = 0
        if nt >= 4:                             # the first four taps and the bias
            w0, w1, w2, w3 = w[k, 0, 0], w[k, 1 // kw, 1 % kw], w[k, 2 // kw, 2 % kw], \
                w[k, 3 // kw, 3 % kw]
            o0, o1, o2, o3 = taps[0], taps[1], taps[2], taps[3]
            for q in range(cnt):
                acc[_u(q)] = (b + w0 * buf[_u(o0 + q)] + w1 * buf[_u(o1 + q)]
                              + w2 * buf[_u(o2 + q)] + w3 * buf[_u(o3 + q)])
            t = 4
        else:
            for q in range(cnt):
                acc[_u(q)] = b
        while t + 4 <= nt:                      # four taps per pass over the plane
            w0, w1 = w[k, t // kw, t % kw], w[k, (t + 1) // kw, (t + 1) % kw]
            w2, w3 = w[k, (t + 2) // kw, (t + 2) % kw], w[k, (t + 3) // kw, (t + 3) % kw]
            o0, o1, o2, o3 = taps[t], taps[t + 1], taps[t + 2], taps[t + 3]
            for q in range(cnt):
                acc[_u(q)] += (w0 * buf[_u(o0 + q)] + w1 * buf[_u(o1 + q)]
                               + w2 * buf[_u(o2 + q)] + w3 * buf[_u(o3 + q)])
            t += 4
        while t < nt:
            w0, o0 = w[k, t // kw, t % kw], taps[t]
            for q in range(cnt):
                acc[_u(q)] += w0 * buf[_u(o0 + q)]
            t += 1
        for r in range(oh):
            for s in range(ow):
                out[_u(n), _u(k), _u(r), _u(s)] = acc[_u(r * wq + s)]


@kernel
def backward_data(dy, w, out, rows, cols, grid, order, size, gsize, gstart, wq, hw, p0, p1):
    """out[n, c] for planes p0..p1 of N·C: Σ_q dy[n, c·m + q] through w[c·m + q], transposed."""
    k_all, oh, ow = dy.shape[1], dy.shape[2], dy.shape[3]
    c_all, h = out.shape[1], out.shape[2]
    kw = w.shape[2]
    m, sw, phases = k_all // c_all, cols.shape[0], grid.shape[0] - 1
    buf = np.empty(size, dy.dtype)
    grad = np.zeros(gsize, dy.dtype)     # zero border and columns s >= oW: they add nothing
    for plane in range(p0, p1):
        n = plane // c_all
        c = plane - n * c_all
        for mq in range(m):
            k = c * m + mq
            for r in range(oh):
                for s in range(ow):
                    grad[_u(gstart + r * wq + s)] = dy[_u(n), _u(k), _u(r), _u(s)]
            for ph in range(phases):
                base = ph * hw
                t, t1 = grid[ph], grid[ph + 1]
                if mq == 0:
                    for q in range(hw):
                        buf[_u(base + q)] = 0
                while t + 4 <= t1:                  # four taps per pass over the phase
                    i0, i1, i2, i3 = order[t, 0], order[t + 1, 0], order[t + 2, 0], \
                        order[t + 3, 0]
                    w0, w1 = w[k, i0 // kw, i0 % kw], w[k, i1 // kw, i1 % kw]
                    w2, w3 = w[k, i2 // kw, i2 % kw], w[k, i3 // kw, i3 % kw]
                    o0, o1, o2, o3 = order[t, 1], order[t + 1, 1], order[t + 2, 1], \
                        order[t + 3, 1]
                    for q in range(hw):
                        buf[_u(base + q)] += (w0 * grad[_u(o0 + q)] + w1 * grad[_u(o1 + q)]
                                              + w2 * grad[_u(o2 + q)] + w3 * grad[_u(o3 + q)])
                    t += 4
                while t < t1:
                    i0, o0 = order[t, 0], order[t, 1]
                    w0 = w[k, i0 // kw, i0 % kw]
                    for q in range(hw):
                        buf[_u(base + q)] += w0 * grad[_u(o0 + q)]
                    t += 1
        for y in range(h):
            for px in range(sw):
                x0, count, start = cols[px, 0], cols[px, 1], rows[y] + cols[px, 2]
                if sw == 1:
                    for t in range(count):
                        out[_u(n), _u(c), _u(y), _u(t)] = buf[_u(start + t)]
                else:
                    for t in range(count):
                        out[_u(n), _u(c), _u(y), _u(x0 + t * sw)] = buf[_u(start + t)]


@kernel
def backward_filter(x, dy, dw_out, db_out, rows, cols, taps, size, wq, c0, c1):
    """dw_out[k], db_out[k] for the output channels of input channels c0..c1, over all N."""
    n_all, c_all = x.shape[0], x.shape[1]
    k_all, oh, ow = dy.shape[1], dy.shape[2], dy.shape[3]
    kw = dw_out.shape[2]
    m, nt = k_all // c_all, taps.shape[0]
    cnt = (oh * wq + LANES - 1) // LANES * LANES   # whole lanes; the tail of grad is zero
    buf = np.zeros(size, x.dtype)
    grad = np.zeros(cnt, dy.dtype)
    acc = np.empty(m * (nt + 1) * LANES, dy.dtype)   # per k: one lane row per tap, then db
    for c in range(c0, c1):
        for u in range(acc.shape[0]):
            acc[_u(u)] = 0
        for n in range(n_all):
            _load_plane(x, n, c, buf, rows, cols)
            for mq in range(m):
                for r in range(oh):
                    for s in range(ow):
                        grad[_u(r * wq + s)] = dy[_u(n), _u(c * m + mq), _u(r), _u(s)]
                a0 = mq * (nt + 1) * LANES
                ab = a0 + nt * LANES
                for q0 in range(0, cnt, LANES):
                    for u in range(LANES):
                        acc[_u(ab + u)] += grad[_u(q0 + u)]
                t = 0
                while t + 4 <= nt:                 # four taps per load of dY
                    o0, o1, o2, o3 = taps[t], taps[t + 1], taps[t + 2], taps[t + 3]
                    at = a0 + t * LANES
                    for q0 in range(0, cnt, LANES):
                        for u in range(LANES):
                            g = grad[_u(q0 + u)]
                            acc[_u(at + u)] += g * buf[_u(o0 + q0 + u)]
                            acc[_u(at + LANES + u)] += g * buf[_u(o1 + q0 + u)]
                            acc[_u(at + 2 * LANES + u)] += g * buf[_u(o2 + q0 + u)]
                            acc[_u(at + 3 * LANES + u)] += g * buf[_u(o3 + q0 + u)]
                    t += 4
                while t < nt:
                    o0, at = taps[t], a0 + t * LANES
                    for q0 in range(0, cnt, LANES):
                        for u in range(LANES):
                            acc[_u(at + u)] += grad[_u(q0 + u)] * buf[_u(o0 + q0 + u)]
                    t += 1
        for row in range(m * (nt + 1)):            # each lane row summed pairwise, in place
            start = row * LANES
            half = LANES // 2
            while half:
                for u in range(half):
                    acc[_u(start + u)] += acc[_u(start + half + u)]
                half //= 2
            mq, t = row // (nt + 1), row % (nt + 1)
            if t < nt:
                dw_out[c * m + mq, t // kw, t % kw] = acc[start]
            else:
                db_out[c * m + mq] = acc[start]


# The float32 signatures the conv ops call: the arrays (C-contiguous), the layout's tables,
# then its sizes and the plane (or channel) range.
_F4, _F3, _F1 = "float32[:,:,:,::1]", "float32[:,:,::1]", "float32[::1]"
_ROWS, _COLS = "int64[::1]", "int64[:,::1]"
SIGNATURES = {
    "forward": f"void({_F4}, {_F3}, {_F1}, {_F4}, {_ROWS}, {_COLS}, {_ROWS}{', int64' * 4})",
    "backward_data": f"void({_F4}, {_F3}, {_F4}, {_ROWS}, {_COLS}, {_ROWS}, {_COLS}"
                     f"{', int64' * 7})",
    "backward_filter": f"void({_F4}, {_F4}, {_F3}, {_F1}, {_ROWS}, {_COLS}, {_ROWS}"
                       f"{', int64' * 4})",
}


def prepare() -> None:
    """Compile (or load from Numba's disk cache) the float32 kernels the conv ops call."""
    for name, signature in SIGNATURES.items():
        globals()[name].prepare(signature)
