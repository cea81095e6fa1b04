"""Caffe files through the CLI: train a solver, fine-tune, infer with a deploy net, convert."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from netrun.cli import cli

SHARED = Path(os.environ.get("NETRUN_SHARED", Path(__file__).resolve().parents[2].parent / "shared"))
LENET = SHARED / "models" / "caffe" / "lenet"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def lenet(shared_data, monkeypatch):
    monkeypatch.setenv("NETRUN_DATA", str(shared_data))
    if not (LENET / "lenet_solver.prototxt").exists():
        pytest.skip(f"Caffe LeNet files not found under {LENET}")
    return LENET


def test_solver_trains_fine_tunes_and_deploys(lenet, tmp_path):
    out = tmp_path / "run"
    r = run("train", lenet / "lenet_solver.prototxt", "--data", "mnist-10k", "--max-iter", "30",
            "-o", out, "--set", "solver.test_iter=2", "--json")
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout)
    assert first["iterations"] == 30 and first["test_metrics"]["accuracy"] > 0.5

    # Fine-tuning from that checkpoint starts where it ended, not from random weights.
    r = run("train", lenet / "lenet_solver.prototxt", "--data", "mnist-10k", "--max-iter", "1",
            "-o", tmp_path / "ft", "--weights", out / "last.h5", "--set", "solver.test_iter=2",
            "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["test_metrics"]["accuracy"] > 0.5

    # The deploy net (Input layer, Softmax 'prob') with those weights, on scaled pixels.
    r = run("infer", lenet / "lenet.prototxt", "mnist-10k:test", "--weights", out / "last.h5",
            "--scale", 0.00390625, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["accuracy"] > 0.5


def test_a_net_is_not_a_solver(lenet):
    r = run("train", lenet / "lenet_train_test.prototxt")
    assert r.exit_code == 2 and "not a solver" in r.output, r.output


def test_model_file_needs_weights(lenet):
    r = run("infer", lenet / "lenet.prototxt", "mnist-10k:test")
    assert r.exit_code == 2 and "--weights" in r.output, r.output


def test_convert_prototxt_to_model_yaml(lenet, tmp_path):
    r = run("convert", lenet / "lenet_train_test.prototxt", tmp_path / "lenet.yaml")
    assert r.exit_code == 0, r.output
    r = run("inspect", tmp_path / "lenet.yaml", "--batch", "64", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["total_params"] == 431080
