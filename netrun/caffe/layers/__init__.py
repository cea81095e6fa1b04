"""Caffe layer translations, one small function per layer type, registered in LAYERS.

Modules by family: data (inputs and data layers), vision (convolution, pooling, inner
product, LRN), pointwise (activations, Power/Exp/Log, Dropout), norm (BatchNorm, Scale,
Bias), blobs (Eltwise, Concat, Slice, Split, Flatten, Reshape, Softmax, Silence) and losses
(loss layers and Accuracy).
"""
from __future__ import annotations

from netrun.caffe.layers.registry import LAYERS, layer

from netrun.caffe.layers import blobs, data, losses, norm, pointwise, vision  # noqa: E402,F401

__all__ = ["LAYERS", "layer"]
