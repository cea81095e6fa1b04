"""The persistent convolution algorithm cache: one JSON file per device, safe for many writers.

An entry maps a key (direction, the problem's every field, and the environment: backend,
device name, thread count, NumPy and BLAS versions) to the time of every algorithm that was
measured for it. Choosing the fastest happens at lookup, so a smaller workspace limit later
still finds its answer among the stored times.

Files live in NETRUN_CACHE_DIR (default: $XDG_CACHE_HOME/netrun/algos, i.e.
~/.cache/netrun/algos). Writes take an fcntl lock on `<file>.lock`, re-read the file, merge
their entries in and replace the file atomically (temp file, fsync, rename), so concurrent
writers never lose each other's entries and a reader never sees half a file. A corrupt or
foreign-version file is ignored with a warning; the next write sets it aside as
`<file>.bad` and starts a new one. A folder that cannot be written (read-only, full) is
warned about once per file and the run goes on with the entries in memory.
"""
from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from netrun.kernels.parallel import thread_count
from netrun.util.atomic import atomic_open

FORMAT = "netrun-algo-cache"
VERSION = 1
_ENV: dict[tuple[str, str], dict[str, str]] = {}
_CACHES: dict[tuple[str, str, str], "AlgoCache"] = {}
_LOCK = threading.Lock()


class AlgoCacheWarning(UserWarning):
    """A cache file could not be used (corrupt, foreign version); it is rebuilt."""


def default_cache_dir() -> Path:
    """NETRUN_CACHE_DIR, else $XDG_CACHE_HOME/netrun/algos, else ~/.cache/netrun/algos."""
    if os.environ.get("NETRUN_CACHE_DIR"):
        return Path(os.environ["NETRUN_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "netrun" / "algos"


def _blas() -> str:
    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{info.get('name', '?')} {info.get('version', '?')}"
    except Exception:   # older NumPy: no dict mode; the NumPy version still separates builds
        return "unknown"


def environment(backend: str, device_name: str,
                libraries: dict[str, str] | None = None) -> dict[str, str]:
    """The fields of the running environment that change which algorithm is fastest;
    `libraries` adds the backend's own (CUDA, driver, CuPy and cuDNN versions on a GPU)."""
    key = (backend, device_name)
    if key not in _ENV:
        _ENV[key] = {"backend": backend, "device": device_name, "numpy": np.__version__,
                     "blas": _blas()}
    # Thread counts may be changed between runs through the environment, so never cached.
    return {**_ENV[key], **(libraries or {}), "threads": str(thread_count())}


def cache_key(direction: str, problem: Any, env: dict[str, str]) -> str:
    """A readable key naming every field of the problem, the direction and the environment."""
    p = problem
    fields = [direction, p.dtype, p.order, f"n{p.n}", f"c{p.c}", f"h{p.h}", f"w{p.w}", f"k{p.k}",
              f"kernel{p.kh}x{p.kw}", f"stride{p.sh}x{p.sw}",
              f"pads{p.pt},{p.pl},{p.pb},{p.pr}", f"dilation{p.dh}x{p.dw}", f"group{p.group}"]
    fields += [f"{k}={env[k]}" for k in sorted(env)]
    return "|".join(fields)


def cache_file(cache_dir: str | Path | None, backend: str, device_name: str) -> Path:
    """The one file that holds every entry for a device."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "unknown"
    return Path(cache_dir or default_cache_dir()).expanduser() / f"{backend}-{slug}.json"


@dataclass
class Entry:
    """Measured milliseconds per algorithm for one key, and what was left out."""

    times_ms: dict[str, float]
    skipped: list[str] = field(default_factory=list)    # over the workspace limit of the search
    limit: int | None = None                             # that limit (None: unlimited)
    created: float = 0.0

    def to_json(self) -> dict:
        return {"times_ms": self.times_ms, "skipped": self.skipped, "limit": self.limit,
                "created": self.created}

    @classmethod
    def from_json(cls, data: dict) -> "Entry":
        times = {str(k): float(v) for k, v in dict(data["times_ms"]).items()}
        if not all(math.isfinite(t) and t >= 0 for t in times.values()):
            raise ValueError("a time is negative or not finite")
        return cls(times, [str(s) for s in data.get("skipped", [])], data.get("limit"),
                   float(data.get("created", 0.0)))


class AlgoCache:
    """The entries of one cache file, loaded once and written through on every new entry."""

    def __init__(self, path: Path, backend: str, device_name: str):
        self.path = Path(path)
        self.backend, self.device_name = backend, device_name
        self.entries: dict[str, Entry] = {}
        self._loaded = False
        self._unwritable = False   # warned once: later entries stay in memory only

    def load(self) -> None:
        """Read the file (once); a bad file is reported and treated as empty."""
        if not self._loaded:
            self.entries = _read(self.path, warn=True)
            self._loaded = True

    def get(self, key: str) -> Entry | None:
        self.load()
        return self.entries.get(key)

    def put(self, key: str, entry: Entry, persist: bool = True) -> None:
        """Remember an entry; with `persist`, merge it into the file under the lock."""
        self.load()
        self.entries[key] = entry
        if persist:
            self.flush({key: entry})

    def flush(self, new: dict[str, Entry]) -> None:
        """Merge `new` into the file: lock, re-read, update, write a temp file, rename. A
        file that cannot be written is warned about (once) and the entries kept in memory."""
        if self._unwritable:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _file_lock(self.path):
                merged, usable = _read_checked(self.path)
                if not usable:   # keep the bad file for a look, out of the way
                    os.replace(self.path, self.path.with_name(self.path.name + ".bad"))
                merged.update(new)
                _write(self.path, merged, self.backend, self.device_name)
        except OSError as e:
            self._unwritable = True
            warnings.warn(f"cannot write the algorithm cache {self.path} "
                          f"({e.strerror or e}); this run keeps its measurements in memory "
                          f"only (set NETRUN_CACHE_DIR to a writable folder to keep them)",
                          AlgoCacheWarning, stacklevel=3)
            return
        self.entries = {**merged, **self.entries}


def get_cache(cache_dir: str | Path | None, backend: str, device_name: str) -> AlgoCache:
    """The process-wide cache object of one file (shared by every workspace using it)."""
    path = cache_file(cache_dir, backend, device_name)
    key = (str(path), backend, device_name)
    with _LOCK:
        if key not in _CACHES:
            _CACHES[key] = AlgoCache(path, backend, device_name)
        return _CACHES[key]


def forget_loaded() -> None:
    """Drop the in-memory copies (tests; `algos clear`): the next lookup reads the disk."""
    with _LOCK:
        _CACHES.clear()


def list_files(cache_dir: str | Path | None = None) -> list[Path]:
    """Every cache file in the folder, sorted."""
    folder = Path(cache_dir or default_cache_dir()).expanduser()
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def read_file(path: str | Path) -> tuple[dict[str, Any], dict[str, Entry]]:
    """(header, entries) of a cache file; a bad file reads as empty, with a warning."""
    path = Path(path)
    header: dict[str, Any] = {}
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
        header = {k: raw.get(k) for k in ("format", "version", "backend", "device")}
    except (OSError, ValueError, AttributeError, RecursionError):
        pass
    return header, _read(path, warn=True)


def clear(cache_dir: str | Path | None = None) -> list[Path]:
    """Delete every cache file in the folder (lock files stay: a writer may hold one)."""
    removed = []
    for path in list_files(cache_dir):
        with _file_lock(path):
            path.unlink(missing_ok=True)
        removed.append(path)
    forget_loaded()
    return removed


# Files --------------------------------------------------------------------------------------
def _read(path: Path, warn: bool) -> dict[str, Entry]:
    entries, _ = _read_checked(path, warn)
    return entries


def _read_checked(path: Path, warn: bool = False) -> tuple[dict[str, Entry], bool]:
    """(entries, whether the file is usable); a missing file is usable and empty."""
    try:
        data_bytes = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return {}, True
    except OSError as e:
        _warn(path, f"cannot be read ({e})", warn)
        return {}, True   # unreadable is not corrupt: leave it where it is
    try:
        data = json.loads(data_bytes.decode("utf-8"))
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("it is not a netrun algorithm cache")
        if data.get("version") != VERSION:
            raise ValueError(f"it has format version {data.get('version')!r}, this netrun "
                             f"reads version {VERSION}")
        return {str(k): Entry.from_json(v) for k, v in dict(data["entries"]).items()}, True
    # UnicodeDecodeError is a ValueError; deep nesting makes json raise RecursionError.
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError,
            RecursionError) as e:
        _warn(path, f"is unusable ({e})", warn)
        return {}, False


def _warn(path: Path, why: str, warn: bool) -> None:
    if warn:
        warnings.warn(f"ignoring the algorithm cache {path}: it {why}; it will be rebuilt",
                      AlgoCacheWarning, stacklevel=3)


def _write(path: Path, entries: dict[str, Entry], backend: str, device_name: str) -> None:
    data = {"format": FORMAT, "version": VERSION, "backend": backend, "device": device_name,
            "written": time.time(),
            "entries": {k: entries[k].to_json() for k in sorted(entries)}}
    with atomic_open(path, "w") as f:
        json.dump(data, f, indent=1)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `<path>.lock` (fcntl; a no-op where fcntl does not exist)."""
    try:
        import fcntl  # POSIX only
    except ImportError:   # Windows: atomic rename still protects readers
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
