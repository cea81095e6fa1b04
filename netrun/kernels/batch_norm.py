"""Batch normalization (optionally followed by ReLU) on the CPU: statistics, normalization
and gradients, compiled and threaded where the engine is there, NumPy otherwise.

The compiled path (netrun.kernels.jit.batch_norm) makes two passes over X forward (the
statistics, then Y) and two backward (the gradient sums, then dX), each cut into the fixed
chunks of netrun.kernels.parallel along the outer axis: per-chunk float64 sums are added in
chunk order by the chunks' commits, so the bits never depend on the thread count. Where the
OpenMP team runs (netrun.kernels.omp) the same chunks run there, one GIL-free call a pass,
as the convolutions' chunks do: on 2 cores the switches between the team and the worker
threads cost more than batch norm itself (ResNet-20's training step ran 7-10% faster). The
NumPy path computes the same quantities (float64 sums too, two-pass variance) for arrays
of other modules (CuPy) and without the engine.

Arrays are viewed as (outer, C, inner); see `view`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import netrun.kernels.jit as jit
import netrun.kernels.jit.batch_norm as jit_bn
from netrun.kernels import omp, parallel
from netrun.kernels import relu as relu_kernels

Scratch = Callable[..., Any]


def view(shape: tuple[int, ...], order: str) -> tuple[int, int, int]:
    """(outer, C, inner) of an N×C×… (NCHW) or N×…×C (NHWC) array."""
    if order == "NHWC":
        return math.prod(shape[:-1]), shape[-1], 1
    return shape[0], shape[1], math.prod(shape[2:])


def compiled(xp: Any, *arrays) -> bool:
    """Whether the compiled kernels run for these arrays (engine on, NumPy, a built dtype)."""
    return jit.enabled(xp) and all(a.dtype in jit_bn.DTYPES and a.dtype == arrays[0].dtype
                                   for a in arrays)


@dataclass
class Stats:
    """Per-channel batch statistics in float64: mean and biased variance over M values."""

    mean: np.ndarray
    var: np.ndarray
    m: int


def _chunk_args(args: tuple, o0: int, o1: int) -> list:
    """The arguments of a kernel's call on chunk o0:o1: (outer, C, inner) arrays sliced."""
    return [a[o0:o1] if isinstance(a, np.ndarray) and a.ndim == 3 else a for a in args]


def _chunked_sums(xp, shape3, scratch: Scratch, kernel, team, *args) -> np.ndarray:
    """(2, C) float64: kernel(*args, lanes, sums) summed over the fixed chunks of the outer
    axis in chunk order, on the OpenMP team (`team`, the kernel's form over slots, where
    `_on_team`) or the worker threads (the same slices and order, so the same bits)."""
    outer, c, inner = shape3
    total = np.zeros((2, c))
    on_team = _on_team(xp, shape3)
    if on_team is not None:
        slots, starts = on_team
        lanes = scratch("bn.team_lanes", (slots, 2, c, inner), "float64")
        sums = scratch("bn.team_sums", (starts.shape[0] - 1, 2, c), "float64")
        omp.launch(team, slots, starts, *args, lanes, sums)
        for part in sums:
            total += part
        return total

    def work(index, o0, o1):
        lanes = parallel.chunk_scratch(scratch, index)("bn.lanes", (2, c, inner), "float64")
        sums = np.empty((2, c))
        kernel(*_chunk_args(args, o0, o1), lanes, sums)

        def commit() -> None:
            total[...] += sums
        return commit

    parallel.chunks(xp, outer, work, work=outer * c * inner)
    return total


def _each_chunk(xp, shape3, kernel, team, *args) -> None:
    """kernel(*args) on each fixed chunk of the outer axis, on the OpenMP team (`team`, the
    kernel's form over slots, where `_on_team`) or the worker threads."""
    outer, c, inner = shape3
    on_team = _on_team(xp, shape3)
    if on_team is not None:
        omp.launch(team, *on_team, *args)
        return
    parallel.chunks(xp, outer, lambda _i, o0, o1: kernel(*_chunk_args(args, o0, o1)),
                    work=outer * c * inner)


def _on_team(xp, shape3) -> tuple[int, np.ndarray] | None:
    """(slots, starts) where a pass runs on the OpenMP team (netrun.kernels.omp.team)."""
    outer, c, inner = shape3
    found = omp.team(xp, outer, outer * c * inner)
    if found is not None:
        jit_bn.prepare_team()
    return found


# Forward ------------------------------------------------------------------------------------
def batch_stats(xp, X, order: str, scratch: Scratch) -> Stats:
    """Mean and biased variance of each channel of X (float64 arrays of xp)."""
    shape3 = view(X.shape, order)
    outer, c, inner = shape3
    m = outer * inner
    if compiled(xp, X):
        x = np.ascontiguousarray(X).reshape(shape3)
        # any value of each channel, the same on every thread count: the first one
        shift = x[0, :, 0].astype(np.float64)
        s = _chunked_sums(xp, shape3, scratch, jit_bn.stats, jit_bn.stats_team, x, shift)
        mean_shifted = s[0] / m
        var = np.maximum(s[1] / m - mean_shifted * mean_shifted, 0.0)
        return Stats(mean_shifted + shift, var, m)
    x = X.reshape(shape3)
    mean = _channel_sum(x) / m
    centred = scratch("bn.centred", shape3, X.dtype)              # two-pass: no cancellation
    xp.subtract(x, mean.astype(X.dtype).reshape(1, c, 1), out=centred)
    xp.multiply(centred, centred, out=centred)
    return Stats(mean, _channel_sum(centred) / m, m)


def _channel_sum(a3):
    """(C,) float64 sums of an (outer, C, inner) array of xp: each row summed in a's dtype
    (NumPy sums a contiguous row pairwise), the rows then in float64."""
    rows = a3.sum(axis=2) if a3.shape[2] > 1 else a3[:, :, 0]
    return rows.sum(axis=0, dtype=np.float64)


def normalize(xp, X, order: str, mean, k, bias, Y, relu: bool) -> None:
    """Y = (X − mean)·k + bias per channel (vectors of X's dtype; mean None: X·k + bias),
    then max(Y, 0) if relu."""
    if mean is None and compiled(xp, X):
        mean = np.zeros(k.shape, X.dtype)   # X − 0 is X exactly
    shape3 = view(X.shape, order)
    c = shape3[1]
    if compiled(xp, X, Y, mean, k, bias):
        x, y = np.ascontiguousarray(X).reshape(shape3), Y.reshape(shape3)
        _each_chunk(xp, shape3, jit_bn.normalize, jit_bn.normalize_team, x, mean, k, bias, y,
                    relu)
        return
    b = (1, c, 1)
    y = Y.reshape(shape3)
    if mean is None:
        xp.multiply(X.reshape(shape3), k.reshape(b), out=y)
    else:
        xp.subtract(X.reshape(shape3), mean.reshape(b), out=y)
        y *= k.reshape(b)
    y += bias.reshape(b)
    if relu:
        xp.maximum(y, 0, out=y)


def inference(xp, X, order: str, scale, bias, mean, var, epsilon: float, Y,
              relu: bool) -> bool:
    """is_test's Y = X·s + (bias − mean·s), s = scale/√(var + ε) (then max(Y, 0) if relu),
    per-channel terms included, in one compiled call per chunk: batch-1 inference pays no
    per-channel NumPy calls. False (nothing done) where the compiled kernels do not apply."""
    if not compiled(xp, X, Y, scale, bias, mean, var):
        return False
    shape3 = view(X.shape, order)
    x, y = np.ascontiguousarray(X).reshape(shape3), Y.reshape(shape3)
    vecs = [np.ascontiguousarray(v) for v in (scale, bias, mean, var)]
    _each_chunk(xp, shape3, jit_bn.inference, jit_bn.inference_team, x, *vecs, epsilon, y,
                relu)
    return True


# Backward -----------------------------------------------------------------------------------
def gradient_sums(xp, X, mean, dY, Y, order: str, scratch: Scratch) -> np.ndarray:
    """(2, C) float64 array of xp: Σ g and Σ (X − mean)·g per channel, g = dY, or
    dY·(Y > 0) given Y."""
    shape3 = view(X.shape, order)
    c = shape3[1]
    relu = Y is not None
    if compiled(xp, X, mean, dY, *([Y] if relu else [])):
        x, dy = np.ascontiguousarray(X).reshape(shape3), np.ascontiguousarray(dY).reshape(shape3)
        y = np.ascontiguousarray(Y).reshape(shape3) if relu else dy
        return _chunked_sums(xp, shape3, scratch, jit_bn.gradient_sums,
                             jit_bn.gradient_sums_team, x, mean, dy, y, relu)
    g = dY.reshape(shape3)
    if relu:
        g = relu_kernels.relu_gradient(xp, Y.reshape(shape3), g,
                                       scratch("bn.masked", shape3, dY.dtype))
    centred = scratch("bn.centred", shape3, X.dtype)
    xp.subtract(X.reshape(shape3), mean.reshape(1, c, 1), out=centred)
    centred *= g
    return xp.stack([_channel_sum(g), _channel_sum(centred)])


def gradient_input(xp, X, mean, dY, Y, order: str, a, b, k, is_test: bool, dX,
                   scratch: Scratch) -> None:
    """dX = ((g − (X − mean)·a) − b)·k per channel, or g·k if is_test; g as in
    gradient_sums (vectors of X's dtype)."""
    shape3 = view(X.shape, order)
    c = shape3[1]
    relu = Y is not None
    if compiled(xp, X, mean, dY, dX, a, b, k, *([Y] if relu else [])):
        x, dy = np.ascontiguousarray(X).reshape(shape3), np.ascontiguousarray(dY).reshape(shape3)
        y = np.ascontiguousarray(Y).reshape(shape3) if relu else dy
        dx = dX.reshape(shape3)
        _each_chunk(xp, shape3, jit_bn.gradient_input, jit_bn.gradient_input_team, x, mean,
                    dy, y, relu, a, b, k, is_test, dx)
        return
    bs = (1, c, 1)
    dx = dX.reshape(shape3)
    g = dY.reshape(shape3)
    if relu:
        g = relu_kernels.relu_gradient(xp, Y.reshape(shape3), g,
                                       scratch("bn.masked", shape3, dY.dtype))
    if is_test:
        xp.multiply(g, k.reshape(bs), out=dx)
        return
    xp.subtract(X.reshape(shape3), mean.reshape(bs), out=dx)
    dx *= a.reshape(bs)
    xp.subtract(g, dx, out=dx)
    dx -= b.reshape(bs)
    dx *= k.reshape(bs)
