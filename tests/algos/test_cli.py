"""`netrun algos list|clear` through click's CliRunner (the group itself, before registration)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from netrun.cli.algos_cmd import algos
from netrun.conv import cache
from netrun.conv.algorithm import algorithm_names, algorithms
from netrun.conv.cache import Entry, cache_key, environment
from netrun.conv.problem import ConvProblem


def run(folder, *args, code=0, input=None):
    result = CliRunner(env={"NETRUN_CACHE_DIR": str(folder)}).invoke(algos, list(args),
                                                                     input=input)
    assert result.exit_code == code, result.output + repr(result.exception)
    return result


@pytest.fixture
def filled(tmp_path):
    p = ConvProblem(64, 20, 12, 12, 50, 5, 5)
    store = cache.AlgoCache(cache.cache_file(tmp_path, "cpu", "Test CPU"), "cpu", "Test CPU")
    key = cache_key("forward", p, environment("cpu", "Test CPU"))
    store.put(key, Entry({"im2col_gemm": 3.5, "shift_gemm": 2.25, "fft": 4.0}))
    yield tmp_path
    cache.forget_loaded()


def test_list_json_shows_entries_and_algorithms(filled):
    data = json.loads(run(filled, "list", "--json").stdout)
    assert data["cache_dir"] == str(filled)
    (f,) = data["files"]
    assert f["device"] == "Test CPU" and f["backend"] == "cpu"
    (e,) = f["entries"]
    assert e["direction"] == "forward" and e["best"] == "shift_gemm"
    assert "n64 c20 h12 w12 k50 kernel5x5" in e["problem"] and e["env"]["device"] == "Test CPU"
    assert {a["name"] for a in data["algorithms"]} == set(algorithm_names())
    for a in data["algorithms"]:   # every algorithm of both backends, under its own
        assert a["name"] in algorithms(a["backend"]), a


def test_list_table(filled):
    result = run(filled, "list")
    assert "shift_gemm" in result.stdout and "2.250" in result.stdout
    assert "1 cached problem in 1 file" in result.output


def test_list_on_an_empty_cache(tmp_path):
    result = run(tmp_path / "none", "list")
    assert "0 cached problems in 0 files" in result.output
    assert json.loads(run(tmp_path / "none", "list", "--json").stdout)["files"] == []


def test_clear_asks_unless_yes(filled):
    run(filled, "clear", input="n\n", code=1)                 # declined: abort, files stay
    assert cache.list_files(filled)
    assert "removed 1 file" in run(filled, "clear", "--yes").output
    assert cache.list_files(filled) == []
    assert "no algorithm cache" in run(filled, "clear", "--yes").output
