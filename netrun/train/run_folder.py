"""Run folders: one run's checkpoints per folder, and no leftovers from killed runs.

A run folder holds `last.h5`, `best.h5`, `iter_<N>.h5` and `metrics.jsonl`. A new run may
not silently mix its checkpoints with another run's: it resumes (`--resume auto`), starts
over (`--force` deletes the old checkpoints) or goes to another folder. Temporary files that
a killed writer left behind (`.NAME.tmp-PID[-HEX]`, see netrun.util.atomic) are removed at
the next start, but only when their writer is gone.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from netrun.errors import NetrunError

LAST, BEST = "last.h5", "best.h5"
_ITER = re.compile(r"iter_(\d+)\.h5")
# Temporary names of netrun.util.atomic.temp_path_beside and checkpoint.link_or_copy.
_TEMP = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)(?:-[0-9a-f]{8})?")


class RunFolderError(NetrunError):
    """A run folder that a new run would mix with another run's checkpoints."""


def checkpoints(folder: str | os.PathLike) -> list[Path]:
    """The checkpoint files of the folder (last.h5, best.h5, iter_<N>.h5), sorted by name."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir()
                  if p.name in (LAST, BEST) or _ITER.fullmatch(p.name))


def newest(folder: str | os.PathLike) -> Path | None:
    """The checkpoint `--resume auto` continues from: last.h5, else the highest iter_<N>.h5.

    A kill between writing iter_<N>.h5 and linking last.h5 to it leaves only the former.
    """
    folder = Path(folder)
    if (folder / LAST).exists():
        return folder / LAST
    numbered = [(int(m.group(1)), p) for p in checkpoints(folder)
                if (m := _ITER.fullmatch(p.name))]
    return max(numbered)[1] if numbered else None


def check_new_run(folder: str | os.PathLike, resume: str | None, auto: bool = False) -> None:
    """Refuse a run that would overwrite or mix with the checkpoints already in `folder`.

    Resuming from a checkpoint inside the folder continues that run and is allowed. `auto`:
    `--resume auto` was asked for (and found nothing to resume from when resume is None).
    """
    folder = Path(folder)
    found = checkpoints(folder)
    if not found:
        return
    if resume is not None and _inside(Path(resume), folder):
        return
    names = ", ".join(p.name for p in found[:4]) + (", ..." if len(found) > 4 else "")
    force = ("start over with `--force` (deletes its last.h5, best.h5 and iter_<N>.h5; "
             "metrics.jsonl is kept and marks the new run's start)")
    if resume is None and auto:
        raise RunFolderError(
            f"{folder} holds {names} of an earlier run but no last.h5 or iter_<N>.h5 to "
            f"resume from: {force}, or write to another folder with `-o`.")
    start = (f"resuming from {resume} would continue another run in" if resume else
             "a new run would overwrite the checkpoints of the run in")
    raise RunFolderError(
        f"{start} {folder} (it holds {names}). Either continue that run with "
        f"`--resume auto`, {force}, or write to another folder with `-o`.")


def clear(folder: str | os.PathLike) -> list[Path]:
    """Delete the folder's checkpoints (for --force); returns what was deleted."""
    found = checkpoints(folder)
    for p in found:
        p.unlink(missing_ok=True)
    return found


def remove_stale_temps(folder: str | os.PathLike) -> list[Path]:
    """Remove temporary files whose writer is gone; returns what was removed.

    A writer is gone when its pid is dead, or when the process now holding that pid started
    after the file was last written (the pid was reused). A live writer's files stay.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for p in folder.iterdir():
        m = _TEMP.fullmatch(p.name)
        if m is None or not p.is_file() or p.is_symlink():
            continue
        try:
            written = p.stat().st_mtime
        except OSError:
            continue                       # gone already (its writer renamed it)
        if _writer_alive(int(m.group("pid")), written):
            continue
        try:
            p.unlink()
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def _writer_alive(pid: int, written: float) -> bool:
    if pid == os.getpid():
        started = _process_start(pid)
        # Our own pid: a leftover of an earlier process with the same pid, unless this
        # process may have written it (we call this before writing anything, but be sure).
        return started is None or written >= started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass                               # alive, someone else's
    except OSError:
        return True
    started = _process_start(pid)
    return started is None or written >= started


def _process_start(pid: int) -> float | None:
    """When the process started (seconds since the epoch) on Linux; None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])     # field 22: starttime
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    return None


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().parent == folder.resolve()
    except OSError:
        return False
