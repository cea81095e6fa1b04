"""Open LMDB and LevelDB handles for reading: the few operations the reader needs from each
library, and this process's shared handles.

Both libraries refuse a second open of one database in a process (LevelDB's lock, py-lmdb's
own check), so readers of one folder share a handle, counted and closed with the last reader.
A forked child keeps the parent's handles: it could not open the folders again. LMDB opens
read-only without its lock file (datasets are not written while read, folders may be
read-only), which also makes an inherited handle safe to read from.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from netrun.errors import DataError
from netrun.train.data.extras import optional_module


class LmdbOps:
    """LMDB operations on an open, read-only environment."""

    @staticmethod
    def open(path: Path) -> Any:
        """The environment of the folder `path`, read-only."""
        lmdb = optional_module("lmdb")
        try:
            # readahead off: training reads records in random order.
            return lmdb.open(str(path), readonly=True, lock=False, readahead=False,
                             subdir=True, max_dbs=0)
        except lmdb.Error as e:
            raise DataError(f"{path}: cannot open the LMDB ({e})") from None

    @staticmethod
    def close(env: Any) -> None:
        """Close the environment."""
        env.close()

    @staticmethod
    def count(env: Any) -> int:
        """Number of records."""
        return int(env.stat()["entries"])

    @staticmethod
    def scan(env: Any, parse: Callable[[memoryview], Any]) -> Iterator[tuple[bytes, Any]]:
        """(key, parse(value)) in key order, parsed inside the read transaction (outside
        it the views into the map are invalid)."""
        with env.begin(buffers=True) as txn:
            for key, value in txn.cursor():
                yield bytes(key), parse(value)

    @staticmethod
    def read(env: Any, keys: Sequence[bytes], parse: Callable[[memoryview], Any]) -> list:
        """parse(value) for each key (None where there is none), in one transaction."""
        out = []
        with env.begin(buffers=True) as txn:
            for key in keys:
                value = txn.get(key)
                out.append(None if value is None else parse(value))
        return out

    @staticmethod
    def errors() -> tuple[type[BaseException], ...]:
        """What the library raises for a damaged or unreadable database."""
        return (optional_module("lmdb").Error,)


class LevelDbOps:
    """LevelDB operations on an open plyvel.DB."""

    @staticmethod
    def open(path: Path) -> Any:
        """The database of the folder `path` (LevelDB takes its lock)."""
        plyvel = optional_module("plyvel")
        try:
            return plyvel.DB(str(path), create_if_missing=False)
        except plyvel.Error as e:
            text = e.args[0].decode(errors="replace") if e.args and isinstance(
                e.args[0], bytes) else str(e)
            if "lock" in text.lower():
                raise DataError(f"{path}: the LevelDB is open in another process (LevelDB "
                                f"allows one at a time); read it with data.workers: 0 or 1, "
                                f"or convert it to LMDB") from None
            raise DataError(f"{path}: cannot open the LevelDB ({text})") from None

    @staticmethod
    def close(db: Any) -> None:
        """Close the database (and release its lock)."""
        db.close()

    @staticmethod
    def count(db: Any) -> int:
        """Number of records (LevelDB keeps no count: a walk over the keys)."""
        return sum(1 for _ in db.iterator(include_value=False))

    @staticmethod
    def scan(db: Any, parse: Callable[[memoryview], Any]) -> Iterator[tuple[bytes, Any]]:
        """(key, parse(value)) in key order."""
        for key, value in db.iterator():
            yield key, parse(memoryview(value))

    @staticmethod
    def read(db: Any, keys: Sequence[bytes], parse: Callable[[memoryview], Any]) -> list:
        """parse(value) for each key (None where there is none)."""
        values = [db.get(key) for key in keys]
        return [None if v is None else parse(memoryview(v)) for v in values]

    @staticmethod
    def errors() -> tuple[type[BaseException], ...]:
        """What the library raises for a damaged or unreadable database."""
        return (optional_module("plyvel").Error,)


OPS = {"lmdb": LmdbOps, "leveldb": LevelDbOps}


class SharedHandles:
    """This process's open database handles by folder, with how many readers use each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple, list] = {}      # (folder, inode, backend) -> [handle, users]

    def acquire(self, path: Path, backend: str) -> tuple[Any, tuple]:
        """The handle of `path` (opened if no reader holds it) and the key to release it."""
        try:
            inode = os.stat(path).st_ino
        except OSError as e:
            raise DataError(f"{path}: cannot open the database ({e.strerror})") from None
        # The folder's inode tells a database replaced by a new one (renamed into place by
        # DatabaseWriter) from the one a reader still holds.
        key = (os.path.realpath(path), inode, backend)
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                entry = self._open[key] = [OPS[backend].open(path), 0]
            entry[1] += 1
            return entry[0], key

    def release(self, key: tuple) -> None:
        """One reader less; the last one closes the handle."""
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                del self._open[key]
                OPS[key[-1]].close(entry[0])

    def after_fork(self) -> None:
        """A forked child keeps the parent's handles (a new open of the same folder would be
        refused) but not a lock some other thread held at the fork."""
        self._lock = threading.Lock()


HANDLES = SharedHandles()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=HANDLES.after_fork)
