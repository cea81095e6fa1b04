"""The memory plan on the command line: `inspect --memory`, the profile footer, the
`--no-memory-plan` flags and the `memory_plan` config key."""
from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from netrun.cli import cli
from netrun.train.config import load_config

REPO = Path(__file__).resolve().parents[1]
RESNET20 = str(REPO / "zoo" / "resnet20.yaml")


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(cli, list(args), prog_name="netrun")
    assert result.exit_code == code, result.output + repr(result.exception)
    return result


def test_inspect_memory_shows_planned_against_unplanned_per_net_and_phase():
    data = json.loads(run("inspect", RESNET20, "--memory", "-b", "8", "--json").output)
    nets = {n["net"]: n for n in data["nets"]}
    assert data["memory_plan"] is True and set(nets) == {"ResNet20_step", "ResNet20_update",
                                                         "predict"}
    step, predict = nets["ResNet20_step"], nets["predict"]
    assert set(step["phases"]) == {"forward", "backward"}
    assert step["planned_peak"] < 0.6 * step["unplanned_peak"]
    assert predict["planned_peak"] < 0.4 * predict["unplanned_peak"]
    assert predict["live_peak"] <= predict["arena"] and "Conv" in predict["peak_op"]
    text = run("inspect", RESNET20, "--memory", "-b", "8").output
    assert "largest live set" in text and "predict" in text and "backward" in text
    off = json.loads(run("inspect", RESNET20, "--memory", "-b", "8", "--json",
                         "--no-memory-plan").output)
    assert all(n["planned_peak"] == n["unplanned_peak"] for n in off["nets"])


def test_profile_footer_and_json_report_the_plan():
    text = run("profile", RESNET20, "-b", "4", "--iters", "1", "--warmup", "0").output
    assert "activation memory (profile_train): planned" in text
    data = json.loads(run("profile", RESNET20, "-b", "4", "--iters", "1", "--warmup", "0",
                          "--forward-only", "--json", "-").stdout)
    (plan,) = data["memory"].values()
    assert plan["planned_peak"] < plan["unplanned_peak"]
    data = json.loads(run("profile", RESNET20, "-b", "4", "--iters", "1", "--warmup", "0",
                          "--forward-only", "--json", "-", "--no-memory-plan").stdout)
    assert data["memory"] == {}


def test_memory_plan_config_key(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(f"model: {RESNET20}\ndata: {{source: generated}}\nmemory_plan: false\n")
    assert load_config(str(config)).memory_plan is False
    config.write_text(f"model: {RESNET20}\ndata: {{source: generated}}\n")
    assert load_config(str(config)).memory_plan is True
    config.write_text(f"model: {RESNET20}\ndata: {{source: generated}}\nmemory_plan: maybe\n")
    result = run("train", str(config), code=2)
    assert "memory_plan" in result.output and "true or false" in result.output


def test_train_and_infer_take_no_memory_plan():
    assert "--no-memory-plan" in run("train", "--help").output
    assert "--no-memory-plan" in run("infer", "--help").output
    assert "--no-memory-plan" in run("profile", "--help").output
    assert "--no-memory-plan" in run("inspect", "--help").output
