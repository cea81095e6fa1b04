"""A new user's first hour: inspect on a checkpoint, the recipes inside the package, the
errors of a typo'd path or option, and the spinner that names a silent wait."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from netrun.cli import cli

REPO = Path(__file__).resolve().parents[1]
LENET = str(REPO / "zoo" / "lenet.yaml")

TINY_MODEL = """\
name: Tiny
inputs: {data: [1, 28, 28], label: []}
layers:
  - {type: conv, name: c1, input: data, num_output: 4, kernel: 5, stride: 3}
  - {type: relu, name: r1}
  - {type: fc, name: f1, num_output: 10}
loss: {type: softmax_cross_entropy, input: f1, label: label}
metrics: [{type: accuracy, input: f1, label: label}]
"""


def run(*args, code: int = 0):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The last.h5 of a 5-step run of a tiny net."""
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "tiny.yaml").write_text(TINY_MODEL)
    (folder / "train.yaml").write_text(textwrap.dedent(f"""\
        model: tiny.yaml
        data: {{source: generated, dir: {folder / 'data'}, train_count: 100, test_count: 20,
               batch_size: 10}}
        solver: {{type: sgd, base_lr: 0.01, max_iter: 5, display: 0}}
        output: run
        """))
    run("train", folder / "train.yaml")
    return folder / "run" / "last.h5"


# inspect on a checkpoint --------------------------------------------------------------------
def test_inspect_checkpoint_shapes_come_from_the_checkpoint(checkpoint):
    from netrun.core.db import open_db

    d = json.loads(run("inspect", checkpoint, "--batch", "3", "--json").stdout)
    assert d["model"] == "Tiny" and d["source"] == str(checkpoint) and d["batch"] == 3
    assert d["inputs"] == [{"name": "data", "shape": [3, 1, 28, 28], "dtype": "float32",
                            "param": False}]
    with open_db(checkpoint, "r") as db:
        stored = {name: list(db.shape(f"params/{name}")) for name in db.keys("params")}
    assert {p["name"]: p["shape"] for p in d["params"]} == stored
    assert d["total_params"] == sum(int(np.prod(s)) for s in stored.values())
    conv = next(o for o in d["ops"] if o["type"] == "Conv")
    assert conv["outputs"][0]["shape"] == [3, 4, 8, 8]
    assert conv["flops"] == 2 * 3 * 4 * 25 * 8 * 8 + 3 * 4 * 8 * 8      # MACs and the bias
    text = run("inspect", checkpoint, "--batch", "3").stdout
    assert "per batch of 3" in text and "Tiny: predict net" in text


def test_inspect_checkpoint_train_net_and_memory(checkpoint):
    d = json.loads(run("inspect", checkpoint, "--net", "train", "--json").stdout)
    assert {"f1", "label"} <= {b["name"] for o in d["ops"] for b in o["inputs"]}
    assert any(o["type"] == "Accuracy" for o in d["ops"])
    memory = json.loads(run("inspect", checkpoint, "--memory", "--json").stdout)
    assert memory["model"] == "Tiny" and memory["nets"]


def test_inspect_checkpoint_refuses_init_and_damaged_files(checkpoint, tmp_path):
    out = run("inspect", checkpoint, "--init", "init_net.pb", code=2).output
    assert "holds its own weights" in out
    assert "no such checkpoint" in run("inspect", tmp_path / "none.h5", code=2).output
    (tmp_path / "junk.h5").write_bytes(b"not hdf5 at all")
    assert "error:" in run("inspect", tmp_path / "junk.h5", code=2).output


def test_flops_footer_names_the_batch_an_input_gives():
    text = run("inspect", LENET, "--input", "data=64,1,28,28").stdout
    assert "per batch of 64" in text and ", batch 64" in text
    d = json.loads(run("inspect", LENET, "--input", "data=64,1,28,28", "--json").stdout)
    assert d["batch"] == 64
    assert "per batch of 8" in run("inspect", LENET, "-b", "8").stdout


def test_draw_reads_checkpoints_through_the_same_loader(checkpoint):
    assert "Tiny" in run("draw", checkpoint).stdout


# recipes.yaml inside the package --------------------------------------------------------------
def test_recipes_live_in_the_package():
    import netrun
    from netrun.train.data import download

    package = Path(netrun.__file__).resolve().parent
    assert download.RECIPES.is_relative_to(package) and download.RECIPES.is_file()
    assert {"mnist", "fashion-mnist"} <= set(download.load_recipes())
    assert not (REPO / "data" / "recipes.yaml").exists(), "a second copy would drift"


def test_a_built_wheel_carries_the_recipes(tmp_path):
    pytest.importorskip("setuptools")
    # A copy of the sources, so the build leaves nothing in the checkout.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "netrun", src / "netrun",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                             "--no-build-isolation", "-q", "-w", str(tmp_path / "wheel")],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0 and "No module named pip" in result.stderr:
        pytest.skip("no pip in this interpreter")
    assert result.returncode == 0, result.stderr
    wheel = next((tmp_path / "wheel").glob("netrun-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        assert "netrun/train/data/recipes.yaml" in z.namelist()


# errors a new user meets ----------------------------------------------------------------------
def test_typo_in_the_config_path_suggests_the_file():
    out = run("train", REPO / "configs" / "quickstrat.yaml", code=2).output
    assert "no such file" in out and "did you mean" in out and "quickstart.yaml" in out


def test_tensorboard_before_config_says_what_happened():
    config = REPO / "configs" / "quickstart.yaml"
    out = run("train", "--tensorboard", config, code=2).output
    assert "--tensorboard took" in out and "--tensorboard=DIR" in out
    assert "Missing argument 'CONFIG'" in run("train", code=2).output


def test_missing_resume_checkpoint_fails_before_the_data_loads(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY_MODEL)
    (tmp_path / "train.yaml").write_text(
        f"model: tiny.yaml\ndata: {{source: generated, dir: {tmp_path / 'data'}}}\n")
    out = run("train", tmp_path / "train.yaml", "--resume", tmp_path / "gone.h5", code=2).output
    assert "no such checkpoint" in out
    assert not (tmp_path / "data").exists()      # nothing was rendered


def test_a_train_config_where_a_model_goes():
    config = REPO / "configs" / "quickstart.yaml"
    lenet = json.loads(run("inspect", LENET, "--json").stdout)
    assert json.loads(run("inspect", config, "--json").stdout)["ops"] == lenet["ops"]
    assert "is a train config" in run("export", config, "x.onnx", code=2).output
    assert "is a train config" in run("infer", config, "generated:test", code=2).output


def test_infer_refuses_weights_with_a_checkpoint(checkpoint):
    out = run("infer", checkpoint, "generated:test", "--weights", checkpoint, code=2).output
    assert "--weights goes with a MODEL file" in out


# the spinner ----------------------------------------------------------------------------------
class _Shown:
    def __init__(self):
        self.shown: list = []

    def __call__(self, words):
        self.shown.append(words)


def test_waits_show_only_long_activities_innermost_first():
    from netrun.cli.console import Waits

    shown = _Shown()
    waits = Waits(shown)
    waits.begin("quick")
    waits.end()
    time.sleep(Waits.DELAY * 2)
    assert shown.shown == []                  # ended before the delay: nothing, no flicker
    waits.begin("outer")
    time.sleep(Waits.DELAY * 2.5)
    waits.begin("inner")
    waits.end()
    waits.end()
    assert shown.shown == ["outer", "inner", "outer", None]
    waits.close()
    assert shown.shown[-1] is None


def test_activity_reaches_the_installed_reporter_only():
    from netrun.util.progress import activity, reporting

    seen: list = []

    class Reporter:
        def begin(self, words):
            seen.append(words)

        def end(self):
            seen.append(None)

    with activity("nobody listens"):
        pass
    with reporting(Reporter()):
        with activity("rendering"):
            other = threading.Thread(target=lambda: activity("elsewhere").__enter__())
            other.start()
            other.join()
    with activity("after"):
        pass
    assert seen == ["rendering", None]


def test_generated_data_announces_its_rendering(tmp_path):
    from netrun.train.data.generated import load_or_generate
    from netrun.util.progress import reporting

    seen: list = []

    class Reporter:
        def begin(self, words):
            seen.append(words)

        def end(self):
            pass

    with reporting(Reporter()):
        load_or_generate(30, 1, "train", tmp_path)
        load_or_generate(30, 1, "train", tmp_path)       # cached: no wait to announce
    assert seen == ["rendering 30 train digits (once: cached for later runs)"]


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
def test_spinner_names_the_wait_on_a_terminal_only(tmp_path, monkeypatch, terminal):
    from netrun.cli.console import Waits

    # Any wait shows at once, so that rendering 6,000 digits (a tenth of a second on a fast
    # machine) is one.
    monkeypatch.setattr(Waits, "DELAY", 0.0)
    (tmp_path / "tiny.yaml").write_text(TINY_MODEL)
    (tmp_path / "train.yaml").write_text(
        f"model: tiny.yaml\ndata: {{source: generated, dir: {tmp_path / 'data'}, "
        f"train_count: 6000, test_count: 20, batch_size: 10}}\n"
        f"solver: {{max_iter: 1, display: 0}}\noutput: run\n")
    # --color makes CliRunner's stderr a terminal to rich (console.interactive).
    result = run(*(["--color"] if terminal else []), "train", tmp_path / "train.yaml")
    assert ("rendering 6,000 train digits" in result.stderr) == terminal, result.stderr
