"""Winograd F(4×4, 3×3) with compiled tile transforms, for stride-1 3×3 convs of any dilation.

The NumPy Winograd algorithms spend most of their time copying tiles (strided copies whose
innermost run is one tile row) and apply only to undilated kernels. Here the tile transforms
are compiled loops (netrun.kernels.jit.winograd) that read the input's phases in place, so a dilated
3×3 conv is the same α² channel GEMMs as an undilated one: 4× fewer multiplications than
direct convolution, with about 1e-6 relative rounding in float32 (F(4×4)'s transform has
entries up to 8 and 1/24).

Each of parallel.chunks' threads takes whole images: transform, α² GEMMs on its own
single-threaded BLAS, output transform with the bias fused. backward_data is the forward
pass on dY with the filter rotated by 180° and its channel axes swapped (pads 2·d - pad);
backward_filter transforms dY with A, multiplies by the input transform's V and sums the
chunks' partial filter spectra in chunk order, so results depend neither on timing nor on
the thread count.

Without the engine (CuPy, NETRUN_JIT=0, no Numba) it runs winograd_f4x4 (undilated) or
shift_gemm (dilated), so a choice remembered in the algorithm cache stays valid.
"""
from __future__ import annotations

import numpy as np

from netrun.conv.algorithm import (
    ConvAlgorithm,
    ConvProblem,
    find_algorithm,
    register_algorithm,
    sum_bias,
)
from netrun.conv.cpu.winograd import _MATRICES, data_gradient_problem
from netrun.kernels import jit, parallel
from netrun.kernels.geometry import ConvGeometry
from netrun.kernels.jit import winograd as kernels

DTYPES = ("float32", "float64")
M = 4                       # output tile side: F(4×4, 3×3)
ALPHA = M + 2
BLOCK_BYTES = 8 << 20       # per thread: a block's transformed input (α²·C·tiles), about this


@register_algorithm
class JitWinograd(ConvAlgorithm):
    """F(4×4, 3×3): compiled phase-tile transforms, α² BLAS GEMMs per block of images."""

    name = "winograd_jit"
    summary = "3×3 stride 1, any dilation: Winograd F(4×4,3×3), compiled (Numba) transforms"

    def applicable(self, p: ConvProblem) -> bool:
        return ((p.kh, p.kw, p.sh, p.sw, p.group) == (3, 3, 1, 1, 1) and p.dtype in DTYPES
                and jit.available())

    def block(self, p: ConvProblem) -> int:
        """Images per block (per thread)."""
        per_image = ALPHA * ALPHA * max(p.c, p.k) * tiles(p) * p.itemsize
        return max(1, min(p.n, BLOCK_BYTES // max(per_image, 1)))

    def workspace_bytes(self, p: ConvProblem) -> int:
        threads, b = parallel.per_thread(p.n, self.block(p), _work(p))
        a2, ck = ALPHA * ALPHA, p.k * p.c
        # per thread: V and M of a block, the partial dU and a block's share of it
        per_thread = a2 * (p.c + p.k) * b * tiles(p) + 2 * a2 * ck
        # the filter spectrum and its transposed filter; backward_data's cropped result
        shared = a2 * ck + 9 * ck
        if max(p.pt, p.pb) > 2 * p.dh or max(p.pl, p.pr) > 2 * p.dw:
            shared += p.n * p.c * (p.oh + 4 * p.dh) * (p.ow + 4 * p.dw)
        return (threads * per_thread + shared) * p.itemsize

    def forward(self, xp, x, w, p, out, scratch, bias=None):
        if not jit.enabled(xp):
            _fallback(p).forward(xp, x, w, p, out, scratch, bias)
            return
        u = _filter_transform(w, p, scratch)
        if bias is None:
            bias = _zeros(scratch, p.k, p.dtype)
        self._correlate(np.ascontiguousarray(x), u, np.ascontiguousarray(bias), p, out,
                        scratch)

    def backward_data(self, xp, dy, w, p, out, scratch):
        if not jit.enabled(xp):
            _fallback(p).backward_data(xp, dy, w, p, out, scratch)
            return
        q, crop = data_gradient_problem(p)
        u = _filter_transform(w[:, :, ::-1, ::-1], p, scratch, swap=True)
        dy = np.ascontiguousarray(dy)
        zero = _zeros(scratch, p.c, p.dtype)
        if not crop:
            self._correlate(dy, u, zero, q, out, scratch)
            return
        full = scratch("wjit.dx_full", (p.n, p.c, q.oh, q.ow), dy.dtype)
        self._correlate(dy, u, zero, q, full, scratch)
        out[...] = full[:, :, p.pt:p.pt + p.h, p.pl:p.pl + p.w]

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        if not jit.enabled(xp):
            _fallback(p).backward_filter(xp, x, dy, p, out, scratch, dbias)
            return
        bt, g, _, a = _matrices(p.dtype)
        a2 = ALPHA * ALPHA
        x, dy = np.ascontiguousarray(x), np.ascontiguousarray(dy)
        # chunk 0 sums into `du`; the other chunks' partial spectra are added in chunk order
        du = scratch("wjit.du", (a2, p.k, p.c), p.dtype)

        def work(index, n0, n1):
            s = parallel.chunk_scratch(scratch, index)
            acc = du if index == 0 else s("wjit.du_chunk", du.shape, p.dtype)
            for b0, b1 in _blocks(n0, n1, self.block(p)):
                t = (b1 - b0) * tiles(p)
                v = s("wjit.v", (a2, t, p.c), p.dtype)
                _gather(x[b0:b1], v, bt, -p.pt, -p.pl, p)
                dm = s("wjit.m", (a2, t, p.k), p.dtype)
                _gather(dy[b0:b1], dm, a, 0, 0, p)
                # per (ξ, ν): dU (K, C) = dMᵀ (K, T) @ V (T, C)
                target = acc if b0 == n0 else s("wjit.du_block", du.shape, p.dtype)
                np.matmul(dm.transpose(0, 2, 1), v, out=target)
                if target is not acc:
                    acc += target
            return None if index == 0 else (lambda: np.add(du, acc, out=du))

        parallel.chunks(xp, p.n, work, work=_work(p), block=self.block(p))
        dw = scratch("wjit.dw", (9, p.k * p.c), p.dtype)
        parallel.matmul(np, g.T, du.reshape(a2, -1), dw)
        out[...] = dw.reshape(3, 3, p.k, p.c).transpose(2, 3, 0, 1)
        sum_bias(xp, dy, dbias, scratch)

    def _correlate(self, x, u, bias, p: ConvProblem, out, scratch) -> None:
        """out (N, K, oH, oW) = the 3×3 stride-1 correlation of x with the spectrum u (α², C, K)."""
        bt, _, at, _ = _matrices(p.dtype)
        a2 = ALPHA * ALPHA
        th, tw = _tiles(p)
        y = out if out.flags.c_contiguous else scratch("wjit.y", out.shape, out.dtype)

        def work(index, n0, n1):
            s = parallel.chunk_scratch(scratch, index)
            for b0, b1 in _blocks(n0, n1, self.block(p)):
                t = (b1 - b0) * tiles(p)
                v = s("wjit.v", (a2, t, p.c), p.dtype)
                _gather(x[b0:b1], v, bt, -p.pt, -p.pl, p)
                prod = s("wjit.m", (a2, t, p.k), p.dtype)
                np.matmul(v, u, out=prod)          # per (ξ, ν): M (T, K) = V (T, C) @ U (C, K)
                kernels.scatter(prod, y[b0:b1], at, bias, p.dh, p.dw, th, tw)

        parallel.chunks(np, p.n, work, work=_work(p), block=self.block(p))
        if y is not out:
            out[...] = y


def _gather(src, dst, mat, top: int, left: int, p: ConvProblem) -> None:
    """dst (α², T, channels) = the transformed phase tiles of src (compiled)."""
    th, tw = _tiles(p)
    kernels.gather(src, dst, mat, M, top, left, p.dh, p.dw, th, tw)


def _fallback(p: ConvProblem) -> ConvAlgorithm:
    """The NumPy algorithm that runs p when the engine is off."""
    return find_algorithm("winograd_f4x4" if (p.dh, p.dw) == (1, 1) else "shift_gemm")


def _matrices(dtype: str):
    """(Bᵀ, G ⊗ G, Aᵀ, A) of F(4×4, 3×3) in dtype, C-contiguous (cached)."""
    if dtype not in _CACHE:
        bt, g, at = _MATRICES[M]
        _CACHE[dtype] = (np.ascontiguousarray(bt, dtype), np.kron(g, g).astype(dtype),
                         np.ascontiguousarray(at, dtype), np.ascontiguousarray(at.T, dtype))
    return _CACHE[dtype]


_CACHE: dict[str, tuple] = {}


def _filter_transform(w, p: ConvProblem, scratch, swap: bool = False):
    """U (α², C, K) = (G ⊗ G) @ w (K, C, 3, 3), channels-in first: the GEMMs' right operand
    (swap: U (α², K, C), the spectrum of w with its channel axes swapped)."""
    g = _matrices(p.dtype)[1]
    k, c = w.shape[:2]
    wt = scratch("wjit.wt", (k, c, 3, 3) if swap else (c, k, 3, 3), p.dtype)
    wt[...] = w if swap else w.transpose(1, 0, 2, 3)
    wt = wt.reshape(-1, 9)
    u = scratch("wjit.u", (ALPHA * ALPHA, k * c), p.dtype)
    parallel.matmul(np, g, wt.T, u)
    return u.reshape((ALPHA * ALPHA, k, c) if swap else (ALPHA * ALPHA, c, k))


def _zeros(scratch, size: int, dtype: str):
    """A zero bias for the output transform (which always adds one)."""
    z = scratch(f"wjit.zeros{size}", (size,), dtype)
    z.fill(0)
    return z


def _tiles(p: ConvProblem) -> tuple[int, int]:
    """Tiles per phase: rows and columns of m×m output tiles covering the largest phase."""
    return -(-(-(-p.oh // p.dh)) // M), -(-(-(-p.ow // p.dw)) // M)


def tiles(p: ConvProblem) -> int:
    """m×m output tiles per image (all phases)."""
    th, tw = _tiles(p)
    return p.dh * p.dw * th * tw


def _blocks(n0: int, n1: int, size: int):
    return ((b, min(b + size, n1)) for b in range(n0, n1, size))


def _work(p: ConvProblem) -> int:
    """Elements touched, for parallel.chunks' is-it-worth-a-thread test."""
    return p.n * p.k * p.cg * p.oh * p.ow


def prepare(args) -> None:
    """Load the float32 kernels for a conv op's args (the conv ops' preparer calls this)."""
    geom = ConvGeometry.from_args(args)
    if (args.algo not in ("", JitWinograd.name) or args.group != 1
            or (geom.kh, geom.kw, geom.sh, geom.sw) != (3, 3, 1, 1)):
        return
    kernels.prepare()
