"""The CPU backend on NumPy."""
from __future__ import annotations

import platform
from typing import Any

import numpy as np

from netrun.backends.base import Backend


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CPUBackend(Backend):
    """Host memory, NumPy kernels; synchronize is a no-op."""

    name = "cpu"
    xp = np

    def __init__(self):
        self._model = _cpu_model()

    @property
    def device(self) -> str:
        return "cpu"

    @property
    def device_name(self) -> str:
        return self._model

    def to_device(self, array: Any) -> np.ndarray:
        return np.array(array, copy=True, order="C")

    def to_host(self, array: Any) -> np.ndarray:
        return np.array(array, copy=True)

    def new_rng(self, seed: int | None) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(seed))
