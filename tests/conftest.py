"""Shared fixtures: the backends to test on, the shared data folder, torch availability."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _gpu_available() -> bool:
    try:
        from netrun.backends import get_backend

        get_backend("gpu")
        return True
    except Exception:
        return False


GPU = _gpu_available()
DEVICES = ["cpu"] + (["gpu"] if GPU else [])


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request):
    """Every backend; GPU cases skip cleanly without CuPy or a device."""
    if request.param == "gpu" and not GPU:
        pytest.skip("no CuPy or no CUDA device")
    return request.param


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data folder (NETRUN_DATA, else ../shared/data beside the checkout)."""
    path = Path(os.environ.get("NETRUN_DATA", REPO.parent / "shared" / "data"))
    if not (path / "mnist" / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip(f"MNIST test split not found under {path}")
    return path
