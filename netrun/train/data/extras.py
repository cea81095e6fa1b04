"""Optional libraries of the image and database sources, imported when first needed.

They sit behind pip extras (`images`: simplejpeg, Pillow, lmdb; `leveldb`: plyvel), so a
netrun without them still trains from its built-in sources; the error says what to install.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from netrun.errors import NetrunError

# Import name -> (what needs it, its package on PyPI, the netrun extra that installs it).
EXTRAS = {
    "simplejpeg": ("decoding and encoding JPEG images", "simplejpeg", "images"),
    "PIL": ("reading PNG, BMP, GIF, TIFF and WebP images", "pillow", "images"),
    "lmdb": ("reading and writing LMDB databases", "lmdb", "images"),
    "plyvel": ("reading and writing LevelDB databases", "plyvel", "leveldb"),
}


def optional_module(name: str) -> ModuleType:
    """The module `name` (a key of EXTRAS), or a NetrunError saying how to install it."""
    purpose, package, extra = EXTRAS[name]
    try:
        return importlib.import_module(name)
    except ImportError:
        raise NetrunError(f"{purpose} needs the Python package '{package}'; install it with: "
                          f"pip install 'netrun[{extra}]'") from None


def pillow_image() -> ModuleType:
    """PIL.Image (Pillow)."""
    optional_module("PIL")
    return importlib.import_module("PIL.Image")
