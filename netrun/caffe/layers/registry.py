"""The Caffe layer table: layer type -> translation function (filled by the family modules)."""
from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from netrun.caffe.context import LayerContext

LayerFn = Callable[["LayerContext"], None]
LAYERS: dict[str, LayerFn] = {}


def layer(*types: str) -> Callable[[LayerFn], LayerFn]:
    """Decorator: register a function that translates Caffe layers of these types."""

    def wrap(fn: LayerFn) -> LayerFn:
        for t in types:
            if t in LAYERS:
                raise ValueError(f"Caffe layer type {t} registered twice")
            LAYERS[t] = fn
        return fn

    return wrap


def axis_of(t: "LayerContext", axis: int, ndim: int, field: str = "axis") -> int:
    """A Caffe axis (negative counts from the end) as an index into `ndim` dims."""
    if not -ndim <= axis < ndim:
        raise t.skip(f"axis {axis} is out of range for a {ndim}-d bottom", field)
    return axis % ndim


def count(shape: Sequence[int]) -> int:
    """Number of elements of a shape (1 for a scalar)."""
    return int(prod(shape))
