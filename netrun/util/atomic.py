"""Atomic file writes: a temporary file beside the target, fsynced, then renamed over it.

A reader sees the old file or the new one, never half of one, whatever kills the writer and
when. Checkpoints, NetDef files and the algorithm cache all write through here.
"""
from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import IO, Iterator


def temp_path_beside(path: str | os.PathLike) -> Path:
    """A fresh temporary name in the target's folder (the rename must not cross filesystems).

    Unique per call, so an interrupted write's leftover never blocks the next one and
    concurrent writers never share a file. Hidden (leading dot) so globs skip it. The pid in
    the name lets the next run in a folder remove what a killed writer left, and only that
    (netrun.train.run_folder.remove_stale_temps matches `.NAME.tmp-PID-HEX8`).
    """
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def publish(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """fsync `tmp`, rename it over `path`, then fsync the folder so the rename is durable."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):   # not every platform can fsync a directory
        fd = os.open(Path(path).parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def discard(tmp: str | os.PathLike) -> None:
    """Remove a temporary file that will not be published (no error if it is gone)."""
    with contextlib.suppress(OSError):
        Path(tmp).unlink()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """`with atomic_path(p) as tmp:` write tmp by any means; on success it replaces p.

    On any exception (Ctrl-C included) the temporary file is removed and p is untouched.
    The folder must exist (OSError otherwise): callers decide whether to create it.
    """
    tmp = temp_path_beside(path)
    try:
        yield tmp
        publish(tmp, path)
    except BaseException:
        discard(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """`with atomic_open(p) as f:` an open file whose contents replace p on success."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **kwargs) as f:
            yield f


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace the file's contents with `text` (UTF-8, "\\n" line ends) atomically."""
    with atomic_open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
