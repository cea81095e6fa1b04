"""A direct NumPy convolution reference (one loop over kernel taps), independent of netrun."""
from __future__ import annotations

import numpy as np


def ref_conv(x, w, stride, pads, dilation, group):
    """Y and a function computing (dX, dW) for a given dY, for NCHW x and M×C/G×kh×kw w."""
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = stride, pads, dilation
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    xg = xp.reshape(n, group, cg, *xp.shape[2:])
    wg = w.reshape(group, m // group, cg, kh, kw)

    def tap(i, j):
        return (slice(None),) * 3 + (slice(i * dh, i * dh + (oh - 1) * sh + 1, sh),
                                     slice(j * dw, j * dw + (ow - 1) * sw + 1, sw))

    y = np.zeros((n, group, m // group, oh, ow))
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("ngcrs,gkc->ngkrs", xg[tap(i, j)], wg[..., i, j])

    def grads(dy):
        dyg = dy.reshape(n, group, m // group, oh, ow)
        dxp, dwg = np.zeros_like(xg), np.zeros_like(wg)
        for i in range(kh):
            for j in range(kw):
                dxp[tap(i, j)] += np.einsum("ngkrs,gkc->ngcrs", dyg, wg[..., i, j])
                dwg[..., i, j] = np.einsum("ngkrs,ngcrs->gkc", dyg, xg[tap(i, j)])
        dx = dxp.reshape(xp.shape)[:, :, pt:pt + h, pl:pl + wd]
        return dx, dwg.reshape(w.shape)

    return y.reshape(n, m, oh, ow), grads
