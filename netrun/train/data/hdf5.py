"""Source `hdf5`, in the style of Caffe's HDF5Data layer: datasets `data` and `label`
spread over a list of `.h5` files, read into memory or lazily, batch by batch.

Each part (`train:`, `test:`) names one `.h5` file, a glob, a list of those, or, as Caffe's
`source` did, a text file with one `.h5` path per line (relative to the list's folder).
"""
from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import numpy as np

from netrun.errors import ConfigError, NetrunError
from netrun.train.data.base import (
    Arrays,
    DataSource,
    SourceRequest,
    as_images,
    as_labels,
    check_lengths,
    label_dtype,
    register_source,
)
from netrun.train.data.paths import expand_path


def _h5py():
    try:
        import h5py  # lazy: a heavy import that only HDF5 paths need
    except ImportError:
        raise NetrunError("the hdf5 data source needs h5py: pip install h5py") from None
    return h5py


# What h5py raises on a damaged file: OSError to open, KeyError or RuntimeError to walk a
# damaged group, ValueError, TypeError, IndexError or OverflowError for a dataset
# or filter pipeline it cannot decode.
H5_DAMAGE = (OSError, KeyError, RuntimeError, ValueError, TypeError, IndexError, OverflowError)
# Deflate (the usual HDF5 filter) expands at most about 1032 times.
_MAX_RATIO = 1032


def h5_dataset(f: Any, key: str, path: Path) -> Any:
    """The dataset `key` of an open file, refused if it is missing, not plain data stored in
    this file (external link, virtual or external storage) or bigger than the file holds."""
    h5py = _h5py()
    if key not in f:
        raise NetrunError(f"{path}: no dataset '{key}' (it has: "
                          f"{', '.join(sorted(f.keys())) or 'nothing'})")
    link = f.get(key, getlink=True)
    if not isinstance(link, h5py.HardLink):
        raise NetrunError(f"{path}: '{key}' is a link to another file or object; netrun reads "
                          "only data stored in the file itself")
    ds = f[key]
    if not isinstance(ds, h5py.Dataset):
        raise NetrunError(f"{path}: '{key}' is a group, not a dataset")
    if ds.is_virtual or ds.external:
        raise NetrunError(f"{path}: dataset '{key}' keeps its data in other files; netrun "
                          "reads only data stored in the file itself")
    if not (np.issubdtype(ds.dtype, np.number) or ds.dtype == np.bool_):
        raise NetrunError(f"{path}: dataset '{key}' has dtype {ds.dtype}; expected numbers")
    stored = ds.id.get_storage_size()
    nbytes = int(np.prod(ds.shape, dtype=object)) * ds.dtype.itemsize if ds.shape else \
        ds.dtype.itemsize
    if nbytes > stored * (_MAX_RATIO if ds.compression else 1) + 1024:
        raise NetrunError(f"{path}: dataset '{key}' claims {'×'.join(map(str, ds.shape))} "
                          f"values ({nbytes:,} bytes) but the file stores {stored:,} bytes "
                          f"of it; the file is damaged")
    return ds


def h5_read(path: Path, keys: tuple[str, ...], optional: tuple[str, ...] = ()
            ) -> dict[str, np.ndarray]:
    """The named datasets of an HDF5 file as arrays (optional ones only if present);
    NetrunError naming the file for anything missing or damaged."""
    h5py = _h5py()
    try:
        with h5py.File(path, "r") as f:
            out = {k: h5_dataset(f, k, path)[()] for k in keys}
            for k in optional:
                if k in f:
                    out[k] = h5_dataset(f, k, path)[()]
            return out
    except H5_DAMAGE as e:
        raise NetrunError(f"{path}: cannot read as HDF5 ({_why(e)})") from None


def _why(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text[:200]


class LazyH5Array:
    """The rows of one dataset across several HDF5 files, read when indexed (float32)."""

    def __init__(self, files: list[Path], key: str, counts: list[int], row_shape: tuple):
        self.files, self.key = files, key
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # (H, W) rows get a channel axis, as in-memory data does.
        self.row_shape = (1, *row_shape) if len(row_shape) == 2 else tuple(row_shape)
        self.shape = (int(self.offsets[-1]), *self.row_shape)
        self.dtype = np.dtype(np.float32)
        self.ndim = len(self.shape)
        self._open: dict[int, Any] = {}

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, (int, np.integer)):
            return self[np.array([index])][0]
        idx = np.arange(len(self))[index] if isinstance(index, slice) else np.asarray(index)
        idx = np.where(idx < 0, idx + len(self), idx)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"index out of range for {len(self)} rows")
        # h5py reads fancy indices only when increasing and unique: read those, then reorder.
        rows, inverse = np.unique(idx, return_inverse=True)
        out = np.empty((len(rows), *self.row_shape), np.float32)
        which = np.searchsorted(self.offsets, rows, side="right") - 1
        for f in np.unique(which):
            sel = which == f
            try:
                data = self._dataset(int(f))[rows[sel] - self.offsets[f]]
            except H5_DAMAGE as e:
                raise NetrunError(f"{self.files[f]}: cannot read rows of '{self.key}' "
                                  f"({_why(e)})") from None
            out[sel] = data.reshape(-1, *self.row_shape)
        return out[inverse.reshape(idx.shape)]

    def _dataset(self, f: int) -> Any:
        if f not in self._open:
            self._open[f] = _h5py().File(self.files[f], "r")
        return h5_dataset(self._open[f], self.key, self.files[f])

    def close(self) -> None:
        """Close the files opened so far."""
        for handle in self._open.values():
            handle.close()
        self._open.clear()


class Hdf5Source(DataSource):
    """Parts from lists of HDF5 files with a data and a label dataset each."""

    name = "hdf5"

    def __init__(self, files: dict[str, list[Path]], data_key: str = "data",
                 label_key: str = "label", lazy: bool = False, label_dtype: str = "int32",
                 num_classes: int | None = None):
        super().__init__()
        self.files, self.parts = files, tuple(files)
        self.data_key, self.label_key, self.lazy = data_key, label_key, lazy
        self.label_dtype, self._num_classes = label_dtype, num_classes

    @property
    def input_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        """Per-example data shape, from the first part's files (without reading the data)."""
        first = self.parts[0]
        _, row_shape = self._scan(first)
        return (1, *row_shape) if len(row_shape) == 2 else row_shape

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        """Configured `num_classes`, else 1 + the largest training label."""
        return self._classes(self._num_classes)

    def describe(self) -> str:
        """One line for logs."""
        return ", ".join(f"{p}: {len(fs)} file(s)" for p, fs in self.files.items()) + \
            (" (lazy)" if self.lazy else "")

    def _scan(self, part: str) -> tuple[list[int], tuple]:
        """Row counts per file and the common row shape; checks keys and lengths."""
        h5py = _h5py()
        counts, row_shape = [], None
        for path in self.files[part]:
            try:
                with h5py.File(path, "r") as f:
                    data = h5_dataset(f, self.data_key, path)
                    label = h5_dataset(f, self.label_key, path)
                    if not data.shape:
                        raise NetrunError(f"{path}: '{self.data_key}' is a scalar, not rows")
                    check_lengths(data, label, str(path))
                    if row_shape is not None and data.shape[1:] != row_shape:
                        raise NetrunError(f"{path}: '{self.data_key}' rows are {data.shape[1:]},"
                                          f" earlier files have {row_shape}")
                    counts.append(len(data))
                    row_shape = data.shape[1:]
            except H5_DAMAGE as e:
                raise NetrunError(f"{path}: cannot read as HDF5 ({_why(e)})") from None
        return counts, tuple(row_shape or ())

    def _load(self, part: str) -> Arrays:
        counts, row_shape = self._scan(part)
        labels, datas = [], []
        for path in self.files[part]:
            keys = (self.label_key,) if self.lazy else (self.label_key, self.data_key)
            arrays = h5_read(path, keys)
            labels.append(arrays[self.label_key])
            if not self.lazy:
                datas.append(arrays[self.data_key])
        where = f"hdf5 {part} ({self.files[part][0]}...)"
        label = as_labels(np.concatenate(labels), where, self.label_dtype)
        if self.lazy:
            return Arrays(LazyH5Array(self.files[part], self.data_key, counts, row_shape), label)
        return Arrays(as_images(np.concatenate(datas), where), label)


def expand_files(value: Any, base: Path, what: str) -> list[Path]:
    """HDF5 paths from a path, a glob, a list of those, or a text file listing paths."""
    if isinstance(value, (list, tuple)):
        return [p for item in value for p in expand_files(item, base, what)]
    if not isinstance(value, (str, Path)):
        raise ConfigError(f"{what}: expected a file name or a list of them, got {value!r}")
    path = Path(expand_path(str(value)))
    path = path if path.is_absolute() else base / path
    if any(ch in str(value) for ch in "*?["):
        found = sorted(Path(p) for p in glob.glob(str(path)))
        if not found:
            raise NetrunError(f"{what}: no file matches {path}")
        return found
    if not path.is_file():
        raise NetrunError(f"{what}: no such file {path}")
    if _h5py().is_hdf5(path):
        return [path]
    # A Caffe-style list: one path per line, relative to the list's own folder (or, as in
    # Caffe, to the working directory).
    try:
        entries = [line.strip() for line in path.read_text().splitlines()]
    except UnicodeDecodeError:
        raise NetrunError(f"{what}: {path} is neither an HDF5 file nor a text list of them")
    files = [Path(expand_path(e)) for e in entries if e and not e.startswith("#")]
    files = [f if f.is_absolute() or not (path.parent / f).exists() else path.parent / f
             for f in files]
    if not files:
        raise NetrunError(f"{path}: the HDF5 file list is empty")
    for f in files:
        if not f.is_file():
            raise NetrunError(f"{path}: lists {f}, which does not exist")
    return files


@register_source("hdf5", "h5")
def make_hdf5(request: SourceRequest) -> Hdf5Source:
    """`source: hdf5` with `train:`/`test:` file lists and optional dataset names."""
    cfg = request.cfg
    files = {part: expand_files(cfg[part], request.file_base(), f"data.{part}")
             for part in ("train", "test") if cfg.get(part) is not None}
    if not files:
        raise ConfigError("data: the hdf5 source needs 'train:' and/or 'test:' (an .h5 file, "
                          "a glob, a list, or a text file listing .h5 files)")
    return Hdf5Source(files, str(cfg.get("data_key", "data")), str(cfg.get("label_key", "label")),
                      bool(cfg.get("lazy", False)), label_dtype(cfg), cfg.get("num_classes"))
