"""The protobuf wire format, read and written by hand (no protobuf library, no generated code).

netrun reads a handful of binary messages: Caffe's NetParameter and BlobProto, Caffe's `Datum`
records in LMDB/LevelDB, and Caffe2's NetDef. A message is a sequence of (key, payload) pairs
where key = field number << 3 | wire type; unknown fields are skipped, which is what keeps
files from newer or forked schemas readable. The readers here check every length against the
buffer, so truncated or crafted bytes raise WireError and never read past the end.
"""
from __future__ import annotations

import struct
from typing import Iterable, Iterator

import numpy as np

from netrun.errors import CheckpointError

VARINT, FIXED64, LENGTH, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5


class WireError(CheckpointError):
    """Bytes that are not the protobuf message they should be."""


# Reading -----------------------------------------------------------------------------------
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


def iter_fields(buf: memoryview | bytes) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) for each field: an int for varints, a memoryview of
    the payload for length-delimited and fixed-size fields."""
    buf = memoryview(buf)
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
        else:  # groups (3, 4) are long deprecated; neither Caffe nor Caffe2 writes them
            raise WireError(f"field {number} has unsupported wire type {wire}")
        yield number, wire, value


def as_text(value) -> str:
    """A string field's value (UTF-8; undecodable bytes replaced, as names are only shown)."""
    return bytes(as_bytes(value)).decode("utf-8", "replace")


def as_bytes(value) -> memoryview:
    """A bytes field's payload."""
    if not isinstance(value, memoryview):
        raise WireError("a string or bytes field is not length-delimited")
    return value


def as_ints(wire: int, value) -> list[int]:
    """A repeated integer field occurrence, packed (LENGTH) or not (VARINT); unsigned."""
    if wire == VARINT:
        return [value]
    if wire != LENGTH:
        raise WireError("an integer field has a fixed-size wire type")
    out, pos = [], 0
    while pos < len(value):
        v, pos = read_varint(value, pos)
        out.append(v)
    return out


def signed(value: int, bits: int = 64) -> int:
    """An int32/int64 field's value: varints carry negatives as two's complement."""
    value &= (1 << 64) - 1
    if bits == 32:
        value &= 0xFFFFFFFF
        return value - (1 << 32) if value >= 1 << 31 else value
    return value - (1 << 64) if value >= 1 << 63 else value


def as_reals(wire: int, value, dtype: str) -> np.ndarray:
    """A repeated float ('<f4') or double ('<f8') occurrence: packed or one fixed-size value."""
    if wire not in (LENGTH, FIXED32, FIXED64):
        raise WireError("a float field has a varint wire type")
    if len(value) % np.dtype(dtype).itemsize:
        raise WireError("a packed float field has a partial element")
    return np.frombuffer(value, dtype=dtype)


def as_real(wire: int, value) -> float:
    """A singular float (FIXED32) or double (FIXED64) field's value."""
    if wire == FIXED32:
        return float(struct.unpack("<f", value)[0])
    if wire == FIXED64:
        return float(struct.unpack("<d", value)[0])
    raise WireError("a float field is not fixed-size")


# Writing -----------------------------------------------------------------------------------
def varint(value: int) -> bytes:
    """The base-128 varint of `value` (negatives as 64-bit two's complement, as protobuf)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    """A field's key."""
    return varint(number << 3 | wire)


class Writer:
    """Builds one message field by field, in the order written (callers write in field-number
    order, as protobuf's own serializers do, so output is canonical and deterministic)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def int(self, number: int, value: int) -> "Writer":
        """A varint field (int32/int64/uint/bool/enum)."""
        self._parts += [key(number, VARINT), varint(int(value))]
        return self

    def bytes(self, number: int, value: bytes | str) -> "Writer":
        """A length-delimited field: bytes, a string (UTF-8) or an encoded sub-message."""
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        self._parts += [key(number, LENGTH), varint(len(data)), data]
        return self

    def float(self, number: int, value: float) -> "Writer":
        """A singular float (fixed32) field."""
        self._parts += [key(number, FIXED32), struct.pack("<f", value)]
        return self

    def packed_floats(self, number: int, values) -> "Writer":
        """A packed repeated float field (skipped when empty, as protobuf does)."""
        data = np.ascontiguousarray(values, dtype="<f4").tobytes()
        return self.bytes(number, data) if data else self

    def packed_ints(self, number: int, values: Iterable[int]) -> "Writer":
        """A packed repeated varint field (skipped when empty)."""
        data = b"".join(varint(int(v)) for v in values)
        return self.bytes(number, data) if data else self

    def to_bytes(self) -> bytes:
        """The serialized message."""
        return b"".join(self._parts)
