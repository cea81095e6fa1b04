"""Metrics: Accuracy. Metrics have no gradient (schema no_gradient=True)."""
from __future__ import annotations

from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, TensorSpec, register_schema
from netrun.errors import SchemaError, ShapeError
from netrun.ops.common import input_cost
from netrun.ops.labels import NO_IGNORE, check_labels, coerce_2d, label_index


# Accuracy --------------------------------------------------------------------------------
def _accuracy_check(op, args: Args) -> None:
    if args.top_k < 1:
        raise SchemaError(f"op {op.label}: argument 'top_k' is {args.top_k}; it must be ≥ 1")


def _accuracy_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0]
    n, d = coerce_2d("Accuracy", x, 1)
    check_labels("Accuracy", n, ins[1], x)
    if args.top_k > d:
        raise ShapeError(f"Accuracy: top_k is {args.top_k} but X has only {d} classes: X {x}")
    return [TensorSpec((), "float32")]


register_schema(
    "Accuracy", inputs=2, outputs=1, input_names=("X", "labels"), output_names=("accuracy",),
    args=[Arg("top_k", "int", 1, doc="a hit when the label is among the k best scores"),
          Arg("ignore_label", "int", NO_IGNORE,
              doc="examples with this label are left out of the count; -1: none")],
    shape_fn=_accuracy_shape, cost_fn=input_cost(2), check_fn=_accuracy_check,
    no_gradient=True, family="metrics",
    doc="Fraction (float32 scalar) of examples whose label scores among the top_k of X (N×D, "
        "trailing axes flattened). As in Caffe, an example is a hit when fewer than top_k "
        "classes score strictly higher than its label, so ties count as hits (Caffe2's "
        "stable sort would rank tied classes of lower index first). Examples labelled "
        "ignore_label are left out of numerator and denominator; 0 when none count. An example "
        "with any NaN or infinite score counts as a miss, so a diverged net scores 0.")


@register_kernel("Accuracy")
def accuracy(ctx, X, labels):
    xp, a = ctx.xp, ctx.args
    n, d = coerce_2d("Accuracy", TensorSpec(X.shape), 1)
    if a.top_k > d:
        raise ValueError(f"top_k is {a.top_k} but X has only {d} classes")
    X2 = X.reshape(n, d)
    lab, valid = label_index(ctx, labels, n, d, a.ignore_label)
    label_score = xp.take_along_axis(X2, lab[:, None], axis=1)       # (N, 1)
    better = (X2 > label_score).sum(axis=1)                           # (N,)
    # NaN compares false both ways, so a NaN row would count as a hit: a diverged net must
    # score nothing (and never win best.h5). Same rule as the GPU kernel.
    hit = (better < a.top_k) & xp.isfinite(X2).all(axis=1)
    out = ctx.output(0, (), "float32")
    if valid is None:
        out[...] = hit.mean(dtype=xp.float32) if n else 0.0
    else:
        count = valid.sum()
        out[...] = (hit & valid).sum() / xp.maximum(count, 1)
