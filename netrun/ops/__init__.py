"""Operator families. Importing this package registers every schema, kernel and gradient.

Each module holds whole operators: schema, kernel(s) and gradient maker side by side; the GPU
backend's own kernels for a family live in `netrun.ops.gpu` under the same module name. This
is the one place the families are imported (`import netrun` does it), so the registries in
netrun.core stay passive dicts.
"""
from __future__ import annotations

from netrun.core.registry import find_kernel
from netrun.ops import (  # noqa: F401
    activation,
    caffe_ops,
    collective,
    conv,
    db,
    dropout,
    elementwise,
    fc,
    fill,
    gpu,  # noqa: F401  (CUDA sources as text: importing it loads no CuPy)
    layout,
    loss,
    metrics,
    movement,
    norm,
    optimizers,
    pool,
    reduce,
    reshape,
    softmax,
    solver_ops,
    unary,
)

# The families in the order `netrun ops` and docs/ops.md list them.
FAMILIES = ("activation", "unary", "elementwise", "movement", "layout", "reshape", "reduce",
            "fc", "conv", "pool", "softmax", "loss", "metrics", "norm", "dropout", "fill",
            "solver_ops", "optimizers", "db", "caffe_ops")


def family_of(type_: str) -> str | None:
    """The family module whose kernel serves `type_` on the CPU; None for ops that are not
    netrun's own (registered by tests or users outside netrun.ops)."""
    kernel = find_kernel(type_, "cpu")
    parts = getattr(kernel, "__module__", "").split(".")
    if parts[:2] != ["netrun", "ops"] or len(parts) < 3 or parts[2] == "gpu":
        return None
    return parts[2]
