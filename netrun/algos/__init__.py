"""Convolution algorithms beyond the basic two, and how one is chosen per problem.

`configure(ws, mode=..., workspace_limit=..., cache_dir=...)` sets how the conv ops of a
workspace pick algorithms (heuristic, exhaustive timing search with a persistent cache, or
deterministic); `compare_algorithms` times every applicable algorithm for a problem or a
bound conv op. The algorithm modules (shift, winograd, fft, depthwise) register themselves
into `netrun.ops.conv_algos.ALGORITHMS` when conv_algos is imported.
"""
from __future__ import annotations

# The operator families first: conv_algos imports the algorithm modules of this package at
# its end, so any import order (netrun.algos.shift before netrun.ops, say) resolves the same.
import netrun.ops  # noqa: F401,E402
from netrun.algos.settings import MODES, AlgoSettings, configure, parse_bytes, settings_of


def choose(*args, **kwargs):
    """See netrun.algos.search.choose (imported lazily: the ops import this package)."""
    from netrun.algos.search import choose as _choose

    return _choose(*args, **kwargs)


def compare_algorithms(*args, **kwargs):
    """See netrun.algos.search.compare_algorithms."""
    from netrun.algos.search import compare_algorithms as _compare

    return _compare(*args, **kwargs)


__all__ = ["MODES", "AlgoSettings", "configure", "settings_of", "parse_bytes", "choose",
           "compare_algorithms"]
