"""Elementwise layers: ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal, BNLL, Power, Exp, Log, Dropout."""
from __future__ import annotations

import math

from netrun.caffe.context import LayerContext
from netrun.caffe.layers.registry import layer


def _unary(t: LayerContext, op_type: str, param: str | None = None, **args) -> None:
    t.counts(1, 1)
    if param:
        t.f.sub(param).ignore("engine")
    t.add(op_type, [t.bottoms[0]], t.top(), **args)


@layer("ReLU")
def relu(t: LayerContext) -> None:
    """Relu, or LeakyRelu when negative_slope is set."""
    p = t.f.sub("relu_param")
    p.ignore("engine")
    slope = p.get("negative_slope", 0.0)
    if slope:
        _unary(t, "LeakyRelu", alpha=slope)
    else:
        _unary(t, "Relu")


@layer("Sigmoid")
def sigmoid(t: LayerContext) -> None:
    """1 / (1 + exp(-x))."""
    _unary(t, "Sigmoid", "sigmoid_param")


@layer("TanH")
def tanh(t: LayerContext) -> None:
    """tanh(x)."""
    _unary(t, "Tanh", "tanh_param")


@layer("AbsVal")
def absval(t: LayerContext) -> None:
    """|x|."""
    _unary(t, "Abs")


@layer("BNLL")
def bnll(t: LayerContext) -> None:
    """Caffe's BNLL, log(1 + exp(x)), is Softplus."""
    _unary(t, "Softplus")


@layer("ELU")
def elu(t: LayerContext) -> None:
    """x for x > 0, alpha·(exp(x) − 1) otherwise."""
    _unary(t, "Elu", alpha=t.f.sub("elu_param").get("alpha", 1.0))


@layer("PReLU")
def prelu(t: LayerContext) -> None:
    """PRelu with one learned slope per channel (or one shared), initialized to 0.25."""
    t.counts(1, 1)
    p = t.f.sub("prelu_param")
    shape = t.shape(0)
    if len(shape) < 2:
        raise t.skip("needs an N×C×… bottom")
    size = 1 if p.get("channel_shared", False) else shape[1]
    slope = t.param(0, "w", (size,), "weight", p.sub("filler"),
                    default={"type": "constant", "value": 0.25})
    t.add("PRelu", [t.bottoms[0], slope], t.top())


def _affine(t: LayerContext, x: str, scale: float, shift: float, out: str) -> str:
    """shift + scale·x into `out` (no op when it is the identity)."""
    if scale == 1.0 and shift == 0.0:
        return x
    if shift == 0.0:
        t.add("Scale", [x], out, scale=scale)
    else:
        t.add("Power", [x], out, power=1.0, scale=scale, shift=shift)
    return out


@layer("Power")
def power(t: LayerContext) -> None:
    """(shift + scale·x)^power; Scale when power is 1 and there is no shift."""
    t.counts(1, 1)
    p = t.f.sub("power_param")
    pw, scale, shift = p.get("power", 1.0), p.get("scale", 1.0), p.get("shift", 0.0)
    if pw == 1.0 and shift == 0.0:
        t.add("Scale", [t.bottoms[0]], t.top(), scale=scale)
    else:
        t.add("Power", [t.bottoms[0]], t.top(), power=pw, scale=scale, shift=shift)


def _log_base(t: LayerContext, base: float, field: str) -> float:
    """ln(base), with Caffe's base = -1 meaning e."""
    if base == -1.0:
        return 1.0
    if base <= 0 or base == 1.0:
        raise t.skip(f"base must be positive and not 1 (or -1 for e), got {base}", field)
    return math.log(base)


@layer("Exp")
def exp(t: LayerContext) -> None:
    """base^(shift + scale·x) = exp(ln(base)·(shift + scale·x))."""
    t.counts(1, 1)
    p = t.f.sub("exp_param")
    ln_base = _log_base(t, p.get("base", -1.0), "exp_param")
    scale, shift = ln_base * p.get("scale", 1.0), ln_base * p.get("shift", 0.0)
    x = _affine(t, t.bottoms[0], scale, shift, t.tmp("exponent"))
    t.add("Exp", [x], t.top())


@layer("Log")
def log(t: LayerContext) -> None:
    """log_base(shift + scale·x) = ln(shift + scale·x) / ln(base)."""
    t.counts(1, 1)
    p = t.f.sub("log_param")
    ln_base = _log_base(t, p.get("base", -1.0), "log_param")
    x = _affine(t, t.bottoms[0], p.get("scale", 1.0), p.get("shift", 0.0), t.tmp("argument"))
    if ln_base == 1.0:
        t.add("Log", [x], t.top())
        return
    ln = t.tmp("ln")
    t.add("Log", [x], ln)
    t.add("Scale", [ln], t.top(), scale=1.0 / ln_base)


@layer("Dropout")
def dropout(t: LayerContext) -> None:
    """Inverted dropout in training (with a mask for the gradient), identity in testing."""
    t.counts(1, 1)
    p = t.f.sub("dropout_param")
    ratio = p.get("dropout_ratio", 0.5)
    if not p.get("scale_train", True):
        raise t.skip("scale_train: false (scaling at test time) is not supported",
                     "dropout_param")
    if not 0.0 <= ratio < 1.0:
        raise t.skip(f"dropout_ratio must lie in [0, 1), got {ratio}", "dropout_param")
    if t.train:
        t.add("Dropout", [t.bottoms[0]], [t.top(), t.tmp("mask")], ratio=ratio, is_test=0)
    else:
        t.add("Dropout", [t.bottoms[0]], t.top(), ratio=ratio, is_test=1)
