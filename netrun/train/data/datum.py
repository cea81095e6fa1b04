"""Caffe's Datum, the record of its LMDB and LevelDB databases, read and written.

    Datum   channels=1, height=2, width=3 (int32), data=4 (bytes: raw C x H x W uint8
            pixels, or an image file when encoded), label=5 (int32), float_data=6
            (repeated float), encoded=7 (bool)

convert_imageset writes raw records, or encoded ones (JPEG/PNG file bytes, channels, height
and width left unset); float_data carries non-image features.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from netrun.errors import DataError
from netrun.proto.wire import (
    VARINT,
    WireError,
    Writer,
    as_bytes,
    as_reals,
    iter_fields,
    signed,
)
from netrun.train.data.images import decode_image

CHANNELS, HEIGHT, WIDTH, DATA, LABEL, FLOAT_DATA, ENCODED = 1, 2, 3, 4, 5, 6, 7
_INT_FIELDS = {CHANNELS: "channels", HEIGHT: "height", WIDTH: "width", LABEL: "label",
               ENCODED: "encoded"}


@dataclass
class Datum:
    """One Caffe Datum: an image (raw pixels or an encoded file) or float features, and a
    label."""

    channels: int = 0
    height: int = 0
    width: int = 0
    data: bytes = b""
    label: int = 0
    float_data: np.ndarray | None = None
    encoded: bool = False


def encode_datum(datum: Datum) -> bytes:
    """The serialized Datum, fields in number order; unset (zero, empty) fields are left
    out except the label, which Caffe always sets."""
    w = Writer()
    for number, value in ((CHANNELS, datum.channels), (HEIGHT, datum.height),
                          (WIDTH, datum.width)):
        if value:
            w.int(number, value)
    if datum.data:
        w.bytes(DATA, datum.data)
    w.int(LABEL, datum.label)
    if datum.float_data is not None:
        w.packed_floats(FLOAT_DATA, np.asarray(datum.float_data, np.float32).reshape(-1))
    if datum.encoded:
        w.int(ENCODED, 1)
    return w.to_bytes()


def decode_datum(buf: bytes | memoryview, where: str = "record") -> Datum:
    """Parse a serialized Datum; DataError naming `where` for damaged bytes."""
    datum, floats = Datum(), []
    try:
        for number, wire, value in iter_fields(buf):
            if number in _INT_FIELDS:
                _expect(wire, VARINT, number)
                if number == ENCODED:
                    datum.encoded = bool(value)
                else:
                    setattr(datum, _INT_FIELDS[number], signed(value, 32))
            elif number == DATA:
                datum.data = bytes(as_bytes(value))
            elif number == FLOAT_DATA:
                floats.append(as_reals(wire, value, "<f4"))
    except WireError as e:
        raise DataError(f"{where}: not a Caffe Datum ({e})") from None
    if floats:
        datum.float_data = np.concatenate(floats).astype(np.float32)
    return datum


def datum_label(buf: bytes | memoryview, where: str = "record") -> int:
    """Only the label of a serialized Datum. Pixel bytes are skipped by their length, never
    read, so a scan over a memory-mapped database touches a page or two per record."""
    label = 0
    try:
        for number, wire, value in iter_fields(buf):
            if number == LABEL:
                _expect(wire, VARINT, number)
                label = signed(value, 32)
    except WireError as e:
        raise DataError(f"{where}: not a Caffe Datum ({e})") from None
    return label


def _expect(wire: int, wanted: int, number: int) -> None:
    if wire != wanted:
        raise WireError(f"field {number} has wire type {wire}, expected {wanted}")


def datum_image(datum: Datum, color: bool | None = None, where: str = "record") -> np.ndarray:
    """The example a Datum holds, C x H x W: uint8 pixels (raw, or decoded from an encoded
    image; `color` as in decode_image, None keeping what the image has) or float32 features
    from float_data."""
    if datum.encoded:
        return decode_image(datum.data, color, where)
    shape = (datum.channels, datum.height, datum.width)
    if datum.data:
        return _sized(np.frombuffer(datum.data, np.uint8), shape, where, "pixel bytes").copy()
    if datum.float_data is not None and datum.float_data.size:
        return _sized(np.asarray(datum.float_data, np.float32), shape, where, "float_data values")
    raise DataError(f"{where}: the record holds no data (neither pixels nor float_data)")


def _sized(values: np.ndarray, shape: tuple[int, int, int], where: str, what: str) -> np.ndarray:
    if min(shape) < 1 or math.prod(shape) != values.size:
        raise DataError(f"{where}: the record says channels x height x width = "
                        f"{' x '.join(map(str, shape))} but holds {values.size} {what}")
    return values.reshape(shape)


def datum_from_image(image: np.ndarray, label: int, encoded: bytes | None = None) -> Datum:
    """A Datum of an example: the given encoded file bytes (channels, height and width left
    0, as convert_imageset writes them), else raw C x H x W pixels (uint8 as `data`, floats
    as float_data)."""
    if encoded is not None:
        return Datum(data=bytes(encoded), label=int(label), encoded=True)
    image = np.asarray(image)
    if image.ndim != 3 or min(image.shape) < 1:
        raise DataError(f"datum_from_image: expected a C x H x W example, got shape "
                        f"{image.shape}")
    c, h, w = image.shape
    if image.dtype == np.uint8:
        return Datum(c, h, w, np.ascontiguousarray(image).tobytes(), int(label))
    if np.issubdtype(image.dtype, np.floating):
        return Datum(c, h, w, b"", int(label), image.astype(np.float32).reshape(-1))
    raise DataError(f"datum_from_image: expected uint8 pixels or float features, got "
                    f"{image.dtype}")
