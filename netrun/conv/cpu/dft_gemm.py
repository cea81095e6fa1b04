"""Fourier convolution on the smallest exact grid, every transform a GEMM (stride 1).

Like `fft`, correlation becomes one complex GEMM per frequency over the channels; unlike it,
the transforms are not FFTs but dense DFT matrices applied as matrix products, which is
what pays on the small images of LeNet- and CIFAR-sized nets (a 16×16 plane transforms in a
few hundred flops per pixel, and a GEMM runs those at BLAS speed while NumPy's pocketfft
spends microseconds per plane in call overhead). Two further savings come from the
matrices:

* Only the rows and columns that hold data are transformed: the zero padding is never
  materialized (the DFT matrix skips it), and the inverse computes only the output pixels.
* The grid is cyclic and as small as exactness allows. Data row h sits at (h + pt) mod P,
  and P = H + max(pt, pb) rows suffice (at least oH and the dilated kernel height): an
  output row reading past the bottom padding wraps into the top padding, which is zero
  too. CIFAR's 16×16 conv with pad 2 needs an 18×18 grid, not 20×20.

Per block of b images, with F = P·V frequencies (V = Q//2 + 1, the half spectrum of a real
signal), the pipeline is

    x (b, C, h, w) --transpose--> (h, C, b, w) --@ Bw--> (h, C·b·V) --Ah @--> (P, C, b, V)
                   --transpose--> X̂ (P, V, C, b)                       [`_spectrum`]
    Ŷ (F, K, b) = conj(Ŵ) (F, K, C) @ X̂ (F, C, b)                      [forward product]
    Ŷ (P, V·K·b) --Eh @--> (oh, V, K, b) --transpose--> (b, K, oh, V) --@ Dw--> y (b, K, oh, ow)

where Bw (w, V) and Ah (P, h) are forward DFT matrices restricted to the data positions and
Eh (oh, P), Dw (V, ow) inverse ones restricted to the wanted outputs (Dw also folds the
Hermitian half spectrum back: Re(Σ_v α_v G_v e^{2πi v s/Q}), α = 1 for v = 0 and Nyquist,
else 2). Complex matrices are applied to real data as real GEMMs against interleaved
(re, im) columns, whose results are complex arrays in memory without a copy.

    forward          Ŷ[f] = conj(Ŵ[f]) X̂[f]          (cyclic correlation)
    backward_data    dX̂[f] = Ŵ[f]ᵀ dŶ[f]              (its adjoint; padding rows dropped)
    backward_filter  dŴ[f] = conj(dŶ[f]) X̂[f]ᵀ        (summed over images; taps at i·dh, j·dw)
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from netrun.conv.algorithm import ConvAlgorithm, ConvProblem, add_bias, register_algorithm, sum_bias
from netrun.kernels.parallel import chunk_scratch, chunks, per_thread

# Images per block: a block's spectra (input and output, complex) stay near this size. The
# per-frequency GEMMs have the block as one side, so larger blocks run them faster, up to
# this size on CIFAR and LeNet shapes (measurements: benchmarks/README.md).
BLOCK_BYTES = 16 << 20
# Grids above this many rows or columns cost more in dense transforms than FFTs would.
MAX_GRID = 64


# Flop-equivalents charged per byte a transform's transposes move: strided copies move far
# fewer bytes per second than GEMMs do flops (measurements: benchmarks/README.md).
BYTE_COST = 8


def model_flops(p: ConvProblem) -> int:
    """Flop-equivalents of a forward pass this way, for the heuristic: the transforms of the
    data and of the filter (whose spectrum, F·K·C/G complex values, dwarfs the filter itself
    on small grids), the per-frequency product, and the inverse, with its copies charged."""
    pp, qq = grid(p)
    v = qq // 2 + 1
    n, c, k = p.n, p.c, p.k
    item = p.itemsize
    spectrum = 4 * n * c * p.h * p.w * v + 8 * pp * p.h * n * c * v
    filt = 4 * k * p.cg * p.kh * p.kw * v + 8 * pp * p.kh * k * p.cg * v
    image = 8 * p.oh * pp * v * n * k + 4 * n * k * p.oh * v * p.ow
    product = 8 * pp * v * k * p.cg * n
    moved = (n * c * p.h * p.w + 2 * 2 * pp * v * n * c        # x transposed, X̂ reordered
             + 2 * 2 * p.oh * v * n * k                          # the inverse's reorder
             + 3 * 2 * pp * v * k * p.cg) * item                 # the filter spectrum's
    return spectrum + filt + image + product + BYTE_COST * moved


def grid(p: ConvProblem) -> tuple[int, int]:
    """The smallest cyclic grid (P, Q) on which correlation is exact for p (stride 1)."""
    pp = max(p.h + max(p.pt, p.pb), p.oh, p.dh * (p.kh - 1) + 1)
    qq = max(p.w + max(p.pl, p.pr), p.ow, p.dw * (p.kw - 1) + 1)
    return pp, qq


def filter_spectra_bytes(p: ConvProblem) -> int:
    """Bytes of the filters' spectra, which every pass streams once per block of images (the
    part of the scratch that does not depend on the thread count)."""
    pp, qq = grid(p)
    return 2 * pp * (qq // 2 + 1) * p.k * p.cg * 2 * 2 * p.itemsize


@register_algorithm
class DFTGemm(ConvAlgorithm):
    """Fourier convolution with dense DFT matrices as GEMMs on the smallest exact grid."""

    name = "dft_gemm"
    summary = "stride 1, small images: DFTs as GEMMs on a minimal cyclic grid, GEMM per frequency"

    def applicable(self, p: ConvProblem) -> bool:
        pp, qq = grid(p)
        return p.sh == 1 and p.sw == 1 and max(pp, qq) <= MAX_GRID

    def block(self, p: ConvProblem) -> int:
        """Images per block."""
        pp, qq = grid(p)
        per_image = 2 * pp * (qq // 2 + 1) * (p.c + p.k) * 2 * p.itemsize
        return max(1, min(p.n, BLOCK_BYTES // max(per_image, 1)))

    def workspace_bytes(self, p: ConvProblem) -> int:
        pp, qq = grid(p)
        v = qq // 2 + 1
        work = p.n * (p.c * p.h * p.w + p.k * p.oh * p.ow) * 8    # as the gradients' `chunks`
        threads, b = per_thread(p.n, self.block(p), work)          # each its own buffers
        per_image = max(p.c * p.h * (p.w + 2 * v), p.k * p.oh * (p.ow + 2 * v))
        spectra = 2 * pp * v * (p.c + p.k) * b * 2        # complex: 2 reals each
        filt = filter_spectra_bytes(p) // p.itemsize
        return (threads * (2 * (spectra + per_image * b) + filt) + filt) * p.itemsize

    # Directions ----------------------------------------------------------------------------
    def forward(self, xp, x, w, p, out, scratch, bias=None):
        pp, qq = grid(p)
        f = pp * (qq // 2 + 1)
        wc = _filter_spectrum(xp, w, p, scratch, conjugate=True)     # (F, G, K/G, C/G)

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                b = n1 - n0
                xf = _spectrum(xp, x[n0:n1], p, (p.pt, p.pl), s, "x")   # (P, V, C, b)
                yf = s("dft.y", (f, p.group, p.kg, b), xf.dtype)
                xp.matmul(wc, xf.reshape(f, p.group, p.cg, b), out=yf)
                _image(xp, yf.reshape(pp, -1, p.k, b), p, (0, 0), out[n0:n1], s)
            add_bias(xp, out[c0:c1], bias)

        chunks(xp, p.n, work, work=p.n * p.k * p.oh * p.ow * 8, block=self.block(p))

    def backward_data(self, xp, dy, w, p, out, scratch):
        pp, qq = grid(p)
        f = pp * (qq // 2 + 1)
        # Ŵ[f]ᵀ per group: (F, G, C/G, K/G)
        wt = _filter_spectrum(xp, w, p, scratch, conjugate=False).transpose(0, 1, 3, 2)

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                b = n1 - n0
                dyf = _spectrum(xp, dy[n0:n1], p, (0, 0), s, "dy")     # (P, V, K, b)
                dxf = s("dft.dx", (f, p.group, p.cg, b), dyf.dtype)
                xp.matmul(wt, dyf.reshape(f, p.group, p.kg, b), out=dxf)
                _image(xp, dxf.reshape(pp, -1, p.c, b), p, (p.pt, p.pl), out[n0:n1], s)

        chunks(xp, p.n, work, work=p.n * p.c * p.h * p.w * 8, block=self.block(p))

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        self._gradients(xp, x, dy, None, p, None, out, scratch, dbias)

    def backward(self, xp, x, dy, w, p, dx, dw, scratch, dbias=None):
        # dŶ is transformed once for both gradients
        self._gradients(xp, x, dy, w, p, dx, dw, scratch, dbias)

    def _gradients(self, xp, x, dy, w, p, dx, dw, scratch, dbias) -> None:
        """dw (and dbias), and dx too unless it is None, from one pass over the blocks."""
        pp, qq = grid(p)
        f = pp * (qq // 2 + 1)
        if dx is not None:   # Ŵ[f]ᵀ per group: (F, G, C/G, K/G)
            wt = _filter_spectrum(xp, w, p, scratch, conjugate=False).transpose(0, 1, 3, 2)
        # chunk 0 sums into `total`; the other chunks' partial sums are added in chunk order
        total = scratch("dft.dw", (f, p.group, p.kg, p.cg), _complex(x.dtype))

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            acc = total if index == 0 else s("dft.dw_chunk", total.shape, total.dtype)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                b = n1 - n0
                xf = _spectrum(xp, x[n0:n1], p, (p.pt, p.pl), s, "x")     # (P, V, C, b)
                dyf = _spectrum(xp, dy[n0:n1], p, (0, 0), s, "dy")       # (P, V, K, b)
                if dx is not None:
                    dxf = s("dft.dx", (f, p.group, p.cg, b), dyf.dtype)
                    xp.matmul(wt, dyf.reshape(f, p.group, p.kg, b), out=dxf)
                    _image(xp, dxf.reshape(pp, -1, p.c, b), p, (p.pt, p.pl), dx[n0:n1], s)
                xp.conjugate(dyf, out=dyf)
                # dŴ[f] (G, K/G, C/G) = conj(dŶ[f]) (G, K/G, b) @ X̂[f]ᵀ (G, b, C/G)
                lhs = dyf.reshape(f, p.group, p.kg, b)
                rhs = xf.reshape(f, p.group, p.cg, b).transpose(0, 1, 3, 2)
                if n0 == c0:
                    xp.matmul(lhs, rhs, out=acc)
                else:
                    part = s("dft.dw_part", acc.shape, acc.dtype)
                    xp.matmul(lhs, rhs, out=part)
                    acc += part
            return None if index == 0 else (lambda: xp.add(total, acc, out=total))

        chunks(xp, p.n, work, work=p.n * (p.c * p.h * p.w + p.k * p.oh * p.ow) * 8,
               block=self.block(p))
        # The inverse of every filter at once: C/G "images" of K channels each, tap (i, j) at
        # grid position (i·dh, j·dw).
        taps = scratch("dft.taps", (p.cg, p.k, p.kh, p.kw), x.dtype)
        _image(xp, total.reshape(pp, -1, p.k, p.cg), p, (0, 0), taps, scratch, kernel=True)
        dw[...] = taps.transpose(1, 0, 2, 3)
        sum_bias(xp, dy, dbias, scratch)


# Transforms ----------------------------------------------------------------------------------
def _spectrum(xp, a, p: ConvProblem, offset: tuple[int, int], scratch, key: str,
              kernel: bool = False):
    """X̂ (P, V, C, b) of a block a (b, C, h, w) whose pixel (r, s) sits at grid position
    (r + top, s + left) mod (P, Q), or at (r·dh, s·dw) for a filter (`kernel`)."""
    pp, qq = grid(p)
    v = qq // 2 + 1
    b, c, h, w = a.shape
    cplx = _complex(a.dtype)
    at = scratch(f"dft.{key}_t", (h, c, b, w), a.dtype)
    at[...] = a.transpose(2, 1, 0, 3)                                   # (h, C, b, w)
    bw = _rows_forward(xp, qq, _positions(w, offset[1], qq, p.dw if kernel else 0),
                       a.dtype)                                          # (w, 2V) real
    z = scratch(f"dft.{key}_z", (h * c * b, 2 * v), a.dtype)
    xp.matmul(at.reshape(h * c * b, w), bw, out=z)                      # (h, C·b·V) complex
    ah = _columns_forward(xp, pp, _positions(h, offset[0], pp, p.dh if kernel else 0),
                          cplx)                                          # (P, h)
    s = scratch(f"dft.{key}_s", (pp, c * b * v), cplx)
    xp.matmul(ah, z.view(cplx).reshape(h, c * b * v), out=s)            # (P, C, b, V)
    spec = scratch(f"dft.{key}_f", (pp, v, c, b), cplx)
    spec[...] = s.reshape(pp, c, b, v).transpose(0, 3, 1, 2)
    return spec


def _image(xp, spec, p: ConvProblem, offset: tuple[int, int], out, scratch,
           kernel: bool = False) -> None:
    """out (b, K, oh, ow) = the real inverse of spec (P, V, K, b) at grid positions
    (t + top, s + left) mod (P, Q), or at (t·dh, s·dw) for filter taps (`kernel`)."""
    pp, qq = grid(p)
    v = qq // 2 + 1
    b, k, oh, ow = out.shape
    real = out.dtype
    eh = _columns_inverse(xp, pp, _positions(oh, offset[0], pp, p.dh if kernel else 0),
                          spec.dtype)                                    # (oh, P)
    g = scratch("dft.g", (oh, v * k * b), spec.dtype)
    xp.matmul(eh, spec.reshape(pp, v * k * b), out=g)                   # (oh, V, K, b)
    gt = scratch("dft.g_t", (b, k, oh, v), spec.dtype)
    gt[...] = g.reshape(oh, v, k, b).transpose(3, 2, 0, 1)
    dw = _rows_inverse(xp, pp, qq, _positions(ow, offset[1], qq, p.dw if kernel else 0),
                       real)                                             # (2V, ow) real
    xp.matmul(gt.view(real).reshape(b * k * oh, 2 * v), dw, out=out.reshape(b * k * oh, ow))


def _filter_spectrum(xp, w, p: ConvProblem, scratch, conjugate: bool):
    """Ŵ (F, G, K/G, C/G), or its conjugate, of the dilated filter (taps at i·dh, j·dw)."""
    pp, qq = grid(p)
    f = pp * (qq // 2 + 1)
    wf = _spectrum(xp, w, p, (0, 0), scratch, "w", kernel=True)         # (P, V, C/G, K)
    key = "dft.w_conj" if conjugate else "dft.w_plain"
    out = scratch(key, (f, p.group, p.kg, p.cg), wf.dtype)
    view = wf.reshape(f, p.cg, p.group, p.kg).transpose(0, 2, 3, 1)
    if conjugate:
        xp.conjugate(view, out=out)
    else:
        out[...] = view
    return out


# DFT matrices (cached per grid, positions and dtype) -----------------------------------------
def _positions(n: int, offset: int, size: int, step: int) -> tuple[int, ...]:
    """Grid positions of n samples: (i + offset) mod size, or i·step for filter taps."""
    if step:
        return tuple(i * step for i in range(n))
    return tuple((i + offset) % size for i in range(n))


def _rows_forward(xp, q: int, pos: tuple[int, ...], dtype):
    """(n, 2V) real: column 2v of row i is Re e^{-2πi v·pos_i/Q}, column 2v+1 its Im."""
    return _on(xp, _rows_forward_np, q, pos, np.dtype(dtype).str)


def _columns_forward(xp, p: int, pos: tuple[int, ...], cplx):
    """(P, n) complex: e^{-2πi u·pos_i/P}."""
    return _on(xp, _dft_np, p, pos, -1, np.dtype(cplx).str)


def _columns_inverse(xp, p: int, pos: tuple[int, ...], cplx):
    """(n, P) complex: e^{+2πi u·pos_t/P}."""
    return _on(xp, _dft_np, p, pos, 1, np.dtype(cplx).str)


def _rows_inverse(xp, p: int, q: int, pos: tuple[int, ...], dtype):
    """(2V, n) real: rows 2v, 2v+1 map (Re G_v, Im G_v) to α_v Re(G_v e^{2πi v·pos/Q})/(P·Q)."""
    return _on(xp, _rows_inverse_np, p, q, pos, np.dtype(dtype).str)


@lru_cache(maxsize=256)
def _dft_np(size: int, pos: tuple[int, ...], sign: int, dtype: str) -> np.ndarray:
    u = np.arange(size)
    m = np.exp(sign * 2j * np.pi * np.outer(pos, u) / size)            # (n, size)
    # forward: (size, n), applied on the left of the data rows; inverse: (n, size)
    return np.ascontiguousarray(m.T if sign < 0 else m).astype(dtype)


@lru_cache(maxsize=256)
def _rows_forward_np(q: int, pos: tuple[int, ...], dtype: str) -> np.ndarray:
    v = np.arange(q // 2 + 1)
    e = np.exp(-2j * np.pi * np.outer(pos, v) / q)                      # (n, V)
    return np.stack([e.real, e.imag], axis=-1).reshape(len(pos), -1).astype(dtype)


@lru_cache(maxsize=256)
def _rows_inverse_np(p: int, q: int, pos: tuple[int, ...], dtype: str) -> np.ndarray:
    v = np.arange(q // 2 + 1)
    alpha = np.where((v == 0) | ((q % 2 == 0) & (v == q // 2)), 1.0, 2.0) / (p * q)
    angle = 2 * np.pi * np.outer(v, pos) / q                            # (V, n)
    rows = np.stack([alpha[:, None] * np.cos(angle), -alpha[:, None] * np.sin(angle)], axis=1)
    return rows.reshape(-1, len(pos)).astype(dtype)                     # (2V, n)


_DEVICE_COPIES: dict[tuple, Any] = {}


def _on(xp, make, *args):
    """make(*args) (a cached NumPy matrix), as an array of xp's device."""
    a = make(*args)
    if xp is np:
        return a
    key = (xp.__name__, make.__name__) + args
    if key not in _DEVICE_COPIES:
        _DEVICE_COPIES[key] = xp.asarray(a)
    return _DEVICE_COPIES[key]


def _complex(dtype):
    return np.result_type(dtype, np.complex64)


def _blocks(start: int, stop: int, size: int):
    return ((n0, min(n0 + size, stop)) for n0 in range(start, stop, size))
