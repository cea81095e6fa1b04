"""Depthwise convolution on the GPU (group = C): direct kernels, one thread per output value."""
from __future__ import annotations

from netrun.backends.cuda.source import contiguous
from netrun.conv.algorithm import register_algorithm
from netrun.conv.gpu import depthwise_kernels as kernels
from netrun.conv.gpu.base import GPUAlgorithm


@register_algorithm
class GpuDepthwise(GPUAlgorithm):
    """Each output sums its kh·kw taps; backward gathers, so every run gives the same bits."""

    name = "gpu_depthwise"
    summary = "group = C: direct kernels per output / input pixel / filter tap, no GEMM"

    def fits(self, p) -> bool:
        return p.group == p.c and p.group > 1

    def workspace_bytes(self, p) -> int:
        return p.n * p.k * p.kh * p.kw * p.itemsize      # backward-filter partials

    def forward(self, xp, x, w, p, out, scratch, bias=None):
        kernels.forward(xp, contiguous(xp, x), contiguous(xp, w), p, out, bias)

    def backward_data(self, xp, dy, w, p, out, scratch):
        kernels.backward_data(xp, contiguous(xp, dy), contiguous(xp, w), p, out)

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None):
        dy = contiguous(xp, dy)
        part = scratch("gconv.dw_part", (p.n, p.k * p.kh * p.kw), dy.dtype)
        kernels.backward_filter(xp, contiguous(xp, x), dy, p, part)
        xp.sum(part, axis=0, out=out.reshape(p.k * p.kh * p.kw))
        if dbias is not None:
            xp.sum(dy.reshape(p.n, p.k, p.oh * p.ow), axis=(0, 2), out=dbias)
