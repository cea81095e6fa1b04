"""The rules that pick a convolution algorithm without timing, per backend, and what an op's
fixed `algo` means on a backend that does not have that algorithm (its counterpart).
"""
from __future__ import annotations

from typing import Any

from netrun.conv.algorithm import ConvAlgorithm, algorithms, find_algorithm
from netrun.conv.cpu.dft_gemm import filter_spectra_bytes, model_flops
from netrun.conv.cpu.jit_winograd import tiles
from netrun.conv.problem import ConvProblem
from netrun.errors import ShapeError

# CPU, best first (the order and the thresholds follow measurements, which are in
# benchmarks/README.md):
# - a depthwise conv runs directly (compiled when the engine is there);
# - a 1×1 kernel is a plain GEMM;
# - a stride-1 3×3 conv of at least WINOGRAD_MIN_CHANNELS channels each way and
#   WINOGRAD_MIN_TILES 4×4 output tiles (dilated or not) runs compiled Winograd F(4×4, 3×3)
#   when the engine is there. Fewer tiles lose: the filter spectrum (4× the filter) is
#   streamed once per block and thread, which dominates small batch-1 layers;
# - a stride-1 conv whose Fourier form (dft_gemm) costs at most DFT_MAX_FLOP_RATIO of the
#   direct flops (its model charges copies and the filter spectrum too) runs that way: 5×5
#   kernels on CIFAR/LeNet-sized images, not first layers (C = 1 or 3);
# - otherwise a stride-1 (in height) conv is row-shifted GEMMs on a kw-expanded copy (kw× less
#   copying than im2col) unless their contraction C/G·kw is too thin for an efficient GEMM
#   (first layers: C = 1 or 3) or the batch has under SHIFT_MIN_PIXELS output pixels, and
#   everything else im2col + GEMM.
# The NumPy Winograd and FFT algorithms win only for some shapes; exhaustive search finds those.
# oneDNN (where installed) goes first, after the depthwise algorithms, for kernels larger
# than 1×1 (its reorders to and from NCHW cost more than a 1×1 GEMM saves, except for one
# image, where its OpenMP team beats the GEMM: ResNet-50 at batch 1 1.25× faster), except: for
# filter gradients only while a group has at most ONEDNN_MAX_FILTER_CHANNELS channels either
# way (it sums the batch in chunks, and on wide layers loses to the GEMM algorithms); for data
# gradients not for first layers (C < ONEDNN_MIN_DATA_CHANNELS: its strided kernel is slow);
# and never where compiled Winograd runs layers of ONEDNN_WINOGRAD_CHANNELS channels or more
# (4× fewer multiplications), except for one image (its team beat Winograd's blocks there:
# ResNet-50 at batch 1 1.1× faster).
# Below ONEDNN_MIN_FLOPS a layer's work is smaller than oneDNN's fixed cost per call (reorders
# in and out, a Python-side plan, and the hand-off of its batch chunks to netrun's workers),
# and the NumPy algorithms win; except for one image, which oneDNN runs as one call on an
# OpenMP team (netrun.conv.cpu.onednn): ResNet-20 at batch 1 runs 1.25× faster that way.
ONEDNN_MIN_FLOPS = 16_000_000
# Nor single-channel first layers (LeNet's 1→20 5×5: 2× slower than im2col forward), nor,
# where the Fourier form (dft_gemm) qualifies, before it (LeNet's and CIFAR's 5×5 layers), nor
# filter gradients of first layers (C < ONEDNN_MIN_DATA_CHANNELS, as for data gradients).
ONEDNN_MIN_CHANNELS = 3
ONEDNN_MAX_FILTER_CHANNELS = 32
ONEDNN_MIN_DATA_CHANNELS = 16
ONEDNN_WINOGRAD_CHANNELS = 64
SHIFT_MIN_CONTRACTION = 32
# Row-shifted GEMMs cost Python work per output row and chunk: under SHIFT_MIN_PIXELS output
# pixels in the batch, im2col's one GEMM wins (ResNet-20's 16×16 and 8×8 layers at batch 1:
# 1.5 to 2.3× faster).
SHIFT_MIN_PIXELS = 1024
DFT_MAX_FLOP_RATIO = 0.75
# ...and only while its filters' spectra (streamed once per block of images) stay within
# DFT_MAX_SPECTRA_RATIO × the layer's input and output: LeNet's and CIFAR's 5×5 layers at
# their training batches need 0.9-1.7×, GoogLeNet's (many filters, batch 8) 6.5-32×, where
# that traffic ate the saved flops (GoogLeNet at batch 8 ran no faster with it) and one
# layer's 168 MB of scratch set the net's memory peak. A ratio of the problem alone: the
# choice must not depend on the thread count.
DFT_MAX_SPECTRA_RATIO = 4
WINOGRAD_MIN_CHANNELS = 32
WINOGRAD_MIN_TILES = 96

# GPU, best first: cuDNN where it is installed and has a plan (its TF32 engines first where
# the settings allow them); a depthwise conv directly; a 1×1 kernel as a plain GEMM;
# everything else im2col + GEMM. Winograd and FFT win only for some shapes; exhaustive search
# finds those.
GPU_PREFERENCE = ("cudnn_tf32", "cudnn", "gpu_depthwise", "gpu_gemm_1x1", "gpu_im2col_gemm")

# An op's fixed `algo` names one algorithm; on the other backend it means this one (None:
# the rules decide), so nets that fix `fft` or `im2col_gemm` run on both.
COUNTERPARTS = {
    "gpu": {"im2col_gemm": "gpu_im2col_gemm", "shift_gemm": "gpu_im2col_gemm",
            "gemm_1x1": "gpu_gemm_1x1", "depthwise": "gpu_depthwise",
            "winograd_f2x2": "gpu_winograd_f2x2", "winograd_f4x4": "gpu_winograd_f4x4",
            "fft": "gpu_fft", "dft_gemm": "gpu_fft", "depthwise_jit": "gpu_depthwise",
            "winograd_jit": "gpu_winograd_f4x4"},
    "cpu": {"gpu_im2col_gemm": "im2col_gemm", "gpu_gemm_1x1": "gemm_1x1",
            "gpu_depthwise": "depthwise", "gpu_winograd_f2x2": "winograd_f2x2",
            "gpu_winograd_f4x4": "winograd_f4x4", "gpu_fft": "fft"},
}


def preference(p: ConvProblem, backend: str = "cpu",
               direction: str = "forward") -> tuple[str, ...]:
    """Algorithm names in the rules' order of preference for one direction of p."""
    if backend == "gpu":
        return GPU_PREFERENCE
    winograd = min(p.c, p.k) >= WINOGRAD_MIN_CHANNELS and p.n * tiles(p) >= WINOGRAD_MIN_TILES
    fourier = (p.sh == p.sw == 1 and model_flops(p) <= DFT_MAX_FLOP_RATIO * direct_flops(p)
               and filter_spectra_bytes(p) <= DFT_MAX_SPECTRA_RATIO * _io_bytes(p))
    first: tuple[str, ...] = ("depthwise_jit", "depthwise")
    if _onednn_first(p, direction, winograd, fourier):
        first += ("onednn",)
    first += ("gemm_1x1",)
    if winograd:
        first += ("winograd_jit",)
    if fourier:
        first += ("dft_gemm",)
    if p.cg * p.kw >= SHIFT_MIN_CONTRACTION and p.n * p.oh * p.ow >= SHIFT_MIN_PIXELS:
        return first + ("shift_gemm", "im2col_gemm")
    return first + ("im2col_gemm", "shift_gemm")


def _onednn_first(p: ConvProblem, direction: str, winograd: bool, fourier: bool) -> bool:
    """Whether oneDNN leads the preference for this direction (see the notes above)."""
    one_image = direction == "forward" and p.n == 1   # one call on an OpenMP team
    if fourier or (p.kh * p.kw == 1 and not one_image):
        return False
    if direct_flops(p) < ONEDNN_MIN_FLOPS and not one_image:
        return False
    if p.cg < ONEDNN_MIN_CHANNELS:
        return False
    if (winograd and min(p.c, p.k) >= ONEDNN_WINOGRAD_CHANNELS and not one_image
            and (p.kh, p.kw, p.sh, p.sw, p.group) == (3, 3, 1, 1, 1)):
        return False
    if direction == "backward_filter":
        return (p.c >= ONEDNN_MIN_DATA_CHANNELS
                and min(p.cg, p.kg) <= ONEDNN_MAX_FILTER_CHANNELS)
    if direction == "backward_data":
        return p.c >= ONEDNN_MIN_DATA_CHANNELS
    return True


def rule_choice(p: ConvProblem, pool: list[ConvAlgorithm], direction: str = "forward",
                backend: str = "cpu", xp: Any = None) -> ConvAlgorithm:
    """The rules' pick among `pool` (applicable algorithms of the backend), without timing."""
    names = {a.name: a for a in pool}
    for name in preference(p, backend, direction):
        algo = names.get(name)
        if algo is not None and algo.supports(xp, p, direction):
            return algo
    return next((a for a in pool if a.supports(xp, p, direction)), pool[0])


def fixed_algorithm(p: ConvProblem, fixed: str, backend: str) -> ConvAlgorithm | None:
    """The algorithm an op's fixed `algo` names on the backend (None: the rules decide).

    ShapeError when the backend's own algorithm of that name cannot run p; a name from the
    other backend means its counterpart here, and the rules where it has none that fits.
    """
    own = algorithms(backend)
    if fixed in own:
        algo = own[fixed]
        if not algo.applicable(p):
            names = ", ".join(a.name for a in own.values() if a.applicable(p))
            # an optional engine says what is missing (how to install it) before the shapes
            why = getattr(algo, "unavailable", lambda: "")()
            raise ShapeError(f"algorithm '{fixed}' cannot run this convolution "
                             f"({p.describe()}){': ' + why if why else ''}; applicable: {names}")
        return algo
    if find_algorithm(fixed) is None:
        raise ShapeError(f"unknown convolution algorithm '{fixed}'")
    counterpart = own.get(COUNTERPARTS.get(backend, {}).get(fixed, ""))
    return counterpart if counterpart is not None and counterpart.applicable(p) else None


def _io_bytes(p: ConvProblem) -> int:
    """Bytes of the layer's input and output."""
    return (p.n * p.c * p.h * p.w + p.n * p.k * p.oh * p.ow) * p.itemsize


def direct_flops(p: ConvProblem) -> int:
    """Multiply-adds × 2 of the direct convolution (one direction)."""
    return 2 * p.n * p.k * p.cg * p.kh * p.kw * p.oh * p.ow
