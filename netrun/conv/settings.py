"""Per-workspace algorithm-selection settings: the mode, the workspace limit, the cache folder.

Settings are explicit objects held by the workspace's conv state (`ws.conv.settings`, see
netrun.conv.state), never module globals; conv kernels read them through `ctx.ws`. A workspace that was never configured gets
the defaults: heuristic choice, no timing, nothing written to disk.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from netrun.errors import ConfigError, suggest

# heuristic: rules, no timing. exhaustive: time every applicable algorithm once per problem,
# keep the fastest (persisted). deterministic: rules restricted to deterministic algorithms,
# so the choice (and the bits) never depend on timing noise or on the cache.
MODES = ("heuristic", "exhaustive", "deterministic")
DEFAULT_WORKSPACE_LIMIT = 1 << 30   # bytes of scratch an algorithm may use (cuDNN's limit)


@dataclass(frozen=True)
class AlgoSettings:
    """How conv ops pick algorithms on one workspace."""

    mode: str = "heuristic"
    workspace_limit: int | None = DEFAULT_WORKSPACE_LIMIT   # None: unlimited
    cache_dir: str | None = None    # None: NETRUN_CACHE_DIR, else ~/.cache/netrun/algos
    persist: bool = True            # exhaustive results go to (and come from) the disk cache
    tf32: bool = False              # float32 convolutions may run in TF32 (GPU tensor cores)

    def allows(self, workspace_bytes: int) -> bool:
        """Whether an algorithm needing this much scratch fits under the limit."""
        return self.workspace_limit is None or workspace_bytes <= self.workspace_limit


DEFAULT = AlgoSettings()


def configure(ws: Any, mode: str | None = None, workspace_limit: int | None | str = "keep",
              cache_dir: str | None | object = "keep", persist: bool | None = None,
              tf32: bool | None = None) -> AlgoSettings:
    """Set the algorithm settings of workspace `ws` (unnamed fields keep their value).

    `workspace_limit` is in bytes (None: unlimited). Conv ops re-pick their algorithms the
    next time they run. Raises ConfigError for an unknown mode or a negative limit.
    """
    current = settings_of(ws)
    changes: dict[str, Any] = {}
    if mode is not None:
        if mode not in MODES:
            raise ConfigError(f"unknown algorithm mode '{mode}'{suggest(mode, MODES)} "
                              f"(known: {', '.join(MODES)})")
        changes["mode"] = mode
    if workspace_limit != "keep":
        if workspace_limit is not None and int(workspace_limit) < 0:
            raise ConfigError(f"workspace limit must not be negative, got {workspace_limit}")
        changes["workspace_limit"] = None if workspace_limit is None else int(workspace_limit)
    if cache_dir != "keep":
        changes["cache_dir"] = None if cache_dir is None else str(cache_dir)
    if persist is not None:
        changes["persist"] = bool(persist)
    if tf32 is not None:
        changes["tf32"] = bool(tf32)
    settings = replace(current, **changes)
    ws.conv.set_settings(settings)
    return settings


def settings_of(ws: Any) -> AlgoSettings:
    """The workspace's settings (the defaults if it was never configured)."""
    return ws.conv.settings if ws is not None else DEFAULT


def parse_bytes(text: str | int | None) -> int | None:
    """'512M', '2GiB', '1048576' or None/'none'/'unlimited' -> bytes (for CLI options)."""
    if text is None or isinstance(text, int):
        return text
    value = str(text).strip().lower()
    if value in ("", "none", "unlimited", "inf"):
        return None
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?", value)
    if match is None:
        raise ConfigError(f"cannot read '{text}' as a size (examples: 512M, 2G, 1048576)")
    scale = 1 << (10 * " kmgt".index(match.group(2) or " "))
    return int(float(match.group(1)) * scale)
