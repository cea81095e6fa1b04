"""GPU test fixtures: every test runs on the host emulator and, where there is one, a real GPU."""
from __future__ import annotations

import shutil

import pytest


def _real_gpu() -> bool:
    try:
        from netrun.backends import get_backend

        get_backend("gpu")
        return True
    except Exception:
        return False


GPU = _real_gpu()


@pytest.fixture(scope="module", params=["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def gpu(request):
    """The GPU backend: the real one on CuPy (skipped without a device), or GPUBackend running
    on the CuPy stand-in of tests/gpu/emulator.py (skipped without a host C++ compiler)."""
    if request.param == "cuda":
        if not GPU:
            pytest.skip("no CuPy or no CUDA device")
        from netrun.backends import get_backend

        yield get_backend("gpu")
        return
    if shutil.which("g++") is None:
        pytest.skip("the GPU emulator compiles CUDA sources with g++, which is not installed")
    from tests.gpu.emulator import emulated_gpu

    with emulated_gpu() as backend:
        yield backend


@pytest.fixture(scope="module")
def emulated():
    """The emulated GPU backend only (tests of what only the emulator can observe)."""
    if shutil.which("g++") is None:
        pytest.skip("the GPU emulator compiles CUDA sources with g++, which is not installed")
    from tests.gpu.emulator import emulated_gpu

    with emulated_gpu() as backend:
        yield backend


@pytest.fixture
def cuda():
    """The real GPU backend (skipped without CuPy and a CUDA device)."""
    if not GPU:
        pytest.skip("no CuPy or no CUDA device")
    from netrun.backends import get_backend

    return get_backend("gpu")
