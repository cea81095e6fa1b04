"""Max pooling over windows that tile the image (kernel == stride, no pads, sizes divisible).

LeNet's 2×2 stride-2 pooling is the common case. The window maximum is separable: first over
the kw columns of each window row, then over the kh rows,

    T[n, c, y, v]  = max_j x[n, c, y, v·kw + j]        (N, C, H, oW)
    Y[n, c, u, v]  = max_i T[n, c, u·kh + i, v]        (N, C, oH, oW)

and both passes read plain views of contiguous data: the column taps x[..., j::kw] flatten to
one long 1-D run each (W is a multiple of kw), and the row taps are T.reshape(N, C, oH, kh,
oW)[:, :, :, i]. No padded or phase-split copy is made, and every pixel lies in exactly one
window, so the gradient is written straight into dX with no zeroing or accumulation.

Ties go to the first tap in row-major window order (Caffe's argmax): the smallest row i whose
maximum equals Y, then the smallest column j in that row. Routing dY back over the rows first
(which row of T holds the maximum) and then over the columns (which column of that row of x)
gives exactly that order, because the row pass picks among row maxima.
"""
from __future__ import annotations

from typing import Any, Callable

from netrun.kernels.geometry import ConvGeometry

Scratch = Callable[..., Any]


def applies(g: ConvGeometry, shape, oh: int, ow: int, order: str) -> bool:
    """Whether the windows tile an NCHW input exactly (no pads, no overlap, no remainder)."""
    return (order == "NCHW" and not g.padded and (g.kh, g.kw) == (g.sh, g.sw)
            and g.dh == 1 and g.dw == 1 and shape[2] == oh * g.kh and shape[3] == ow * g.kw)


def _column_taps(x, kw: int) -> list:
    """x[..., j::kw] for each column tap j, as flat 1-D views (N·C·H·oW elements each)."""
    flat = x.reshape(-1)
    return [flat[j::kw] for j in range(kw)]


def _row_taps(t, kh: int, oh: int) -> list:
    """T (n, C, H, oW) split into its kh row taps, each (n, C, oH, oW)."""
    n, c, _, ow = t.shape
    rows = t.reshape(n, c, oh, kh, ow)
    return [rows[:, :, :, i] for i in range(kh)]


def _max_into(xp, taps: list, out) -> None:
    """out = the elementwise maximum of the taps (NaN propagates, as in np.maximum)."""
    if len(taps) == 1:
        xp.copyto(out, taps[0])
        return
    xp.maximum(taps[0], taps[1], out=out)
    for tap in taps[2:]:
        xp.maximum(out, tap, out=out)


def forward(xp, scratch: Scratch, g: ConvGeometry, x, y) -> None:
    """y (n, C, oH, oW) = the window maxima of x (n, C, H, W)."""
    n, c, h, _ = x.shape
    oh, ow = y.shape[2:]
    t = scratch("tiled_pool.t", (n, c, h, ow), x.dtype)       # (n, C, H, oW)
    _max_into(xp, _column_taps(x, g.kw), t.reshape(-1))
    _max_into(xp, _row_taps(t, g.kh, oh), y)


def backward(xp, scratch: Scratch, g: ConvGeometry, x, dy, dx) -> None:
    """dx (n, C, H, W): each dy at the first maximum (row-major) of its window of x."""
    n, c, h, _ = x.shape
    oh, ow = dy.shape[2:]
    cols = _column_taps(x, g.kw)
    t = scratch("tiled_pool.t", (n, c, h, ow), x.dtype)       # row maxima (n, C, H, oW)
    _max_into(xp, cols, t.reshape(-1))
    rows = _row_taps(t, g.kh, oh)
    dt = scratch("tiled_pool.dt", t.shape, dy.dtype)          # dY routed to its row
    _route(xp, scratch, "rows", rows, dy, _row_taps(dt, g.kh, oh), dy.shape)
    _route(xp, scratch, "cols", cols, dt.reshape(-1), _column_taps(dx, g.kw), (t.size,))


def _route(xp, scratch: Scratch, key: str, taps: list, grad, outs: list, shape) -> None:
    """outs[k] = grad where tap k holds the first maximum of the taps, else 0 (nowhere when
    the maximum is NaN, as in netrun.ops.pool)."""
    hit = scratch(f"tiled_pool.{key}.hit", shape, "bool")
    if len(taps) == 1:
        xp.equal(taps[0], taps[0], out=hit)      # False where NaN
        xp.multiply(grad, hit, out=outs[0])
        return
    if len(taps) == 2:
        # the second tap wins only if strictly greater: ties stay with the first; with a
        # NaN both comparisons are False
        xp.greater(taps[1], taps[0], out=hit)
        xp.multiply(grad, hit, out=outs[1])
        xp.greater_equal(taps[0], taps[1], out=hit)
        xp.multiply(grad, hit, out=outs[0])
        return
    top = scratch(f"tiled_pool.{key}.top", shape, taps[0].dtype)
    taken = scratch(f"tiled_pool.{key}.taken", shape, "bool")
    _max_into(xp, taps, top)
    taken.fill(False)
    for tap, out in zip(taps, outs):
        xp.equal(tap, top, out=hit)
        xp.greater(hit, taken, out=hit)      # equal to the maximum and not taken yet
        xp.logical_or(taken, hit, out=taken)
        xp.multiply(grad, hit, out=out)
