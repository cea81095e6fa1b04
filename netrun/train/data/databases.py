"""Caffe's key-value databases, LMDB and LevelDB: find which a folder holds, read it, write
one atomically.

The backend is always told from the files (an LMDB folder holds data.mdb, a LevelDB folder
CURRENT and MANIFEST-*), never from a config field: Caffe's `backend` defaults to LEVELDB
while its tools write LMDB, so the field is often wrong.

A DatabaseReader pickles as (path, backend) and opens its handle on first use in whichever
process uses it, so worker processes can read the same database; readers of one folder in a
process share a handle (database_handles.py).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from netrun.errors import ConfigError, DataError
from netrun.train.data.database_handles import HANDLES, OPS
from netrun.train.data.extras import optional_module
from netrun.util.atomic import temp_path_beside

BACKENDS = ("lmdb", "leveldb")
_LMDB_MAP_START = 64 << 20          # the writer's first map size; it doubles when full
_WRITE_BATCH = 1000                 # records per write transaction


def detect_backend(path: str | os.PathLike) -> str:
    """"lmdb" or "leveldb", from the files in the folder `path`; DataError otherwise."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such database folder")
    if not path.is_dir():
        raise DataError(f"{path} is a file, not a database folder (an LMDB folder holds "
                        f"data.mdb; a LevelDB folder holds CURRENT and MANIFEST-* files)")
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        raise DataError(f"{path}: cannot list the database folder ({e.strerror})") from None
    if "data.mdb" in names:
        return "lmdb"
    if "CURRENT" in names and any(n.startswith("MANIFEST-") for n in names):
        return "leveldb"
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    raise DataError(f"{path}: not an LMDB (no data.mdb) or LevelDB (no CURRENT and "
                    f"MANIFEST-*) database; the folder holds {shown or 'nothing'}")


def _check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ConfigError(f"unknown database backend '{backend}' (lmdb or leveldb)")
    return backend


# Reading -----------------------------------------------------------------------------------
class DatabaseReader:
    """Records of an LMDB or LevelDB folder by key, in key order; pickles as (path, backend)
    and opens lazily in the process that reads."""

    def __init__(self, path: str | os.PathLike, backend: str | None = None):
        self.path = Path(path)
        found = detect_backend(self.path)
        if backend is not None and _check_backend(backend) != found:
            raise DataError(f"{self.path} is a{'n LMDB' if found == 'lmdb' else ' LevelDB'} "
                            f"database, not {backend}")
        self.backend = found
        self._handle: Any = None
        self._release: Any = None
        self._count: int | None = None

    def __getstate__(self) -> dict:
        return {"path": str(self.path), "backend": self.backend}

    def __setstate__(self, state: dict) -> None:
        self.path, self.backend = Path(state["path"]), state["backend"]
        self._handle = self._release = self._count = None

    def _db(self) -> Any:
        if self._handle is None:
            handle, key = HANDLES.acquire(self.path, self.backend)
            self._handle = handle
            self._release = weakref.finalize(self, HANDLES.release, key)
        return self._handle

    def _guard(self, what: str):
        return _Guard(self, what)

    def __len__(self) -> int:
        if self._count is None:
            with self._guard("count the records"):
                self._count = OPS[self.backend].count(self._db())
        return self._count

    def scan(self, parse: Callable[[memoryview], Any] = bytes) -> Iterator[tuple[bytes, Any]]:
        """(key, parse(value)) for every record in key order; the value is a view that is
        valid only during the call of `parse` (no copy of records parse does not need)."""
        with self._guard("read the records"):
            yield from OPS[self.backend].scan(self._db(), parse)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) for every record, in key order."""
        return self.scan(bytes)

    def keys(self) -> list[bytes]:
        """Every key, in key order."""
        return [key for key, _ in self.scan(_nothing)]

    def first(self) -> tuple[bytes, bytes] | None:
        """The first record in key order, or None for an empty database."""
        with contextlib.closing(self.scan(bytes)) as records:
            return next(records, None)

    def get(self, key: bytes) -> bytes:
        """The value stored under `key`; DataError if there is none."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[bytes], parse: Callable[[memoryview], Any] = bytes
                 ) -> list:
        """parse(value) for each of `keys` (one read transaction for all)."""
        with self._guard("read records"):
            values = OPS[self.backend].read(self._db(), keys, parse)
        for key, value in zip(keys, values):
            if value is None:
                raise DataError(f"{self.path}: no record with key {key!r} (was the database "
                                f"changed while in use?)")
        return values

    def close(self) -> None:
        """Give up this reader's handle (the reader reopens if used again)."""
        if self._release is not None:
            self._release()
        self._handle = self._release = None

    def __enter__(self) -> DatabaseReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<DatabaseReader {self.backend} {self.path}>"


def _nothing(_: memoryview) -> None:
    return None


class _Guard:
    """Turns the library's errors for a damaged database into DataError naming the folder."""

    def __init__(self, reader: DatabaseReader, what: str):
        self.reader, self.what = reader, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> bool:
        if error is not None and isinstance(error, OPS[self.reader.backend].errors()):
            raise DataError(f"{self.reader.path}: cannot {self.what} of the "
                            f"{self.reader.backend} database ({error})") from None
        return False


def open_database(path: str | os.PathLike, backend: str | None = None) -> DatabaseReader:
    """A reader of the database folder `path` (backend detected from its files)."""
    return DatabaseReader(path, backend)


# Writing -----------------------------------------------------------------------------------
class DatabaseWriter:
    """Writes a new database folder: records go to a temporary folder beside `path`, renamed
    into place when the `with` block ends cleanly; an error leaves no database behind.

    An existing `path` is refused unless `overwrite`, and even then only if it is a
    database (a folder of other files is never removed)."""

    def __init__(self, path: str | os.PathLike, backend: str = "lmdb", overwrite: bool = False):
        self.path, self.backend = Path(path), _check_backend(backend)
        self.overwrite, self.count = bool(overwrite), 0
        self._check_target()
        self._tmp: Path | None = None
        self._handle: Any = None
        self._pending: list[tuple[bytes, bytes]] = []

    def _check_target(self) -> None:
        if not (self.path.exists() or self.path.is_symlink()):
            return
        if not self.overwrite:
            raise DataError(f"{self.path} already exists; remove it, choose another name, or "
                            f"overwrite it")
        detect_backend(self.path)           # only a database is replaced

    def __enter__(self) -> DatabaseWriter:
        self._start()
        return self

    def _start(self) -> None:
        if self._tmp is not None:
            return
        if not self.path.parent.is_dir():
            raise DataError(f"{self.path}: the folder {self.path.parent} does not exist")
        library = optional_module("lmdb" if self.backend == "lmdb" else "plyvel")
        self._tmp = temp_path_beside(self.path)
        self._tmp.mkdir()
        try:
            if self.backend == "lmdb":
                # No fsync per transaction: commit() syncs every file once, before the rename.
                self._handle = library.open(str(self._tmp), map_size=_LMDB_MAP_START,
                                            subdir=True, sync=False, metasync=False)
            else:
                self._handle = library.DB(str(self._tmp), create_if_missing=True,
                                          error_if_exists=True)
        except BaseException:
            self.abort()
            raise

    def put(self, key: bytes, value: bytes) -> None:
        """Store `value` under `key` (a later put of the same key replaces it)."""
        if not isinstance(key, bytes) or not key:
            raise TypeError(f"database keys are non-empty bytes, got {key!r}")
        self._start()
        self._pending.append((key, bytes(value)))
        self.count += 1
        if len(self._pending) >= _WRITE_BATCH:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self.backend == "lmdb":
            self._flush_lmdb()
        else:
            with self._handle.write_batch() as batch:
                for key, value in self._pending:
                    batch.put(key, value)
        self._pending.clear()

    def _flush_lmdb(self) -> None:
        lmdb = optional_module("lmdb")
        while True:
            try:
                with self._handle.begin(write=True) as txn:
                    for key, value in self._pending:
                        txn.put(key, value)
                return
            except lmdb.MapFullError:          # the transaction is aborted: grow and redo it
                self._handle.set_mapsize(self._handle.info()["map_size"] * 2)

    def commit(self) -> None:
        """Write what is pending, close, and move the database into place."""
        self._start()
        self._flush()
        self._close_handle()
        _sync_files(self._tmp)
        self._check_target()
        old = None
        if self.path.exists():
            old = temp_path_beside(self.path)
            os.replace(self.path, old)
        os.replace(self._tmp, self.path)
        self._tmp = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        _sync_folder(self.path.parent)

    def abort(self) -> None:
        """Drop everything written (the target is left as it was)."""
        self._pending.clear()
        self._close_handle()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _close_handle(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            handle.close()

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        if kind is None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()


def _sync_files(folder: Path) -> None:
    """fsync every file of a finished database, so the rename publishes complete data."""
    for entry in os.scandir(folder):
        if entry.is_file():
            with open(entry.path, "rb") as f:
                os.fsync(f.fileno())
    _sync_folder(folder)


def _sync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (not every platform can fsync a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
