"""`netrun train`, `infer` and `profile` through click's CliRunner."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from netrun.cli import cli


def run(*args):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result


def test_train_then_infer_json(tiny_config, tmp_path):
    r = run("train", tiny_config, "--max-iter", "20", "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["iterations"] == 20 and 0 <= summary["test_metrics"]["accuracy"] <= 1
    ckpt = summary["checkpoint"]
    lines = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert any("test_accuracy" in x for x in lines)

    r = run("infer", ckpt, "generated:test", "--json", "--top-k", "3")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["count"] == 96 and len(out["predictions"][0]["top_k"]) == 3
    assert abs(out["accuracy"] - summary["test_metrics"]["accuracy"]) < 1e-9

    x = np.random.default_rng(0).uniform(0, 255, size=(5, 28, 28)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = run("infer", ckpt, str(tmp_path / "x.npy"), "-o", str(tmp_path / "p.npy"))
    assert r.exit_code == 0, r.output
    probs = np.load(tmp_path / "p.npy")
    assert probs.shape == (5, 10) and np.allclose(probs.sum(1), 1, atol=1e-5)


def test_non_finite_loss_stops_with_a_clear_error(tiny_config):
    r = run("train", tiny_config, "--set", "solver.base_lr=1e12", "--max-iter", "50")
    assert r.exit_code == 2, r.output
    assert "loss became" in r.output and "Traceback" not in r.output


def test_bad_config_key_exit_2(tiny_config):
    r = run("train", tiny_config, "--set", "solver.base_lrr=0.1")
    assert r.exit_code == 2 and "did you mean 'base_lr'" in r.output, r.output


def test_profile_json_adds_up(tiny_config, tmp_path):
    r = run("profile", str(tmp_path / "tiny.yaml"), "--batch", "8", "--iters", "3", "--warmup", "1",
            "--json", "-")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert set(data["phases"]) == {"forward", "backward", "update"}
    conv = next(o for o in data["ops"] if o["type"] == "Conv")
    assert conv["flops"] == 2 * 8 * 4 * 25 * 8 * 8 + 8 * 4 * 8 * 8
    assert data["iteration_ms"] > 0 and data["sum_of_ops_ms"] > 0
    r = run("profile", str(tmp_path / "tiny.yaml"), "--forward-only", "--iters", "2",
            "--trace", str(tmp_path / "t.json"))
    assert r.exit_code == 0, r.output
    trace = json.load(open(tmp_path / "t.json"))
    assert trace["traceEvents"] and all(e["ph"] in ("X", "M") for e in trace["traceEvents"])


def test_gpu_without_cupy_exits_2(tiny_config, tmp_path):
    try:
        import cupy  # noqa: F401
        import pytest

        pytest.skip("CuPy is installed")
    except ImportError:
        pass
    for args in (["train", tiny_config, "--device", "gpu", "--max-iter", "1"],
                 ["profile", str(tmp_path / "tiny.yaml"), "--device", "gpu:1"]):
        r = run(*args)
        assert r.exit_code == 2, r.output
        assert "needs CuPy" in r.output and "Traceback" not in r.output


def test_a_model_given_as_the_config_gets_a_minimal_config_to_start_from(tmp_path):
    r = run("train", "zoo/lenet.yaml")
    assert r.exit_code == 2 and "is a model, not a train config" in r.output
    example = r.output.split("e.g.:\n", 1)[1].split("(configs/", 1)[0]
    config = tmp_path / "train.yaml"
    small = f"source: generated, train_count: 64, test_count: 64, dir: {tmp_path / 'data'},"
    config.write_text(example.replace("model: lenet.yaml",
                                      f"model: {Path('zoo/lenet.yaml').resolve()}")
                      .replace("source: generated,", small) + f"    output: {tmp_path / 'run'}\n")
    assert run("train", str(config), "--max-iter", "2").exit_code == 0
