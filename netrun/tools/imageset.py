"""Building an image database as Caffe's `convert_imageset` does: images in, Datums out.

```python
summary = build_database("photos/", "train_lmdb", resize=(32, 32), shuffle=True, seed=1)
summary["records"], summary["shapes"], summary["classes"]
```

The input is a folder with one subfolder per class (labels are the sorted class names'
indices; the names go to OUT/classes.txt) or a Caffe list file ("path label" per line, paths
under `root`). Records are keyed "%08d_%s" % (index, path), index counting the (shuffled)
list, so the database's key order is the written order; an image that cannot be read is
skipped and its index left unused, as Caffe does.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from netrun.errors import ConfigError, DataError
from netrun.tools.db_records import Progress, encoded_format
from netrun.train.data.image_lists import CLASSES_FILE
from netrun.util.atomic import write_text_atomic

ENCODE_TYPES = ("png", "jpg")
# OpenCV's default JPEG quality, which convert_imageset's cv::imencode uses.
JPEG_QUALITY = 95

# on_skip(path, reason): an image that was left out.
Skip = Callable[[str, str], None]


@dataclass(frozen=True)
class ImageEntry:
    """One image to write: where to read it, its name in the key, its label."""

    path: Path
    name: str
    label: int


@dataclass(frozen=True)
class ImageOptions:
    """How each image becomes a record (convert_imageset's flags)."""

    resize: tuple[int, int] = (0, 0)
    gray: bool = False
    encode_type: str | None = None    # None with encoded: keep each file's own format
    encoded: bool = False
    quality: int = JPEG_QUALITY


def list_images(source: str | Path, root: str | Path = "") -> tuple[list[ImageEntry],
                                                                    list[str] | None]:
    """The images of a class folder or a list file, and the class names (None for a list).
    List paths resolve against `root`, else the list file's folder."""
    from netrun.train.data.image_lists import read_list_file, scan_folder

    source = Path(source)
    if source.is_dir():
        if str(root):
            raise ConfigError(f"--root is for a list file input; {source} is a folder (its "
                              f"subfolders are the classes)")
        pairs, classes = scan_folder(source)
        return [ImageEntry(p, _name(p, source), label) for p, label in pairs], list(classes)
    if not source.exists():
        raise DataError(f"{source} does not exist: give a folder with one subfolder per class "
                        f"or a list file of 'path label' lines")
    pairs = read_list_file(source, root_folder=root)
    # Keys hold each path as the list writes it: relative to the folder it resolves against.
    base = Path(root) if str(root) else source.parent
    return [ImageEntry(p, _name(p, base), label) for p, label in pairs], None


def build_database(source: str | Path, out: str | Path, *, root: str | Path = "",
                   resize: tuple[int, int] = (0, 0), gray: bool = False, shuffle: bool = False,
                   seed: int | None = None, encoded: bool = False,
                   encode_type: str | None = None, quality: int = JPEG_QUALITY,
                   backend: str = "lmdb", check_size: bool = False, overwrite: bool = False,
                   on_progress: Progress | None = None, on_skip: Skip | None = None) -> dict:
    """Write the images of `source` to a new database at `out`; return a summary dict."""
    from netrun.train.data.databases import DatabaseWriter
    from netrun.train.data.datum import encode_datum

    start = time.perf_counter()
    options = _options(resize, gray, encoded, encode_type, quality)
    out = Path(out)
    if out.exists() and not overwrite:   # before reading any image, not after all of them
        raise DataError(f"{out} already exists: choose another name, or pass --overwrite "
                        f"to replace it")
    if seed is not None and seed < 0:
        raise ConfigError(f"shuffle seed {seed}: use a whole number of 0 or more")
    entries, classes = list_images(source, root)   # never empty: both readers see to that
    if shuffle:
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % 2**32)
        entries = [entries[i] for i in np.random.default_rng(seed).permutation(len(entries))]

    shapes: dict[tuple[int, ...], int] = {}
    labels: dict[int, int] = {}
    skipped: list[dict] = []
    written = record_bytes = 0
    with DatabaseWriter(out, backend=backend, overwrite=overwrite) as writer:
        for index, entry in enumerate(entries):
            try:
                image, datum = _record(entry, options)
            except (DataError, OSError) as e:
                reason = _reason(e, entry.path)
                skipped.append({"path": str(entry.path), "reason": reason})
                if on_skip is not None:
                    on_skip(str(entry.path), reason)
            else:
                if check_size and shapes and image.shape not in shapes:
                    first = next(iter(shapes))
                    raise DataError(f"{entry.path}: an image of {_shape(image.shape)} where the "
                                    f"first was {_shape(first)} (--check-size wants one size; "
                                    f"--resize HxW makes them so)")
                value = encode_datum(datum)
                writer.put(f"{index:08d}_{entry.name}".encode(), value)
                shapes[image.shape] = shapes.get(image.shape, 0) + 1
                labels[entry.label] = labels.get(entry.label, 0) + 1
                written += 1
                record_bytes += len(value)
            if on_progress is not None:
                on_progress(index + 1, len(entries))
        if not written:
            # Raised inside the writer, so nothing is committed (an old OUT stays as it was).
            raise DataError(f"{source}: none of the {len(entries)} images could be read, so "
                            f"no database was written (first: {skipped[0]['path']}: "
                            f"{skipped[0]['reason']})")
    if classes is not None:
        write_text_atomic(out / CLASSES_FILE, "".join(f"{c}\n" for c in classes))
    return {
        "source": str(source), "output": str(out), "backend": backend, "records": written,
        "skipped": skipped, "encoded": options.encoded,
        "shapes": [{"shape": list(s), "count": n} for s, n in shapes.items()],
        "classes": classes, "labels": [{"label": k, "count": labels[k]} for k in sorted(labels)],
        "seed": seed if shuffle else None, "record_bytes": record_bytes,
        "disk_bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file()),
        "seconds": round(time.perf_counter() - start, 3),
    }


def _record(entry: ImageEntry, options: ImageOptions) -> tuple[np.ndarray, object]:
    """(the image as stored, its Datum) for one file; DataError/OSError if it cannot be read."""
    from netrun.train.data.datum import datum_from_image
    from netrun.train.data.images import decode_image, encode_image, resize_image

    data = entry.path.read_bytes()
    image = decode_image(data, color=not options.gray, where=str(entry.path))
    height, width = options.resize
    if height and width:
        image = resize_image(image, height, width)
    if not options.encoded:
        return image, datum_from_image(image, entry.label)
    own = _writable_format(encoded_format(data))
    target = options.encode_type or own
    # As convert_imageset: the file's own bytes when the pixels are unchanged and the format is
    # the one asked for (so no second lossy JPEG pass); otherwise the pixels are re-encoded.
    unchanged = not (height and width) and not options.gray
    if unchanged and (options.encode_type is None or own == options.encode_type):
        return image, datum_from_image(image, entry.label, encoded=data)
    # A changed BMP/GIF/... with no --encode-type: we write PNG or JPEG only, so PNG (lossless).
    fmt = target if target in ENCODE_TYPES else "png"
    return image, datum_from_image(image, entry.label,
                                   encoded=encode_image(image, fmt, quality=options.quality))


def _options(resize, gray, encoded, encode_type, quality) -> ImageOptions:
    height, width = resize
    if height < 0 or width < 0 or bool(height) != bool(width):
        raise ConfigError(f"resize {height}x{width}: give both a height and a width above 0 "
                          f"(or neither, to keep each image's size)")
    if encode_type is not None:
        encode_type = _writable_format(encode_type.lower())
        if encode_type not in ENCODE_TYPES:
            raise ConfigError(f"encode type '{encode_type}': use png or jpg")
    if not 1 <= quality <= 100:
        raise ConfigError(f"JPEG quality {quality}: use 1 to 100")
    # An encode type means encoded records, as in convert_imageset.
    return ImageOptions((height, width), gray, encode_type, encoded or encode_type is not None,
                        quality)


def _writable_format(name: str) -> str:
    return "jpg" if name in ("jpg", "jpeg") else name


def _name(path: Path, root: Path) -> str:
    """The path as it goes into the key: relative to the input folder, with '/'."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def _reason(error: Exception, path: Path) -> str:
    """Why an image was skipped, without the path the caller shows anyway."""
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error).removeprefix(f"{path}: ")


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)
