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

Arrays are viewed as (outer, C, inner); see `view`. A 5-D array in order NCHW is
channel-blocked (N × C/B × H × W × B, whole blocks: netrun.rewrite.layout keeps a training
net's activations so between oneDNN's convolutions): the same quantities, computed by
netrun.kernels.jit.batch_norm_blocked, its per-channel vectors seen as (C/B, B). There a
training op's two passes and the per-channel terms between them run as one team call
(`train_forward`, `train_backward`), with the same bits: on ResNet-20's 8×8 and 16×16
layers at batch 32 the Python around each pass and the terms' NumPy calls cost more than
the passes themselves (a SpatialBN 0.28 ms, 0.07 of it arithmetic), and the training step
ran 0.89-0.94× as long (batch 128: 0.93×).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

import netrun.kernels.jit as jit
import netrun.kernels.jit.batch_norm as jit_bn
import netrun.kernels.jit.batch_norm_blocked as jit_bnb
from netrun.kernels import omp, parallel
from netrun.kernels import relu as relu_kernels

Scratch = Callable[..., Any]


def view(shape: tuple[int, ...], order: str) -> tuple[int, int, int]:
    """(outer, C, inner) of an N×C×… (NCHW) or N×…×C (NHWC) array."""
    if order == "NHWC":
        return math.prod(shape[:-1]), shape[-1], 1
    return shape[0], shape[1], math.prod(shape[2:])


def blocked(X, order: str) -> bool:
    """Whether X is channel-blocked (5-D, N × C/B × H × W × B) rather than in `order`."""
    return X.ndim == 5 and order == "NCHW"


def _view4(X) -> tuple[int, int, int, int]:
    """(outer, C/B, P, B) of a blocked array."""
    n, blocks, h, w, b = X.shape
    return n, blocks, h * w, b


def _flat(shape4) -> tuple[int, int, int]:
    """(outer, C/B, P·B): how the compiled kernels see a blocked array."""
    return shape4[0], shape4[1], shape4[2] * shape4[3]


def _pair(v, shape4):
    """A per-channel vector (C,) as (C/B, B)."""
    return v.reshape(shape4[1], shape4[3])


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
    """The arguments of a kernel's call on chunk o0:o1: (outer, C, inner) arrays, and
    blocked (outer, C/B, P, B) ones, sliced."""
    return [a[o0:o1] if isinstance(a, np.ndarray) and a.ndim >= 3 else a for a in args]


def _chunked_sums(xp, shape3, scratch: Scratch, kernel, team, *args,
                  lanes_shape: tuple[int, ...] | None = None,
                  sums_shape: tuple[int, ...] | None = None) -> np.ndarray:
    """float64 sums (default (2, C)): kernel(*args, lanes, sums) summed over the fixed chunks
    of the outer axis in chunk order, on the OpenMP team (`team`, the kernel's form over
    slots, where `_on_team`) or the worker threads (the same slices and order, so the same
    bits). lanes_shape: one chunk's lanes (default (2, C, inner))."""
    outer, c, inner = shape3
    lanes_shape = lanes_shape or (2, c, inner)
    sums_shape = sums_shape or (2, c)
    total = np.zeros(sums_shape)
    if parallel.chunk_count(outer, outer * c * inner) == 1:   # as `_each_chunk`
        # written into the zeros directly: sums that start from +0 are what 0 + them is
        kernel(*args, scratch("bn.lanes", lanes_shape, "float64"), total)
        return total
    on_team = _on_team(xp, shape3, team)
    if on_team is not None:
        slots, starts = on_team
        lanes = scratch("bn.team_lanes", (slots, *lanes_shape), "float64")
        sums = scratch("bn.team_sums", (starts.shape[0] - 1, *sums_shape), "float64")
        omp.launch(team, slots, starts, *args, lanes, sums)
        for part in sums:
            total += part
        return total

    def work(index, o0, o1):
        lanes = parallel.chunk_scratch(scratch, index)("bn.lanes", lanes_shape, "float64")
        sums = np.empty(sums_shape)
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
    if parallel.chunk_count(outer, outer * c * inner) == 1:
        kernel(*args)   # the one chunk here, without a hand-off's Python (~30 µs a pass)
        return
    on_team = _on_team(xp, shape3, team)
    if on_team is not None:
        omp.launch(team, *on_team, *args)
        return
    parallel.chunks(xp, outer, lambda _i, o0, o1: kernel(*_chunk_args(args, o0, o1)),
                    work=outer * c * inner)


def _on_team(xp, shape3, team) -> tuple[int, np.ndarray] | None:
    """(slots, starts) where a pass runs on the OpenMP team (netrun.kernels.omp.team), the
    team forms of `team`'s module loaded (its `prepare_team`)."""
    outer, c, inner = shape3
    found = omp.team(xp, outer, outer * c * inner)
    if found is not None:
        sys.modules[team.fn.__module__].prepare_team()
    return found


# Forward ------------------------------------------------------------------------------------
def batch_stats(xp, X, order: str, scratch: Scratch) -> Stats:
    """Mean and biased variance of each channel of X (float64 arrays of xp)."""
    if blocked(X, order):
        return _blocked_stats(xp, X, scratch)
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


def _blocked_stats(xp, X, scratch: Scratch) -> Stats:
    """batch_stats of a blocked X."""
    shape4 = _view4(X)
    outer, blocks, p, b = shape4
    m = outer * p
    x = X.reshape(shape4)
    if compiled(xp, X):
        x = np.ascontiguousarray(x)
        shift = x[0, :, 0, :].astype(np.float64)   # as in the NCHW path: a first value
        s = _chunked_sums(xp, _flat(shape4), scratch, jit_bnb.stats, jit_bnb.stats_team,
                          x.reshape(_flat(shape4)), shift,
                          lanes_shape=(2, jit_bnb.LANE_BLOCK * b), sums_shape=(2, blocks, b))
        s = s.reshape(2, blocks * b)
        shift = shift.reshape(-1)
        mean_shifted = s[0] / m
        var = np.maximum(s[1] / m - mean_shifted * mean_shifted, 0.0)
        return Stats(mean_shifted + shift, var, m)
    mean = _blocked_sum(x) / m
    centred = scratch("bn.centred", shape4, X.dtype)
    xp.subtract(x, mean.astype(X.dtype).reshape(1, blocks, 1, b), out=centred)
    xp.multiply(centred, centred, out=centred)
    return Stats(mean, _blocked_sum(centred) / m, m)


def _blocked_sum(a4):
    """(C,) float64 sums of an (outer, C/B, P, B) array of xp, as _channel_sum does."""
    return a4.sum(axis=2).sum(axis=0, dtype=np.float64).reshape(-1)


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
    if blocked(X, order):
        _blocked_normalize(xp, X, mean, k, bias, Y, relu)
        return
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


def _blocked_normalize(xp, X, mean, k, bias, Y, relu: bool) -> None:
    """normalize on blocked arrays."""
    shape4 = _view4(X)
    x, y = X.reshape(shape4), Y.reshape(shape4)
    if compiled(xp, X, Y, mean, k, bias):
        x = np.ascontiguousarray(x).reshape(_flat(shape4))
        _each_chunk(xp, _flat(shape4), jit_bnb.normalize, jit_bnb.normalize_team, x,
                    *(_pair(v, shape4) for v in (mean, k, bias)), y.reshape(_flat(shape4)),
                    relu)
        return
    b = (1, shape4[1], 1, shape4[3])
    if mean is None:
        xp.multiply(x, k.reshape(b), out=y)
    else:
        xp.subtract(x, mean.reshape(b), out=y)
        y *= k.reshape(b)
    y += bias.reshape(b)
    if relu:
        xp.maximum(y, 0, out=y)


def train_forward(xp, X, order: str, scale, bias, running_mean, running_var,
                  momentum: float, epsilon: float, Y, relu: bool, new_mean, new_var,
                  saved_mean, saved_inv_std, scratch: Scratch) -> Callable[[], None] | None:
    """SpatialBN's whole training forward on a blocked X in one team call: the statistics,
    the per-channel terms, the running statistics (new_mean, new_var: may be the inputs
    themselves) and Y, with the bits of batch_stats, netrun.ops.norm's terms and normalize.
    Returns that call, bound to these arrays and scratch, to make again; None (nothing done)
    where it does not apply (`_whole_pass`)."""
    vectors = (scale, bias, running_mean, running_var, new_mean, new_var, saved_mean,
               saved_inv_std)
    found = _whole_pass(xp, X, order, (X, Y, *vectors), scratch)
    if found is None:
        return None
    shape4, slots, starts, lanes, parts = found
    outer, blocks, p, b = shape4
    x = np.ascontiguousarray(X).reshape(_flat(shape4))
    shift = scratch("bn.shift", (blocks, b), "float64")
    mean, k = (scratch(key, (blocks, b), X.dtype) for key in ("bn.mean", "bn.k"))
    pairs = [_pair(v, shape4) for v in vectors]
    call = partial(omp.launch, jit_bnb.forward_train, slots, starts, x, shift, lanes, parts,
                   outer * p, float(epsilon), float(momentum), *pairs[:4], bool(relu),
                   Y.reshape(_flat(shape4)), mean, k, *pairs[4:])
    call()
    return call


def train_backward(xp, X, order: str, scale, mean, inv_std, dY, Y, dX, dscale, dbias,
                   scratch: Scratch) -> Callable[[], None] | None:
    """SpatialBNGradient's whole training pass on a blocked X in one team call (Y: the
    ReLU's output, whose mask applies to dY, or None): the gradient sums, dscale, dbias and
    dX, with the bits of gradient_sums, netrun.ops.norm's terms and gradient_input. Returns
    that call, bound to these arrays and scratch, to make again; None (nothing done) where
    it does not apply (`_whole_pass`)."""
    relu = Y is not None
    arrays = (X, scale, mean, inv_std, dY, dX, dscale, dbias, *([Y] if relu else []))
    found = _whole_pass(xp, X, order, arrays, scratch)
    if found is None:
        return None
    shape4, slots, starts, lanes, parts = found
    outer, blocks, p, b = shape4
    x, dy = (np.ascontiguousarray(a).reshape(_flat(shape4)) for a in (X, dY))
    y = np.ascontiguousarray(Y).reshape(_flat(shape4)) if relu else dy
    terms = [scratch(key, (blocks, b), X.dtype) for key in ("bn.a", "bn.b", "bn.k")]
    call = partial(omp.launch, jit_bnb.backward_train, slots, starts, x, _pair(mean, shape4),
                   dy, y, relu, lanes, parts, outer * p, _pair(scale, shape4),
                   _pair(inv_std, shape4), _pair(dscale, shape4), _pair(dbias, shape4),
                   *terms, dX.reshape(_flat(shape4)))
    call()
    return call


def _whole_pass(xp, X, order: str, arrays: tuple, scratch: Scratch) -> tuple | None:
    """(shape4, slots, starts, lanes, parts) for a whole training pass over a blocked X in
    one team call: parallel.chunks' chunks of the outer axis on the team (one slot for one
    chunk), each slot's lanes and each chunk's sums from scratch. None where X is not
    blocked, the compiled kernels do not take `arrays`, the OpenMP team is not usable, or
    several chunks would leave it spinning long (omp.team's rule)."""
    if not blocked(X, order) or not compiled(xp, *arrays) or not omp.usable(xp):
        return None
    shape4 = _view4(X)
    outer, blocks, p, b = shape4
    starts = omp.bounds(outer, outer * blocks * p * b)
    chunks = starts.shape[0] - 1
    if chunks > 1 and not parallel.in_chunk() and not omp.short_spin():
        return None
    jit_bnb.prepare_team()
    slots = omp.team_size(chunks)
    lanes = scratch("bn.team_lanes", (slots, 2, jit_bnb.LANE_BLOCK * b), "float64")
    parts = scratch("bn.team_sums", (chunks, 2, blocks, b), "float64")
    return shape4, slots, starts, lanes, parts


def inference(xp, X, order: str, scale, bias, mean, var, epsilon: float, Y,
              relu: bool) -> bool:
    """is_test's Y = X·s + (bias − mean·s), s = scale/√(var + ε) (then max(Y, 0) if relu),
    per-channel terms included, in one compiled call per chunk: batch-1 inference pays no
    per-channel NumPy calls. False (nothing done) where the compiled kernels do not apply."""
    if not compiled(xp, X, Y, scale, bias, mean, var) or blocked(X, order):
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
    if blocked(X, order):
        return _blocked_gradient_sums(xp, X, mean, dY, Y, scratch)
    shape3 = view(X.shape, order)
    c = shape3[1]
    relu = Y is not None
    if compiled(xp, X, mean, dY, *([Y] if relu else [])):
        x, dy = np.ascontiguousarray(X).reshape(shape3), np.ascontiguousarray(dY).reshape(shape3)
        y = np.ascontiguousarray(Y).reshape(shape3) if relu else dy
        return _chunked_sums(xp, shape3, scratch, jit_bn.gradient_sums,
                             jit_bn.gradient_sums_team, x, mean, dy, y, relu)
    return _numpy_gradient_sums(xp, X, mean, dY, Y, shape3, (1, c, 1), _channel_sum, scratch)


def _blocked_gradient_sums(xp, X, mean, dY, Y, scratch: Scratch):
    """gradient_sums on blocked arrays."""
    shape4 = _view4(X)
    outer, blocks, p, b = shape4
    relu = Y is not None
    if compiled(xp, X, mean, dY, *([Y] if relu else [])):
        x, dy = (np.ascontiguousarray(a).reshape(_flat(shape4)) for a in (X, dY))
        y = np.ascontiguousarray(Y).reshape(_flat(shape4)) if relu else dy
        s = _chunked_sums(xp, _flat(shape4), scratch, jit_bnb.gradient_sums,
                          jit_bnb.gradient_sums_team, x, _pair(mean, shape4), dy, y, relu,
                          lanes_shape=(2, jit_bnb.LANE_BLOCK * b), sums_shape=(2, blocks, b))
        return s.reshape(2, blocks * b)
    return _numpy_gradient_sums(xp, X, mean, dY, Y, shape4, (1, blocks, 1, b), _blocked_sum,
                                scratch)


def _blocked_gradient_input(xp, X, mean, dY, Y, a, b, k, is_test: bool, dX,
                            scratch: Scratch) -> None:
    """gradient_input on blocked arrays."""
    shape4 = _view4(X)
    relu = Y is not None
    dx = dX.reshape(shape4)
    if compiled(xp, X, mean, dY, dX, a, b, k, *([Y] if relu else [])):
        x, dy = (np.ascontiguousarray(v).reshape(_flat(shape4)) for v in (X, dY))
        y = np.ascontiguousarray(Y).reshape(_flat(shape4)) if relu else dy
        _each_chunk(xp, _flat(shape4), jit_bnb.gradient_input, jit_bnb.gradient_input_team,
                    x, _pair(mean, shape4), dy, y, relu,
                    *(_pair(v, shape4) for v in (a, b, k)), is_test, dx.reshape(_flat(shape4)))
        return
    _numpy_gradient_input(xp, X, mean, dY, Y, shape4, (1, shape4[1], 1, shape4[3]), a, b, k,
                          is_test, dx, scratch)


def gradient_input(xp, X, mean, dY, Y, order: str, a, b, k, is_test: bool, dX,
                   scratch: Scratch) -> None:
    """dX = ((g − (X − mean)·a) − b)·k per channel, or g·k if is_test; g as in
    gradient_sums (vectors of X's dtype)."""
    if blocked(X, order):
        _blocked_gradient_input(xp, X, mean, dY, Y, a, b, k, is_test, dX, scratch)
        return
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
    _numpy_gradient_input(xp, X, mean, dY, Y, shape3, (1, c, 1), a, b, k, is_test,
                          dX.reshape(shape3), scratch)


def _masked(xp, dY, Y, shape, scratch: Scratch):
    """g: dY, or dY·(Y > 0) given Y, viewed as `shape` (NumPy paths)."""
    g = dY.reshape(shape)
    if Y is None:
        return g
    return relu_kernels.relu_gradient(xp, Y.reshape(shape), g,
                                      scratch("bn.masked", shape, dY.dtype))


def _numpy_gradient_sums(xp, X, mean, dY, Y, shape, bs, total, scratch: Scratch):
    """gradient_sums without the compiled kernels: arrays viewed as `shape`, the vectors
    as `bs`, `total` the float64 per-channel sum of such a view."""
    g = _masked(xp, dY, Y, shape, scratch)
    centred = scratch("bn.centred", shape, X.dtype)
    xp.subtract(X.reshape(shape), mean.reshape(bs), out=centred)
    centred *= g
    return xp.stack([total(g), total(centred)])


def _numpy_gradient_input(xp, X, mean, dY, Y, shape, bs, a, b, k, is_test: bool, dx,
                          scratch: Scratch) -> None:
    """gradient_input without the compiled kernels into dx (viewed as `shape`), the vectors
    as `bs`."""
    g = _masked(xp, dY, Y, shape, scratch)
    if is_test:
        xp.multiply(g, k.reshape(bs), out=dx)
        return
    xp.subtract(X.reshape(shape), mean.reshape(bs), out=dx)
    dx *= a.reshape(bs)
    xp.subtract(g, dx, out=dx)
    dx -= b.reshape(bs)
    dx *= k.reshape(bs)
