"""The persistent algorithm cache: keys, atomic merged writes, concurrent writers, bad files."""
from __future__ import annotations

import json
import multiprocessing
from dataclasses import fields, replace

import pytest

from netrun.conv import cache
from netrun.conv.cache import AlgoCacheWarning, Entry, cache_key
from netrun.conv.problem import ConvProblem

BASE = ConvProblem(8, 4, 10, 12, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2, "float32", "NCHW")
ENV = {"backend": "cpu", "device": "Some CPU", "numpy": "2.0.0", "blas": "openblas 0.3",
       "threads": "2"}


def test_key_separates_problems_that_differ_in_any_field():
    keys = {"base": cache_key("forward", BASE, ENV)}
    for f in fields(ConvProblem):   # every field, including ones added later
        value = getattr(BASE, f.name)
        changed = {"dtype": "float64", "order": "NHWC"}.get(f.name, value)
        if isinstance(value, int):
            changed = value + 1
        keys[f.name] = cache_key("forward", replace(BASE, **{f.name: changed}), ENV)
    for direction in ("backward_data", "backward_filter"):
        keys[direction] = cache_key(direction, BASE, ENV)
    for name in ENV:
        keys[name] = cache_key("forward", BASE, {**ENV, name: ENV[name] + "0"})
    assert len(set(keys.values())) == len(keys), keys


def test_key_does_not_confuse_swapped_fields():
    tall = replace(BASE, kh=3, kw=5)
    wide = replace(BASE, kh=5, kw=3)
    top = replace(BASE, pt=2, pl=0)
    left = replace(BASE, pt=0, pl=2)
    assert cache_key("forward", tall, ENV) != cache_key("forward", wide, ENV)
    assert cache_key("forward", top, ENV) != cache_key("forward", left, ENV)


def test_environment_names_threads_and_libraries(monkeypatch):
    monkeypatch.delenv("NETRUN_THREADS", raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    env = cache.environment("cpu", "Some CPU")
    assert env["threads"] == "3" and env["backend"] == "cpu" and env["device"] == "Some CPU"
    assert env["numpy"] and env["blas"]
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert cache.environment("cpu", "Some CPU")["threads"] == "1"
    # a backend's own library versions (CUDA, CuPy, cuDNN on a GPU) join the fields
    gpu = cache.environment("gpu", "Some GPU", {"cupy": "13.0", "cudnn": "9.1"})
    assert gpu["cupy"] == "13.0" and gpu["cudnn"] == "9.1" and gpu["backend"] == "gpu"
    assert "cupy" not in cache.environment("cpu", "Some CPU")


def test_cache_dir_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("NETRUN_CACHE_DIR", str(tmp_path / "here"))
    assert cache.default_cache_dir() == tmp_path / "here"
    monkeypatch.delenv("NETRUN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.default_cache_dir() == tmp_path / "xdg" / "netrun" / "algos"
    path = cache.cache_file(None, "cpu", "AMD EPYC 9R14 (x86)")
    assert path == tmp_path / "xdg" / "netrun" / "algos" / "cpu-amd-epyc-9r14-x86.json"


def test_entries_survive_a_round_trip_and_merge(tmp_path):
    path = cache.cache_file(tmp_path, "cpu", "dev")
    first = cache.AlgoCache(path, "cpu", "dev")
    first.put("a", Entry({"im2col_gemm": 2.0, "fft": 1.0}, ["winograd_f4x4"], 1024, 5.0))
    second = cache.AlgoCache(path, "cpu", "dev")   # another process's view, loaded later
    second.put("b", Entry({"im2col_gemm": 3.0}))
    header, entries = cache.read_file(path)
    assert header == {"format": cache.FORMAT, "version": cache.VERSION, "backend": "cpu",
                      "device": "dev"}
    assert set(entries) == {"a", "b"}
    assert entries["a"] == Entry({"im2col_gemm": 2.0, "fft": 1.0}, ["winograd_f4x4"], 1024, 5.0)
    assert list(tmp_path.glob("*.tmp")) == []


def _writer(args) -> None:
    folder, worker, count = args
    store = cache.AlgoCache(cache.cache_file(folder, "cpu", "dev"), "cpu", "dev")
    for i in range(count):
        store.put(f"worker{worker}-entry{i}", Entry({"im2col_gemm": float(i)}))


def test_concurrent_writers_lose_no_entries_and_never_corrupt_the_file(tmp_path):
    workers, count = 4, 25
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.map(_writer, [(str(tmp_path), w, count) for w in range(workers)])
    with _no_warnings():
        _, entries = cache.read_file(cache.cache_file(tmp_path, "cpu", "dev"))
    assert len(entries) == workers * count
    assert {f"worker{w}-entry{i}" for w in range(workers) for i in range(count)} == set(entries)
    assert list(tmp_path.glob("*.tmp")) == []


class _no_warnings:
    """Fail on any AlgoCacheWarning inside the block."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error", AlgoCacheWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


BAD_FILES = {
    "truncated json": '{"format": "netrun-algo-cache", "version": 1, "entr',
    "not an object": "[1, 2, 3]",
    "another format": json.dumps({"format": "something-else", "version": 1, "entries": {}}),
    "newer version": json.dumps({"format": cache.FORMAT, "version": 99, "entries": {}}),
    "bad entry": json.dumps({"format": cache.FORMAT, "version": cache.VERSION,
                             "entries": {"k": {"times_ms": "fast"}}}),
    "binary garbage": "\x00\x01\x02\xff",
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_cache_file_is_ignored_with_a_warning_and_rebuilt(tmp_path, name):
    path = cache.cache_file(tmp_path, "cpu", "dev")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(BAD_FILES[name])
    store = cache.AlgoCache(path, "cpu", "dev")
    with pytest.warns(AlgoCacheWarning, match="ignoring the algorithm cache .* rebuilt"):
        assert store.get("k") is None
    store.put("fresh", Entry({"im2col_gemm": 1.0}))
    with _no_warnings():
        header, entries = cache.read_file(path)
    assert header["version"] == cache.VERSION and set(entries) == {"fresh"}


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    path = cache.cache_file(tmp_path, "cpu", "dev")
    store = cache.AlgoCache(path, "cpu", "dev")
    store.put("old", Entry({"im2col_gemm": 1.0}))
    before = path.read_text()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(cache.json, "dump", crash)
    # A cache that cannot be written is not worth stopping a run for: warn, keep it in memory.
    with pytest.warns(cache.AlgoCacheWarning, match="disk full"):
        store.put("new", Entry({"im2col_gemm": 2.0}))
    assert store.get("new") is not None
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_clear_removes_the_files_and_the_loaded_copies(tmp_path):
    store = cache.get_cache(tmp_path, "cpu", "dev")
    assert cache.get_cache(tmp_path, "cpu", "dev") is store   # one object per file
    store.put("k", Entry({"im2col_gemm": 1.0}))
    assert cache.list_files(tmp_path) == [store.path]
    assert cache.clear(tmp_path) == [store.path]
    assert cache.list_files(tmp_path) == []
    assert cache.get_cache(tmp_path, "cpu", "dev") is not store
    assert cache.get_cache(tmp_path, "cpu", "dev").get("k") is None
