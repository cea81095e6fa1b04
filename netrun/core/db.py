"""The DB interface behind Save/Load (Caffe2's DB), with one implementation: HDF5.

A writer is a transaction: everything goes to a temporary file next to the target, which
is fsynced and renamed over the target only on commit, so a crash or a kill at any point
leaves the previous file intact. Every dataset carries a CRC32 that readers verify.
"""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from netrun.errors import CheckpointError, suggest
from netrun.util.atomic import discard, publish, temp_path_beside

FORMAT_VERSION = 1
_COMPLETE = "netrun_complete"


def _crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).view(np.uint8).reshape(-1).data) & 0xFFFFFFFF


class H5Writer:
    """Writes named arrays and JSON/text metadata; nothing is visible until commit()."""

    def __init__(self, path: str | os.PathLike):
        import h5py  # lazy: a heavy import that only HDF5 paths need

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = temp_path_beside(self.path)
        self._f = None
        try:
            self._f = h5py.File(self.tmp, "w")
            self._f.attrs["format_version"] = FORMAT_VERSION
        except BaseException:   # Ctrl-C included: leave no open handle and no temp file
            self.abort()
            raise

    def put(self, key: str, array: Any) -> None:
        """Store an array under a slash-separated key such as 'params/conv1_w'."""
        array = np.asarray(array)
        ds = self._f.create_dataset(key, data=array)
        ds.attrs["crc32"] = _crc(array)

    def put_text(self, key: str, text: str) -> None:
        self._f.create_dataset(key, data=np.frombuffer(text.encode(), dtype=np.uint8))
        self._f[key].attrs["crc32"] = zlib.crc32(text.encode()) & 0xFFFFFFFF
        self._f[key].attrs["text"] = 1

    def put_json(self, key: str, value: Any) -> None:
        self.put_text(key, json.dumps(value, sort_keys=True))

    def set_attr(self, name: str, value: Any) -> None:
        self._f.attrs[name] = value

    def commit(self) -> None:
        """Mark complete, flush, fsync and atomically replace the target file."""
        try:
            self._f.attrs[_COMPLETE] = 1
            self._f.flush()
            self._f.close()
            publish(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        try:
            if self._f is not None:
                self._f.close()
        finally:
            discard(self.tmp)

    def __enter__(self) -> "H5Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class H5Reader:
    """Reads what an H5Writer committed; any damage is a CheckpointError naming the file."""

    def __init__(self, path: str | os.PathLike):
        import h5py  # lazy: a heavy import that only HDF5 paths need

        self.path = Path(path)
        if not self.path.exists():
            raise CheckpointError(f"checkpoint '{self.path}' does not exist")
        try:
            self._f = h5py.File(self.path, "r")
        except OSError as e:
            raise CheckpointError(f"checkpoint '{self.path}' is not a readable HDF5 file "
                                  f"(truncated or corrupt?): {e}") from None
        if int(self._f.attrs.get(_COMPLETE, 0)) != 1:
            self.close()
            raise CheckpointError(f"checkpoint '{self.path}' is incomplete (its write never finished)")
        version = int(self._f.attrs.get("format_version", -1))
        if version != FORMAT_VERSION:
            self.close()
            raise CheckpointError(f"checkpoint '{self.path}' has format version {version}; "
                                  f"this netrun reads version {FORMAT_VERSION}")

    def keys(self, group: str) -> list[str]:
        """Names stored directly under a group ('' for the root)."""
        node = self._f[group] if group else self._f
        return sorted(node.keys()) if group in self._f or not group else []

    def has(self, key: str) -> bool:
        return key in self._f

    def get(self, key: str) -> np.ndarray:
        try:
            ds = self._f[key]
            value = ds[()]
        except KeyError:
            raise CheckpointError(f"checkpoint '{self.path}' has no entry '{key}'") from None
        except OSError as e:
            raise CheckpointError(f"checkpoint '{self.path}': entry '{key}' cannot be read "
                                  f"(corrupt?): {e}") from None
        value = np.asarray(value)
        if "crc32" in ds.attrs and _crc(value) != int(ds.attrs["crc32"]):
            raise CheckpointError(f"checkpoint '{self.path}': entry '{key}' fails its checksum "
                                  f"(the file is corrupt)")
        return value

    def get_text(self, key: str) -> str:
        return self.get(key).tobytes().decode()

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_text(key))

    def attr(self, name: str, default: Any = None) -> Any:
        return self._f.attrs.get(name, default)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "H5Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


DB_TYPES = {"h5": (H5Writer, H5Reader)}


def open_db(path: str | os.PathLike, mode: str, db_type: str = "h5"):
    """A writer (mode 'w') or reader (mode 'r') of the given db_type."""
    if db_type not in DB_TYPES:
        raise CheckpointError(f"unknown db_type '{db_type}'{suggest(db_type, DB_TYPES)}")
    writer, reader = DB_TYPES[db_type]
    return writer(path) if mode == "w" else reader(path)
