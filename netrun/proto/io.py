"""Read and write NetDef files, picking the format from the file name."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable

from netrun.errors import NetrunError
from netrun.proto.defs import NetDef
from netrun.proto.netdef_yaml import netdef_from_yaml, netdef_to_yaml
from netrun.proto.pbtxt import netdef_from_text, netdef_to_text

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


def read_text(path: str | os.PathLike) -> str:
    """The file's text as UTF-8; NetrunError("cannot read ...") instead of OSError."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NetrunError(f"cannot read '{path}': no such file") from None
    except IsADirectoryError:
        raise NetrunError(f"cannot read '{path}': it is a directory") from None
    except UnicodeDecodeError as e:
        raise NetrunError(f"cannot read '{path}': not UTF-8 text (byte 0x{e.object[e.start]:02x} "
                          f"at offset {e.start})") from None
    except OSError as e:
        raise NetrunError(f"cannot read '{path}': {e.strerror or e}") from None


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
    # a crash mid-write leaves the old file, never a half-written one; the temporary name is
    # per process so concurrent writers do not share it
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise NetrunError(f"cannot write '{path}': {e.strerror or e}") from None
