"""Reading user files: text with a NetrunError that names the file instead of an OSError."""
from __future__ import annotations

import os
from pathlib import Path

from netrun.errors import NetrunError


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
