"""Reading a Caffe image database back as images: what `data mean` and `data describe` share.

A record is a Datum: raw uint8 pixels, an encoded image file (PNG, JPEG, ...) or float_data.
`record_images` yields each one as a C x H x W array, in key order, one at a time, so a
database of any size is read in constant memory.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from netrun.errors import DataError

# on_progress(done, total): called after each record or image, for progress bars.
Progress = Callable[[int, int], None]


class Record(NamedTuple):
    """One record read back: its key, its Datum, its image and the stored value's size."""

    key: str
    datum: object          # netrun.train.data.datum.Datum
    image: np.ndarray      # C x H x W: uint8, or float32 from float_data
    size: int              # bytes of the stored value


def record_images(path: str | Path, backend: str | None = None,
                  on_progress: Progress | None = None) -> Iterator[Record]:
    """Every record of the database as a Record, in key order."""
    from netrun.train.data.databases import open_database
    from netrun.train.data.datum import datum_image, decode_datum

    try:
        reader = open_database(path, backend)
    except DataError as e:
        raise DataError(f"{e} (`netrun data build` makes a database of image files)") from None
    try:
        total = len(reader)
        for done, (key, value) in enumerate(reader.items(), 1):
            where = f"{path}: record {key_text(key)}"
            datum = decode_datum(value, where=where)
            image = datum_image(datum, where=where)
            yield Record(key_text(key), datum, image, len(value))
            if on_progress is not None:
                on_progress(done, total)
    finally:
        reader.close()


def key_text(key: bytes) -> str:
    """A record key for messages and JSON (Caffe's keys are ASCII; others are shown escaped)."""
    return key.decode("utf-8", errors="backslashreplace")


def record_kind(datum) -> str:
    """'encoded', 'float' or 'raw': how a Datum stores its image."""
    if datum.encoded:
        return "encoded"
    if datum.float_data is not None and len(datum.float_data) and not datum.data:
        return "float"
    return "raw"


def encoded_format(data: bytes) -> str:
    """The file format of an encoded record's bytes, from their magic number."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    return "other"


_MAGIC = ((b"\xff\xd8\xff", "jpeg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"BM", "bmp"),
          (b"GIF8", "gif"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"), (b"P5", "pgm"),
          (b"P6", "ppm"))
