"""Operators that Caffe models need and the core library lacks: Power, Max (Eltwise MAX),
CaffeBatchNorm (Caffe's BatchNorm with its three statistics blobs), ContrastiveLoss, and the
Caffe fillers BilinearFill, SparseGaussianFill and PositiveUnitballFill.

One module per kind; each op's section holds its schema, kernel, gradient maker, and the
gradient op's schema and kernel.
"""
from __future__ import annotations

from netrun.ops.caffe_ops import batch_norm, contrastive, fillers, pointwise  # noqa: F401

__all__ = ["batch_norm", "contrastive", "fillers", "pointwise"]
