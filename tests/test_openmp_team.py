"""netrun.kernels.omp: when fixed chunks may run on the OpenMP team, and how GNU OpenMP is
loaded. The team's results are checked against the worker threads' in
tests/algos/test_onednn.py (oneDNN's chunks) and tests/test_determinism.py."""
from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from netrun.kernels import jit, omp, parallel


class _Loader:
    """ctypes.CDLL stand-in: records what the environment said when libgomp was loaded."""

    def __init__(self, loaded: bool):
        self.loaded, self.seen = loaded, []

    def __call__(self, name, mode=0):
        if mode == os.RTLD_NOLOAD:
            if not self.loaded:
                raise OSError("not loaded")
            return object()
        self.seen.append((name, os.environ.get("GOMP_SPINCOUNT")))
        self.loaded = True
        return object()


def _clean_env(monkeypatch):
    for var in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(omp, "_SPIN", {})   # a fresh process: nothing recorded yet


def test_first_to_load_it_loads_libgomp_with_netruns_spin_and_puts_the_environment_back(
        monkeypatch):
    _clean_env(monkeypatch)
    loader = _Loader(loaded=False)
    monkeypatch.setattr(ctypes, "CDLL", loader)
    omp.load_runtime()
    assert loader.seen == [(omp.LIBGOMP, omp.SPIN_COUNT)]
    assert "GOMP_SPINCOUNT" not in os.environ
    assert omp.short_spin()
    omp.load_runtime()   # loaded now, by netrun: the first answer stands
    assert omp.short_spin() and len(loader.seen) == 1


def test_a_libgomp_loaded_already_keeps_its_settings(monkeypatch):
    _clean_env(monkeypatch)
    loader = _Loader(loaded=True)
    monkeypatch.setattr(ctypes, "CDLL", loader)
    omp.load_runtime()
    assert loader.seen == [] and "GOMP_SPINCOUNT" not in os.environ
    assert not omp.short_spin()   # its default spin is libgomp's long one


@pytest.mark.parametrize("var,value,short", [("OMP_WAIT_POLICY", "passive", True),
                                             ("OMP_WAIT_POLICY", "active", False),
                                             ("GOMP_SPINCOUNT", "1000", True),
                                             ("GOMP_SPINCOUNT", "1000000", False),
                                             ("GOMP_SPINCOUNT", "infinite", False)])
def test_the_users_openmp_settings_win(var, value, short, monkeypatch):
    _clean_env(monkeypatch)
    monkeypatch.setenv(var, value)
    loader = _Loader(loaded=False)
    monkeypatch.setattr(ctypes, "CDLL", loader)
    omp.load_runtime()
    assert loader.seen == [] and os.environ[var] == value
    assert omp.short_spin() == short


def test_elementwise_passes_stay_on_the_workers_under_a_long_spin(monkeypatch):
    if not omp.usable(np):
        pytest.skip("Numba's OpenMP threading layer is not available here")
    monkeypatch.setattr(parallel, "thread_count", lambda: 2)
    work = 64 << 20
    monkeypatch.setattr(omp, "_SPIN", {"short": True})
    slots, starts = omp.team(np, 64, work)
    assert slots == 2 and starts.shape[0] > 2
    monkeypatch.setattr(omp, "_SPIN", {"short": False})
    assert omp.team(np, 64, work) is None


def test_switched_off_or_without_the_compiled_engine_the_workers_take_the_chunks(monkeypatch):
    monkeypatch.setenv(omp.ENV, "off")
    assert not omp.usable(np)
    monkeypatch.delenv(omp.ENV)
    with jit.disabled():
        assert not omp.usable(np)
    assert not omp.usable(object())   # another array module (CuPy) never


def test_team_size_is_the_thread_count_capped_by_the_chunks_and_one_when_nested(monkeypatch):
    if not omp.usable(np):
        pytest.skip("Numba's OpenMP threading layer is not available here")
    monkeypatch.setattr(parallel, "thread_count", lambda: 2)
    assert omp.team_size(4) == 2 and omp.team_size(1) == 1
    monkeypatch.setattr(parallel, "in_chunk", lambda: True)
    assert omp.team_size(4) == 1


def test_bounds_are_the_worker_threads_chunks():
    spans = parallel.chunk_bounds(37, work=37 << 20)
    bounds = omp.bounds(37, work=37 << 20)
    assert [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])] == spans
