"""Reorders between NCHW and the channel-blocked layout (N × ⌈C/B⌉ × H × W × B, the channels
zero-padded to whole blocks: oneDNN's aBcd8b / aBcd16b) that the bind-time layout plan keeps
activations in between oneDNN's convolutions. Compiled and threaded over the images where the
engine is there, NumPy's strided copies otherwise; pure copies, so the bits never depend on
the threads."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from netrun.kernels import jit, omp, parallel
from netrun.kernels.jit import blocked as jit_blocked


def blocked_shape(shape: tuple[int, ...], block: int) -> tuple[int, ...]:
    """The blocked shape of an NCHW shape."""
    n, c, h, w = shape
    return (n, -(-c // block), h, w, block)


def _compiled(xp: Any, *arrays) -> bool:
    return jit.enabled(xp) and all(a.dtype == np.float32 and a.flags.c_contiguous
                                   for a in arrays)


def _images(xp: Any, n: int, bytes_per_image: int, fn) -> None:
    """fn(n0, n1) over the images, in fixed chunks on netrun's workers when big enough."""
    parallel.chunks(xp, n, lambda _i, n0, n1: fn(n0, n1), work=n * bytes_per_image // 4)


def to_blocked(xp: Any, x, out) -> None:
    """out (blocked) = x (NCHW), zeros in the padding channels."""
    n, c, h, w = x.shape
    blocks, block = out.shape[1], out.shape[4]
    if _compiled(xp, x, out):
        xs, os_ = x.reshape(n, c, h * w), out.reshape(n, blocks, h * w, block)
        _images(xp, n, x[0].nbytes, lambda n0, n1: jit_blocked.block(xs[n0:n1], os_[n0:n1]))
        return
    padded = xp.zeros((n, blocks * block, h, w), x.dtype) if c % block else None
    if padded is not None:
        padded[:, :c] = x
    src = x if padded is None else padded
    out[...] = src.reshape(n, blocks, block, h, w).transpose(0, 1, 3, 4, 2)


def to_nchw(xp: Any, x, out) -> None:
    """out (NCHW) = x (blocked), the padding channels dropped."""
    n, blocks, h, w, block = x.shape
    c = out.shape[1]
    if _compiled(xp, x, out):
        xs, os_ = x.reshape(n, blocks, h * w, block), out.reshape(n, c, h * w)
        _images(xp, n, out[0].nbytes, lambda n0, n1: jit_blocked.unblock(xs[n0:n1], os_[n0:n1]))
        return
    full = x.transpose(0, 1, 4, 2, 3).reshape(n, blocks * block, h, w)
    out[...] = full[:, :c]


# Elements of x up to which global pooling is one call on this thread: a pass at memory
# speed (ResNet-20's at batch 128, 0.5 M elements: 0.06 ms) costs less than a hand-off.
# Handed to netrun's workers that pool took 0.5-0.7 ms (profiler), on the OpenMP team
# 0.37, as one call 0.18 with its op; each image's result is the same either way.
POOL_ONE_CALL = 1 << 22


def global_pool(xp: Any, x, out, average: bool) -> Callable[[], None] | None:
    """out (N × ⌈C/B⌉ × 1 × 1 × B) = the mean (average) or maximum of blocked x over its
    pixels; the padding channels stay 0. Returns the pass as one call on views of x and out,
    to repeat while they stay, where it was one compiled call (`POOL_ONE_CALL`); else None.
    Bigger passes run in image chunks on the OpenMP team where it runs, else on netrun's
    worker threads."""
    n, blocks, h, w, block = x.shape
    if _compiled(xp, x, out):
        xs, os_ = x.reshape(n, blocks, h * w, block), out.reshape(n, blocks, block)
        work = n * x[0].nbytes // 4
        if work <= POOL_ONE_CALL or parallel.chunk_count(n, work) == 1:
            call = partial(jit_blocked.global_pool, xs, os_, average)
            call()
            return call
        team = omp.team(xp, n, work)
        if team is not None:
            jit_blocked.prepare_team()
            omp.launch(jit_blocked.global_pool_team, *team, xs, os_, average)
            return None
        _images(xp, n, x[0].nbytes, lambda n0, n1: jit_blocked.global_pool(
            xs[n0:n1], os_[n0:n1], average))
        return None
    (xp.mean if average else xp.max)(x, axis=(2, 3), keepdims=True, out=out)
    return None
