"""Compiled Winograd tile transforms for 3×3 stride-1 convolutions of any dilation.

A dilation-d conv is d_h·d_w undilated convs on the input's phases (every d-th row and
column, starting at each offset), so tiles are numbered per phase: tile t of a block is

    t = ((image · d_h + phase row) · d_w + phase column) · tH·tW + tile row · tW + tile column

Transforms are vector loops over channels: each image is first copied channels-last into a
zero-bordered buffer (one transpose, which also supplies the padding), then every tile's
transform is a few multiply-adds of whole channel vectors, and the transformed tiles are
stored channels-last too, (α², T, C): the layout the channel GEMMs take as it is.

    gather     dst[u·α + v, t, c] = Σ_r Σ_s L[u, r] L[v, s] · image[c, phase tile (β×β) pixel]
    scatter    out[n, k, tile pixels] = Σ_u Σ_v R[o, u] R[p, v] · src[u·α + v, t, k] + bias[k]

The input transform is a gather with L = Bᵀ (β = α), the output transform a scatter with
R = Aᵀ, and backward-filter's transform of dY a gather with L = A (β = m, no padding).

The channels-last copies are allocated inside the kernels on purpose: passed in from the
workspace, LLVM cannot rule out that they alias the operands and stops vectorizing the
channel loops (the output transform ran markedly slower that way; measurements:
benchmarks/README.md). They are one image's worth, from the C heap, which reuses the block
from call to call.
"""
from __future__ import annotations

import numpy as np

from netrun.kernels.jit import kernel

_u = np.uint64   # unsigned indices: no negative-index wraparound code in the loops


@kernel
def gather(src, dst, mat, step, top, left, dh, dw, th, tw):
    """dst (α², T, C) for every image of src (b, C, H, W): L ⊗ L (L = mat, α×β) applied to
    the β×β phase tiles whose first pixel is (top, left) + d·(step·tile); zeros outside."""
    b, chans, h, w = src.shape[0], src.shape[1], src.shape[2], src.shape[3]
    alpha, beta = mat.shape[0], mat.shape[1]
    # rows and columns of the image that the tiles read, relative to (top, left)
    rows = dh * (th * step + beta - step)
    cols = dw * (tw * step + beta - step)
    image = np.empty((rows, cols, chans), src.dtype)
    half = np.empty((alpha, beta, chans), src.dtype)
    per_image = dh * dw * th * tw
    for n in range(b):
        # channels-last copy of rows [top, top + rows) and columns [left, left + cols)
        for q in range(rows):
            y = top + q
            if y < 0 or y >= h:
                for s in range(cols):
                    for c in range(chans):
                        image[_u(q), _u(s), _u(c)] = 0
                continue
            for s in range(cols):
                xcol = left + s
                if xcol < 0 or xcol >= w:
                    for c in range(chans):
                        image[_u(q), _u(s), _u(c)] = 0
            s0, s1 = max(0, -left), min(cols, w - left)
            for c in range(chans):
                for s in range(s0, s1):
                    image[_u(q), _u(s), _u(c)] = src[n, _u(c), _u(y), _u(left + s)]
        for ph in range(dh):
            for pw in range(dw):
                t = n * per_image + (ph * dw + pw) * th * tw
                for ty in range(th):
                    for tx in range(tw):
                        y0, x0 = ph + dh * ty * step, pw + dw * tx * step
                        # rows: half[u, s] = Σ_r L[u, r] · pixel (r, s) of the tile
                        for u in range(alpha):
                            for s in range(beta):
                                xs = _u(x0 + dw * s)
                                for c in range(chans):
                                    half[_u(u), _u(s), _u(c)] = 0
                                for r in range(beta):
                                    f = mat[u, r]
                                    if f != 0:
                                        yr = _u(y0 + dh * r)
                                        for c in range(chans):
                                            half[_u(u), _u(s), _u(c)] += f * image[yr, xs, _u(c)]
                        # columns: dst[u·α + v, t] = Σ_s L[v, s] · half[u, s]
                        for u in range(alpha):
                            for v in range(alpha):
                                row = _u(u * alpha + v)
                                for c in range(chans):
                                    dst[row, _u(t), _u(c)] = 0
                                for s in range(beta):
                                    f = mat[v, s]
                                    if f != 0:
                                        for c in range(chans):
                                            dst[row, _u(t), _u(c)] += f * half[_u(u), _u(s),
                                                                               _u(c)]
                        t += 1


@kernel
def scatter(src, out, mat, bias, dh, dw, th, tw):
    """out (b, K, oH, oW) = R ⊗ R (R = mat, m×α) applied to src (α², T, K) tile by tile,
    each m×m result written to its phase pixels inside out, plus bias (K,)."""
    b, chans, oh, ow = out.shape[0], out.shape[1], out.shape[2], out.shape[3]
    m, alpha = mat.shape[0], mat.shape[1]
    per_image = dh * dw * th * tw
    image = np.empty((dh * th * m, dw * tw * m, chans), src.dtype)
    half = np.empty((alpha, m, chans), src.dtype)
    for n in range(b):
        t = n * per_image
        for ph in range(dh):
            for pw in range(dw):
                for ty in range(th):
                    for tx in range(tw):
                        # columns: half[u, o] = Σ_v R[o, v] · src[u·α + v, t]
                        for u in range(alpha):
                            for o in range(m):
                                for c in range(chans):
                                    half[_u(u), _u(o), _u(c)] = 0
                                for v in range(alpha):
                                    f = mat[o, v]
                                    if f != 0:
                                        row = _u(u * alpha + v)
                                        for c in range(chans):
                                            half[_u(u), _u(o), _u(c)] += f * src[row, _u(t),
                                                                                 _u(c)]
                        # rows, into the channels-last image at the tile's phase pixels
                        y0, x0 = ph + dh * ty * m, pw + dw * tx * m
                        for o in range(m):
                            yo = _u(y0 + dh * o)
                            for p in range(m):
                                xo = _u(x0 + dw * p)
                                for c in range(chans):
                                    image[yo, xo, _u(c)] = bias[_u(c)]
                                for u in range(alpha):
                                    f = mat[o, u]
                                    if f != 0:
                                        for c in range(chans):
                                            image[yo, xo, _u(c)] += f * half[_u(u), _u(p),
                                                                              _u(c)]
                        t += 1
        for c in range(chans):
            for y in range(oh):
                for x in range(ow):
                    out[n, _u(c), _u(y), _u(x)] = image[_u(y), _u(x), _u(c)]


def _signatures(dtype: str) -> dict[str, str]:
    planes, mat, table, i = f"{dtype}[:,:,:,::1]", f"{dtype}[:,::1]", f"{dtype}[:,:,::1]", "int64"
    return {
        "gather": f"void({planes}, {table}, {mat}, " + ", ".join([i] * 7) + ")",
        "scatter": f"void({table}, {planes}, {mat}, {dtype}[::1], " + ", ".join([i] * 4) + ")",
    }


def prepare(dtype: str = "float32") -> None:
    """Compile (or load from Numba's disk cache) the kernels for one dtype."""
    for name, signature in _signatures(dtype).items():
        globals()[name].prepare(signature)
