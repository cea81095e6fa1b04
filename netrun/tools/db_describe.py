"""What an image database holds: records, how they are stored, shapes, labels, sample images.

```python
info = describe_database("train_lmdb", samples=64)
info["records"], info["shapes"], info["labels"]
write_grid(info.pop("samples"), "samples.png")
```

The database is read once, record by record; only the first `samples` images are kept.
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np

from netrun.errors import ConfigError, DataError
from netrun.tools.db_records import (
    Progress,
    encoded_format,
    record_images,
    record_kind,
)
from netrun.train.data.image_lists import read_class_names
from netrun.util.atomic import atomic_open

GRID_FORMATS = {".png": "png", ".jpg": "jpg", ".jpeg": "jpg"}


def describe_database(path: str | Path, backend: str | None = None, samples: int = 0,
                      on_progress: Progress | None = None) -> dict:
    """Counts of a database's records by storage kind, shape and label; with samples > 0 the
    first `samples` images (C x H x W, BGR) under "samples"."""
    from netrun.train.data.databases import detect_backend

    kinds: Counter[str] = Counter()
    formats: Counter[str] = Counter()
    shapes: Counter[tuple[int, ...]] = Counter()
    labels: Counter[int] = Counter()
    kept: list[np.ndarray] = []
    count = size = 0
    for record in record_images(path, backend, on_progress):
        kind = record_kind(record.datum)
        kinds[kind] += 1
        if kind == "encoded":
            formats[encoded_format(record.datum.data)] += 1
        shapes[record.image.shape] += 1
        labels[int(record.datum.label)] += 1
        count += 1
        size += record.size
        if len(kept) < samples:
            kept.append(record.image)
    classes = read_class_names(path)
    info = {
        "path": str(path), "backend": backend or detect_backend(path), "records": count,
        "record_bytes": size, "kinds": {k: kinds[k] for k in ("raw", "encoded", "float")},
        "formats": dict(sorted(formats.items())),
        "shapes": [{"shape": list(s), "count": n} for s, n in _by_count(shapes)],
        "classes": classes,
        "labels": [{"label": label, "count": labels[label], "name": _class(classes, label)}
                   for label in sorted(labels)],
    }
    if samples > 0:
        info["samples"] = kept
    return info


def image_grid(images: list[np.ndarray]) -> np.ndarray:
    """The images as one C x H x W uint8 picture (BGR, or gray if none has colour): rows of
    ceil(sqrt(n)) cells, each cell the size of the largest image, padded with black."""
    if not images:
        raise DataError("no images to put in a grid: the database has no records")
    tiles = [_displayable(image) for image in images]
    channels = 3 if any(t.shape[0] == 3 for t in tiles) else 1
    tiles = [np.repeat(t, channels, axis=0) if t.shape[0] != channels else t for t in tiles]
    cell_h, cell_w = max(t.shape[1] for t in tiles), max(t.shape[2] for t in tiles)
    columns = math.ceil(math.sqrt(len(tiles)))
    rows = math.ceil(len(tiles) / columns)
    grid = np.zeros((channels, rows * cell_h, columns * cell_w), np.uint8)
    for i, tile in enumerate(tiles):
        top, left = (i // columns) * cell_h, (i % columns) * cell_w
        grid[:, top:top + tile.shape[1], left:left + tile.shape[2]] = tile
    return grid


def write_grid(images: list[np.ndarray], path: str | Path) -> tuple[int, int]:
    """Write `image_grid(images)` as a PNG (or JPEG) file, atomically; returns its (height,
    width)."""
    from netrun.train.data.images import encode_image

    fmt = grid_format(path)
    grid = image_grid(images)
    data = encode_image(grid, fmt)
    with atomic_open(path, "wb") as f:
        f.write(data)
    return grid.shape[1], grid.shape[2]


def grid_format(path: str | Path) -> str:
    """"png" or "jpg" from the file name; ConfigError for any other name."""
    fmt = GRID_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ConfigError(f"{path}: name the grid image .png (or .jpg)")
    return fmt


def _displayable(image: np.ndarray) -> np.ndarray:
    """A record's image as 1 or 3 uint8 channels: float data stretched to 0..255, images of
    other channel counts shown by their first channel."""
    if image.shape[0] not in (1, 3):
        image = image[:1]
    if image.dtype == np.uint8:
        return image
    # float_data has no fixed range (0..255, 0..1, mean-subtracted): stretch each image's own.
    image = np.nan_to_num(image.astype(np.float64), posinf=0.0, neginf=0.0)
    low, high = float(np.min(image)), float(np.max(image))
    scale = 255.0 / (high - low) if high > low else 0.0
    return np.clip(np.rint((image - low) * scale), 0, 255).astype(np.uint8)


def _by_count(counts: Counter) -> list:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _class(classes: list[str] | None, label: int) -> str | None:
    return classes[label] if classes is not None and 0 <= label < len(classes) else None
