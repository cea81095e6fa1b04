"""Operator families. Importing this package registers every schema, kernel and gradient.

Each module holds whole operators: schema, kernel(s) and gradient maker side by side.
"""
from __future__ import annotations

import importlib

FAMILIES = ("activation", "elementwise", "shape", "reshape", "reduce", "fc", "conv", "pool",
            "softmax", "loss", "metrics", "norm", "dropout", "fill", "optim", "optimizers", "db")

for _family in FAMILIES:
    try:
        importlib.import_module(f"netrun.ops.{_family}")
    except ModuleNotFoundError as e:  # a family not written yet
        if e.name != f"netrun.ops.{_family}":
            raise
