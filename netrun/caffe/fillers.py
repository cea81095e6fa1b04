"""Caffe FillerParameter -> the init op that fills one parameter blob.

Caffe's defaults apply: type "constant" with value 0 when a layer gives no filler.
"""
from __future__ import annotations

from typing import Any, Sequence

from netrun.caffe.fields import Fields
from netrun.proto.defs import OperatorDef, op as make_op

VARIANCE_NORMS = ("FAN_IN", "FAN_OUT", "AVERAGE")
# Every FillerParameter field: Caffe ignores the ones a filler type does not use (a "xavier"
# filler with a std is common), so they are accepted, not reported.
FILLER_FIELDS = ("type", "value", "min", "max", "mean", "std", "sparse", "variance_norm")


def _constant(f: Fields) -> tuple[str, dict[str, Any]]:
    return "ConstantFill", {"value": f.get("value", 0.0)}


def _gaussian(f: Fields) -> tuple[str, dict[str, Any]]:
    args = {"mean": f.get("mean", 0.0), "std": f.get("std", 1.0)}
    sparse = f.get("sparse", -1)
    if sparse >= 0:
        return "SparseGaussianFill", {**args, "sparse": sparse}
    return "GaussianFill", args


def _uniform(f: Fields) -> tuple[str, dict[str, Any]]:
    return "UniformFill", {"min": f.get("min", 0.0), "max": f.get("max", 1.0)}


def _scaled(op_type: str):
    def make(f: Fields) -> tuple[str, dict[str, Any]]:
        norm = f.enum("variance_norm", "FAN_IN", VARIANCE_NORMS)
        return op_type, ({"variance_norm": norm} if norm != "FAN_IN" else {})
    return make


FILLERS = {
    "constant": _constant,
    "gaussian": _gaussian,
    "uniform": _uniform,
    "xavier": _scaled("XavierFill"),
    "msra": _scaled("MSRAFill"),
    "bilinear": lambda f: ("BilinearFill", {}),
    "positive_unitball": lambda f: ("PositiveUnitballFill", {}),
}


def filler_op(filler: Fields | None, blob: str, shape: Sequence[int],
              default: dict[str, Any] | None = None) -> OperatorDef:
    """The init op for `blob` from a filler message; `default` ({"type": ..., key: value})
    stands in for a layer's own default filler when the message is absent."""
    shape = [int(d) for d in shape]
    if filler is None or not filler.msg.fields:
        default = dict(default or {"type": "constant"})
        kind = default.pop("type")
        op_type, args = FILLERS[kind](Fields(None, ""))
        args.update(default)
        return make_op(op_type, [], [blob], shape=shape, **args)
    kind = filler.get("type", "constant", "str")
    if kind not in FILLERS:
        raise filler.skip(f"filler type '{kind}' is not supported (supported: "
                          f"{', '.join(FILLERS)})", filler.position("type"))
    op_type, args = FILLERS[kind](filler)
    filler.ignore(*FILLER_FIELDS)
    if op_type == "BilinearFill" and (len(shape) != 4 or shape[2] != shape[3]):
        raise filler.skip(f"the bilinear filler needs a square 4-D blob, got {shape}",
                          filler.position("type"))
    return make_op(op_type, [], [blob], shape=shape, **args)
