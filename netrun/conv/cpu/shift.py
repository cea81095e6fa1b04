"""Shift-and-accumulate GEMMs on a kw-expanded copy of the input (stride 1 in height).

The input is copied kw times, each copy shifted by one kernel column:

    E[n, c, j, y, s] = x_pad[n, c, y, s·sw + j·dw]       per image   (b, C·kw, Hp, oW)
    E[c, j, y, n, s] = the same                           batch-inner (C·kw, Hp, b, oW)

Kernel row i reads rows y = r + i·dh of it. For fixed i the rows (c, j) of that view are one
stride apart and its columns (r, s) (per image) or (r, n, s) (batch-inner) are contiguous, so
the view is a plain GEMM operand without any further copy, and

    forward          Y_n (K, oH·oW)    = Σ_i W_i (K, C·kw) @ E_i,n        per image, into Y
    backward_data    dE_i,n (C·kw, ·)  = W_i^T @ dY_n, added into E's rows, folded back over j
    backward_filter  dW_i (K, C·kw)    = dY (K, oH·b·oW) @ E_i^T          batch-inner: one GEMM

are kh GEMMs over strided views: kw× the input is copied instead of im2col's kh·kw× the output
(forward and backward-data write NCHW directly; backward-filter sums the batch inside its GEMM).
With one group the bias rides along as an extra row of ones: forward [W_0 | b] @ [E_0; 1],
and backward-filter's extra column of dW is db.
"""
from __future__ import annotations

from netrun.conv.algorithm import ConvAlgorithm, ConvProblem, add_bias, register_algorithm, sum_bias
from netrun.kernels.parallel import chunk_scratch, chunks, per_thread

# Images per block: the expanded copy of a block stays near this size (in cache as far as
# possible, and a moderate reusable allocation however large the batch).
BLOCK_BYTES = 6 << 20


@register_algorithm
class ShiftGemm(ConvAlgorithm):
    """kh GEMMs over a kw-expanded copy; any kernel, width stride, dilation, pads, groups."""

    name = "shift_gemm"
    summary = "stride 1 in height: kh GEMMs on a kw-times expanded input copy, bias fused"

    def applicable(self, p: ConvProblem) -> bool:
        return p.sh == 1

    def block(self, p: ConvProblem) -> int:
        """Images per block."""
        per_image = (p.c * p.kw + 1) * _hp(p) * p.ow * p.itemsize
        return max(1, min(p.n, BLOCK_BYTES // max(per_image, 1)))

    def workspace_bytes(self, p: ConvProblem) -> int:
        threads, b = per_thread(p.n, self.block(p), p.n * p.k * p.oh * p.ow * p.kh)
        cols = p.oh * b * p.ow
        e = (p.c * p.kw + 1) * _hp(p) * b * p.ow
        weights = p.k * p.cg * p.kh * p.kw + p.k * (p.cg * p.kw + 1)
        work = max(2 * p.k * cols, p.k * cols + p.c * p.kw * cols)
        # every thread has its own buffers (a partial dW among them), plus the summed dW
        return (threads * (e + work + weights) + weights) * p.itemsize

    def forward(self, xp, x, w, p, out, scratch, bias=None):
        fuse = bias is not None and p.group == 1
        wr, w0 = _weights(xp, w, p, scratch, bias if fuse else None)
        hw = p.oh * p.ow

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                b = n1 - n0
                e = _expand_images(xp, x[n0:n1], p, s, ones=fuse)
                y = out[n0:n1].reshape(b, p.group, p.kg, hw)
                tmp = s("shift.tmp", y.shape, x.dtype)
                for i in range(p.kh):
                    lhs = w0 if (i == 0 and fuse) else wr[:, i]       # (G, K/G, C/G·kw [+1])
                    rhs = _image_rows(xp, e, p, i, fuse and i == 0)   # (b, G, ·, oH·oW)
                    if i == 0:
                        xp.matmul(lhs, rhs, out=y)
                    else:
                        xp.matmul(lhs, rhs, out=tmp)
                        y += tmp
            if not fuse:
                add_bias(xp, out[c0:c1], bias)

        chunks(xp, p.n, work, work=p.n * p.k * hw * p.kh, block=self.block(p))

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        fuse = dbias is not None and p.group == 1
        ckw = p.cg * p.kw
        first = 1 if fuse else 0             # with the bias fused, row 0 lives in dw0
        # chunk 0 sums into these; the other chunks' partial sums are added in chunk order
        total_r = scratch("shift.dw", (p.group, p.kh, p.kg, ckw), dy.dtype)
        total_0 = scratch("shift.dw0", (p.k, p.c * p.kw + 1), dy.dtype)

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            dwr = total_r if index == 0 else s("shift.dw_chunk", total_r.shape, dy.dtype)
            dw0 = total_0 if index == 0 else s("shift.dw0_chunk", total_0.shape, dy.dtype)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                b = n1 - n0
                e = _expand(xp, x[n0:n1], p, s, ones=fuse)
                dyt = _dy_rows(xp, dy[n0:n1], p, s)                  # (G, K/G, oH·b·oW)
                for i in range(p.kh):
                    ext = fuse and i == 0
                    target = dw0[None] if ext else dwr[:, i]
                    rhs = _rows(xp, e, p, b, i, ext).transpose(0, 2, 1)
                    if n0 == c0:
                        xp.matmul(dyt, rhs, out=target)
                    else:
                        part = s("shift.dw_part", target.shape, dy.dtype)
                        xp.matmul(dyt, rhs, out=part)
                        target += part
            if index == 0:
                return None

            def commit():
                total_r[:, first:] += dwr[:, first:]
                if fuse:
                    total_0[...] += dw0
            return commit

        chunks(xp, p.n, work, work=p.n * p.k * p.oh * p.ow * p.kh, block=self.block(p))
        if fuse:
            total_r[0, 0] = total_0[:, :ckw]
            dbias[...] = total_0[:, ckw]
        # (G, kh, K/G, C/G, kw) -> (G, K/G, C/G, kh, kw)
        out.reshape(p.group, p.kg, p.cg, p.kh, p.kw)[...] = (
            total_r.reshape(p.group, p.kh, p.kg, p.cg, p.kw).transpose(0, 2, 3, 1, 4))
        if not fuse:
            sum_bias(xp, dy, dbias, scratch)

    def backward_data(self, xp, dy, w, p, out, scratch):
        flipped = _flipped(p)
        if flipped is not None:
            # dX is the forward pass of the transposed problem: dY correlated with W rotated
            # by 180° and its channel axes swapped, pads d·(k-1) - pad. Its GEMMs contract
            # over K/G·kw instead of K/G, and there is no fold.
            wf = scratch("shift.w_flip", (p.group, p.cg, p.kg, p.kh, p.kw), w.dtype)
            wf[...] = w.reshape(p.group, p.kg, p.cg, p.kh, p.kw)[..., ::-1, ::-1].transpose(
                0, 2, 1, 3, 4)
            self.forward(xp, dy, wf.reshape(p.c, p.kg, p.kh, p.kw), flipped, out, scratch)
            return
        wr, _ = _weights(xp, w, p, scratch, None)
        wt = wr.transpose(0, 1, 3, 2)                            # (G, kh, C/G·kw, K/G)
        hp, hw = _hp(p), p.oh * p.ow

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                b = n1 - n0
                g = dy[n0:n1].reshape(b, p.group, p.kg, hw)
                de = s("shift.e", (b, p.c * p.kw, hp, p.ow), dy.dtype)
                tmp = s("shift.tmp", (b, p.group, p.cg * p.kw, hw), dy.dtype)
                if p.kh > 1:
                    de[:, :, p.oh:] = 0      # rows that kernel row 0 does not write
                for i in range(p.kh):
                    view = _image_rows(xp, de, p, i, False)
                    if i == 0:
                        xp.matmul(wt[:, 0], g, out=view)
                    else:
                        xp.matmul(wt[:, i], g, out=tmp)
                        view += tmp
                _fold(xp, de.reshape(b, p.c, p.kw, hp, p.ow), p, out[n0:n1])

        chunks(xp, p.n, work, work=p.n * p.c * p.kw * hp * p.ow * p.kh, block=self.block(p))


# backward_data runs as a forward conv of dY when that computes at most this many times the
# outputs of the direct way (H·W vs oH·oW): "same" padded convs, not valid ones (LeNet's 12×12
# -> 8×8 would cost 2.25×).
FLIP_MAX_RATIO = 1.3


def _flipped(p: ConvProblem) -> ConvProblem | None:
    """The transposed problem computing dX from dY as a forward conv, if it pays here."""
    dkh, dkw = p.dh * (p.kh - 1), p.dw * (p.kw - 1)
    if p.sh != 1 or p.sw != 1 or max(p.pt, p.pb) > dkh or max(p.pl, p.pr) > dkw:
        return None
    if p.h * p.w > FLIP_MAX_RATIO * p.oh * p.ow:
        return None
    return ConvProblem(p.n, p.k, p.oh, p.ow, p.c, p.kh, p.kw, 1, 1, dkh - p.pt, dkw - p.pl,
                       dkh - p.pb, dkw - p.pr, p.dh, p.dw, p.group, p.dtype, p.order)


def _hp(p: ConvProblem) -> int:
    return p.h + p.pt + p.pb


def _blocks(start: int, stop: int, size: int):
    return ((n0, min(n0 + size, stop)) for n0 in range(start, stop, size))


def _weights(xp, w, p: ConvProblem, scratch, bias):
    """W by kernel row, (G, kh, K/G, C/G·kw); with a bias also [W_0 | b] (1, K, C·kw + 1)."""
    wr = scratch("shift.w", (p.group, p.kh, p.kg, p.cg, p.kw), w.dtype)
    wr[...] = w.reshape(p.group, p.kg, p.cg, p.kh, p.kw).transpose(0, 3, 1, 2, 4)
    wr = wr.reshape(p.group, p.kh, p.kg, p.cg * p.kw)
    if bias is None:
        return wr, None
    w0 = scratch("shift.w0", (p.k, p.c * p.kw + 1), w.dtype)
    w0[:, :-1] = wr[0, 0]
    w0[:, -1] = bias
    return wr, w0[None]


def _column_range(p: ConvProblem, j: int) -> tuple[int, int, int]:
    """Output columns [s0, s1) whose tap j lands inside the image, and the first x column."""
    lo = p.pl - j * p.dw                       # s·sw >= lo  and  s·sw <= W - 1 + lo
    s0 = max(0, -(-lo // p.sw))
    s1 = min(p.ow, (p.w - 1 + lo) // p.sw + 1) if p.w - 1 + lo >= 0 else 0
    return s0, max(s0, s1), s0 * p.sw - lo


def _expand(xp, x, p: ConvProblem, scratch, ones: bool):
    """E (C·kw [+1 ones row], Hp, b, oW) from an unpadded block x (b, C, H, W).

    Only the padding is zeroed: every element is written exactly once, and the copy of each
    tap reads whole image rows (runs of oW, contiguous for width stride 1).
    """
    b, hp = x.shape[0], _hp(p)
    rows = p.c * p.kw + (1 if ones else 0)
    e = scratch("shift.e", (rows, hp, b, p.ow), x.dtype)
    ev = e[:p.c * p.kw].reshape(p.c, p.kw, hp, b, p.ow)
    for j in range(p.kw):
        ej = ev[:, j]                                         # (C, Hp, b, oW)
        if p.pt:
            ej[:, :p.pt] = 0
        if p.pb:
            ej[:, p.pt + p.h:] = 0
        mid = ej[:, p.pt:p.pt + p.h]                         # (C, H, b, oW)
        s0, s1, x0 = _column_range(p, j)
        if s0 > 0:
            mid[..., :s0] = 0
        if s1 < p.ow:
            mid[..., s1:] = 0
        if s1 > s0:
            cols = x[:, :, :, x0:x0 + (s1 - s0 - 1) * p.sw + 1:p.sw]       # (b, C, H, s)
            mid[..., s0:s1] = cols.transpose(1, 2, 0, 3)
    if ones:
        e[-1].reshape(-1)[:p.oh * b * p.ow] = 1
    return e


def _rows(xp, e, p: ConvProblem, b: int, i: int, with_ones: bool):
    """Kernel row i's GEMM operand (G, C/G·kw [+1], oH·b·oW): a strided view into E."""
    flat = e.reshape(-1)
    row = e.strides[0]
    cols = p.oh * b * p.ow
    start = flat[i * p.dh * b * p.ow:]
    if with_ones:   # one group: every row of E, the ones row included
        return xp.lib.stride_tricks.as_strided(start, (1, p.c * p.kw + 1, cols),
                                               (0, row, flat.strides[0]))
    per_group = p.cg * p.kw
    return xp.lib.stride_tricks.as_strided(start, (p.group, per_group, cols),
                                           (per_group * row, row, flat.strides[0]))


def _dy_rows(xp, dy, p: ConvProblem, scratch):
    """dY of a block as (G, K/G, oH·b·oW) (a transposed copy)."""
    b = dy.shape[0]
    dyt = scratch("shift.dyt", (p.k, p.oh, b, p.ow), dy.dtype)
    dyt[...] = dy.transpose(1, 2, 0, 3)
    return dyt.reshape(p.group, p.kg, p.oh * b * p.ow)


def _fold(xp, de, p: ConvProblem, dx) -> None:
    """dx (b, C, H, W) = Σ_j of the per-image E-gradient (b, C, kw, Hp, oW) shifted back."""
    dx.fill(0)
    for j in range(p.kw):
        s0, s1, x0 = _column_range(p, j)
        if s1 > s0:
            dx[:, :, :, x0:x0 + (s1 - s0 - 1) * p.sw + 1:p.sw] += de[:, :, j, p.pt:p.pt + p.h,
                                                                      s0:s1]


def _expand_images(xp, x, p: ConvProblem, scratch, ones: bool):
    """Per-image E (b, C·kw [+1 ones row], Hp, oW) from an unpadded block x (b, C, H, W)."""
    b, hp = x.shape[0], _hp(p)
    rows = p.c * p.kw + (1 if ones else 0)
    e = scratch("shift.e", (b, rows, hp, p.ow), x.dtype)
    ev = e[:, :p.c * p.kw].reshape(b, p.c, p.kw, hp, p.ow)
    for j in range(p.kw):
        ej = ev[:, :, j]                                      # (b, C, Hp, oW)
        if p.pt:
            ej[:, :, :p.pt] = 0
        if p.pb:
            ej[:, :, p.pt + p.h:] = 0
        mid = ej[:, :, p.pt:p.pt + p.h]                      # (b, C, H, oW)
        s0, s1, x0 = _column_range(p, j)
        if s0 > 0:
            mid[..., :s0] = 0
        if s1 < p.ow:
            mid[..., s1:] = 0
        if s1 > s0:
            mid[..., s0:s1] = x[:, :, :, x0:x0 + (s1 - s0 - 1) * p.sw + 1:p.sw]
    if ones:
        e[:, -1].reshape(b, -1)[:, :p.oh * p.ow] = 1
    return e


def _image_rows(xp, e, p: ConvProblem, i: int, with_ones: bool):
    """Kernel row i's per-image GEMM operand (b, G, C/G·kw [+1], oH·oW): a view into E."""
    flat = e.reshape(-1)
    b, item = e.shape[0], flat.strides[0]
    image, row = e.strides[0], e.strides[1]
    start = flat[i * p.dh * p.ow:]
    if with_ones:
        shape, strides = (b, 1, p.c * p.kw + 1), (image, 0, row)
    else:
        per_group = p.cg * p.kw
        shape, strides = (b, p.group, per_group), (image, per_group * row, row)
    return xp.lib.stride_tricks.as_strided(start, shape + (p.oh * p.ow,), strides + (item,))
