"""The memory budget: planned tensors are refused before they are allocated, not after.

A net's planned bytes (its parameters when the init net runs, its outputs when it is bound)
are Python-int sums of Python-int shape products, so a size that would overflow int64 never
reaches NumPy. The budget is NETRUN_MEMORY_LIMIT when set ("16G", "512M", "1.5GiB", a byte
count, or "off" for none); otherwise the memory available right now: MemAvailable from
/proc/meminfo (os.sysconf elsewhere), or what the cgroup (container) leaves, whichever is
less. Each plan is checked against the budget as it stands when the plan is made, so memory
earlier plans took (faulted in at bind) counts against later ones.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from netrun.errors import ConfigError, MemoryLimitError

ENV = "NETRUN_MEMORY_LIMIT"
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """'16G' -> bytes; 'off', 'none' or 'unlimited' -> None (no budget)."""
    if text.strip().lower() in ("off", "none", "unlimited"):
        return None
    m = _SIZE.match(text)
    if m is None:
        raise ConfigError(f"{ENV}={text!r}: expected a size such as 16G, 512M or 1.5GiB, "
                          f"or 'off'")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def human(nbytes: int) -> str:
    """1536 -> '1.5 KiB' (binary units, as the budget is written)."""
    size = float(nbytes)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if size < 1024 or unit == "EiB":
            return f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{nbytes} bytes"


def available_memory() -> int | None:
    """Bytes this process could still get: MemAvailable, capped by a cgroup limit."""
    candidates = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                candidates.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    if not candidates:
        try:
            candidates.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    try:   # cgroup v2: what the container may still use
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            candidates.append(max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return min(candidates) if candidates else None


def budget() -> tuple[int | None, str]:
    """(bytes allowed, where that number comes from); None: no limit."""
    text = os.environ.get(ENV)
    if text:
        return parse_size(text), f"{ENV}={text}"
    return available_memory(), "the memory available now"


def check(nbytes: int, what: str) -> None:
    """Refuse `nbytes` of planned tensors for `what` if over the budget."""
    allowed, source = budget()
    if allowed is None or nbytes <= allowed:
        return
    raise MemoryLimitError(
        f"{what} needs {human(nbytes)} ({nbytes:,} bytes), more than {human(allowed)} "
        f"({source}); make the model or batch smaller, or set {ENV} to a larger size "
        f"(e.g. {ENV}={-(-nbytes // (1 << 30)) + 1}G) or to 'off' to allow it")
