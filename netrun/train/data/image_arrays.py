"""Lazy example arrays: N x C x H x W, decoded from database records or image files when
indexed, and picklable with no open handle (worker processes unpickle them and open their
own).

The loader indexes them with a batch of positions; each example is decoded (and resized)
into one preallocated (k, C, H, W) output. Every example must have the first one's shape:
another is a DataError naming the record or file and both shapes.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

import numpy as np

from netrun.errors import DataError
from netrun.train.data.databases import DatabaseReader
from netrun.train.data.datum import datum_image, decode_datum
from netrun.train.data.images import read_image, resize_image


class PackedBytes:
    """Many byte strings (keys, file names) in one buffer with offsets: a million of them
    pickle in one piece, not as a million objects."""

    def __init__(self, items: Iterable[bytes]):
        items = list(items)
        self.blob = b"".join(items)
        self.offsets = np.zeros(len(items) + 1, np.int64)
        np.cumsum([len(item) for item in items], out=self.offsets[1:])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> bytes:
        return self.blob[self.offsets[i]:self.offsets[i + 1]]


def positions(index: Any, size: int) -> tuple[np.ndarray, bool]:
    """An int, slice, integer array or boolean mask as example positions in 0..size-1, and
    whether it was a single int (the result then drops the batch axis)."""
    if isinstance(index, (int, np.integer)):
        idx, single = np.array([int(index)]), True
    elif isinstance(index, slice):
        steps = range(size)[index]          # no array of all N positions per batch
        idx, single = np.arange(steps.start, steps.stop, steps.step), False
    else:
        idx, single = np.asarray(index), False
        if idx.dtype == np.bool_:
            if idx.shape != (size,):
                raise IndexError(f"a boolean index of shape {idx.shape} for {size} examples")
            idx = np.flatnonzero(idx)
        elif idx.size and not np.issubdtype(idx.dtype, np.integer):
            raise IndexError(f"examples are indexed by integers, not {idx.dtype}")
        idx = idx.astype(np.int64).reshape(-1)
    idx = np.where(idx < 0, idx + size, idx)
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise IndexError(f"index out of range for {size} examples")
    return idx, single


def _shape_text(shape: tuple) -> str:
    return " x ".join(map(str, shape))


class _LazyExamples:
    """What both lazy arrays share: shape, dtype, indexing into a preallocated output."""

    shape: tuple[int, ...]
    dtype: np.dtype
    # Indexing decodes files: the trainer reads such data in worker processes by default.
    decodes = True

    @property
    def ndim(self) -> int:
        """Number of axes (N, C, H, W)."""
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = self[:]
        return data if dtype is None else data.astype(dtype)

    def __getitem__(self, index: Any) -> np.ndarray:
        idx, single = positions(index, len(self))
        out = np.empty((len(idx), *self.shape[1:]), self.dtype)
        self._fill(idx, out)
        return out[0] if single else out

    def _fill(self, idx: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError

    def _check(self, example: np.ndarray, where: str, hint: str) -> np.ndarray:
        if example.shape != self.shape[1:]:
            raise DataError(f"{where}: the example is {_shape_text(example.shape)} but the "
                            f"first one is {_shape_text(self.shape[1:])}; {hint}")
        return example


class DatumArray(_LazyExamples):
    """The examples of a Caffe database, one Datum per key (raw, encoded or float_data)."""

    def __init__(self, reader: DatabaseReader, keys: PackedBytes,
                 example_shape: tuple[int, ...], dtype: Any, color: bool | None = None):
        self.reader, self.keys, self.color = reader, keys, color
        self.shape = (len(keys), *example_shape)
        self.dtype = np.dtype(dtype)

    def _fill(self, idx: np.ndarray, out: np.ndarray) -> None:
        keys = [self.keys[int(i)] for i in idx]
        for k, (key, value) in enumerate(zip(keys, self.reader.get_many(keys))):
            where = f"{self.reader.path} record {key.decode(errors='replace')!r}"
            example = datum_image(decode_datum(value, where), self.color, where)
            hint = ("all records must have one size" if example.dtype == self.dtype else
                    "pixel and float_data records cannot be mixed")
            if example.ndim == 3 and example.shape[0] != self.shape[1] and self.color is None:
                hint = "set color: true (or false) to read every image with one channel count"
            out[k] = self._check(example, where, hint)

    def close(self) -> None:
        """Let go of the database handle (reopened if indexed again)."""
        self.reader.close()

    def __repr__(self) -> str:
        return f"<DatumArray {_shape_text(self.shape)} {self.dtype} from {self.reader.path}>"


class ImageFileArray(_LazyExamples):
    """The examples of a list of image files, read, decoded and (optionally) resized."""

    def __init__(self, files: Iterable[str | os.PathLike], example_shape: tuple[int, int, int],
                 color: bool = True, resize: bool = False, hint: str = ""):
        self.files = PackedBytes(os.fsencode(f) for f in files)
        self.color, self.resize, self.hint = bool(color), bool(resize), hint
        self.shape = (len(self.files), *example_shape)
        self.dtype = np.dtype(np.uint8)

    def path(self, i: int) -> str:
        """The file of example `i`."""
        return os.fsdecode(self.files[i])

    def _fill(self, idx: np.ndarray, out: np.ndarray) -> None:
        _, height, width = self.shape[1:]
        for k, i in enumerate(idx):
            path = self.path(int(i))
            image = read_image(path, self.color)
            if self.resize:
                image = resize_image(image, height, width)
            out[k] = self._check(image, path, self.hint)

    def close(self) -> None:
        """Nothing stays open between reads; here for symmetry with DatumArray."""

    def __repr__(self) -> str:
        return f"<ImageFileArray {_shape_text(self.shape)} from {len(self.files)} files>"
