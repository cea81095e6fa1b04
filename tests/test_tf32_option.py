"""The TF32 opt-in for GPU convolutions: the `tf32` config key, `--tf32` on train and
profile, and the workspace setting they set (cuDNN's tensor-core engines become candidates)."""
from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import netrun
from netrun.cli import cli
from netrun.cli.algo_options import configure_algos
from netrun.train.config import load_config

REPO = Path(__file__).resolve().parents[1]
LENET = str(REPO / "zoo" / "lenet.yaml")


def test_tf32_config_key(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(f"model: {LENET}\ndata: {{source: generated}}\n")
    assert load_config(str(config)).tf32 is False
    config.write_text(f"model: {LENET}\ndata: {{source: generated}}\ntf32: true\n")
    assert load_config(str(config)).tf32 is True
    config.write_text(f"model: {LENET}\ndata: {{source: generated}}\ntf32: sometimes\n")
    result = CliRunner().invoke(cli, ["train", str(config)], prog_name="netrun")
    assert result.exit_code == 2
    assert "tf32" in result.output and "true or false" in result.output


def test_the_option_sets_the_workspace_setting_and_nothing_else():
    from netrun.conv import configure

    ws = netrun.Workspace("cpu")
    configure_algos(ws, None, None, None)
    assert ws.conv.settings.tf32 is False
    configure(ws, mode="deterministic", workspace_limit=1 << 20)
    configure_algos(ws, None, None, True)
    settings = ws.conv.settings
    assert settings.tf32 is True
    # the options not given keep what the workspace had
    assert settings.mode == "deterministic" and settings.workspace_limit == 1 << 20


def test_profile_takes_tf32_and_cpu_convolutions_are_unchanged():
    args = ["profile", LENET, "-b", "2", "--iters", "1", "--warmup", "0", "--json", "-"]
    plain = CliRunner().invoke(cli, args, prog_name="netrun")
    tf32 = CliRunner().invoke(cli, args + ["--tf32"], prog_name="netrun")
    assert plain.exit_code == 0 and tf32.exit_code == 0, tf32.output
    algos = [{o["name"]: o["algo"] for o in json.loads(r.stdout)["ops"] if o["algo"]}
             for r in (plain, tf32)]
    assert algos[0] == algos[1] and algos[0]   # no CPU algorithm is reduced-precision


def test_a_pick_made_before_tf32_is_turned_on_is_made_again(monkeypatch):
    """Nets bound before `configure(tf32=True)` (a memory plan picks algorithms at bind) must
    not keep their float32-only picks: the rules' memo is keyed by the TF32 setting too."""
    from netrun.conv import configure, select
    from netrun.conv.problem import ConvProblem

    monkeypatch.setattr(select, "candidates", lambda p, settings, backend: (
        ["a TF32 engine", "float32"] if settings.tf32 else ["float32"]))
    monkeypatch.setattr(select, "rule_choice", lambda p, pool, direction, backend, xp: pool[0])
    ws = netrun.Workspace("cpu")
    p = ConvProblem(2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1)
    assert select.choose(ws.conv, p, "forward", ws.backend) == "float32"
    configure(ws, tf32=True)
    assert select.choose(ws.conv, p, "forward", ws.backend) == "a TF32 engine"
    configure(ws, tf32=False)
    assert select.choose(ws.conv, p, "forward", ws.backend) == "float32"
