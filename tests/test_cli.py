"""The `netrun` command through click's CliRunner: exit codes, data on stdout, clear errors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import netrun
from netrun.cli import cli
from netrun.proto.pbtxt import netdef_from_text

REPO = Path(__file__).resolve().parents[1]
LENET = str(REPO / "zoo" / "lenet.yaml")
MLP = str(REPO / "zoo" / "mlp.yaml")

LENET_SHAPES = {"conv1": [64, 20, 24, 24], "pool1": [64, 20, 12, 12], "conv2": [64, 50, 8, 8],
                "pool2": [64, 50, 4, 4], "ip1": [64, 500], "ip2": [64, 10]}


def run(*args: str, code: int = 0, env: dict | None = None):
    """Invoke `netrun ARGS`; assert the exit code, showing the output when it differs."""
    result = CliRunner(env=env).invoke(cli, list(args), prog_name="netrun")
    assert result.exit_code == code, result.output + repr(result.exception)
    return result


def test_version_and_help():
    lines = run("--version").stdout.splitlines()
    assert lines[0] == f"netrun, version {netrun.__version__}"
    assert any(line.strip().startswith("NumPy:") and "BLAS" in line for line in lines)
    assert any(line.strip().startswith("CuPy (GPU):") for line in lines)
    out = run("--help").stdout
    assert all(c in out for c in ("ops", "inspect", "convert", "--debug", "--no-color"))
    assert "did you mean 'inspect'" in run("inspct", code=2).output


def test_ops_lists_the_catalogue():
    result = run("ops")
    lines = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    assert {"Conv", "Relu", "FC", "SoftmaxWithLoss", "XavierFill"} <= lines
    assert "operators" in result.stderr  # the count is a diagnostic, not data
    rows = {r["type"]: r for r in json.loads(run("ops", "--json").stdout)}
    assert rows["Conv"]["gradient"] is True and rows["XavierFill"]["gradient"] is False
    assert rows["Conv"]["inputs"] == {"min": 2, "max": 4, "names": ["X", "W", "b", "S"]}
    assert rows["Relu"]["family"] == "activation"


def test_ops_type_shows_the_full_schema():
    out = run("ops", "Conv").stdout
    assert out.startswith("Conv\n")
    for word in ("kernel", "pads", "group", "NCHW", "X, W, b?", "gradient: yes"):
        assert word in out, word
    d = json.loads(run("ops", "Relu", "--json").stdout)
    assert d["inplace"] == [[0, 0]] and d["args"] == [] and d["gradient"] is True
    args = {a["name"]: a for a in json.loads(run("ops", "Conv", "--json").stdout)["args"]}
    assert args["order"]["default"] == "NCHW" and args["order"]["allowed"] == ["NCHW", "NHWC"]


def test_unknown_op_type_suggests_and_exits_2():
    result = run("ops", "Convolutoin", code=2)
    assert "unknown op type 'Convolutoin', did you mean 'Conv'?" in result.stderr
    assert result.stdout == "" and "Traceback" not in result.output


def test_inspect_lenet_batch_64_table():
    out = run("inspect", LENET, "--batch", "64").stdout
    for blob, shape in LENET_SHAPES.items():
        assert re.search(rf"\b{blob} {'×'.join(map(str, shape))}\b", out), blob
    assert "431,080" in out and "LeNet: predict net" in out


def test_inspect_lenet_json_gives_the_same_as_data():
    d = json.loads(run("inspect", LENET, "--batch", "64", "--json").stdout)
    outputs = {b["name"]: b["shape"] for o in d["ops"] for b in o["outputs"]}
    assert {k: outputs[k] for k in LENET_SHAPES} == LENET_SHAPES
    assert d["total_params"] == 431_080 and d["batch"] == 64 and d["net"] == "predict"
    assert d["inputs"] == [{"name": "data", "shape": [64, 1, 28, 28], "dtype": "float32",
                            "param": False}]
    assert [o["params"] for o in d["ops"]] == [520, 0, 25_050, 0, 400_500, 0, 5_010]
    assert d["total_flops"] == sum(o["flops"] for o in d["ops"]) > 0
    params = {p["name"]: p for p in d["params"]}
    assert params["ip1_w"]["shape"] == [500, 800] and params["ip1_w"]["size"] == 400_000


def test_inspect_train_net_and_mlp():
    d = json.loads(run("inspect", LENET, "--net", "train", "-b", "8", "--json").stdout)
    assert [o["type"] for o in d["ops"]][-2:] == ["SoftmaxWithLoss", "Accuracy"]
    assert {"name": "label", "shape": [8], "dtype": "int32", "param": False} in d["inputs"]
    assert json.loads(run("inspect", MLP, "--json").stdout)["total_params"] == 269_322


def test_inspect_nets_prints_parseable_netdef_text():
    out = run("inspect", LENET, "--nets").stdout
    parts = re.split(r"^# (init|train|predict) net\n", out, flags=re.M)[1:]
    nets = dict(zip(parts[::2], parts[1::2]))
    model = netrun.load_model(LENET)
    assert list(nets) == ["init", "train", "predict"]
    for which, text in nets.items():
        assert netdef_from_text(text) == model.net(which), which


def test_convert_round_trips_between_yaml_and_pbtxt(tmp_path):
    a, b, c = tmp_path / "a.pbtxt", tmp_path / "b.yaml", tmp_path / "c.pbtxt"
    run("convert", LENET, str(a))
    run("convert", str(a), str(b))
    run("convert", str(b), str(c))
    assert a.read_text() == c.read_text()
    assert netdef_from_text(a.read_text()) == netrun.load_model(LENET).predict_net
    run("convert", LENET, str(tmp_path / "train.pbtxt"), "--net", "train")
    assert netrun.load_model(tmp_path / "train.pbtxt").train_net == netrun.load_model(
        LENET).train_net


def test_inspect_pbtxt_without_shapes_marks_them_and_names_the_inputs(tmp_path):
    path = tmp_path / "lenet.pbtxt"
    run("convert", LENET, str(path))
    result = run("inspect", str(path))
    assert "--input data=D1,D2,..." in result.stderr and "Traceback" not in result.output
    shapes = [f"{p.name}={','.join(map(str, p.shape))}" for p in netrun.load_model(LENET).params]
    args = [a for s in ["data=64,1,28,28", *shapes] for a in ("--input", s)]
    d = json.loads(run("inspect", str(path), *args, "--json").stdout)
    assert d["total_params"] == 431_080 and d["ops"][-1]["outputs"][0]["shape"] == [64, 10]
    assert "expected NAME=D1,D2" in run("inspect", str(path), "--input", "data=a,b", code=2).output


def test_yaml_errors_report_file_line_column_without_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("inputs: {x: [4]}\nlayers:\n  - {type: fc, num_output: 3\n")
    result = run("inspect", str(path), code=2)
    assert re.search(rf"error: {re.escape(str(path))}:4:1: invalid YAML", result.stderr)
    assert "Traceback" not in result.output
    path.write_text("inputs: {x: [4]}\nlayers:\n  - {type: fcc, num_output: 3}\n")
    result = run("inspect", str(path), code=2)
    assert f"{path}:3:12: unknown layer type 'fcc', did you mean 'fc'?" in result.stderr


def test_raw_ops_model_with_unknown_op_or_arg_exits_2_with_suggestions(tmp_path):
    path = tmp_path / "raw.yaml"
    base = "inputs: {x: [2, 4, 4]}\nops:\n  - {type: %s, inputs: [x], outputs: [y]%s}\n"
    path.write_text(base % ("Rleu", ""))
    assert "unknown op type 'Rleu', did you mean 'Relu'?" in run("inspect", str(path),
                                                                 code=2).stderr
    path.write_text(base % ("MaxPool", ", kernal: 2"))
    assert "MaxPool has no argument 'kernal', did you mean 'kernel'?" in run(
        "inspect", str(path), code=2).stderr
    path.write_text(base % ("MaxPool", ", kernel: 2"))
    assert json.loads(run("inspect", str(path), "--json").stdout)["outputs"][0]["shape"] == [
        1, 2, 3, 3]  # MaxPool's stride defaults to 1


def test_shape_mismatch_names_both_shapes(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("inputs: {x: [3, 8, 8]}\nlayers:\n"
                    "  - {type: conv, name: a, num_output: 4, kernel: 3, pad: 1}\n"
                    "  - {type: conv, name: b, input: x, num_output: 5, kernel: 3, pad: 1}\n"
                    "  - {type: add, name: s, input: [a, b]}\n")
    err = run("inspect", str(path), code=2).stderr
    assert f"{path}:5:5" in err and "1×4×8×8" in err and "1×5×8×8" in err


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(how):
    args, env = (["--debug"], None) if how == "flag" else ([], {"NETRUN_DEBUG": "1"})
    result = run(*args, "ops", "Convolutoin", code=2, env=env)
    assert "Traceback" in result.stderr and "UnknownOpError" in result.stderr


def test_colour_follows_the_options():
    assert "\x1b[" not in run("ops", "Nope", code=2).stderr  # not a terminal
    assert "\x1b[" in run("--color", "ops", "Nope", code=2).stderr
    assert "\x1b[" not in run("--no-color", "ops", "Nope", code=2).stderr
    # An explicit --color wins over NO_COLOR.
    assert "\x1b[" in run("--color", "ops", "Nope", code=2, env={"NO_COLOR": "1"}).stderr


def test_missing_model_file_is_a_clear_error(tmp_path):
    result = run("inspect", str(tmp_path / "nope.yaml"), code=2)
    assert "no such model file" in result.stderr


def test_verbosity_flags_change_only_stderr():
    loud, quiet = run("-v", "inspect", MLP), run("-q", "ops")
    assert "loaded model 'MLP'" in loud.stderr and "parameters: 269,322" in loud.stdout
    assert quiet.stderr == "" and "Conv" in quiet.stdout
    assert "loaded model" not in run("inspect", MLP).stderr
