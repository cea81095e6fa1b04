"""Source `npz`: NumPy `.npz` archives with data and label arrays.

Either one file per part (`train:`, `test:`) holding `data`/`label` (or `x`/`y`), or one
file for both (`path:`) holding `x_train`/`y_train`/`x_test`/`y_test` (Keras' mnist.npz) or
`data_train`/`label_train`/... . `data_key`/`label_key` override the names. Files are read
with `allow_pickle=False`: loading data never runs code from the file.
"""
from __future__ import annotations

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
from netrun.train.data.numpy_files import NpzArchive
from netrun.train.data.paths import expand_path


class NpzSource(DataSource):
    """Parts from `.npz` files: one per part, or one shared file with per-part keys."""

    name = "npz"

    def __init__(self, files: dict[str, Path], shared: bool = False,
                 data_key: str | None = None, label_key: str | None = None,
                 label_dtype: str = "int32", num_classes: int | None = None):
        super().__init__()
        self.files, self.shared, self.parts = files, shared, tuple(files)
        self.data_key, self.label_key = data_key, label_key
        self.label_dtype, self._num_classes = label_dtype, num_classes

    @property
    def input_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        """Per-example data shape of the first part."""
        return tuple(self.part(self.parts[0]).data.shape[1:])

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        """Configured `num_classes`, else 1 + the largest label of the first part."""
        return self._classes(self._num_classes)

    def describe(self) -> str:
        """One line for logs."""
        return ", ".join(f"{p}: {f}" for p, f in self.files.items())

    def _candidates(self, part: str) -> list[tuple[str, str]]:
        if self.data_key or self.label_key:
            data, label = self.data_key or "data", self.label_key or "label"
            return [(f"{data}_{part}", f"{label}_{part}")] if self.shared else [(data, label)]
        if self.shared:
            return [(f"x_{part}", f"y_{part}"), (f"data_{part}", f"label_{part}")]
        return [("data", "label"), ("x", "y")]

    def _load(self, part: str) -> Arrays:
        path = self.files[part]
        with NpzArchive(path) as archive:
            data, label = self._pick(archive, part, path)
        where = f"{path} ({part})"
        check_lengths(data, label, where)
        return Arrays(as_images(data, where), as_labels(label, where, self.label_dtype))

    def _pick(self, archive: NpzArchive, part: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
        keys = set(archive.files)
        for data_key, label_key in self._candidates(part):
            if data_key in keys and label_key in keys:
                return archive[data_key], archive[label_key]
        wanted = " or ".join(f"{d}/{lbl}" for d, lbl in self._candidates(part))
        raise NetrunError(f"{path}: no arrays {wanted} (it has: "
                          f"{', '.join(sorted(keys)) or 'nothing'})")


def _file(value: Any, base: Path, what: str) -> Path:
    if not isinstance(value, (str, Path)):
        raise ConfigError(f"{what}: expected an .npz file name, got {value!r}")
    path = Path(expand_path(str(value)))
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise NetrunError(f"{what}: no such file {path}")
    return path


@register_source("npz")
def make_npz(request: SourceRequest) -> NpzSource:
    """`source: npz` with `train:`/`test:` files, or `path:` for one file with both parts."""
    cfg, base = request.cfg, request.file_base()
    if cfg.get("path") is not None:
        path = _file(cfg["path"], base, "data.path")
        files, shared = {"train": path, "test": path}, True
    else:
        files = {p: _file(cfg[p], base, f"data.{p}") for p in ("train", "test")
                 if cfg.get(p) is not None}
        shared = False
    if not files:
        raise ConfigError("data: the npz source needs 'train:' and/or 'test:' files, or "
                          "'path:' for one file with x_train/y_train/x_test/y_test")
    return NpzSource(files, shared, cfg.get("data_key"), cfg.get("label_key"),
                     label_dtype(cfg), cfg.get("num_classes"))
