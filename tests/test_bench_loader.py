"""benchmarks/bench_loader.py cannot rot: it runs at its smallest sizes and says what it
measured (no timing thresholds: the numbers depend on the machine)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"

pytest.importorskip("simplejpeg")
pytest.importorskip("PIL")
pytest.importorskip("lmdb")
pytest.importorskip("rich")


@pytest.fixture
def bench(monkeypatch):
    """The script as a module; NETRUN_THREADS, which its main sets, restored afterwards."""
    monkeypatch.setenv("NETRUN_THREADS", "2")
    spec = importlib.util.spec_from_file_location("bench_loader", BENCH / "bench_loader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(bench, capsys, *argv) -> dict:
    assert bench.main(["--quick", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_png_loader_and_resnet20_steps(bench, capsys, tmp_path):
    result = _run(bench, capsys, "--only", "png", "--batch", "4", "--steps", "2", "--seconds",
                  "0.1")
    assert set(result["datasets"]) == {"png"}
    png = result["datasets"]["png"]
    assert png["images"] > 0 and png["size"] == [32, 32] and png["mean_file_bytes"] > 0

    assert [r["workers"] for r in result["loader"]] == [None, 0, 1, 2]
    for r in result["loader"]:
        assert (r["dataset"], r["kind"], r["batch"]) == ("png", "folder", 4)
        assert r["images"] == 4 * r["batches"] > 0
        for key in ("images_per_s", "batch_ms", "seconds", "net_alone_images_per_s",
                    "over_net_need"):
            assert r[key] > 0, key
        assert r["startup_s"] >= 0

    assert [r["workers"] for r in result["train"]] == [None, 0, 1, 2]
    assert result["train"][0]["mode"] == "net alone"
    assert result["train"][0]["over_net_alone"] == pytest.approx(1.0)
    for r in result["train"]:
        assert (r["net"], r["batch"], r["steps"]) == ("resnet20", 4, 2)
        assert len(r["all_step_ms"]) == len(r["all_wait_ms"]) == r["warmup_steps"] + 2
        for key in ("step_ms_median", "step_ms_total", "images_per_s", "over_net_alone"):
            assert r[key] > 0, key
        assert 0 <= r["wait_ms_median"] <= r["step_ms_median"]
        assert 0 <= r["wait_fraction"] < 1

    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(result))
    assert bench.main(["--show", str(saved)]) == 0
    shown = capsys.readouterr().out
    assert "Loader" in shown and "Training steps" in shown and "ResNet-20 batch 4" in shown


def test_jpeg_folder_and_lmdb_sources(bench, capsys):
    """The JPEGs are the size of real ones, and the LMDB built from them is read too."""
    result = _run(bench, capsys, "--only", "jpeg,loader", "--workers", "0", "--seconds",
                  "0.05")
    jpeg = result["datasets"]["jpeg"]
    assert jpeg["size"] == [256, 256] and jpeg["quality"] == 90
    assert 15_000 < jpeg["mean_file_bytes"] < 45_000
    assert jpeg["lmdb_bytes"] > jpeg["folder_bytes"]
    assert [(r["kind"], r["workers"]) for r in result["loader"]] == [
        ("folder", None), ("folder", 0), ("lmdb", None), ("lmdb", 0)]
    assert all(r["images_per_s"] > 0 and r["batch"] == 8 for r in result["loader"])
    assert result["train"] == []
