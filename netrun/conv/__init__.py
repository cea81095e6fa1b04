"""Convolution: the problem, algorithms per backend, one `choose`, the cache, the settings.

Importing this package registers both algorithm sets, each under its backend's name: CPU
(`netrun.conv.cpu`) and GPU (`netrun.conv.gpu`, CUDA sources as text, no CuPy imported).
`configure(ws, mode=..., workspace_limit=..., cache_dir=...)` sets how the conv ops of a
workspace pick algorithms (heuristic, exhaustive timing search with a persistent cache, or
deterministic); `compare_algorithms` times every applicable algorithm for a problem.
"""
from __future__ import annotations

from netrun.conv import cpu, gpu  # noqa: F401  (each registers its backend's algorithms)
from netrun.conv.compare import compare_algorithms, op_directions, warm_up
from netrun.conv.plan import ConvPlan
from netrun.conv.problem import DIRECTIONS, ConvProblem
from netrun.conv.select import choose
from netrun.conv.settings import MODES, AlgoSettings, configure, parse_bytes, settings_of
from netrun.conv.state import ConvState

__all__ = ["MODES", "DIRECTIONS", "AlgoSettings", "ConvPlan", "ConvProblem", "ConvState",
           "configure", "settings_of", "parse_bytes", "choose", "compare_algorithms",
           "op_directions", "warm_up"]
