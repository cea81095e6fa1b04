"""Depthwise convolution on compiled kernels (netrun.kernels.jit.depthwise): one memory pass
each way.

The NumPy `depthwise` algorithm turns a depthwise conv into row GEMMs or per-tap passes over
memory; compiled, each direction reads its inputs and writes its output once, plane by plane
in cache, which beats the NumPy algorithm's many passes (measurements: benchmarks/README.md).
It applies where the NumPy one does (group = C, any channel multiplier K/C, kernel, stride,
pads and dilation) in float32 and float64 when Numba is installed. On other array modules
(CuPy), or inside `jit.disabled()`, it runs the NumPy algorithm, so a choice remembered in
the algorithm cache stays valid.

Forward and backward-data split the N·K (N·C) planes over parallel.chunks' threads;
backward-filter splits the input channels, so each dW and db element is summed by one thread
in a fixed order: the results do not depend on the thread count.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from netrun.conv.algorithm import ConvAlgorithm, ConvProblem, find_algorithm, register_algorithm
from netrun.kernels import jit, parallel
from netrun.kernels.jit import depthwise as kernels
from netrun.kernels.jit.depthwise import layout

DTYPES = ("float32", "float64")


@register_algorithm
class JitDepthwise(ConvAlgorithm):
    """Compiled per-plane loops: a zero-padded plane in cache, a vectorized loop per tap."""

    name = "depthwise_jit"
    summary = "group = C: compiled (Numba) loops over cached planes, one memory pass per pass"

    def applicable(self, p: ConvProblem) -> bool:
        # the cheap tests first: only a depthwise problem asks whether Numba is installed
        return p.group == p.c and p.group > 1 and p.dtype in DTYPES and jit.available()

    def workspace_bytes(self, p: ConvProblem) -> int:
        # the kernels' own plane buffers, per thread (contiguous copies of the operands, which
        # the conv ops never need, are not counted)
        hp, wp = p.h + p.pt + p.pb + p.sh, p.w + p.pl + p.pr + p.sw
        return parallel.thread_count() * (2 * hp * wp + 128 * (p.kh * p.kw + 1)) * p.itemsize

    def forward(self, xp, x, w, p, out, scratch, bias=None):
        if not jit.enabled(xp):
            find_algorithm("depthwise").forward(xp, x, w, p, out, scratch, bias)
            return
        x, w3 = np.ascontiguousarray(x), _filters(w, p)
        if bias is None:
            bias = scratch("dwjit.zero_bias", (p.k,), p.dtype)
            bias.fill(0)
        bias = np.ascontiguousarray(bias)
        y = _writable(out, scratch, "dwjit.y")
        t = _layout(p)
        parallel.chunks(xp, p.n * p.k, lambda i, a, b: kernels.forward(
            x, w3, bias, y, t.rows, t.cols, t.taps, t.size, t.wq, a, b), work=_work(p))
        if y is not out:
            out[...] = y

    def backward_data(self, xp, dy, w, p, out, scratch):
        if not jit.enabled(xp):
            find_algorithm("depthwise").backward_data(xp, dy, w, p, out, scratch)
            return
        dy, w3 = np.ascontiguousarray(dy), _filters(w, p)
        dx = _writable(out, scratch, "dwjit.dx")
        t = _layout(p)
        parallel.chunks(xp, p.n * p.c, lambda i, a, b: kernels.backward_data(
            dy, w3, dx, t.rows, t.cols, t.grid, t.order, t.size, t.gsize, t.gstart, t.wq, t.hw,
            a, b), work=_work(p))
        if dx is not out:
            out[...] = dx

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        if not jit.enabled(xp):
            find_algorithm("depthwise").backward_filter(xp, x, dy, p, out, scratch, dbias)
            return
        x, dy = np.ascontiguousarray(x), np.ascontiguousarray(dy)
        dw = _writable(out, scratch, "dwjit.dw")
        dw3 = dw.reshape(p.k, p.kh, p.kw)                        # (K, 1, kh, kw) -> (K, kh, kw)
        # db comes out of the same pass over dY; without dbias it goes to scratch
        db = _writable(dbias, scratch, "dwjit.db") if dbias is not None else \
            scratch("dwjit.db", (p.k,), p.dtype)
        t = _layout(p)
        parallel.chunks(xp, p.c, lambda i, a, b: kernels.backward_filter(
            x, dy, dw3, db, t.rows, t.cols, t.taps, t.size, t.wq, a, b), work=_work(p))
        if dw is not out:
            out[...] = dw
        if dbias is not None and db is not dbias:
            dbias[...] = db


@lru_cache(maxsize=64)
def _layout(p: ConvProblem):
    """The kernels' index tables for p, built once: the same problem recurs every iteration."""
    return layout(p.h, p.w, p.kh, p.kw, p.sh, p.sw, p.pt, p.pl, p.pb, p.pr, p.dh, p.dw)


def _filters(w, p: ConvProblem):
    """W (K, 1, kh, kw) as a C-contiguous (K, kh, kw)."""
    return np.ascontiguousarray(w).reshape(p.k, p.kh, p.kw)


def _writable(out, scratch, key: str):
    """`out` itself when the kernels can write it directly (C-contiguous), else a scratch twin."""
    if out.flags.c_contiguous:
        return out
    return scratch(key, out.shape, out.dtype)


def _work(p: ConvProblem) -> int:
    """Elements touched, for parallel.chunks' is-it-worth-a-thread test."""
    return p.n * p.k * p.oh * p.ow * p.kh * p.kw


def prepare(args: Any) -> None:
    """Load the float32 depthwise kernels for a grouped conv op's args (the conv ops'
    preparer calls this when the engine is enabled)."""
    if args.group <= 1 or args.algo not in ("", JitDepthwise.name):
        return
    kernels.prepare()
