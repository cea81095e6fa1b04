"""`netrun draw`: DOT text of zoo/lenet.yaml, files through the CLI, with and without
Graphviz's dot."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from click.testing import CliRunner

from netrun.cli import cli
from netrun.cli.inspect_cmd import report
from netrun.model import load_model
from netrun.tools.net_drawing import net_dot

LENET = str(Path(__file__).resolve().parents[1] / "zoo" / "lenet.yaml")


def _dot(which="predict", batch=1):
    return net_dot(report(load_model(LENET), which, batch, {}))


def test_lenet_dot_has_nodes_edges_shapes_and_params():
    text = _dot(batch=4)
    assert text.startswith("digraph ") and text.rstrip().endswith("}")
    for name in ("conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2"):
        assert f'label="{name}\\n' in text
    assert "Conv" in text and "MaxPool" in text and "FC" in text
    assert "4×20×24×24" in text and "4×1×28×28" in text      # output and input shapes
    assert "params 520" in text and "params 400,500" in text  # conv1: 20*25+20; ip1
    assert "431,080 parameters" in text
    assert '"in:data" -> op0 [label="data"];' in text
    assert '"op0" -> op1 [label="conv1"];' in text
    assert '"op6" -> "out:ip2";' in text


def test_dot_is_deterministic_and_train_net_differs():
    assert _dot() == _dot()
    train = _dot("train")
    assert train == _dot("train") and train != _dot()
    assert '"in:label"' in train and "loss" in train


def test_draw_dot_file_and_stdout(tmp_path):
    out = tmp_path / "x.dot"
    result = CliRunner().invoke(cli, ["draw", LENET, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == _dot()
    piped = CliRunner().invoke(cli, ["draw", LENET, "--batch", "1"])
    assert piped.exit_code == 0 and piped.stdout == _dot()


def test_draw_svg_without_dot_writes_dot_and_names_graphviz(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = tmp_path / "net.svg"
    result = CliRunner().invoke(cli, ["draw", LENET, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert not out.exists()
    assert (tmp_path / "net.dot").read_text(encoding="utf-8") == _dot()
    assert "graphviz" in result.stderr and "apt install graphviz" in result.stderr


def test_draw_svg_runs_dot_when_present(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "dot"
    # A stand-in for Graphviz: records its arguments and stdin, writes a minimal SVG to -o.
    fake.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\n'
                    'cat > "$(dirname "$0")/stdin"\n'
                    'while [ "$1" != "-o" ]; do shift; done\n'
                    'echo \'<svg xmlns="http://www.w3.org/2000/svg"/>\' > "$2"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir) + os.pathsep + os.environ.get("PATH", ""))
    out = tmp_path / "net.svg"
    result = CliRunner().invoke(cli, ["draw", LENET, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "<svg" in out.read_text()
    assert (bin_dir / "args").read_text().split() == ["-Tsvg", "-o", str(out)]
    assert (bin_dir / "stdin").read_text(encoding="utf-8") == _dot()
    assert not (tmp_path / "net.dot").exists()


def test_draw_errors_are_clear(tmp_path):
    result = CliRunner().invoke(cli, ["draw", LENET, "-o", str(tmp_path / "x.jpg")])
    assert result.exit_code == 2 and "use .dot, .svg or .png" in result.stderr
    result = CliRunner().invoke(cli, ["draw", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2 and "no such model file" in result.stderr
