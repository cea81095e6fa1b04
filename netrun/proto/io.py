"""Read and write NetDef files, picking the format from the file name."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from netrun.errors import NetrunError
from netrun.proto.defs import NetDef
from netrun.proto.netdef_yaml import netdef_from_yaml, netdef_to_yaml
from netrun.proto.pbtxt import netdef_from_text, netdef_to_text
from netrun.util.atomic import write_text_atomic
from netrun.util.files import read_text

# Longest suffix first, so "x.pb.txt" is text format whatever ".txt" maps to.
_FORMATS: dict[str, tuple[Callable[[str, str | None], NetDef], Callable[[NetDef], str]]] = {
    ".pb.txt": (netdef_from_text, netdef_to_text),
    ".pbtxt": (netdef_from_text, netdef_to_text),
    ".txt": (netdef_from_text, netdef_to_text),
    ".yaml": (netdef_from_yaml, netdef_to_yaml),
    ".yml": (netdef_from_yaml, netdef_to_yaml),
}


def _format_of(path: Path):
    name = path.name.lower()
    for suffix, codec in _FORMATS.items():
        if name.endswith(suffix):
            return codec
    hint = (" (a Caffe .prototxt is a model, not a NetDef: load it with netrun.load_model)"
            if name.endswith(".prototxt") else "")
    raise NetrunError(f"cannot tell the format of '{path}': expected one of "
                      f"{', '.join(_FORMATS)}{hint}")


def load_netdef(path: str | os.PathLike) -> NetDef:
    """Load a NetDef from .pbtxt/.pb.txt/.txt (Caffe2 text format) or .yaml/.yml."""
    path = Path(path)
    read, _ = _format_of(path)
    return read(read_text(path), str(path))


def save_netdef(net: NetDef, path: str | os.PathLike) -> None:
    """Write a NetDef in the format its extension names, atomically (temp file, rename)."""
    path = Path(path)
    _, write = _format_of(path)
    text = write(net)
    try:
        write_text_atomic(path, text)
    except OSError as e:
        raise NetrunError(f"cannot write '{path}': {e.strerror or e}") from None
