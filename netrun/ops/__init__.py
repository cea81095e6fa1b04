"""Operator families. Importing this package registers every schema, kernel and gradient.

Each module holds whole operators: schema, kernel(s) and gradient maker side by side.
"""
from __future__ import annotations

import importlib

from netrun.core.schema import all_schemas

FAMILIES = ("activation", "unary", "elementwise", "shape", "reshape", "reduce", "fc", "conv",
            "pool", "softmax", "loss", "metrics", "norm", "dropout", "fill", "optim", "optimizers",
            "db", "caffe_ops")

# op type -> the family module that registered it (ops registered elsewhere, by tests for
# example, are not netrun's and are absent).
FAMILY_OF: dict[str, str] = {}

for _family in FAMILIES:
    _before = set(all_schemas())
    try:
        importlib.import_module(f"netrun.ops.{_family}")
    except ModuleNotFoundError as e:  # a family not written yet
        if e.name != f"netrun.ops.{_family}":
            raise
    FAMILY_OF.update((t, _family) for t in set(all_schemas()) - _before)
