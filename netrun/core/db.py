"""The DB interface behind Save/Load (Caffe2's DB), with one implementation: HDF5.

A writer is a transaction: everything goes to a temporary file next to the target, which
is fsynced and renamed over the target only on commit, so a crash or a kill at any point
leaves the previous file intact. Every dataset carries a CRC32 of its bytes and its dtype
(files from before the dtype was recorded still load), which readers verify.

The reader trusts nothing in the file: before reading any data it walks every link and
refuses what the writer never makes (soft and external links, virtual or external-storage
datasets, chunked or compressed layouts, non-numeric dtypes, datasets without a CRC or
larger than the file), so a crafted file can neither reach other files nor make a reader
allocate more than the file holds. Damage of any kind is a CheckpointError naming the file.
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
        # The CRC covers the bytes only; a damaged datatype message could make the same bytes
        # read as another type (float32 as uint32), so the type is recorded beside it.
        ds.attrs["dtype"] = np.bytes_(array.dtype.str)

    def put_text(self, key: str, text: str) -> None:
        self._f.create_dataset(key, data=np.frombuffer(text.encode(), dtype=np.uint8))
        self._f[key].attrs["crc32"] = zlib.crc32(text.encode()) & 0xFFFFFFFF
        self._f[key].attrs["dtype"] = np.bytes_(np.dtype(np.uint8).str)
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


# What h5py raises while reading a damaged file: every one of these means "corrupt file".
DAMAGE = (OSError, KeyError, ValueError, TypeError, RuntimeError, AttributeError, IndexError,
          OverflowError, RecursionError)
_MAX_DEPTH = 8             # netrun writes group/name; Caffe's HDF5 form data/<layer>/<i>
_MAX_ENTRIES = 1_000_000   # bounds the walk of a hostile file with a huge link table


def _layouts():
    from h5py import h5d  # lazy: a heavy import that only HDF5 paths need

    # Compact data lives in the object header, contiguous data in one extent of the file;
    # chunked (filters, fill-value bombs), virtual and external layouts are never written.
    return {h5d.CONTIGUOUS, h5d.COMPACT}


def check_h5_tree(f, path: str | os.PathLike, need_crc: bool) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Walk an open HDF5 file without following links; refuse what the writers never make.

    Refused: soft, external and user-defined links, named datatypes, virtual datasets,
    external storage, chunked or filtered layouts, dtypes that are not plain numbers, empty
    dataspaces, datasets larger than the file itself and (with need_crc) datasets without a
    crc32 attribute. Returns dataset path -> (shape, dtype); groups map to None values.
    """
    import h5py  # lazy: a heavy import that only HDF5 paths need

    size = os.stat(path).st_size
    layouts = _layouts()
    entries: dict[str, Any] = {}

    def refuse(key: str, why: str) -> CheckpointError:
        return CheckpointError(f"'{path}': entry '{key}' {why}; netrun does not read such files")

    def walk(group, prefix: str, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise refuse(prefix, f"is nested more than {_MAX_DEPTH} groups deep")
        for name in group:
            key = f"{prefix}/{name}" if prefix else name
            if len(entries) >= _MAX_ENTRIES:
                raise CheckpointError(f"'{path}' holds more than {_MAX_ENTRIES:,} entries")
            link = group.get(name, getlink=True)
            if not isinstance(link, h5py.HardLink):
                raise refuse(key, f"is a {type(link).__name__} (links to other places or files)")
            obj = group[name]
            if isinstance(obj, h5py.Group):
                entries[key] = None
                walk(obj, key, depth + 1)
            elif isinstance(obj, h5py.Dataset):
                entries[key] = _check_dataset(obj, key, size, layouts, need_crc, refuse)
            else:
                raise refuse(key, f"is a {type(obj).__name__}, not a group or dataset")

    walk(f, "", 0)
    # Each dataset's bytes are stored once in the file, so together they fit in it; claims
    # beyond that (overlapping or unallocated extents) would make readers allocate at will.
    total = sum(_nbytes(*e) for e in entries.values() if e is not None)
    if total > size:
        raise CheckpointError(f"'{path}': its datasets claim {total:,} bytes, more than the "
                              f"whole file ({size:,}); the file is corrupt")
    return entries


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    n = dtype.itemsize
    for d in shape:      # Python ints: no int64 overflow for absurd dimensions
        n *= int(d)
    return n


def _check_dataset(ds, key: str, file_size: int, layouts, need_crc: bool, refuse):
    plist = ds.id.get_create_plist()
    if ds.is_virtual or plist.get_layout() not in layouts:
        raise refuse(key, "is virtual, chunked or compressed")
    if plist.get_external_count():
        raise refuse(key, "keeps its data in external files")
    dtype, shape = ds.dtype, ds.shape
    if dtype.kind not in "biuf" or dtype.names is not None or dtype.subdtype is not None:
        raise refuse(key, f"has dtype {dtype}, not a plain number type")
    if shape is None:
        raise refuse(key, "has no dataspace")
    nbytes = _nbytes(shape, dtype)
    if nbytes > file_size:
        raise refuse(key, f"claims {nbytes:,} bytes, more than the whole file ({file_size:,})")
    if need_crc:
        crc = small_attr(ds, "crc32")
        if crc is None or np.asarray(crc).shape != () or np.asarray(crc).dtype.kind not in "iu":
            raise refuse(key, "has no checksum (crc32)")
    return tuple(int(d) for d in shape), dtype


def small_attr(obj, name: str, default: Any = None) -> Any:
    """An attribute holding one number or a short fixed-length string, else ValueError.

    Anything else is damage: an array, or a variable-length string, whose heap reference a
    flipped byte can turn into minutes of looping inside HDF5 (seen in fuzzing).
    """
    if name not in obj.attrs:
        return default
    aid = obj.attrs.get_id(name)
    if aid.shape not in ((), (1,)) or aid.dtype.kind not in "iuS" or aid.dtype.itemsize > 64:
        raise ValueError(f"attribute '{name}' is not a single number or short string "
                         f"({aid.dtype}, shape {aid.shape})")
    return obj.attrs[name]


class H5Reader:
    """Reads what an H5Writer committed; any damage is a CheckpointError naming the file."""

    def __init__(self, path: str | os.PathLike):
        import h5py  # lazy: a heavy import that only HDF5 paths need

        self.path = Path(path)
        if not self.path.exists():
            raise CheckpointError(f"checkpoint '{self.path}' does not exist")
        if not self.path.is_file():
            raise CheckpointError(f"checkpoint '{self.path}' is not a file (a folder?)")
        try:
            self._f = h5py.File(self.path, "r")
        except DAMAGE as e:
            raise CheckpointError(f"checkpoint '{self.path}' is not a readable HDF5 file "
                                  f"(truncated or corrupt?): {e}") from None
        try:
            self._check_header()
            self._entries = check_h5_tree(self._f, self.path, need_crc=True)
        except CheckpointError:
            self.close()
            raise
        except DAMAGE as e:
            self.close()
            raise CheckpointError(f"checkpoint '{self.path}' is corrupt: {e}") from None

    def _check_header(self) -> None:
        if int(np.asarray(small_attr(self._f, _COMPLETE, 0))) != 1:
            raise CheckpointError(f"checkpoint '{self.path}' is incomplete (its write never finished)")
        version = int(np.asarray(small_attr(self._f, "format_version", -1)))
        if version != FORMAT_VERSION:
            raise CheckpointError(f"checkpoint '{self.path}' has format version {version}; "
                                  f"this netrun reads version {FORMAT_VERSION}")

    def keys(self, group: str) -> list[str]:
        """Names stored directly under a group ('' for the root)."""
        if group and (group not in self._entries or self._entries[group] is not None):
            return []                       # absent, or a dataset rather than a group
        prefix = f"{group}/" if group else ""
        return sorted(k[len(prefix):] for k in self._entries
                      if k.startswith(prefix) and "/" not in k[len(prefix):])

    def has(self, key: str) -> bool:
        return self._entries.get(key) is not None

    def shape(self, key: str) -> tuple[int, ...] | None:
        """The shape of a dataset, None when there is none under that key."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def get(self, key: str) -> np.ndarray:
        if not self.has(key):
            raise CheckpointError(f"checkpoint '{self.path}' has no entry '{key}'")
        try:
            ds = self._f[key]
            value = np.asarray(ds[()])
            value = value.astype(value.dtype.newbyteorder("="), copy=False)
            crc = int(np.asarray(small_attr(ds, "crc32")))
            dtype = small_attr(ds, "dtype")      # absent in files written before it was added
            dtype = None if dtype is None else str(np.asarray(dtype).astype(str))
        except DAMAGE as e:
            raise CheckpointError(f"checkpoint '{self.path}': entry '{key}' cannot be read "
                                  f"(corrupt?): {e}") from None
        if (value.shape != self.shape(key) or _crc(value) != crc
                or (dtype is not None and dtype != value.dtype.str)):
            raise CheckpointError(f"checkpoint '{self.path}': entry '{key}' fails its checksum "
                                  f"(the file is corrupt)")
        return value

    def get_text(self, key: str) -> str:
        value = self.get(key)
        if value.dtype != np.uint8 or value.ndim != 1:
            raise CheckpointError(f"checkpoint '{self.path}': entry '{key}' is not text")
        try:
            return value.tobytes().decode()
        except UnicodeDecodeError:
            raise CheckpointError(f"checkpoint '{self.path}': entry '{key}' is not UTF-8 "
                                  f"text (corrupt?)") from None

    def get_json(self, key: str) -> Any:
        try:
            return json.loads(self.get_text(key))
        except (ValueError, RecursionError) as e:
            raise CheckpointError(f"checkpoint '{self.path}': entry '{key}' is not valid "
                                  f"JSON: {e}") from None

    def attr(self, name: str, default: Any = None) -> Any:
        try:
            return small_attr(self._f, name, default)
        except DAMAGE as e:
            raise CheckpointError(f"checkpoint '{self.path}': attribute '{name}' cannot be "
                                  f"read (corrupt?): {e}") from None

    def close(self) -> None:
        try:
            self._f.close()
        except DAMAGE:
            pass          # closing a damaged file may complain; there is nothing to keep

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
