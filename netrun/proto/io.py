"""Read and write NetDef files, picking the format from the file name."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, NamedTuple

from netrun.errors import NetrunError
from netrun.proto.defs import NetDef
from netrun.proto.netdef_binary import netdef_from_bytes, netdef_to_bytes
from netrun.proto.netdef_yaml import netdef_from_yaml, netdef_to_yaml
from netrun.proto.pbtxt import netdef_from_text, netdef_to_text
from netrun.util.atomic import atomic_open, write_text_atomic
from netrun.util.files import read_text


class Codec(NamedTuple):
    """One NetDef file format: its reader (contents, file name) and writer."""

    read: Callable[..., NetDef]
    write: Callable[[NetDef], str | bytes]
    binary: bool = False


_TEXT = Codec(netdef_from_text, netdef_to_text)
_YAML = Codec(netdef_from_yaml, netdef_to_yaml)
_BINARY = Codec(netdef_from_bytes, netdef_to_bytes, binary=True)
# Longest suffix first, so "x.pb.txt" is text format whatever ".txt" maps to.
_FORMATS: dict[str, Codec] = {
    ".pb.txt": _TEXT,
    ".pbtxt": _TEXT,
    ".txt": _TEXT,
    ".pb": _BINARY,
    ".yaml": _YAML,
    ".yml": _YAML,
}
# Suffixes of the Caffe2 NetDef formats (text and binary protobuf), for callers that tell a
# Caffe2 init net from other weight files.
CAFFE2_SUFFIXES = (".pb.txt", ".pbtxt", ".pb")


def _format_of(path: Path) -> Codec:
    name = path.name.lower()
    for suffix, codec in _FORMATS.items():
        if name.endswith(suffix):
            return codec
    hint = (" (a Caffe .prototxt is a model, not a NetDef: load it with netrun.load_model)"
            if name.endswith(".prototxt") else "")
    raise NetrunError(f"cannot tell the format of '{path}': expected one of "
                      f"{', '.join(_FORMATS)}{hint}")


def is_caffe2_netdef(path: str | os.PathLike) -> bool:
    """Whether the file name says Caffe2 NetDef (.pb binary, .pbtxt/.pb.txt text)."""
    return Path(path).name.lower().endswith(CAFFE2_SUFFIXES)


def load_netdef(path: str | os.PathLike) -> NetDef:
    """Load a NetDef from .pb (Caffe2 binary protobuf), .pbtxt/.pb.txt/.txt (Caffe2 text
    format) or .yaml/.yml."""
    path = Path(path)
    codec = _format_of(path)
    if codec.binary:
        return codec.read(_read_bytes(path), str(path))
    return codec.read(read_text(path), str(path))


def save_netdef(net: NetDef, path: str | os.PathLike) -> None:
    """Write a NetDef in the format its extension names, atomically (temp file, rename)."""
    path = Path(path)
    codec = _format_of(path)
    data = codec.write(net)
    try:
        if codec.binary:
            with atomic_open(path, "wb") as f:
                f.write(data)
        else:
            write_text_atomic(path, data)
    except OSError as e:
        raise NetrunError(f"cannot write '{path}': {e.strerror or e}") from None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise NetrunError(f"cannot read '{path}': no such file") from None
    except IsADirectoryError:
        raise NetrunError(f"cannot read '{path}': it is a directory") from None
    except OSError as e:
        raise NetrunError(f"cannot read '{path}': {e.strerror or e}") from None
