"""`netrun plot`: curves from metrics.jsonl to PNG and SVG, runs overlaid, the terminal chart."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from netrun.cli import cli
from netrun.tools import curves

SVG = "{http://www.w3.org/2000/svg}"


def _run(folder, scale=1.0):
    """A synthetic run folder as the trainer writes it: start marker, train and test records."""
    folder.mkdir(parents=True)
    lines = [{"event": "start", "iter": 0, "resumed_from": None}]
    for it in range(1, 41):
        lines.append({"iter": it, "loss": scale * 2.3 / it ** 0.5,
                      "lr": 0.01 * (1 + 1e-3 * it) ** -0.75,
                      "seconds": 0.01})
        if it % 10 == 0:
            lines.append({"iter": it, "test_loss": 1.0 / it, "test_accuracy": 0.5 + it / 100})
    lines.append({"iter": 41, "loss": None, "lr": 0.001})           # NaN as the trainer writes it
    text = "\n".join(json.dumps(r) for r in lines) + '\n{"iter": 42, "lo'   # cut short by a crash
    (folder / "metrics.jsonl").write_text(text)
    return folder


def test_read_run_series_skip_nulls_and_markers(tmp_path):
    run = curves.read_run(_run(tmp_path / "a"))
    assert run.name == "a"
    assert len(run.series["loss"]) == 40 and run.series["loss"][0][0] == 1
    assert len(run.series["lr"]) == 41
    assert [p[0] for p in run.series["test_accuracy"]] == [10, 20, 30, 40]
    assert curves.metric_key(run, "accuracy") == "test_accuracy"


def test_png(tmp_path):
    from PIL import Image

    _run(tmp_path / "a")
    out = tmp_path / "curves.png"
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "a"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    with Image.open(out) as image:
        assert image.format == "PNG" and image.mode == "RGB"
        assert image.width == 800 and image.height > 600          # three panels
        colours = {c for _, c in image.getcolors(1 << 16)}
        assert (0, 0x72, 0xB2) in colours                         # the first run's line


def test_svg_two_runs_overlaid(tmp_path):
    _run(tmp_path / "sgd")
    _run(tmp_path / "adam", scale=0.5)
    out = tmp_path / "curves.svg"
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "sgd"), str(tmp_path / "adam"),
                                      "-o", str(out), "--metric", "loss,accuracy"])
    assert result.exit_code == 0, result.output
    root = ET.parse(out).getroot()
    assert root.tag == SVG + "svg"
    texts = [t.text for t in root.iter(SVG + "text")]
    assert "sgd" in texts and "adam" in texts                     # the legend
    assert "loss" in texts and "accuracy" in texts and "iteration" in texts
    data = [p for p in root.iter(SVG + "polyline") if p.get("stroke-width") == "2"]
    assert len(data) == 4                                          # 2 runs × 2 metrics
    assert all(len(p.get("points").split()) > 1 for p in data)


def test_plot_from_a_real_training_run(tmp_path):
    from tests.train.conftest import write_config

    config = write_config(tmp_path, "test_interval: 10\ntest_iter: 2\n")
    text = open(config).read().replace("max_iter: 40", "max_iter: 20")
    text = text.replace("display: 0", "display: 2")
    open(config, "w").write(text)
    result = CliRunner().invoke(cli, ["train", config])
    assert result.exit_code == 0, result.output
    out = tmp_path / "run.svg"
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "run"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    texts = [t.text for t in ET.parse(out).getroot().iter(SVG + "text")]
    assert {"loss", "lr", "accuracy"} <= set(texts)


def test_terminal_chart_has_axis_labels(tmp_path):
    pytest.importorskip("plotext")
    runs = curves.read_runs([_run(tmp_path / "a"), _run(tmp_path / "b", 0.5)])
    text = curves.terminal_chart(runs, ("loss", "accuracy"), 100, 40)
    assert "iteration" in text and "loss" in text and "accuracy" in text


def test_piped_prints_last_values(tmp_path):
    _run(tmp_path / "a")
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "run" in result.stdout and "accuracy" in result.stdout
    assert "0.9" in result.stdout and "41" in result.stdout        # accuracy at 40; last iter


def test_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "no metrics.jsonl" in result.stderr
    _run(tmp_path / "a")
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "a"), "--metric", "top5"])
    assert result.exit_code == 2 and "logged: " in result.stderr
    result = CliRunner().invoke(cli, ["plot", str(tmp_path / "a"), "-o", str(tmp_path / "x.pdf")])
    assert result.exit_code == 2 and "use .png or .svg" in result.stderr


def test_no_plotext_says_how_to_install(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "plotext", None)
    runs = curves.read_runs([_run(tmp_path / "a")])
    with pytest.raises(curves.NetrunError, match=r"pip install 'netrun\[plot\]'"):
        curves.terminal_chart(runs)
