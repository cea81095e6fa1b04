"""Backends (Caffe2's Contexts): one per device kind, chosen by a device string."""
from __future__ import annotations

from netrun.backends.base import Backend
from netrun.errors import BackendError

_CACHE: dict[str, Backend] = {}


def parse_device(device: str) -> tuple[str, int]:
    """'cpu' -> ('cpu', 0); 'gpu' / 'gpu:1' / 'cuda:1' -> ('gpu', 1)."""
    text = (device or "cpu").strip().lower()
    kind, _, index = text.partition(":")
    if kind == "cuda":
        kind = "gpu"
    if kind not in ("cpu", "gpu") or (index and not index.isdigit()):
        raise BackendError(f"unknown device '{device}': use cpu, gpu or gpu:N")
    return kind, int(index or 0)


def get_backend(device: str = "cpu") -> Backend:
    """The backend for a device string, created once per device."""
    kind, index = parse_device(device)
    key = f"{kind}:{index}"
    if key not in _CACHE:
        if kind == "cpu":
            from netrun.backends.cpu import CPUBackend  # lazy, as the GPU one below

            _CACHE[key] = CPUBackend()
        else:
            from netrun.backends.gpu import GPUBackend  # lazy: imports CuPy

            _CACHE[key] = GPUBackend(index)
    return _CACHE[key]


__all__ = ["Backend", "get_backend", "parse_device"]
