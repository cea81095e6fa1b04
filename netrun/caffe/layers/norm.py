"""BatchNorm (Caffe's, without scale and shift), Scale and Bias."""
from __future__ import annotations

from netrun.caffe.context import LayerContext
from netrun.caffe.fields import Fields
from netrun.caffe.layers.registry import axis_of, layer

_ZERO = {"type": "constant", "value": 0.0}
_ONE = {"type": "constant", "value": 1.0}


@layer("BatchNorm")
def batch_norm(t: LayerContext) -> None:
    """CaffeBatchNorm over the three Caffe statistics blobs (mean and variance sums and their
    weight), which are saved and imported as they are; use_global_stats defaults to the phase."""
    t.counts(1, 1)
    p = t.f.sub("batch_norm_param")
    p.ignore("engine")
    shape = t.shape(0)
    if len(shape) < 2:
        raise t.skip("needs an N×C×… bottom")
    c = shape[1]
    stats = [t.param(0, "mean", (c,), "running_mean", default=_ZERO, trainable=False),
             t.param(1, "var", (c,), "running_var", default=_ZERO, trainable=False),
             t.param(2, "factor", (1,), "running_factor", default=_ZERO, trainable=False)]
    args = {"moving_average_fraction": p.get("moving_average_fraction", 0.999),
            "epsilon": p.get("eps", 1e-5)}
    if p.get("use_global_stats", not t.train):
        t.add("CaffeBatchNorm", [t.bottoms[0], *stats], t.top(), is_test=1, **args)
    else:
        # The statistics are updated in place; the batch's are kept for the gradient.
        outs = [t.top(), *stats, t.tmp("saved_mean"), t.tmp("saved_inv_std")]
        t.add("CaffeBatchNorm", [t.bottoms[0], *stats], outs, is_test=0, **args)


def _shape(t: LayerContext, p: Fields, param: str) -> tuple[int, tuple[int, ...]]:
    """(axis, parameter shape): bottom dims axis .. axis+num_axes (-1: to the end)."""
    x = t.shape(0)
    axis = axis_of(t, p.get("axis", 1), len(x), param)
    num_axes = p.get("num_axes", 1)
    if num_axes < -1 or axis + max(num_axes, 0) > len(x):
        raise t.skip(f"num_axes {num_axes} does not fit a {len(x)}-d bottom at axis {axis}",
                     param)
    return axis, tuple(x[axis:] if num_axes == -1 else x[axis:axis + num_axes])


def _operand(t: LayerContext, p: Fields, param: str) -> tuple[int, str | None, tuple]:
    """(axis, second bottom or None, parameter shape) of a Scale or Bias layer."""
    t.counts((1, 2), 1)
    if t.nbottom == 2:
        x, y = t.shape(0), t.shape(1)
        axis = axis_of(t, p.get("axis", 1), len(x), param)
        p.ignore("num_axes")   # the second bottom's shape says it
        if tuple(x[axis:axis + len(y)]) != tuple(y):
            raise t.skip(f"bottom 1 of shape {'×'.join(map(str, y))} does not match bottom 0 "
                         f"({'×'.join(map(str, x))}) at axis {axis}")
        return axis, t.bottoms[1], y
    axis, shape = _shape(t, p, param)
    return axis, None, shape


@layer("Scale")
def scale(t: LayerContext) -> None:
    """X·γ (+ β) with γ, β broadcast from `axis`: Mul (and Add) with legacy broadcasting."""
    p = t.f.sub("scale_param")
    axis, operand, shape = _operand(t, p, "scale_param")
    if operand is None:
        operand = t.param(0, "w", shape, "scale", p.sub("filler"), default=_ONE)
    bias = p.get("bias_term", False)
    scaled = t.tmp("scaled") if bias else t.top()
    t.add("Mul", [t.bottoms[0], operand], scaled, broadcast=1, axis=axis)
    if bias:
        b = t.param(1 if t.nbottom == 1 else 0, "b", shape, "bias", p.sub("bias_filler"))
        t.add("Add", [scaled, b], t.top(), broadcast=1, axis=axis)


@layer("Bias")
def bias(t: LayerContext) -> None:
    """X + β with β broadcast from `axis` (a learned blob or the second bottom)."""
    p = t.f.sub("bias_param")
    axis, operand, shape = _operand(t, p, "bias_param")
    if operand is None:
        operand = t.param(0, "b", shape, "bias", p.sub("filler"))
    t.add("Add", [t.bottoms[0], operand], t.top(), broadcast=1, axis=axis)
