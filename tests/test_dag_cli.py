"""`--executor` on train, infer and profile, and the `executor` config key."""
from __future__ import annotations

import json

import pytest

from netrun.train.config import load_config
from tests.test_cli import LENET, run


@pytest.mark.parametrize("command", ["train", "infer", "profile"])
def test_the_executor_flag(command):
    assert "--executor [simple|dag]" in run(command, "--help").output
    result = run(command, LENET, "--executor", "fast", code=2)
    assert "'fast' is not one of 'simple', 'dag'" in result.output


def test_profile_times_every_op_under_the_dag_executor():
    data = [json.loads(run("profile", LENET, "-b", "8", "--iters", "2", "--warmup", "0",
                           "--executor", ex, "--json", "-").stdout) for ex in ("simple", "dag")]
    names = [[op["name"] for op in d["ops"]] for d in data]
    assert names[0] == names[1] and names[0]
    # hooks come in the net's order: every op gets a time, and they add up to the run
    assert all(op["median_ms"] >= 0 for op in data[1]["ops"])
    assert data[1]["sum_of_ops_ms"] > 0


def test_the_executor_config_key_and_a_training_run_under_it(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(f"model: {LENET}\ndata: {{source: generated, batch_size: 8}}\n"
                      f"executor: dag\n")
    assert load_config(str(config)).executor == "dag"
    config.write_text(f"model: {LENET}\ndata: {{source: generated, batch_size: 8}}\n")
    assert load_config(str(config)).executor == "simple"
    out = {}
    for ex in ("simple", "dag"):
        d = json.loads(run("train", str(config), "-o", str(tmp_path / ex), "--max-iter", "3",
                           "--executor", ex, "--json").stdout)
        out[ex] = d
    for key in ("final_loss", "test_loss", "test_metrics"):
        assert out["simple"][key] == out["dag"][key], key
    import h5py
    import numpy as np

    params = []
    for ex in ("simple", "dag"):
        with h5py.File(tmp_path / ex / "last.h5", "r") as f:
            got = {}
            f["params"].visititems(lambda name, d, got=got: got.__setitem__(name, d[()])
                                   if isinstance(d, h5py.Dataset) else None)
            params.append(got)
    assert params[0].keys() == params[1].keys() and params[0]
    for name in params[0]:
        assert np.asarray(params[0][name]).tobytes() == np.asarray(params[1][name]).tobytes()
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((5, 1, 28, 28)).astype(np.float32))
    inferred = [run("infer", str(tmp_path / "dag" / "last.h5"), str(x), "--executor", ex,
                    "--json").stdout for ex in ("simple", "dag")]
    assert inferred[0] == inferred[1] and json.loads(inferred[1])["count"] == 5
    config.write_text(f"model: {LENET}\ndata: {{source: generated}}\nexecutor: fast\n")
    result = run("train", str(config), code=2)
    assert "executor" in result.output and "simple, dag" in result.output
