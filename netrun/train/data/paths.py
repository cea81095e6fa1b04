"""Where data lives: `${VAR:-default}` expansion and the data-directory search order."""
from __future__ import annotations

import os
import re
from pathlib import Path

_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")


def expand_path(text: str) -> str:
    """Expand `${VAR:-default}`, `${VAR}`, `$VAR` and a leading `~` as a POSIX shell does."""

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        value = os.environ.get(name, "")
        if m.group(2) is not None and not value:        # ':-' also replaces an empty value
            return expand_path(m.group(2))
        return value

    return os.path.expanduser(_VAR.sub(sub, str(text)))


def cache_root() -> Path:
    """~/.cache/netrun, the last place data is looked for (and downloaded to)."""
    return Path.home() / ".cache" / "netrun"


def resolve_data_dir(subdir: str, explicit: str | os.PathLike | None = None,
                     base: Path | None = None) -> tuple[Path, str]:
    """(folder, how it was chosen): explicit, else $NETRUN_DATA/<subdir>, else the cache.

    An explicit folder that does not itself hold the data but has a `<subdir>` folder is
    taken as a root, so `--data-dir` may name either `.../data` or `.../data/mnist`.
    """
    if explicit is not None and str(explicit) != "":
        path = Path(expand_path(str(explicit)))
        if not path.is_absolute() and base is not None:
            path = base / path
        if path.name != subdir and (path / subdir).is_dir():
            path = path / subdir
        return path, "given by --data-dir or data.dir"
    env = os.environ.get("NETRUN_DATA")
    if env:
        return Path(expand_path(env)) / subdir, "under $NETRUN_DATA"
    return cache_root() / subdir, "the default, as NETRUN_DATA is not set"


def checkout_data_dir() -> Path | None:
    """The `data/` folder of the source checkout netrun runs from, if it runs from one."""
    path = Path(__file__).resolve().parents[3] / "data"
    return path if (path.parent / "pyproject.toml").is_file() and path.is_dir() else None


def writable_dir(path: Path) -> bool:
    """Create `path` if needed; True when files can be written there."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)
