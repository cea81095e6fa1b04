"""`--device gpu` through the CLI: train, infer and profile on the GPU backend."""
from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from netrun.cli import cli
from tests.train.conftest import write_config

REPO = Path(__file__).resolve().parents[2]


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_train_infer_and_profile_on_the_gpu(gpu, tmp_path):
    config = write_config(tmp_path)
    r = run("train", config, "--device", "gpu", "--max-iter", "6", "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["iterations"] == 6
    r = run("infer", summary["checkpoint"], "generated:test", "--device", "gpu:0", "--json")
    assert r.exit_code == 0, r.output
    on_gpu = json.loads(r.stdout)
    r = run("infer", summary["checkpoint"], "generated:test", "--json")
    on_cpu = json.loads(r.stdout)
    assert abs(on_gpu["accuracy"] - on_cpu["accuracy"]) < 1e-9
    r = run("profile", str(REPO / "zoo" / "lenet.yaml"), "--device", "gpu", "--batch", "4",
            "--iters", "2", "--warmup", "1", "--json", str(tmp_path / "p.json"))
    assert r.exit_code == 0, r.output
    prof = json.loads((tmp_path / "p.json").read_text())
    algos = {o["algo"] for o in prof["ops"] if o["type"].startswith("Conv")}
    assert algos and all(a.startswith("gpu_") or a == "cudnn" for a in algos), algos


def test_a_missing_gpu_is_a_clear_exit_2(tmp_path):
    config = write_config(tmp_path)
    r = CliRunner().invoke(cli, ["train", config, "--device", "gpu:7", "--max-iter", "1"])
    assert r.exit_code == 2
    assert "gpu" in r.output and "Traceback" not in r.output
