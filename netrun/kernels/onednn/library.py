"""Finding and loading oneDNN's shared library (the optional `netrun[onednn]` engine).

The engine is the `onednn-cpu-gomp` wheel's libdnnl.so.3, reached through its C API with
ctypes: nothing is compiled at install. It is looked for next to the running Python
(sys.prefix/lib, where the wheel puts it), then on the loader's path. NETRUN_ONEDNN=off (or
0/false/no) switches it off, so that tests and users can run the pure NumPy paths with the
wheel installed. The library is loaded once per process, on first use, so `import netrun`
stays fast.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from pathlib import Path

from netrun.errors import BackendError
from netrun.kernels import omp

ENV = "NETRUN_ONEDNN"
SONAME = "libdnnl.so.3"
INSTALL_HINT = "install netrun[onednn] (pip install onednn-cpu-gomp)"
OFF_VALUES = ("0", "off", "false", "no")

_LOCK = threading.Lock()
# The one loaded library, or the reason it could not load (a string). Set once per process:
# a shared library cannot be unloaded, so this is a fact about the process, not mutable state.
_LOADED: dict[str, object] = {}


def switched_off() -> bool:
    """Whether NETRUN_ONEDNN turns the engine off."""
    return os.environ.get(ENV, "").strip().lower() in OFF_VALUES


def candidates() -> list[str]:
    """Paths (or sonames for the loader) to try, in order."""
    found = [str(Path(sys.prefix) / "lib" / SONAME)]
    if sys.base_prefix != sys.prefix:
        found.append(str(Path(sys.base_prefix) / "lib" / SONAME))
    found.append(SONAME)
    located = ctypes.util.find_library("dnnl")
    if located:
        found.append(located)
    return found


def load() -> ctypes.CDLL | None:
    """The library, or None when it is switched off or cannot be loaded (see `why_not`)."""
    if switched_off():
        return None
    if "lib" not in _LOADED and "error" not in _LOADED:
        with _LOCK:
            if "lib" not in _LOADED and "error" not in _LOADED:
                _load_once()
    lib = _LOADED.get("lib")
    return lib  # type: ignore[return-value]


def why_not() -> str:
    """Why the engine is not available ('' when it is)."""
    if switched_off():
        return f"oneDNN is switched off ({ENV}={os.environ.get(ENV)})"
    if load() is not None:
        return ""
    return str(_LOADED.get("error", "oneDNN could not be loaded"))


def require() -> ctypes.CDLL:
    """The library; BackendError with what to do when the user asked for it and it is absent."""
    lib = load()
    if lib is None:
        raise BackendError(f"the oneDNN engine is not available: {why_not()}")
    return lib


def _load_once() -> None:
    omp.load_runtime()   # GNU OpenMP first, with netrun's settings (netrun.kernels.omp)
    errors = []
    for path in candidates():
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            _LOADED["lib"] = ctypes.CDLL(path)
            return
        except OSError as e:
            errors.append(f"{path}: {e}")
    if any("libgomp" in e for e in errors):
        _LOADED["error"] = ("oneDNN's library was found but needs GNU OpenMP (libgomp.so.1), "
                            "which is not installed: install it with the system's package "
                            "manager (e.g. apt-get install libgomp1). " + "; ".join(errors))
    else:
        _LOADED["error"] = f"{SONAME} was not found; {INSTALL_HINT}"
