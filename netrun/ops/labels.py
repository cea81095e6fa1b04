"""Helpers for ops that score classes (softmax, losses, metrics): N×D coercion, label checks."""
from __future__ import annotations

import math

from netrun.core.schema import TensorSpec
from netrun.errors import NetrunError, ShapeError

NO_IGNORE = -1  # ignore_label's default: every label counts


def coerce_2d(what: str, x: TensorSpec, axis: int) -> tuple[int, int]:
    """(N, D) of X flattened to 2-D at `axis`, as Caffe2's softmax family coerces its input."""
    nd = len(x.shape)
    a = axis + nd if axis < 0 else axis
    if not 0 <= a < nd:
        raise ShapeError(f"{what}: axis {axis} is out of range for X {x} ({nd} axes)")
    return math.prod(x.shape[:a]), math.prod(x.shape[a:])


def check_labels(what: str, n: int, labels: TensorSpec, x: TensorSpec) -> None:
    """Raise a ShapeError unless `labels` holds one integer per example of X."""
    if labels.size != n or len(labels.shape) > 2:
        raise ShapeError(f"{what}: labels have {labels.size} entries but X has {n} examples: "
                         f"X {x}, labels {labels}")


def label_index(ctx, labels, n: int, d: int, ignore_label: int = NO_IGNORE):
    """Labels as an (N,) index safe for gathering, and a bool mask of counted rows (or None).

    A label outside [0, D) that is not ignored raises: NumPy would wrap negative ones
    silently. (On a GPU this check waits for the device once per run.)
    """
    xp = ctx.xp
    lab = labels.reshape(n)
    if lab.dtype.kind not in "iu":
        lab = lab.astype(xp.int64)  # Caffe data layers write labels as floats
    valid = None if ignore_label == NO_IGNORE else lab != ignore_label
    bad = (lab < 0) | (lab >= d)
    if valid is not None:
        bad &= valid
    if bool(bad.any()):
        first = int(lab[bad][0])
        raise NetrunError(f"op {ctx.def_.label}: label {first} is outside [0, {d}) "
                          f"(X has {d} classes)")
    if valid is not None:
        lab = xp.where(valid, lab, 0)
    return lab, valid
