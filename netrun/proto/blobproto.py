"""Caffe's BlobProto (a mean image `.binaryproto`, a caffemodel's weights), read and written.

    BlobProto   num=1, channels=2, height=3, width=4 (legacy 4-D shape), data=5 (float,
                packed or not), shape=7 (BlobShape: dim=1, int64), double_data=8
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from netrun.errors import CheckpointError
from netrun.proto.wire import LENGTH, VARINT, WireError, Writer, as_ints, as_reals, iter_fields


def parse_blob(buf: memoryview | bytes) -> np.ndarray:
    """A BlobProto as a float32 array of its shape (legacy num/channels/height/width too)."""
    dims: list[int] = []
    legacy: dict[int, int] = {}
    chunks: list[np.ndarray] = []
    doubles: list[np.ndarray] = []
    for number, wire, value in iter_fields(buf):
        if number in (1, 2, 3, 4) and wire == VARINT:
            legacy[number] = value
        elif number == 5:
            chunks.append(as_reals(wire, value, "<f4"))
        elif number == 8:
            doubles.append(as_reals(wire, value, "<f8"))
        elif number == 7 and wire == LENGTH:
            for n, w, v in iter_fields(value):
                if n == 1:
                    dims += as_ints(w, v)
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


def blob_bytes(array: np.ndarray) -> bytes:
    """A BlobProto of `array` (float32 data, its shape as BlobShape; a 4-D array also gets the
    legacy num/channels/height/width, which old Caffe readers of mean files look at)."""
    array = np.asarray(array, np.float32)
    w = Writer()
    if array.ndim == 4:
        for number, dim in zip((1, 2, 3, 4), array.shape):
            w.int(number, dim)
    w.packed_floats(5, array.reshape(-1))
    w.bytes(7, Writer().packed_ints(1, array.shape).to_bytes())
    return w.to_bytes()


def read_blobproto(path: str | Path) -> np.ndarray:
    """Read a .binaryproto file (one BlobProto, e.g. Caffe's mean image)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
    try:
        return parse_blob(data)
    except WireError as e:
        raise WireError(f"{path}: not a readable BlobProto ({e})") from None
