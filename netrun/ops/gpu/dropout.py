"""Dropout on the GPU: the mask and the scaled output in one pass from the device generator."""
from __future__ import annotations

import numpy as np

from netrun.backends.cuda.random import SOURCE, DeviceGenerator
from netrun.backends.cuda.source import contiguous, i64, launch, real
from netrun.core.registry import register_kernel
from netrun.ops import dropout as dropout_ops


@register_kernel("Dropout", backend="gpu")
def dropout(ctx, X):
    """Training: mask and Y = X·mask/(1 − ratio) in one pass from the device generator."""
    a, gen = ctx.args, ctx.rng
    if a.is_test or not isinstance(gen, DeviceGenerator):
        return dropout_ops.dropout(ctx, X)
    x = contiguous(ctx.xp, X)
    mask = ctx.output(1, X.shape, "bool")
    Y = ctx.output(0, X.shape, X.dtype)
    key, offset = gen.reserve(X.size)
    launch(SOURCE.function(ctx.xp, "dropout_forward", X.dtype), X.size,
           (x, Y, mask, i64(X.size), key, offset, np.float32(a.ratio),
            real(X.dtype, 1.0 / (1.0 - a.ratio))))
