"""A rewrite rule: a name, one line saying what it does, and a matcher.

A matcher looks at a Graph and returns one Match or None. A Match removes some ops and puts
one fused op at the position of the last of them (so every value the fused op reads is
there, and the rule checked that no op in between touches what moved), plus the folds
whose blobs the fused op reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from netrun.proto.defs import OperatorDef
from netrun.rewrite.fold import Fold
from netrun.rewrite.graph import Graph
from netrun.util.names import unique_name


@dataclass(frozen=True)
class Match:
    """Replace the ops at `remove` by `op` at the largest of those indices."""

    remove: tuple[int, ...]
    op: OperatorDef
    folds: tuple[Fold, ...] = ()


@dataclass(frozen=True)
class Context:
    """What a matcher may ask beyond the graph: parameter shapes and data types (None where
    unknown) and fresh blob names."""

    shape_of: Callable[[str], tuple[int, ...] | None]
    taken: set = field(default_factory=set)
    dtype_of: Callable[[str], str | None] = lambda name: None

    def fresh(self, base: str) -> str:
        """A blob name no op or earlier rewrite uses, from `base`."""
        return unique_name(base, self.taken, "")


@dataclass(frozen=True)
class Rule:
    """One named rewrite."""

    name: str
    description: str
    mode: str                  # "inference" or "training"
    find: Callable[[Graph, Context], Match | None]
    available: Callable[[], bool] = lambda: True    # the ops it makes are registered


def fused_name(*ops: OperatorDef) -> str:
    """The fused op's name: its parts' names joined with '+', or '' when none has one."""
    return "+".join(o.name for o in ops if o.name)
