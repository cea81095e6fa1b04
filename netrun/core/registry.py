"""Operator registry: (op type, backend) -> kernel function.

A kernel is `fn(ctx, *inputs)`. It either returns its outputs (one array or a tuple) or
writes them into buffers from `ctx.output(i, shape, dtype)`, which the workspace keeps
alive across iterations. Kernels registered for backend "any" are written against
`ctx.xp` and serve every backend that has no kernel of its own.
"""
from __future__ import annotations

from typing import Callable

from netrun.util.registry import registrar

Kernel = Callable[..., object]
_KERNELS: dict[tuple[str, str], Kernel] = {}
# Per op type: fn(ctx) run when an operator of that type is bound (compiled kernels load
# there, ahead of the first iteration).
_PREPARERS: dict[str, Callable[..., None]] = {}


def register_kernel(type: str, backend: str = "any") -> Callable[[Kernel], Kernel]:
    """Decorator: register `fn` as the kernel of `type` on `backend` ("any", "cpu", "gpu")."""

    def wrap(fn: Kernel) -> Kernel:
        if (type, backend) in _KERNELS:
            raise ValueError(f"kernel for {type} on {backend} registered twice")
        _KERNELS[(type, backend)] = fn
        return fn

    return wrap


def find_kernel(type: str, backend: str) -> Kernel | None:
    """The backend's own kernel for `type`, else the shared one, else None."""
    return _KERNELS.get((type, backend)) or _KERNELS.get((type, "any"))


def kernel_backends(type: str) -> list[str]:
    """Backends that have a kernel for `type` ("any" means all)."""
    return sorted(b for (t, b) in _KERNELS if t == type)


# Decorator: `fn(ctx)` runs when an operator of one of the types named is bound to a workspace.
register_preparer = registrar(_PREPARERS, "preparer")


def find_preparer(type: str) -> Callable[..., None] | None:
    """The function that prepares operators of `type` when they are bound, if any."""
    return _PREPARERS.get(type)
