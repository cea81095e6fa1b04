"""A protobuf wire-format reader for the few Caffe messages netrun needs (no protobuf library).

Binary `.caffemodel` files are a serialized NetParameter; `.binaryproto` mean files are one
BlobProto. Field numbers are Caffe's (caffe.proto):

    NetParameter       name=1, layers=2 (V1LayerParameter), layer=100 (LayerParameter)
    LayerParameter     name=1, type=2, blobs=7
    V1LayerParameter   name=4, type=5 (an enum), blobs=6
    BlobProto          num=1, channels=2, height=3, width=4 (legacy 4-D shape), data=5
                       (float, packed or not), shape=7 (BlobShape: dim=1, int64),
                       double_data=8
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from netrun.errors import CheckpointError

VARINT, FIXED64, LENGTH, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5


class WireError(CheckpointError):
    """Bytes that are not the protobuf message they should be."""


def read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """(value, next position) of the base-128 varint at `pos`."""
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def iter_fields(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) for each field: an int for varints, a memoryview of
    the payload for length-delimited and fixed-size fields."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == VARINT:
            value, pos = read_varint(buf, pos)
        elif wire == LENGTH:
            size, pos = read_varint(buf, pos)
            if pos + size > end:
                raise WireError(f"field {number} runs past the end of its message")
            value, pos = buf[pos:pos + size], pos + size
        elif wire in (FIXED64, FIXED32):
            size = 8 if wire == FIXED64 else 4
            if pos + size > end:
                raise WireError(f"field {number} runs past the end of its message")
            value, pos = buf[pos:pos + size], pos + size
        else:  # groups (3, 4) are long deprecated; Caffe never writes them
            raise WireError(f"field {number} has unsupported wire type {wire}")
        yield number, wire, value


def _text(value) -> str:
    if not isinstance(value, memoryview):
        raise WireError("a string field is not length-delimited")
    return bytes(value).decode("utf-8", "replace")


def _ints(wire: int, value) -> list[int]:
    """A repeated integer field occurrence, packed (LENGTH) or not (VARINT)."""
    if wire == VARINT:
        return [value]
    if wire != LENGTH:
        raise WireError("an integer field has a fixed-size wire type")
    out, pos = [], 0
    while pos < len(value):
        v, pos = read_varint(value, pos)
        out.append(v)
    return out


def _reals(wire: int, value, dtype: str) -> np.ndarray:
    """A repeated float/double occurrence: packed (LENGTH) or one fixed-size value."""
    if wire not in (LENGTH, FIXED32, FIXED64):
        raise WireError("a float field has a varint wire type")
    if len(value) % np.dtype(dtype).itemsize:
        raise WireError("a packed float field has a partial element")
    return np.frombuffer(value, dtype=dtype)


def parse_blob(buf: memoryview) -> np.ndarray:
    """A BlobProto as a float32 array of its shape (legacy num/channels/height/width too)."""
    dims: list[int] = []
    legacy: dict[int, int] = {}
    chunks: list[np.ndarray] = []
    doubles: list[np.ndarray] = []
    for number, wire, value in iter_fields(buf):
        if number in (1, 2, 3, 4) and wire == VARINT:
            legacy[number] = value
        elif number == 5:
            chunks.append(_reals(wire, value, "<f4"))
        elif number == 8:
            doubles.append(_reals(wire, value, "<f8"))
        elif number == 7 and wire == LENGTH:
            for n, w, v in iter_fields(value):
                if n == 1:
                    dims += _ints(w, v)
    data = np.concatenate(chunks or doubles or [np.zeros(0, np.float32)]).astype(np.float32)
    if dims:
        shape = tuple(dims)
    elif legacy:
        shape = tuple(legacy.get(k, 0) for k in (1, 2, 3, 4))
    else:
        shape = (data.size,)
    # BlobShape.dim is an int64: a varint of 2**63 or more is a negative dimension.
    if any(not 0 <= d < 2**63 for d in shape):
        raise WireError(f"a blob has a negative dimension in its shape {shape}")
    # Python ints: dims whose product overflows int64 must not wrap into a plausible count.
    if math.prod(shape) != data.size:
        raise WireError(f"a blob of shape {shape} ({math.prod(shape):,} values) holds "
                        f"{data.size:,} values")
    return data.reshape(shape)


@dataclass
class LayerBlobs:
    """One layer of a caffemodel: name, type (V1 enums as their number) and blobs."""

    name: str
    type: str
    blobs: list[np.ndarray] = field(default_factory=list)


def parse_layer(buf: memoryview, v1: bool) -> LayerBlobs:
    """A LayerParameter (or V1LayerParameter): its name, type and blobs; the rest is skipped."""
    name_no, type_no, blobs_no = (4, 5, 6) if v1 else (1, 2, 7)
    layer = LayerBlobs("", "")
    for number, wire, value in iter_fields(buf):
        if number == name_no:
            layer.name = _text(value)
        elif number == type_no:
            layer.type = str(value) if wire == VARINT else _text(value)
        elif number == blobs_no and wire == LENGTH:
            layer.blobs.append(parse_blob(value))
    return layer


def parse_net(data: bytes) -> tuple[str, list[LayerBlobs]]:
    """(net name, layers) of a serialized NetParameter."""
    buf = memoryview(data)
    name, layers = "", []
    for number, wire, value in iter_fields(buf):
        if number == 1 and wire == LENGTH:
            name = _text(value)
        elif number in (2, 100) and wire == LENGTH:
            layers.append(parse_layer(value, v1=number == 2))
    return name, layers


def read_caffemodel(path: str | Path) -> tuple[str, list[LayerBlobs]]:
    """Read a binary .caffemodel: (net name, layers with their blobs)."""
    data = _read(path)
    try:
        return parse_net(data)
    except WireError as e:
        raise WireError(f"{path}: not a readable binary caffemodel ({e})") from None


def read_blobproto(path: str | Path) -> np.ndarray:
    """Read a .binaryproto file (one BlobProto, e.g. Caffe's mean image)."""
    try:
        return parse_blob(memoryview(_read(path)))
    except WireError as e:
        raise WireError(f"{path}: not a readable BlobProto ({e})") from None


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
