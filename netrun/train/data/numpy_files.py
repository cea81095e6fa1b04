"""Reading `.npy` and `.npz` files that may be damaged or hostile: NetrunError, never a crash.

Each array's header is read and checked against the bytes the file (or the archive member)
really holds before NumPy allocates the array, so a header that claims a huge shape is
refused instead of reserving memory for it. Pickled (object) arrays are refused too.
"""
from __future__ import annotations

import tokenize
import zipfile
import zlib
from pathlib import Path
from typing import IO, Iterator

import numpy as np
from numpy.lib import format as npy_format

from netrun.errors import NetrunError

# What NumPy and zipfile raise on damaged input (a bad header is a ValueError or, in the
# Python 2 header path, a TokenError or SyntaxError; a bad member a BadZipFile or zlib.error;
# an unknown compression method NotImplementedError; an encrypted member RuntimeError).
_DAMAGE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, tokenize.TokenError,
           SyntaxError, KeyError, OverflowError, NotImplementedError, RuntimeError)


# Deflate expands at most about 1032 times: a compressed member cannot hold more than that.
_MAX_RATIO = 1032


def _check_header(f: IO[bytes], size: int, where: str) -> None:
    """Refuse an array whose header is malformed or claims more than the `size` bytes of the
    stream hold."""
    version = npy_format.read_magic(f)
    # The header's own length comes first: check it, or NumPy reads up to 4 GiB to find out.
    width = 2 if version == (1, 0) else 4
    length = int.from_bytes(f.read(width), "little")
    if length > size - f.tell():
        raise NetrunError(f"{where}: the array header claims {length:,} bytes, more than the "
                          f"{size:,}-byte file holds; the file is truncated or damaged")
    f.seek(-width, 1)
    if version == (1, 0):
        shape, _, dtype = npy_format.read_array_header_1_0(f)
    else:
        shape, _, dtype = npy_format.read_array_header_2_0(f)
    if dtype.hasobject:
        raise ValueError("the array holds Python objects (pickled data), which netrun "
                         "does not load")
    need = dtype.itemsize
    for dim in shape:
        need *= dim                  # Python ints: no overflow on a hostile shape
    size -= f.tell()
    if need > size:
        raise NetrunError(f"{where}: the header describes a {'×'.join(map(str, shape))} "
                          f"{dtype} array ({need:,} bytes) but only {size:,} bytes follow; "
                          f"the file is truncated or damaged")


def load_npy(path: str | Path) -> np.ndarray:
    """The array of a `.npy` file (NetrunError naming the file if it is damaged)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            _check_header(f, path.stat().st_size, str(path))
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except NetrunError:
        raise
    except _DAMAGE as e:
        raise NetrunError(f"{path}: cannot read as .npy ({_why(e)})") from None


class NpzArchive:
    """The arrays of an `.npz` file, each checked before it is read."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
            members = self._zip.namelist()
        except _DAMAGE as e:
            raise NetrunError(f"{self.path}: cannot read as .npz ({_why(e)})") from None
        # np.savez names members "<key>.npy"; other zip writers may leave the suffix out
        self._members = {m.removesuffix(".npy"): m for m in members}
        self.files = list(self._members)

    def __contains__(self, key: str) -> bool:
        return key in self._members

    def __getitem__(self, key: str) -> np.ndarray:
        where = f"{self.path}: array '{key}'"
        try:
            member = self._zip.getinfo(self._members[key])
            size = member.file_size
            if member.compress_type != zipfile.ZIP_STORED:
                size = min(size, member.compress_size * _MAX_RATIO + 1024)
            with self._zip.open(member) as f:
                _check_header(f, size, where)
            with self._zip.open(member) as f:
                return np.lib.format.read_array(f, allow_pickle=False)
        except NetrunError:
            raise
        except _DAMAGE as e:
            raise NetrunError(f"{self.path}: cannot read as .npz: array '{key}': {_why(e)}"
                              ) from None

    def close(self) -> None:
        """Close the archive."""
        self._zip.close()

    def __enter__(self) -> "NpzArchive":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)


def _why(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text[:200]
