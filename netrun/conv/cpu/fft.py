"""FFT convolution for stride-1 problems (large kernels are where it pays).

On a P×Q grid (P ≥ padded height, Q ≥ padded width, both 5-smooth) correlation becomes a
product per frequency, and the channel sum a complex GEMM per frequency f:

    forward          Ŷ[f] (K, N)  = conj(Ŵ[f]) (K, C) @ X̂[f] (C, N)    y = irfft2(Ŷ) cropped
    backward_data    dX̂[f] (C, N) = Ŵ[f]ᵀ (C, K) @ dŶ[f] (K, N)        dx = its padded middle
    backward_filter  dŴ[f] (K, C) = conj(dŶ[f]) (K, N) @ X̂[f]ᵀ (N, C)   dw = irfft2 cropped

(x̂ = rfft2 of the zero-padded input, ŵ of the dilated filter). The grid holds every tap of
every output without wrap-around: outputs t = r ∈ [0, oH) read t + i·dh ≤ Hp - 1 < P. The
cost is independent of the kernel size, so 5×5 and larger kernels on small images win most.
"""
from __future__ import annotations

import numpy as np

from netrun.conv.algorithm import ConvAlgorithm, ConvProblem, add_bias, register_algorithm, sum_bias
from netrun.kernels import parallel


def good_size(n: int) -> int:
    """The smallest 2^a·3^b·5^c >= n (sizes pocketfft and cuFFT transform fastest)."""
    best = 1 << max(0, (n - 1).bit_length())
    f5 = 1
    while f5 < 2 * n:
        f35 = f5
        while f35 < 2 * n:
            f = f35
            while f < n:
                f *= 2
            best = min(best, f)
            f35 *= 3
        f5 *= 5
    return best


@register_algorithm
class FFTConv(ConvAlgorithm):
    """rfft2 of padded inputs and dilated filters, complex GEMMs per frequency, irfft2."""

    name = "fft"
    summary = "stride 1: rfft2, one complex GEMM per frequency, irfft2; cost independent of kernel"

    def applicable(self, p: ConvProblem) -> bool:
        return p.sh == 1 and p.sw == 1

    def grid(self, p: ConvProblem) -> tuple[int, int, int]:
        """(P, Q, frequencies) of the transform grid."""
        hp, wp = p.h + p.pt + p.pb, p.w + p.pl + p.pr
        pp, qq = good_size(hp), good_size(wp)
        return pp, qq, pp * (qq // 2 + 1)

    def workspace_bytes(self, p: ConvProblem) -> int:
        pp, qq, f = self.grid(p)
        real = p.n * max(p.c, p.k) * pp * qq + p.k * p.cg * pp * qq
        cplx = 2 * (2 * p.n * p.c + 2 * p.n * p.k + 2 * p.k * p.cg) * f
        return (real + cplx) * p.itemsize

    # Transforms ----------------------------------------------------------------------------
    def _spectrum(self, xp, a, p: ConvProblem, key: str, scratch, top: int = 0, left: int = 0,
                  step: tuple[int, int] = (1, 1)):
        """rfft2 of `a` (B, C, h, w) placed at (top, left) of a zero P×Q grid, its rows
        and columns spread `step` apart (dilation, stride): returned as (F, C, B)."""
        pp, qq, f = self.grid(p)
        bsz, ch = a.shape[:2]
        grid = scratch(f"fft.grid_{key}", (bsz, ch, pp, qq), a.dtype)
        grid.fill(0)
        sy, sx = step
        grid[:, :, top:top + (a.shape[2] - 1) * sy + 1:sy,
             left:left + (a.shape[3] - 1) * sx + 1:sx] = a
        spec = scratch(f"fft.spec_{key}", (bsz, ch, pp, qq // 2 + 1), _complex(a.dtype))
        _rfft2(xp, grid, spec)
        freq = scratch(f"fft.freq_{key}", (f, ch, bsz), spec.dtype)
        freq[...] = spec.reshape(bsz, ch, f).transpose(2, 1, 0)     # (F, C, B)
        return freq

    def _spatial(self, xp, freq, p: ConvProblem, dtype, scratch):
        """irfft2 of a (F, C, B) spectrum: the (B, C, P, Q) real grid."""
        pp, qq, f = self.grid(p)
        _, ch, bsz = freq.shape
        spec = scratch("fft.spec_out", (bsz, ch, pp, qq // 2 + 1), freq.dtype)
        spec.reshape(bsz, ch, f)[...] = freq.transpose(2, 1, 0)
        grid = scratch("fft.grid_out", (bsz, ch, pp, qq), dtype)
        _irfft2(xp, spec, grid, (pp, qq), scratch)
        return grid

    def _filter(self, xp, w, p: ConvProblem, scratch):
        """Ŵ (F, G, K/G, C/G) of the dilated filter."""
        pp, qq, f = self.grid(p)
        wf = self._spectrum(xp, w, p, "w", scratch, step=(p.dh, p.dw))   # (F, C/G, K)
        return wf.reshape(f, p.cg, p.group, p.kg).transpose(0, 2, 3, 1)

    # Directions ----------------------------------------------------------------------------
    def forward(self, xp, x, w, p, out, scratch, bias=None):
        _, _, f = self.grid(p)
        xf = self._spectrum(xp, x, p, "x", scratch, p.pt, p.pl)       # (F, C, N)
        wf = self._filter(xp, w, p, scratch)
        wc = scratch("fft.w_conj", wf.shape, wf.dtype)
        xp.conjugate(wf, out=wc)
        yf = scratch("fft.prod", (f, p.group, p.kg, p.n), xf.dtype)
        parallel.matmul(xp, wc, xf.reshape(f, p.group, p.cg, p.n), yf)
        grid = self._spatial(xp, yf.reshape(f, p.k, p.n), p, x.dtype, scratch)
        out[...] = grid[:, :, :p.oh, :p.ow]
        add_bias(xp, out, bias)

    def backward_data(self, xp, dy, w, p, out, scratch):
        _, _, f = self.grid(p)
        dyf = self._spectrum(xp, dy, p, "dy", scratch)                # (F, K, N)
        wf = self._filter(xp, w, p, scratch)                           # (F, G, K/G, C/G)
        dxf = scratch("fft.prod", (f, p.group, p.cg, p.n), dyf.dtype)
        parallel.matmul(xp, wf.transpose(0, 1, 3, 2), dyf.reshape(f, p.group, p.kg, p.n), dxf)
        grid = self._spatial(xp, dxf.reshape(f, p.c, p.n), p, dy.dtype, scratch)
        out[...] = grid[:, :, p.pt:p.pt + p.h, p.pl:p.pl + p.w]

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        _, _, f = self.grid(p)
        xf = self._spectrum(xp, x, p, "x", scratch, p.pt, p.pl)       # (F, C, N)
        dyf = self._spectrum(xp, dy, p, "dy", scratch)                # (F, K, N)
        xp.conjugate(dyf, out=dyf)
        dwf = scratch("fft.prod", (f, p.group, p.kg, p.cg), xf.dtype)
        parallel.matmul(xp, dyf.reshape(f, p.group, p.kg, p.n),
                        xf.reshape(f, p.group, p.cg, p.n).transpose(0, 1, 3, 2), dwf)
        # (F, K, C/G) as a batch of K·C/G spectra
        grid = self._spatial(xp, dwf.reshape(f, p.k, p.cg), p, x.dtype, scratch)   # (C/G, K, P, Q)
        dkh, dkw = p.dh * (p.kh - 1) + 1, p.dw * (p.kw - 1) + 1
        out[...] = grid[:, :, :dkh:p.dh, :dkw:p.dw].transpose(1, 0, 2, 3)
        sum_bias(xp, dy, dbias, scratch)


def _complex(dtype):
    return np.result_type(dtype, np.complex64)


def _rfft2(xp, a, out) -> None:
    try:
        xp.fft.rfft2(a, out=out)
    except TypeError:   # an array library whose FFT has no out= (CuPy)
        out[...] = xp.fft.rfft2(a)


def _irfft2(xp, a, out, s, scratch) -> None:
    # Two 1-D passes: NumPy 2.4's irfft2(..., out=) returns garbage (it reuses `out` for the
    # complex intermediate), while ifft and irfft with out= are fine.
    try:
        mid = scratch("fft.ifft_mid", a.shape, a.dtype)
        xp.fft.ifft(a, axis=-2, out=mid)
        xp.fft.irfft(mid, n=s[1], axis=-1, out=out)
    except TypeError:   # an array library whose FFT has no out= (CuPy)
        out[...] = xp.fft.irfft2(a, s=s)
