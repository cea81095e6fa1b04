"""The GPU backend's own kernels, one module per op family (the families' names).

They register `@register_kernel(type, backend="gpu")` for the ops where array-module code
would be slow on a GPU or would wait for it: pooling, LRN, SpatialBN, the softmax loss and
other label readers, the update ops and LearningRate, and Dropout (with the counter-based
device generator). Every other op, convolution included (its GPU algorithms are in
netrun.conv.gpu), runs its shared `xp` kernel on CuPy. The CUDA sources are text compiled
on first use, so importing this package imports no CuPy; netrun.ops imports it with the
families, and a CPU workspace never looks these kernels up. A short kernel stays in its op's
section of the family module instead (HardSigmoid's, for one); every source registers itself
(netrun.backends.cuda.source.all_sources).
"""
from __future__ import annotations

from netrun.ops.gpu import batch_norm, dropout, loss, lrn, optimizers, pool  # noqa: F401
