"""Sources of users' own images: Caffe databases (`lmdb`, `leveldb`, `db`), Caffe image
lists (`imagedata`) and folders with one subfolder per class (`folder`).

Labels are read when a part is first used (for a database, a scan that skips the pixel
bytes); the examples stay where they are and are decoded batch by batch (image_arrays.py).
Each source has `shuffle`, which the trainer hands to the batch loader: Caffe's Data and
ImageData layers read in file order unless told otherwise, a folder is shuffled.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from netrun.errors import ConfigError, DataError
from netrun.train.data.base import Arrays, DataSource, SourceRequest, as_labels, register_source
from netrun.train.data.databases import DatabaseReader
from netrun.train.data.datum import datum_image, datum_label, decode_datum
from netrun.train.data.image_arrays import DatumArray, ImageFileArray, PackedBytes
from netrun.train.data.image_lists import (
    class_names,
    folder_images,
    read_class_names,
    read_list_file,
)
from netrun.train.data.images import read_image
from netrun.train.data.paths import expand_path

PARTS = ("train", "test")


# Sources -----------------------------------------------------------------------------------
class DatabaseSource(DataSource):
    """Parts from Caffe LMDB or LevelDB folders of Datum records (the backend of each is
    told from its files)."""

    def __init__(self, folders: dict[str, Path], color: bool | None = None,
                 num_classes: int | None = None, shuffle: bool = False, name: str = "db"):
        super().__init__()
        self.folders, self.parts, self.name = folders, tuple(folders), name
        self.color, self._num_classes, self.shuffle = color, num_classes, shuffle

    @property
    def input_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        """Per-example shape, from the first record of the first part (no full scan)."""
        return first_example(self.folders[self.parts[0]], self.color).shape

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        """Configured `num_classes`, else 1 + the largest label of the first part."""
        return self._classes(self._num_classes)

    def describe(self) -> str:
        """One line for logs."""
        return ", ".join(f"{p}: {f}" for p, f in self.folders.items())

    @property
    def class_names(self) -> list[str] | None:  # type: ignore[override]
        """The names `netrun data build` wrote beside the first part's records, if any."""
        return read_class_names(self.folders[self.parts[0]])

    def _load(self, part: str) -> Arrays:
        folder = self.folders[part]
        keys, labels = [], []
        # The reader is closed once the labels and the first record are read: it reopens in
        # whichever process reads batches (a LevelDB opens in one process at a time, and a
        # worker may be the one).
        with DatabaseReader(folder) as reader:
            for key, label in reader.scan(lambda value: datum_label(value, str(folder))):
                keys.append(key)
                labels.append(label)
            if not keys:
                raise DataError(f"{folder}: the database has no records")
            where = f"{folder} record {keys[0].decode(errors='replace')!r}"
            first = datum_image(decode_datum(reader.get(keys[0]), where), self.color, where)
        data = DatumArray(reader, PackedBytes(keys), first.shape, first.dtype, self.color)
        return Arrays(data, as_labels(np.asarray(labels, np.int64), str(folder)))


def first_example(folder: str | Path, color: bool | None = None) -> np.ndarray:
    """The example of the first record (in key order) of a database folder."""
    with DatabaseReader(folder) as reader:
        record = reader.first()
    if record is None:
        raise DataError(f"{folder}: the database has no records")
    where = f"{folder} record {record[0].decode(errors='replace')!r}"
    return datum_image(decode_datum(record[1], where), color, where)


class ImageFilesSource(DataSource):
    """Parts that are lists of image files with labels: Caffe's ImageData lists, or folders
    with one subfolder per class (classes from the first part, by sorted name)."""

    def __init__(self, name: str, places: dict[str, Path], size: tuple[int, int] | None,
                 color: bool, shuffle: bool, num_classes: int | None = None,
                 root_folder: Path | None = None):
        super().__init__()
        self.name, self.places, self.parts = name, places, tuple(places)
        self.size, self.color, self.shuffle = size, color, shuffle
        self._num_classes, self.root_folder = num_classes, root_folder
        self._class_names: list[str] | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        """Per-example shape: the resize target, else the first image's size."""
        if self.size is not None:
            return (3 if self.color else 1, *self.size)
        return tuple(self.part(self.parts[0]).data.shape[1:])

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        """The number of class folders, else configured `num_classes`, else 1 + the largest
        label of the first part."""
        if self.name == "folder":
            return len(self.class_names)
        return self._classes(self._num_classes)

    @property
    def class_names(self) -> list[str] | None:  # type: ignore[override]
        """The class folder names, label = index (folder source; None for a list file)."""
        if self.name != "folder":
            return None
        if self._class_names is None:
            self._class_names = class_names(self.places[self.parts[0]])
        return self._class_names

    def describe(self) -> str:
        """One line for logs."""
        return ", ".join(f"{p}: {f}" for p, f in self.places.items())

    def _entries(self, part: str) -> list[tuple[Path, int]]:
        if self.name == "folder":
            return folder_images(self.places[part], self.class_names)
        return read_list_file(self.places[part], self.root_folder or "")

    def _load(self, part: str) -> Arrays:
        entries = self._entries(part)
        missing = [str(p) for p, _ in entries if not p.is_file()] if self.name == "imagedata" \
            else []
        if missing:
            more = " ..." if len(missing) > 3 else ""
            raise DataError(f"{self.places[part]}: {len(missing)} of {len(entries)} images are "
                            f"missing: {', '.join(missing[:3])}{more}")
        files = [p for p, _ in entries]
        if self.size is not None:
            shape = (3 if self.color else 1, *self.size)
        else:
            shape = read_image(files[0], self.color).shape
        hint = ("give new_height and new_width to resize every image to one size"
                if self.name == "imagedata" else
                "set resize: N (or [H, W]) to resize every image to one size")
        data = ImageFileArray(files, shape, self.color, self.size is not None, hint)
        labels = np.asarray([label for _, label in entries], np.int64)
        return Arrays(data, as_labels(labels, str(self.places[part])))


# Config ------------------------------------------------------------------------------------
def _path(value: Any, base: Path, what: str) -> Path:
    if not isinstance(value, (str, Path)):
        raise ConfigError(f"{what}: expected a path, got {value!r}")
    path = Path(expand_path(str(value)))
    return path if path.is_absolute() else base / path


def _places(request: SourceRequest, what: str, kind: str) -> dict[str, Path]:
    cfg, base = request.cfg, request.file_base()
    places = {part: _path(cfg[part], base, f"data.{part}") for part in PARTS
              if cfg.get(part) is not None}
    if not places:
        raise ConfigError(f"data: the {request.name} source needs 'train:' and/or 'test:' "
                          f"({what})")
    for part, path in places.items():
        exists = path.is_dir() if kind == "folder" else path.is_file()
        if not exists:
            raise DataError(f"data.{part}: no such {kind} {path}")
    return places


def _flag(cfg: dict, key: str, default: bool | None) -> bool | None:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"data.{key}: expected true or false, got {value!r}")
    return value


def _count(cfg: dict, key: str, minimum: int) -> int | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"data.{key}: expected a whole number >= {minimum}, got {value!r}")
    return value


def _resize(cfg: dict) -> tuple[int, int] | None:
    value = cfg.get("resize")
    if value is None:
        return None
    sizes = [value] * 2 if isinstance(value, int) and not isinstance(value, bool) else value
    if not (isinstance(sizes, (list, tuple)) and len(sizes) == 2 and
            all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes)):
        raise ConfigError(f"data.resize: expected a size N (square) or [HEIGHT, WIDTH] of "
                          f"whole numbers >= 1, got {value!r}")
    return int(sizes[0]), int(sizes[1])


@register_source("lmdb", "leveldb", "db")
def make_database_source(request: SourceRequest) -> DatabaseSource:
    """`source: lmdb | leveldb | db`: train/test database folders; color, num_classes,
    shuffle (default false, as Caffe's Data layer)."""
    cfg = request.cfg
    folders = _places(request, "LMDB or LevelDB database folders", "folder")
    return DatabaseSource(folders, _flag(cfg, "color", None), _count(cfg, "num_classes", 1),
                          bool(_flag(cfg, "shuffle", False)), request.name)


@register_source("imagedata")
def make_imagedata_source(request: SourceRequest) -> ImageFilesSource:
    """`source: imagedata` (Caffe's ImageData): train/test list files, root_folder,
    new_height/new_width, is_color, num_classes, shuffle (default false, as Caffe)."""
    cfg = request.cfg
    lists = _places(request, "Caffe image list files, one 'IMAGE_PATH LABEL' per line", "file")
    height, width = _count(cfg, "new_height", 0) or 0, _count(cfg, "new_width", 0) or 0
    if bool(height) != bool(width):
        raise ConfigError("data: give both new_height and new_width (or neither), as Caffe's "
                          "ImageData requires")
    root = cfg.get("root_folder")
    root_folder = _path(root, request.file_base(), "data.root_folder") if root else None
    if root_folder is not None and not root_folder.is_dir():
        raise DataError(f"data.root_folder: no such folder {root_folder}")
    return ImageFilesSource("imagedata", lists, (height, width) if height else None,
                            bool(_flag(cfg, "is_color", True)), bool(_flag(cfg, "shuffle", False)),
                            _count(cfg, "num_classes", 1), root_folder)


@register_source("folder")
def make_folder_source(request: SourceRequest) -> ImageFilesSource:
    """`source: folder`: train/test roots with one subfolder per class; resize, color,
    shuffle (default true)."""
    cfg = request.cfg
    roots = _places(request, "folders with one subfolder of images per class", "folder")
    return ImageFilesSource("folder", roots, _resize(cfg), bool(_flag(cfg, "color", True)),
                            bool(_flag(cfg, "shuffle", True)))
