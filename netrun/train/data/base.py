"""Data sources: parts of (data, label) arrays loaded on first use, and their registry."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from netrun.errors import ConfigError, NetrunError, suggest
from netrun.train.data.paths import expand_path


class Arrays(NamedTuple):
    """One part of a dataset: data (N, ...) float32 or a lazy array, labels (N,) int32."""

    data: Any
    label: Any

    @property
    def size(self) -> int:
        """Number of examples."""
        return len(self.label)


class DataSource:
    """A dataset with parts `train` and `test`; subclasses implement `_load(part)`."""

    name: str = "source"
    parts: tuple[str, ...] = ("train", "test")
    # Whether training visits the examples in a new random order every epoch (Caffe's
    # database and list-file layers read in file order, so their sources say False).
    shuffle: bool = True
    input_shape: tuple[int, ...] = ()
    num_classes: int = 0

    def __init__(self) -> None:
        self._cache: dict[str, Arrays] = {}

    def part(self, name: str) -> Arrays:
        """The arrays of one part, read (or rendered) on first use and kept."""
        if name not in self.parts:
            raise ConfigError(f"data source '{self.name}' has no part '{name}' (parts: "
                              f"{', '.join(self.parts)}){suggest(name, self.parts)}")
        if name not in self._cache:
            self._cache[name] = self._load(name)
        return self._cache[name]

    @property
    def train(self) -> Arrays:
        """The training part."""
        return self.part("train")

    @property
    def test(self) -> Arrays:
        """The test part."""
        return self.part("test")

    def _load(self, part: str) -> Arrays:
        raise NotImplementedError

    @property
    def class_names(self) -> list[str] | None:
        """The name of each class (label = index), where the data says; else None."""
        return None

    def _classes(self, configured: int | None) -> int:
        """`configured`, else 1 + the largest label of the first part (read if needed)."""
        if configured is not None:
            return int(configured)
        labels = self.part(self.parts[0]).label
        return int(labels.max()) + 1 if labels.size else 0

    def describe(self) -> str:
        """One line for logs."""
        return self.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


def as_images(data: np.ndarray, where: str) -> np.ndarray:
    """float32 (N, C, H, W) or (N, D); an (N, H, W) array gets a channel axis."""
    data = np.asarray(data)
    if data.ndim < 2:
        raise NetrunError(f"{where}: data has shape {data.shape}; expected N x ... examples")
    if not (np.issubdtype(data.dtype, np.number) or data.dtype == np.bool_):
        raise NetrunError(f"{where}: data has dtype {data.dtype}; expected numbers")
    if data.ndim == 3:
        data = data[:, None]                                  # (N, 1, H, W)
    return data.astype(np.float32, copy=False)


def as_labels(label: np.ndarray, where: str, dtype: str = "int32") -> np.ndarray:
    """Labels as (N,) int32 (class indices) or float32 (regression targets, dtype float32)."""
    label = np.asarray(label)
    # Caffe stores labels as N, N x 1 or N x 1 x 1 x 1: drop the trailing unit axes.
    while label.ndim > 1 and label.shape[-1] == 1:
        label = label[..., 0]
    if not (np.issubdtype(label.dtype, np.integer) or np.issubdtype(label.dtype, np.floating)
            or label.dtype == np.bool_):
        raise NetrunError(f"{where}: labels have dtype {label.dtype}; expected numbers")
    if dtype == "float32":
        return label.astype(np.float32, copy=False)
    if label.ndim != 1:
        raise NetrunError(f"{where}: class labels must be one per example, got shape "
                          f"{label.shape} (set label_dtype: float32 for multi-valued targets)")
    if np.issubdtype(label.dtype, np.floating) and not np.all(label == np.rint(label)):
        raise NetrunError(f"{where}: labels are not whole numbers; set label_dtype: float32 "
                          f"for regression targets")
    if label.size and label.min() < 0:
        raise NetrunError(f"{where}: negative class label {int(label.min())}")
    if label.size and label.max() > np.iinfo(np.int32).max:
        raise NetrunError(f"{where}: class label {label.max()} is too large to be a class index")
    return label.astype(np.int32)


def label_dtype(cfg: dict) -> str:
    """The configured `label_dtype`: int32 (class indices, default) or float32 (targets)."""
    value = str(cfg.get("label_dtype", "int32"))
    if value not in ("int32", "float32"):
        raise ConfigError(f"data.label_dtype: '{value}' is not int32 or float32")
    return value


def check_lengths(data: Any, label: Any, where: str) -> None:
    """Data and labels must have one entry per example."""
    if len(data) != len(label):
        raise NetrunError(f"{where}: {len(data)} examples but {len(label)} labels")


class SourceRequest(NamedTuple):
    """What a source factory gets: the name as written, the data config, where paths live."""

    name: str
    cfg: dict
    data_dir: str | None      # --data-dir or data.dir, unexpanded
    config_dir: Path          # relative paths in the config resolve against this

    def file_base(self) -> Path:
        """Where relative file names of the config point: the data dir, else the config's."""
        if not self.data_dir:
            return self.config_dir
        base = Path(expand_path(str(self.data_dir)))
        return base if base.is_absolute() else self.config_dir / base


Factory = Callable[[SourceRequest], DataSource]
SOURCES: dict[str, Factory] = {}


def register_source(*names: str) -> Callable[[Factory], Factory]:
    """Decorator: make `factory(request)` the data source for each of `names`."""

    def wrap(factory: Factory) -> Factory:
        for name in names:
            SOURCES[name] = factory
        return factory

    return wrap
