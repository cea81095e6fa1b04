"""What a workspace remembers about convolutions: its settings, the rules' picks, counters.

One `ConvState` per workspace (`ws.conv`), so two workspaces in a process (a CPU and a GPU
one, or two with different modes) never see each other's choices. The picks of the timing
search live in the on-disk cache instead (netrun.conv.cache), shared on purpose.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from netrun.conv.settings import DEFAULT, AlgoSettings


@dataclass
class SearchStats:
    """Counters of one workspace's algorithm selection, so tests can assert that a warm
    cache performs no search and that nothing is warmed up twice."""

    searches: int = 0      # timing searches (one per problem and direction)
    timed_runs: int = 0    # algorithm runs inside searches, warm-up runs included
    cache_hits: int = 0    # exhaustive-mode answers found in the cache
    warm_ups: int = 0      # bind-time warm-up runs on a one-image copy

    def reset(self) -> None:
        self.searches = self.timed_runs = self.cache_hits = self.warm_ups = 0


@dataclass
class ConvState:
    """A workspace's conv settings, the rules' remembered picks and selection counters."""

    settings: AlgoSettings = DEFAULT
    # Bumped by every settings change: an op's plan made under older settings is redone.
    generation: int = 0
    # (problem, direction, backend, settings, engine available) -> the rules' pick: a net's
    # bind-time memory plan asks for the same problems its first run then needs.
    picks: dict[tuple, Any] = field(default_factory=dict)
    # (algorithm, one-image problem, direction): warmed up already (netrun.conv.compare).
    warmed: set[tuple] = field(default_factory=set)
    stats: SearchStats = field(default_factory=SearchStats)

    def set_settings(self, settings: AlgoSettings) -> None:
        """New settings: conv ops re-plan the next time they run."""
        self.settings = settings
        self.generation += 1
