"""Convolution algorithms as pluggable units (cuDNN's forward / backward-data / backward-filter).

Every algorithm computes the same three directions of one `ConvProblem`, always in NCHW with
Caffe2's filter layout K × C/G × kh × kw:

    forward          Y  (N, K, oH, oW)    = conv(X (N, C, H, W), W)
    backward_data    dX (N, C, H, W)      = conv^T(dY, W)
    backward_filter  dW (K, C/G, kh, kw)  = corr(X, dY)

ConvTranspose runs on the same units: its forward is the backward-data pass of the conv
whose input has ConvTranspose's output shape, and vice versa. Algorithms write into `out`
and draw temporaries from `scratch(key, shape, dtype)` (the workspace's shared scratch), so
nothing is allocated per iteration. This module holds the interface, the registry, the rule
used without timing (`heuristic_choice`) and the universal fallback im2col + GEMM; the other
algorithms live in netrun.algos (one module each), and so do the timing search and the
persistent algorithm cache keyed on ConvProblem, direction, backend and device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from netrun import jit
from netrun.algos.parallel import chunk_scratch, chunks, per_thread
from netrun.errors import ShapeError
from netrun.ops.geometry import ConvGeometry, pad_into, window_slices

Scratch = Callable[..., Any]   # scratch(key, shape, dtype) -> array

# The im2col column buffer is filled this many bytes at a time (a block of images), which
# keeps it in a moderate, reusable allocation however large the batch. 4 MB per thread beat
# 8 MB by 5-10% on the benchmark's stride-2 3×3 filter gradient (even blocks per thread, and
# more of each block still in cache for the GEMM) and tied on CIFAR's first layer.
COL_BUFFER_BYTES = 4 << 20
# backward_filter sums per-image products when a block's worth of filters is this small.
PER_IMAGE_FILTER_ELEMENTS = 1 << 16


@dataclass(frozen=True)
class ConvProblem:
    """Every field that changes a convolution's result or speed, except the direction."""

    n: int
    c: int
    h: int
    w: int
    k: int              # output channels (Caffe2's M)
    kh: int
    kw: int
    sh: int = 1
    sw: int = 1
    pt: int = 0
    pl: int = 0
    pb: int = 0
    pr: int = 0
    dh: int = 1
    dw: int = 1
    group: int = 1
    dtype: str = "float32"
    # The op's storage order; algorithms always see NCHW (the op transposes NHWC), but the
    # transposes are part of what a timing measures, so it stays in the key.
    order: str = "NCHW"

    @classmethod
    def make(cls, x_shape, w_shape, geom: ConvGeometry, group: int, dtype: Any,
             order: str = "NCHW") -> "ConvProblem":
        """The problem for NCHW input/filter shapes and a geometry resolved for that input."""
        n, c, h, w = (int(d) for d in x_shape)
        return cls(n, c, h, w, int(w_shape[0]), geom.kh, geom.kw, geom.sh, geom.sw, *geom.pads,
                   geom.dh, geom.dw, group, str(np.dtype(dtype)), order)

    @property
    def geometry(self) -> ConvGeometry:
        return ConvGeometry(self.kh, self.kw, self.sh, self.sw, self.pt, self.pl, self.pb,
                            self.pr, self.dh, self.dw)

    @property
    def oh(self) -> int:
        return (self.h + self.pt + self.pb - self.dh * (self.kh - 1) - 1) // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.w + self.pl + self.pr - self.dw * (self.kw - 1) - 1) // self.sw + 1

    @property
    def cg(self) -> int:
        return self.c // self.group

    @property
    def kg(self) -> int:
        return self.k // self.group

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def padded(self) -> bool:
        return any((self.pt, self.pl, self.pb, self.pr))

    def describe(self) -> str:
        """One line for error messages and profiles."""
        return (f"N={self.n} C={self.c} H={self.h} W={self.w} K={self.k} kernel {self.kh}×"
                f"{self.kw} stride {self.sh}×{self.sw} pads {[self.pt, self.pl, self.pb, self.pr]}"
                f" dilation {self.dh}×{self.dw} group {self.group} {self.dtype} {self.order}")


class ConvAlgorithm:
    """One way to compute all three directions of a convolution."""

    name = ""
    deterministic = True   # same bits on every run (no atomics / reordering by timing)
    summary = ""           # one line for `netrun algos` and profiles
    backends = ("cpu",)    # the backends whose searches and comparisons time it

    def applicable(self, p: ConvProblem) -> bool:
        """Whether this algorithm handles the problem."""
        return True

    def workspace_bytes(self, p: ConvProblem) -> int:
        """Scratch bytes needed by the most demanding of the three directions."""
        return 0

    def forward(self, xp, x, w, p: ConvProblem, out, scratch: Scratch, bias=None) -> None:
        """out (N, K, oH, oW) = conv(x, w) (+ bias (K,) when given, fused where possible)."""
        raise NotImplementedError

    def backward_data(self, xp, dy, w, p: ConvProblem, out, scratch: Scratch) -> None:
        """out (N, C, H, W) = gradient of the loss with respect to x."""
        raise NotImplementedError

    def backward_filter(self, xp, x, dy, p: ConvProblem, out, scratch: Scratch,
                        dbias=None) -> None:
        """out (K, C/G, kh, kw) = gradient with respect to w (and dbias (K,) = Σ dy if given)."""
        raise NotImplementedError

    def backward(self, xp, x, dy, w, p: ConvProblem, dx, dw, scratch: Scratch,
                 dbias=None) -> None:
        """Both gradients, when this algorithm was chosen for both directions; algorithms that
        share work between them (a transform of dy) override it."""
        self.backward_filter(xp, x, dy, p, dw, scratch, dbias=dbias)
        self.backward_data(xp, dy, w, p, dx, scratch)


def add_bias(xp, out, bias) -> None:
    """out (N, K, ...) += bias (K,): for algorithms that cannot fold the bias into a GEMM."""
    if bias is not None:
        xp.add(out, bias.reshape((1, -1) + (1,) * (out.ndim - 2)), out=out)


def sum_bias(xp, dy, dbias) -> None:
    """dbias (K,) = Σ dy over every axis but the channel axis 1."""
    if dbias is not None:
        n, k = dy.shape[:2]
        # The pixel sums as a matrix-vector product with ones (BLAS runs it 3× faster than
        # NumPy's reduction), then the batch sum of the small (N, K) result.
        pixels = xp.matmul(dy.reshape(n, k, -1), _ones(xp, dy[0, 0].size, dy.dtype))
        xp.sum(pixels, axis=0, out=dbias)


_ONES: dict[tuple, Any] = {}


def _ones(xp, size: int, dtype) -> Any:
    """A cached vector of ones (allocated once per size, dtype and array module)."""
    key = (id(xp), size, str(dtype))   # modules live as long as the process
    if key not in _ONES:
        _ONES[key] = xp.ones(size, dtype)
    return _ONES[key]


ALGORITHMS: dict[str, ConvAlgorithm] = {}


def register_algorithm(cls: type[ConvAlgorithm]) -> type[ConvAlgorithm]:
    """Class decorator: add one instance of the algorithm to ALGORITHMS under its name."""
    ALGORITHMS[cls.name] = cls()
    return cls


def applicable_algorithms(p: ConvProblem) -> list[ConvAlgorithm]:
    """Algorithms that can run the problem, in registration order."""
    return [a for a in ALGORITHMS.values() if a.applicable(p)]


# The rule-based preference without timing, best first (measured on 2-core AVX-512 machines
# with OpenBLAS; see benchmarks/bench_cpu.py):
# - a depthwise conv runs directly (compiled when the engine is there: 3× the NumPy loops);
# - a 1×1 kernel is a plain GEMM;
# - a stride-1 3×3 conv of at least WINOGRAD_MIN_CHANNELS channels each way and
#   WINOGRAD_MIN_TILES 4×4 output tiles (dilated or not) runs compiled Winograd F(4×4, 3×3)
#   when the engine is there: 1.4-2× shift_gemm from 8×8 to 56×56 images. Fewer tiles lose:
#   the filter spectrum (4× the filter) is streamed once per block and thread, so batch-1
#   ResNet-50 layers of 256-512 channels on 14×14 and 7×7 run 1.5-5× slower that way;
# - a stride-1 conv whose Fourier form (dft_gemm) costs at most DFT_MAX_FLOP_RATIO of the
#   direct flops (its model charges copies and the filter spectrum too) runs that way: 5×5
#   kernels on CIFAR/LeNet-sized images at 0.4-0.7, not first layers (C = 1 or 3: 2-6);
# - otherwise a stride-1 (in height) conv is row-shifted GEMMs on a kw-expanded copy (kw× less
#   copying than im2col) unless their contraction C/G·kw is too thin for an efficient GEMM
#   (first layers: C = 1 or 3), and everything else im2col + GEMM.
# The NumPy Winograd and FFT algorithms win only for some shapes; exhaustive search finds those.
SHIFT_MIN_CONTRACTION = 32
DFT_MAX_FLOP_RATIO = 0.75
WINOGRAD_MIN_CHANNELS = 32
WINOGRAD_MIN_TILES = 96


def preference(p: ConvProblem) -> tuple[str, ...]:
    """Algorithm names in the heuristic's order of preference for p."""
    from netrun.algos.dft import model_flops
    from netrun.algos.jit_winograd import tiles

    first: tuple[str, ...] = ("depthwise_jit", "depthwise", "gemm_1x1")
    if (min(p.c, p.k) >= WINOGRAD_MIN_CHANNELS and p.n * tiles(p) >= WINOGRAD_MIN_TILES):
        first += ("winograd_jit",)
    direct = 2 * p.n * p.k * p.cg * p.kh * p.kw * p.oh * p.ow
    if p.sh == p.sw == 1 and model_flops(p) <= DFT_MAX_FLOP_RATIO * direct:
        first += ("dft_gemm",)
    if p.cg * p.kw >= SHIFT_MIN_CONTRACTION:
        return first + ("shift_gemm", "im2col_gemm")
    return first + ("im2col_gemm", "shift_gemm")


def heuristic_choice(p: ConvProblem, direction: str = "forward",
                     candidates: list[ConvAlgorithm] | None = None) -> ConvAlgorithm:
    """The rule-based pick without timing, among `candidates` (default: all applicable)."""
    pool = applicable_algorithms(p) if candidates is None else candidates
    names = {a.name: a for a in pool}
    for name in preference(p):
        if name in names:
            return names[name]
    return pool[0]


def select_algorithm(p: ConvProblem, fixed: str = "") -> ConvAlgorithm:
    """The fixed algorithm if named (ShapeError if it cannot run p), else the heuristic's."""
    if not fixed:
        return heuristic_choice(p)
    algo = ALGORITHMS[fixed]
    if not algo.applicable(p):
        names = ", ".join(a.name for a in applicable_algorithms(p))
        raise ShapeError(f"algorithm '{fixed}' cannot run this convolution ({p.describe()}); "
                         f"applicable: {names}")
    return algo


# im2col + GEMM ----------------------------------------------------------------------------
@register_algorithm
class Im2colGemm(ConvAlgorithm):
    """Unfold windows into a column buffer, then one GEMM per group (Caffe's default)."""

    name = "im2col_gemm"
    summary = "unfold windows into columns, one GEMM per group; runs every problem"

    def block(self, p: ConvProblem) -> int:
        """Images per column-buffer fill."""
        per_image = p.c * p.kh * p.kw * p.oh * p.ow * p.itemsize
        return max(1, min(p.n, COL_BUFFER_BYTES // max(per_image, 1)))

    def workspace_bytes(self, p: ConvProblem) -> int:
        threads, b = per_thread(p.n, self.block(p))    # every thread has its own buffers
        col = b * p.c * p.kh * p.kw * p.oh * p.ow
        pad = b * p.c * (p.h + p.pt + p.pb) * (p.w + p.pl + p.pr) if p.padded else 0
        dy_t = b * p.k * p.oh * p.ow + p.k * p.cg * p.kh * p.kw   # backward_filter only
        return threads * (col + pad + dy_t) * p.itemsize

    def forward(self, xp, x, w, p, out, scratch, bias=None):
        ckk, hw = p.cg * p.kh * p.kw, p.oh * p.ow
        wg = w.reshape(p.group, p.kg, ckk)                  # (G, K/G, C/G*kh*kw)
        y = out.reshape(p.n, p.group, p.kg, hw)             # (N, G, K/G, oH*oW)

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                col = _im2col(xp, x[n0:n1], p, s, batch_inner=False)
                # (b, G, K/G, oH*oW) = (G, K/G, C/G*kh*kw) @ (b, G, C/G*kh*kw, oH*oW)
                xp.matmul(wg, col.reshape(n1 - n0, p.group, ckk, hw), out=y[n0:n1])
            add_bias(xp, out[c0:c1], bias)

        chunks(xp, p.n, work, work=p.n * ckk * p.group * hw)

    def backward_data(self, xp, dy, w, p, out, scratch):
        ckk, hw = p.cg * p.kh * p.kw, p.oh * p.ow
        wt = w.reshape(p.group, p.kg, ckk).transpose(0, 2, 1)    # (G, C/G*kh*kw, K/G)
        dyv = dy.reshape(p.n, p.group, p.kg, hw)                 # (N, G, K/G, oH*oW)

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                b = n1 - n0
                col = s("conv.col", (b, p.group, ckk, hw), dy.dtype)
                xp.matmul(wt, dyv[n0:n1], out=col)
                _col2im(xp, col.reshape(b, p.c, p.kh, p.kw, p.oh, p.ow), p, out[n0:n1], s)

        chunks(xp, p.n, work, work=p.n * ckk * p.group * hw)

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        ckk, hw = p.cg * p.kh * p.kw, p.oh * p.ow
        parts = []

        def work(index, c0, c1):
            s = chunk_scratch(scratch, index)
            dw = out.reshape(p.group, p.kg, ckk) if index == 0 else \
                s("conv.dw_chunk", (p.group, p.kg, ckk), dy.dtype)   # (G, K/G, C/G*kh*kw)
            for n0, n1 in _blocks(c0, c1, self.block(p)):
                b = n1 - n0
                if b * dw.size <= PER_IMAGE_FILTER_ELEMENTS:
                    # A small filter (first layers): a GEMM per image straight from dY and
                    # per-image columns, then a sum of b tiny products, beats transposing dY
                    # for one long GEMM (LeNet's conv1: 2.5× faster).
                    col = _im2col(xp, x[n0:n1], p, s, batch_inner=False)   # (b, C, kh, kw, ·)
                    each = s("conv.dw_each", (b,) + dw.shape, dy.dtype)    # (b, G, K/G, ·)
                    xp.matmul(dy[n0:n1].reshape(b, p.group, p.kg, hw),
                              col.reshape(b, p.group, ckk, hw).transpose(0, 1, 3, 2), out=each)
                    part = dw if n0 == c0 else s("conv.dw_part", dw.shape, dy.dtype)
                    xp.sum(each, axis=0, out=part)
                else:
                    # Batch inside the columns so the whole block is one GEMM per group:
                    # dW_g = dY_g (K/G, b*oH*oW) @ col_g^T (b*oH*oW, C/G*kh*kw).
                    col = _im2col(xp, x[n0:n1], p, s, batch_inner=True)  # (C, kh, kw, b, ·)
                    dyt = s("conv.dy_t", (p.k, b, hw), dy.dtype)
                    dyt[...] = dy[n0:n1].reshape(b, p.k, hw).transpose(1, 0, 2)   # (K, b, ·)
                    lhs = dyt.reshape(p.group, p.kg, b * hw)
                    rhs = col.reshape(p.group, ckk, b * hw).transpose(0, 2, 1)
                    part = dw if n0 == c0 else s("conv.dw_part", dw.shape, dy.dtype)
                    xp.matmul(lhs, rhs, out=part)
                if part is not dw:
                    dw += part
            parts.append((index, dw))

        chunks(xp, p.n, work, work=p.n * ckk * p.group * hw)
        total = out.reshape(p.group, p.kg, ckk)
        for _, dw in sorted(parts, key=lambda r: r[0])[1:]:   # partial sums in chunk order
            total += dw
        sum_bias(xp, dy, dbias)


def _blocks(start: int, stop: int, size: int):
    return ((n0, min(n0 + size, stop)) for n0 in range(start, stop, size))


def _im2col(xp, x, p: ConvProblem, scratch: Scratch, batch_inner: bool):
    """Columns of a block of images: (b, C, kh, kw, oH, oW), or (C, kh, kw, b, oH, oW)."""
    if jit.enabled(xp):   # one compiled pass, padding included (same values)
        from netrun.jit.im2col import im2col

        return im2col(x, p, scratch, batch_inner)
    b = x.shape[0]
    src = x
    if p.padded:
        hp, wp = p.h + p.pt + p.pb, p.w + p.pl + p.pr
        src = pad_into(x, scratch("conv.pad", (b, p.c, hp, wp), x.dtype), p.geometry, (2, 3), 0)
    sn, sc, sy, sx = src.strides
    # A read-only strided view: element (n, c, i, j, r, s) is src[n, c, r*sh + i*dh, s*sw + j*dw].
    windows = xp.lib.stride_tricks.as_strided(
        src, shape=(b, p.c, p.kh, p.kw, p.oh, p.ow),
        strides=(sn, sc, sy * p.dh, sx * p.dw, sy * p.sh, sx * p.sw))
    if batch_inner:
        col = scratch("conv.col", (p.c, p.kh, p.kw, b, p.oh, p.ow), x.dtype)
        col[...] = windows.transpose(1, 2, 3, 0, 4, 5)
    else:
        col = scratch("conv.col", (b, p.c, p.kh, p.kw, p.oh, p.ow), x.dtype)
        col[...] = windows
    return col


def _col2im(xp, col, p: ConvProblem, out, scratch: Scratch) -> None:
    """Scatter-add columns (b, C, kh, kw, oH, oW) back to images: one strided add per tap."""
    if jit.enabled(xp):   # one compiled pass, taps added in the same order (same bits)
        from netrun.jit.im2col import col2im

        col2im(col, p, out)
        return
    b = col.shape[0]
    g = p.geometry
    if p.padded:
        acc = scratch("conv.pad", (b, p.c, p.h + p.pt + p.pb, p.w + p.pl + p.pr), col.dtype)
    else:
        acc = out
    acc.fill(0)
    for i in range(p.kh):
        for j in range(p.kw):
            rows, cols = window_slices(g, i, j, p.oh, p.ow)
            acc[:, :, rows, cols] += col[:, :, i, j]
    if p.padded:
        out[...] = acc[:, :, p.pt:p.pt + p.h, p.pl:p.pl + p.w]


# The other algorithms live in netrun.algos, one module each, and register themselves here.
from netrun.algos import depthwise, dft, fft, gemm1x1, shift, winograd  # noqa: E402,F401
from netrun.algos import jit_depthwise, jit_winograd  # noqa: E402,F401
