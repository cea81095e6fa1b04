"""The GPU backend's own kernels: CUDA sources compiled by CuPy, registered per op family.

Importing this package registers `@register_kernel(type, backend="gpu")` kernels for the ops
where array-module code would be slow on a GPU or would wait for it: convolution (GPU
algorithms), pooling, LRN, SpatialBN, the softmax loss and other label readers, the update
ops and LearningRate, and Dropout (with the counter-based device generator). Every other op
runs its shared `xp` kernel on CuPy. Nothing here imports cupy; the GPU backend imports this
package when it is created, so CPU-only processes never load it.
"""
from __future__ import annotations

from netrun.backends.gpu_kernels import (bn, conv, conv_depthwise, conv_im2col,  # noqa: F401
                                         lrn, optim, pool, random, softmax_loss)

SOURCES = (bn.SOURCE, conv_depthwise.SOURCE, conv_im2col.SOURCE, lrn.SOURCE, optim.SOURCE,
           pool.SOURCE, random.SOURCE, softmax_loss.SOURCE)
