"""IDX files (the MNIST format), gzip-compressed or raw.

Layout: two zero bytes, a type byte, a rank byte, then `rank` big-endian uint32 sizes and
the row-major data, big-endian. MNIST images are 0x00000803 (uint8, N x rows x cols) and
labels 0x00000801 (uint8, N).
"""
from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from netrun.errors import NetrunError

IMAGES_MAGIC = 0x803
LABELS_MAGIC = 0x801

# Type byte -> big-endian dtype, as in LeCun's format description.
_DTYPES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"),
           0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_CODES = {dt.newbyteorder("="): code for code, dt in _DTYPES.items()}


def read_idx(path: str | os.PathLike, magic: int | None = None) -> np.ndarray:
    """Read an IDX file (gzip or raw); with `magic`, insist on that magic number."""
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise NetrunError(f"{path}: not an IDX file ({len(raw)} bytes, shorter than a header)")
    zero, code, rank = struct.unpack(">HBB", raw[:4])
    found = (code << 8) | rank
    if zero != 0 or code not in _DTYPES or rank == 0:
        want = f"0x{magic:08x}" if magic is not None else "0x000008xx"
        raise NetrunError(f"{path}: not an IDX file (magic number 0x{raw[:4].hex()}, "
                          f"expected {want})")
    if magic is not None and found != magic:
        raise NetrunError(f"{path}: IDX magic number 0x{found:08x}, expected 0x{magic:08x} "
                          f"({_describe(magic)})")
    header = 4 + 4 * rank
    if len(raw) < header:
        raise NetrunError(f"{path}: truncated IDX header ({len(raw)} bytes, needs {header})")
    dims = struct.unpack(f">{rank}I", raw[4:header])
    dtype = _DTYPES[code]
    expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        state = "truncated" if len(raw) < expected else "has trailing bytes"
        shape = " x ".join(map(str, dims))
        raise NetrunError(f"{path}: IDX file {state}: a {shape} {dtype.name} array needs "
                          f"{expected} bytes, the file has {len(raw)}")
    data = np.frombuffer(raw, dtype, offset=header).reshape(dims)
    return np.array(data, dtype.newbyteorder("="))   # native order, writable


def write_idx(path: str | os.PathLike, array: np.ndarray, compress: bool | None = None) -> None:
    """Write `array` as IDX; gzip it when `compress` (default: the name ends in .gz)."""
    path = Path(path)
    array = np.asarray(array)
    native = array.dtype.newbyteorder("=")
    if native not in _CODES:
        raise NetrunError(f"{path}: IDX cannot store dtype {array.dtype}")
    code = _CODES[native]
    header = struct.pack(">HBB", 0, code, array.ndim) + struct.pack(f">{array.ndim}I",
                                                                      *array.shape)
    body = header + np.ascontiguousarray(array, _DTYPES[code]).tobytes()
    if compress if compress is not None else path.suffix == ".gz":
        body = gzip.compress(body, mtime=0)
    path.write_bytes(body)


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise NetrunError(f"{path}: no such file") from None
    except OSError as e:
        raise NetrunError(f"{path}: cannot read ({e.strerror})") from None
    if raw[:2] != b"\x1f\x8b":               # gzip magic; anything else is read as raw IDX
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as e:
        raise NetrunError(f"{path}: corrupt or truncated gzip data ({e}); "
                          f"delete the file and fetch it again") from None


def _describe(magic: int) -> str:
    return {IMAGES_MAGIC: "uint8 images, N x rows x cols",
            LABELS_MAGIC: "uint8 labels, N"}.get(magic, "IDX")
