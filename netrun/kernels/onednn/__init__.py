"""oneDNN as an optional CPU engine, through its C API (ctypes; `pip install netrun[onednn]`).

library: finding and loading libdnnl (NETRUN_ONEDNN=off switches it off); enums: its enum
values, looked up by name; api: prototypes, errors and owned objects; threads: OpenMP's
thread count and waiting policy; conv: convolution primitives, compiled once per problem.
"""
from __future__ import annotations

from netrun.kernels.onednn.library import ENV, INSTALL_HINT, require, switched_off, why_not


def available() -> bool:
    """Whether oneDNN is installed, loads, and is not switched off."""
    from netrun.kernels.onednn import api

    try:
        return api.get() is not None
    except (LookupError, OSError, AttributeError):
        return False


__all__ = ["ENV", "INSTALL_HINT", "available", "require", "switched_off", "why_not"]
