"""Depthwise convolution (group = C, K = C·m): the stride-1 case on row GEMMs, else per tap.

Stride 1 (the common case, and the one that matters for speed): forward and backward-filter
are shift_gemm's row GEMMs per channel (a (m × kw) @ (kw × oH·oW) product per channel and
kernel row sums kw taps in registers in one pass over memory); backward-data is the forward
pass of the transposed problem, a depthwise conv of dY with the kernel rotated by 180° and
pads d·(k-1) - pad, so it needs no scatter-add. Other strides run one broadcast multiply-add
per tap over cache-sized blocks of images (channel multipliers broadcast over an extra axis).
"""
from __future__ import annotations

from netrun.conv.algorithm import ConvAlgorithm, ConvProblem, add_bias, register_algorithm, sum_bias
from netrun.conv.cpu.shift import ShiftGemm
from netrun.kernels.geometry import pad_into, window_slices

BLOCK_BYTES = 512 << 10   # output bytes per block of images: about half a core's L2
_ROWS = ShiftGemm()


@register_algorithm
class Depthwise(ConvAlgorithm):
    """Per-tap broadcast multiply-adds over blocks of images."""

    name = "depthwise"
    summary = "group = C: a broadcast multiply-add per kernel tap, cache-sized image blocks"

    def applicable(self, p: ConvProblem) -> bool:
        return p.group == p.c and p.group > 1

    def block(self, p: ConvProblem) -> int:
        per_image = max(p.k * p.oh * p.ow, p.c * p.h * p.w) * p.itemsize
        return max(1, min(p.n, BLOCK_BYTES // max(per_image, 1)))

    def workspace_bytes(self, p: ConvProblem) -> int:
        if _unit_stride(p):
            flipped = _flipped(p)
            return max(_ROWS.workspace_bytes(p), _ROWS.workspace_bytes(flipped)
                       + p.k * p.kh * p.kw * p.itemsize)
        b = self.block(p)
        padded = b * p.c * (p.h + p.pt + p.pb) * (p.w + p.pl + p.pr)
        return (padded + 2 * b * p.k * p.oh * p.ow + p.k * p.kh * p.kw) * p.itemsize

    def _taps(self, p: ConvProblem):
        g = p.geometry
        for i in range(p.kh):
            for j in range(p.kw):
                yield i, j, window_slices(g, i, j, p.oh, p.ow)

    def _padded(self, x, p: ConvProblem, scratch):
        if not p.padded:
            return x
        buf = scratch("dw.pad", (x.shape[0], p.c, p.h + p.pt + p.pb, p.w + p.pl + p.pr), x.dtype)
        return pad_into(x, buf, p.geometry, (2, 3), 0)

    def forward(self, xp, x, w, p, out, scratch, bias=None):
        if _unit_stride(p):
            _ROWS.forward(xp, x, w, p, out, scratch, bias)
            return
        m = p.kg
        wv = w.reshape(1, p.c, m, p.kh, p.kw)
        for n0, n1 in _blocks(p.n, self.block(p)):
            b = n1 - n0
            src = self._padded(x[n0:n1], p, scratch)
            y = out[n0:n1].reshape(b, p.c, m, p.oh, p.ow)
            tmp = scratch("dw.tmp", y.shape, x.dtype)
            for t, (i, j, (rows, cols)) in enumerate(self._taps(p)):
                view = src[:, :, None, rows, cols]                    # (b, C, 1, oH, oW)
                tap = wv[:, :, :, i, j, None, None]                   # (1, C, m, 1, 1)
                if t == 0:
                    xp.multiply(view, tap, out=y)
                else:
                    xp.multiply(view, tap, out=tmp)
                    y += tmp
        add_bias(xp, out, bias)

    def backward_data(self, xp, dy, w, p, out, scratch):
        if _unit_stride(p):
            # the transposed problem: dY (N, C·m) -> dX (N, C), groups of m inputs and one
            # output, W'[c, q] = W[c·m + q] rotated by 180°
            flipped = _flipped(p)
            wf = scratch("dw.w_flip", (p.c, p.kg, p.kh, p.kw), w.dtype)
            wf[...] = w.reshape(p.c, p.kg, p.kh, p.kw)[:, :, ::-1, ::-1]
            _ROWS.forward(xp, dy, wf, flipped, out, scratch)
            return
        m = p.kg
        wv = w.reshape(1, p.c, m, p.kh, p.kw)
        hp, wp = p.h + p.pt + p.pb, p.w + p.pl + p.pr
        for n0, n1 in _blocks(p.n, self.block(p)):
            b = n1 - n0
            acc = out[n0:n1] if not p.padded else scratch("dw.pad", (b, p.c, hp, wp), dy.dtype)
            acc.fill(0)
            g = dy[n0:n1].reshape(b, p.c, m, p.oh, p.ow)
            tmp = scratch("dw.tmp", g.shape, dy.dtype)
            part = scratch("dw.part", (b, p.c, p.oh, p.ow), dy.dtype)
            for i, j, (rows, cols) in self._taps(p):
                xp.multiply(g, wv[:, :, :, i, j, None, None], out=tmp)
                if m == 1:
                    acc[:, :, rows, cols] += tmp[:, :, 0]
                else:
                    xp.sum(tmp, axis=2, out=part)
                    acc[:, :, rows, cols] += part
            if p.padded:
                out[n0:n1] = acc[:, :, p.pt:p.pt + p.h, p.pl:p.pl + p.w]

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        if _unit_stride(p):
            _ROWS.backward_filter(xp, x, dy, p, out, scratch, dbias)
            return
        m = p.kg
        dwt = scratch("dw.dw", (p.kh, p.kw, p.c, m), dy.dtype)
        part = scratch("dw.dw_part", (p.c, m), dy.dtype)
        for n0, n1 in _blocks(p.n, self.block(p)):
            b = n1 - n0
            src = self._padded(x[n0:n1], p, scratch)
            g = dy[n0:n1].reshape(b, p.c, m, p.oh, p.ow)
            for i, j, (rows, cols) in self._taps(p):
                # Σ over images and pixels of dY · the tap's input view, per (channel, m)
                target = dwt[i, j] if n0 == 0 else part
                _einsum(xp, "ncmrs,ncrs->cm", g, src[:, :, rows, cols], target)
                if n0:
                    dwt[i, j] += part
        out.reshape(p.c, m, p.kh, p.kw)[...] = dwt.transpose(2, 3, 0, 1)
        sum_bias(xp, dy, dbias, scratch)


def _unit_stride(p: ConvProblem) -> bool:
    """Stride 1 and pads small enough that the transposed problem needs no negative pads."""
    dkh, dkw = p.dh * (p.kh - 1), p.dw * (p.kw - 1)
    return p.sh == 1 and p.sw == 1 and max(p.pt, p.pb) <= dkh and max(p.pl, p.pr) <= dkw


def _flipped(p: ConvProblem) -> ConvProblem:
    """The depthwise conv computing dX from dY for a stride-1 problem (output H × W)."""
    dkh, dkw = p.dh * (p.kh - 1), p.dw * (p.kw - 1)
    return ConvProblem(p.n, p.k, p.oh, p.ow, p.c, p.kh, p.kw, 1, 1, dkh - p.pt, dkw - p.pl,
                       dkh - p.pb, dkw - p.pr, p.dh, p.dw, p.c, p.dtype, p.order)


def _einsum(xp, spec: str, a, b, out) -> None:
    try:
        xp.einsum(spec, a, b, out=out)
    except TypeError:   # an array library whose einsum has no out= (CuPy)
        out[...] = xp.einsum(spec, a, b)


def _blocks(n: int, size: int):
    return ((n0, min(n0 + size, n)) for n0 in range(0, n, size))
