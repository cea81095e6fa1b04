"""The error of a data-parallel job that cannot start (its own module: every part raises it)."""
from __future__ import annotations

from netrun.errors import NetrunError

INSTALL_HINT = "pip install 'netrun[dist]'"


class DistError(NetrunError):
    """A data-parallel job that cannot start: no MPI, or a launcher that does not match it."""
