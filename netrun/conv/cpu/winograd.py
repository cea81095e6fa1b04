"""Winograd F(2×2, 3×3) and F(4×4, 3×3) for 3×3 stride-1 undilated convolutions (Lavin & Gray).

Per m×m output tile and α×α input tile d (α = m + 2):  Y = Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A. Every
transform is one GEMM with a Kronecker matrix over all tiles at once (vec(P X Q) = (P ⊗ Qᵀ)
vec(X)), and the channel sums are α² batched GEMMs:

    V  (α², C, T)   = (Bᵀ ⊗ Bᵀ) @ tiles of x              input transform
    U  (α², K, C)   = (G ⊗ G) @ w                         filter transform
    M  (α², K, T)   = U @ V                               per (ξ, ν): the channel GEMM
    Y  (m², K, T)   = (Aᵀ ⊗ Aᵀ) @ M                       output transform

The backward passes are the exact adjoints: backward_filter dU = [(A ⊗ A) @ tiles of dY] @ Vᵀ,
dW = (G ⊗ G)ᵀ @ dU; backward_data is the forward transform applied to dY with the filter
rotated by 180° and its channel axes swapped (a full correlation), padded 2 - pad.
F(4×4) does 4× fewer channel multiplications than direct 3×3 but rounds more (its
transform has entries up to 8 and 1/24): about 1e-6 relative in float32 instead of 1e-7.
"""
from __future__ import annotations

import numpy as np

from netrun.conv.algorithm import ConvAlgorithm, ConvProblem, add_bias, register_algorithm, sum_bias
from netrun.kernels import parallel

BLOCK_BYTES = 24 << 20   # transformed input (α²·C·tiles) per block of images, about

_MATRICES = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]),
        np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]])),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]])),
}


class _Winograd(ConvAlgorithm):
    m = 2

    def applicable(self, p: ConvProblem) -> bool:
        return (p.kh, p.kw, p.sh, p.sw, p.dh, p.dw) == (3, 3, 1, 1, 1, 1)

    def _tiles(self, p: ConvProblem) -> tuple[int, int]:
        return -(-p.oh // self.m), -(-p.ow // self.m)

    def block(self, p: ConvProblem) -> int:
        th, tw = self._tiles(p)
        a2 = (self.m + 2) ** 2
        per_image = a2 * max(p.c, p.k) * th * tw * p.itemsize
        return max(1, min(p.n, BLOCK_BYTES // max(per_image, 1)))

    def workspace_bytes(self, p: ConvProblem) -> int:
        th, tw = self._tiles(p)
        t = self.block(p) * th * tw
        a2, m2 = (self.m + 2) ** 2, self.m ** 2
        pad = self.block(p) * max(p.c, p.k) * (th * self.m + 2) * (tw * self.m + 2)
        # D and V (input tiles), M (products), the output tiles, U and the padded input
        return (2 * a2 * max(p.c, p.k) * t + a2 * max(p.c, p.k) * t + m2 * max(p.c, p.k) * t
                + a2 * p.k * p.cg + pad) * p.itemsize

    def _kron(self, xp, dtype):
        """(Bᵀ⊗Bᵀ, G⊗G, Aᵀ⊗Aᵀ) on the device in the problem's dtype (cached per dtype)."""
        key = (id(xp), str(dtype))
        cache = self.__dict__.setdefault("_kron_cache", {})
        if key not in cache:
            bt, g, at = _MATRICES[self.m]
            cache[key] = tuple(xp.asarray(np.kron(a, a), dtype=dtype) for a in (bt, g, at))
        return cache[key]

    def forward(self, xp, x, w, p, out, scratch, bias=None):
        u = self._filter(xp, w, p, scratch)
        self._correlate(xp, x, u, p, out, scratch)
        add_bias(xp, out, bias)

    def _filter(self, xp, w, p: ConvProblem, scratch):
        """U (α², G, K/G, C/G) = (G ⊗ G) @ w."""
        _, kg, _ = self._kron(xp, w.dtype)
        a2 = (self.m + 2) ** 2
        u = scratch("wino.u", (a2, p.group, p.kg, p.cg), w.dtype)
        parallel.matmul(xp, kg, w.reshape(p.k * p.cg, 9).T, u.reshape(a2, -1))
        return u

    def _input_tiles(self, xp, x, p: ConvProblem, scratch):
        """V (α², G, C/G, b·tH·tW) = (Bᵀ ⊗ Bᵀ) @ the α×α tiles (stride m) of padded x."""
        kb, _, _ = self._kron(xp, x.dtype)
        m, a = self.m, self.m + 2
        th, tw = self._tiles(p)
        b, c = x.shape[:2]
        hp, wp = th * m + 2, tw * m + 2          # room for whole tiles; extra rows are zero
        xpad = scratch("wino.pad", (b, c, hp, wp), x.dtype)
        _pad(xpad, x, p.pt, p.pl)
        sn, sc, sy, sx = xpad.strides
        tiles = xp.lib.stride_tricks.as_strided(
            xpad, (a, a, c, b, th, tw), (sy, sx, sc, sn, m * sy, m * sx))
        d = scratch("wino.d", (a, a, c, b, th, tw), x.dtype)
        d[...] = tiles
        v = scratch("wino.v", (a * a, c * b * th * tw), x.dtype)
        parallel.matmul(xp, kb, d.reshape(a * a, -1), v)
        return v.reshape(a * a, p.group, c // p.group, b * th * tw)

    def _correlate(self, xp, x, u, p: ConvProblem, out, scratch) -> None:
        """out (N, K, oH, oW) = the stride-1 correlation of x with the filter transform u."""
        _, _, ka = self._kron(xp, x.dtype)
        m, a2 = self.m, (self.m + 2) ** 2
        th, tw = self._tiles(p)
        for n0, n1 in _blocks(p.n, self.block(p)):
            b = n1 - n0
            t = b * th * tw
            v = self._input_tiles(xp, x[n0:n1], p, scratch)
            prod = scratch("wino.m", (a2, p.group, p.kg, t), x.dtype)
            parallel.matmul(xp, u, v, prod)
            yt = scratch("wino.y", (m, m, p.k, b, th, tw), x.dtype)
            parallel.matmul(xp, ka, prod.reshape(a2, -1), yt.reshape(m * m, -1))
            tiled = yt.transpose(3, 2, 4, 0, 5, 1)               # (b, K, tH, m, tW, m)
            if th * m == p.oh and tw * m == p.ow:
                out[n0:n1].reshape(b, p.k, th, m, tw, m)[...] = tiled
            else:
                full = scratch("wino.full", (b, p.k, th, m, tw, m), x.dtype)
                full[...] = tiled
                out[n0:n1] = full.reshape(b, p.k, th * m, tw * m)[:, :, :p.oh, :p.ow]

    def backward_data(self, xp, dy, w, p, out, scratch):
        q, crop = data_gradient_problem(p)
        wf = scratch("wino.w_flip", (p.group, p.cg, p.kg, 3, 3), w.dtype)
        wf[...] = w.reshape(p.group, p.kg, p.cg, 3, 3)[..., ::-1, ::-1].transpose(0, 2, 1, 3, 4)
        u = self._filter(xp, wf.reshape(p.c, p.kg, 3, 3), q, scratch)
        if not crop:
            self._correlate(xp, dy, u, q, out, scratch)
            return
        full = scratch("wino.dx_full", (p.n, p.c, q.oh, q.ow), dy.dtype)
        self._correlate(xp, dy, u, q, full, scratch)
        out[...] = full[:, :, p.pt:p.pt + p.h, p.pl:p.pl + p.w]

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        _, kg, ka = self._kron(xp, x.dtype)
        m, a2 = self.m, (self.m + 2) ** 2
        th, tw = self._tiles(p)
        du = scratch("wino.du", (a2, p.group, p.kg, p.cg), x.dtype)
        for n0, n1 in _blocks(p.n, self.block(p)):
            b = n1 - n0
            v = self._input_tiles(xp, x[n0:n1], p, scratch)     # (α², G, C/G, T)
            # dY in whole m×m tiles (zeros past the edge), as (m², K, T)
            dyp = scratch("wino.dy_pad", (b, p.k, th * m, tw * m), dy.dtype)
            _pad(dyp, dy[n0:n1], 0, 0)
            dyt = scratch("wino.y", (m, m, p.k, b, th, tw), dy.dtype)
            dyt[...] = dyp.reshape(b, p.k, th, m, tw, m).transpose(3, 5, 1, 0, 2, 4)
            dm = scratch("wino.m", (a2, p.group, p.kg, b * th * tw), dy.dtype)
            parallel.matmul(xp, ka.T, dyt.reshape(m * m, -1), dm.reshape(a2, -1))
            target = du if n0 == 0 else scratch("wino.du_part", du.shape, dy.dtype)
            parallel.matmul(xp, dm, v.transpose(0, 1, 3, 2), target)
            if n0:
                du += target
        dw = scratch("wino.dw", (3, 3, p.k, p.cg), x.dtype)
        parallel.matmul(xp, kg.T, du.reshape(a2, -1), dw.reshape(9, -1))
        out[...] = dw.transpose(2, 3, 0, 1)
        sum_bias(xp, dy, dbias, scratch)


def data_gradient_problem(p: ConvProblem) -> tuple[ConvProblem, bool]:
    """dX of a 3×3 stride-1 conv as a correlation: dY with W rotated by 180° and its channel
    axes swapped, pads 2·d - pad (exactly H×W), and whether it must be cropped: larger pads
    than 2·d compute the whole padded image instead."""
    pads = [2 * p.dh - p.pt, 2 * p.dw - p.pl, 2 * p.dh - p.pb, 2 * p.dw - p.pr]
    crop = min(pads) < 0
    if crop:
        pads = [2 * p.dh, 2 * p.dw, 2 * p.dh, 2 * p.dw]
    return ConvProblem(p.n, p.k, p.oh, p.ow, p.c, 3, 3, 1, 1, *pads, p.dh, p.dw, p.group,
                       p.dtype), crop


def _pad(buf, x, top: int, left: int) -> None:
    """buf = x placed at (top, left) of the last two axes, zeros elsewhere (borders only)."""
    h, w = x.shape[2:]
    buf[:, :, :top] = 0
    buf[:, :, top + h:] = 0
    buf[:, :, top:top + h, :left] = 0
    buf[:, :, top:top + h, left + w:] = 0
    buf[:, :, top:top + h, left:left + w] = x


def _blocks(n: int, size: int):
    return ((n0, min(n0 + size, n)) for n0 in range(0, n, size))


@register_algorithm
class WinogradF2(_Winograd):
    """F(2×2, 3×3): 16 channel GEMMs per 2×2 outputs, 2.25× fewer multiplications."""

    name = "winograd_f2x2"
    summary = "3×3 stride 1: Winograd F(2×2,3×3), transforms as Kronecker GEMMs"
    m = 2


@register_algorithm
class WinogradF4(_Winograd):
    """F(4×4, 3×3): 36 channel GEMMs per 4×4 outputs, 4× fewer multiplications."""

    name = "winograd_f4x4"
    summary = "3×3 stride 1: Winograd F(4×4,3×3), 4× fewer multiplications, more rounding"
    m = 4
