"""Normalization folded into a convolution's weights: the new blobs, computed at bind.

A test-mode normalization after a conv is an affine map per output channel, y = s·x + t,
so conv(x, W) + b followed by it is conv(x, s·W) + (s·b + t). The folded blobs are
computed from the workspace's current parameters in float64 and stored in the weights'
dtype; `compute` runs again whenever the parameters changed (a trainer's test pass).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from netrun.core.schema import TensorSpec
from netrun.errors import NetrunError


@dataclass(frozen=True)
class Fold:
    """How to compute (weight, bias) of one folded conv from the blobs it replaces."""

    weight: str                 # the new blobs
    bias: str
    conv_w: str                 # the conv's filters (output channels on axis 0) and bias
    conv_b: str | None
    mean: str                   # SpatialBN: running stats; Caffe: running sums over `factor`
    var: str
    epsilon: float
    factor: str | None = None
    gamma: str | None = None    # the per-channel scale and shift (absent: 1 and 0)
    beta: str | None = None

    def specs(self, spec_of) -> dict[str, TensorSpec]:
        """Shapes of the new blobs from the conv's filter spec (for shape inference)."""
        w = spec_of(self.conv_w)
        return {self.weight: TensorSpec(tuple(w.shape), w.dtype),
                self.bias: TensorSpec((w.shape[0],), w.dtype)}

    def compute(self, ws) -> None:
        """Write the folded filters and bias into the workspace."""
        read = (lambda n: None if n is None else _fetch(ws, n).astype(np.float64))
        w = _fetch(ws, self.conv_w)
        mean, var = read(self.mean), read(self.var)
        if self.factor is not None:           # Caffe keeps sums: statistic = sum / factor
            f = read(self.factor).reshape(-1)[0]
            k = 0.0 if f == 0 else 1.0 / f
            mean, var = mean * k, var * k
        s = 1.0 / np.sqrt(var + self.epsilon)
        if self.gamma is not None:
            s = s * read(self.gamma).reshape(-1)
        t = -mean * s
        if self.beta is not None:
            t = t + read(self.beta).reshape(-1)
        b = t if self.conv_b is None else read(self.conv_b) * s + t
        shape = (-1,) + (1,) * (w.ndim - 1)
        _store(ws, self.weight, (w.astype(np.float64) * s.reshape(shape)).astype(w.dtype))
        _store(ws, self.bias, b.astype(w.dtype))


def _fetch(ws, name: str) -> np.ndarray:
    if not ws.has_blob(name):
        raise NetrunError(f"blob '{name}' does not exist: the folded convolution needs it")
    return ws.fetch_blob(name)


def _store(ws, name: str, value: np.ndarray) -> None:
    """Overwrite the blob's buffer when it fits (bound ops may hold it), else feed anew."""
    if ws.has_blob(name):
        old = ws.get_blob(name)
        if tuple(old.shape) == value.shape and old.dtype == value.dtype:
            old[...] = ws.backend.to_device(value)
            ws.touch(name)
            return
    ws.feed_blob(name, value)
