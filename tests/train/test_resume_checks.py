"""Resume refuses settings that change the trajectory, listing all of them, unless allowed."""
from __future__ import annotations

from click.testing import CliRunner

from netrun.cli import cli
from netrun.train import checkpoint as ckpt
from netrun.train.resume_check import differences

BASE = {
    "model": "tiny.yaml",
    "data": {"source": "generated", "dir": "/a", "batch_size": 16,
             "transform": {"scale": 0.00390625}},
    "solver": {"type": "sgd", "base_lr": 0.05, "momentum": 0.9, "max_iter": 40,
               "lr_policy": {"type": "inv", "gamma": 0.001, "power": 0.75}},
}


def _with(**changes) -> dict:
    import copy

    raw = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        node, *path, last = [raw, *dotted.split("__")]
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return raw


def test_every_trajectory_setting_is_compared():
    new = _with(data__batch_size=32, data__source="mnist", data__transform={"scale": 1.0},
                solver__momentum=0.5, solver__momentum2=0.9, solver__iter_size=2,
                solver__seed=7, solver__weight_decay=0.1, solver__clip_gradients=5,
                solver__regularization_type="L1", solver__delta=1e-6, solver__rms_decay=0.9,
                solver__base_lr=0.1, solver__type="adam",
                solver__lr_policy={"type": "step", "gamma": 0.1, "stepsize": 10})
    found = {line.split(":")[0] for line in differences(BASE, new)}
    assert found == {
        "data.batch_size", "data.source", "data.transform.scale", "solver.momentum",
        "solver.momentum2", "solver.iter_size", "solver.seed", "solver.weight_decay",
        "solver.clip_gradients", "solver.regularization_type", "solver.delta",
        "solver.rms_decay", "solver.base_lr", "solver.type", "solver.lr_policy.type",
        "solver.lr_policy.gamma", "solver.lr_policy.power", "solver.lr_policy.stepsize"}
    line = next(x for x in differences(BASE, new) if x.startswith("solver.lr_policy.stepsize"))
    assert line == "solver.lr_policy.stepsize: (not set) in the checkpoint, 10 now"


def test_scheduling_and_location_may_change():
    new = _with(solver__max_iter=4000, solver__display=1, solver__snapshot=100,
                solver__test_interval=50, solver__test_iter=3, solver__test_initialization=True,
                solver__average_loss=10, data__dir="/elsewhere", data__test_batch_size=100)
    assert differences(BASE, new) == []


def test_defaults_and_spellings_of_the_same_value_are_equal():
    # momentum 0.9 is the default; YAML reads `1e-3` as a string; 16 and 16.0 are one size.
    new = _with(data__batch_size=16.0, solver__lr_policy={"type": "inv", "gamma": "1e-3",
                                                          "power": 0.75})
    del new["solver"]["momentum"]
    assert differences(BASE, new) == []
    assert differences({"model": "m"}, {"model": "m", "data": {"batch_size": 64}}) == []


def run(*args):
    return CliRunner().invoke(cli, ["train", *map(str, args)], catch_exceptions=False)


def test_resume_lists_all_differences_at_once_and_allow_changes_overrides(tiny_config, tmp_path):
    out = tmp_path / "run"
    assert run(tiny_config, "--max-iter", "3").exit_code == 0
    changed = ["--set", "data.batch_size=8", "--set", "solver.momentum=0.5",
               "--set", "solver.lr_policy={type: step, gamma: 0.5, stepsize: 2}",
               "--set", "solver.iter_size=2"]
    r = run(tiny_config, "--max-iter", "5", "--resume", "auto", *changed)
    assert r.exit_code == 2, r.output
    for key in ("data.batch_size: 16 in the checkpoint, 8 now", "solver.momentum",
                "solver.lr_policy.type", "solver.lr_policy.stepsize", "solver.iter_size",
                "--allow-changes"):
        assert key in r.output, key
    assert "Traceback" not in r.output and ckpt.read_info(out / "last.h5").iteration == 3
    r = run(tiny_config, "--max-iter", "5", "--resume", "auto", "--allow-changes", *changed)
    assert r.exit_code == 0, r.output
    assert "changed setting (--allow-changes): solver.momentum" in r.output
    assert ckpt.read_info(out / "last.h5").iteration == 5


def test_changing_the_schedule_needs_no_override(tiny_config, tmp_path):
    assert run(tiny_config, "--max-iter", "3").exit_code == 0
    r = run(tiny_config, "--max-iter", "6", "--resume", "auto", "--set", "solver.display=1",
            "--set", "solver.snapshot=2", "--set", "solver.test_interval=2")
    assert r.exit_code == 0, r.output
    assert "changed setting" not in r.output
