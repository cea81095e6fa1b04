"""ONNX export: every zoo net and Caffe deploy file agrees with onnxruntime; CLI; errors."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from netrun.cli import cli
from netrun.core.workspace import Workspace
from netrun.errors import NetrunError
from netrun.export import export_onnx, source_from_model, to_onnx
from netrun.model import load_model
from netrun.proto.defs import op
from tests.caffe.helpers import random_params, shared_model

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
ZOO = Path(__file__).resolve().parents[1] / "zoo"


def _seeded(path) -> object:
    """The model's export source with random (seeded) parameters."""
    src = source_from_model(path)
    params = random_params(load_model(path), seed=1)
    return replace(src, params={n: params.get(n, v) for n, v in src.params.items()})


def _agree(src, model, batch: int = 2) -> None:
    x = np.random.default_rng(2).standard_normal((batch, *src.input_shape)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {src.input_name: x})[0]
    ws = Workspace("cpu", memory_plan=False)
    for name, value in src.params.items():
        ws.feed_blob(name, value)
    ws.feed_blob(src.input_name, x)
    ws.run_net_once(src.net)
    want = ws.fetch_blob(src.outputs[0])
    assert got.shape == want.shape
    # rtol 1e-4; atol relative to the output's scale (summation order differs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("name", ["lenet", "mlp", "cifar10_quick", "resnet20", "googlenet",
                                  pytest.param("resnet50", marks=pytest.mark.slow)])
def test_zoo_net_agrees_with_onnxruntime(name):
    src = _seeded(ZOO / f"{name}.yaml")
    _agree(src, to_onnx(src))


@pytest.mark.parametrize("relative", [
    "lenet/lenet.prototxt", "cifar10_quick/cifar10_quick.prototxt",
    pytest.param("bvlc_alexnet/deploy.prototxt", marks=pytest.mark.slow),
    pytest.param("resnet50/ResNet-50-deploy.prototxt", marks=pytest.mark.slow)])
def test_caffe_deploy_agrees_with_onnxruntime(relative):
    src = _seeded(shared_model(relative))
    _agree(src, to_onnx(src))


def test_opset_13_and_fixed_batch():
    src = _seeded(ZOO / "resnet20.yaml")
    model = to_onnx(src, opset=13, batch=3)
    assert model.opset_import[0].version == 13
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 3
    _agree(src, model, batch=3)


def test_in_place_blobs_become_single_assignments():
    model = to_onnx(_seeded(shared_model("lenet/lenet.prototxt")))   # Relu ip1 -> ip1
    written = [o for n in model.graph.node for o in n.output]
    assert len(written) == len(set(written))


def test_unsupported_ops_listed_at_once():
    src = _seeded(ZOO / "lenet.yaml")
    ops = list(src.net.ops)
    ops.insert(1, op("Exp", [ops[0].outputs[0]], [ops[0].outputs[0]]))
    ops.insert(2, op("Log", [ops[0].outputs[0]], [ops[0].outputs[0]]))
    net = type(src.net)(src.net.name, ops, list(src.net.external_inputs),
                        list(src.net.external_outputs))
    with pytest.raises(NetrunError, match="Exp, Log"):
        to_onnx(replace(src, net=net))


def test_old_opset_refused():
    with pytest.raises(NetrunError, match="opset 12"):
        to_onnx(_seeded(ZOO / "mlp.yaml"), opset=12)


def test_cli_export(tmp_path):
    out = tmp_path / "lenet.onnx"
    result = CliRunner().invoke(cli, ["export", str(ZOO / "lenet.yaml"), str(out),
                                      "--opset", "13", "--batch", "1"])
    assert result.exit_code == 0, result.output
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert [o.name for o in model.graph.output] == ["ip2"]
    assert not list(tmp_path.glob(".*"))        # no temporary file left beside it


def test_cli_help_has_examples():
    result = CliRunner().invoke(cli, ["export", "--help"])
    assert result.exit_code == 0 and "netrun export" in result.output


def test_cli_missing_folder(tmp_path):
    result = CliRunner().invoke(cli, ["export", str(ZOO / "mlp.yaml"),
                                      str(tmp_path / "no" / "x.onnx")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_export_writes_file(tmp_path):
    out = tmp_path / "m.onnx"
    export_onnx(_seeded(ZOO / "mlp.yaml"), out)
    assert out.stat().st_size > 0


def test_a_checkpoint_exports_and_predicts_as_netrun_does(tmp_path):
    """A trained run's checkpoint (dropout dropped) gives onnxruntime what infer gives."""
    import json

    import onnxruntime as ort

    from netrun.infer import Predictor
    from tests.train.conftest import write_config

    summary = json.loads(CliRunner().invoke(
        cli, ["train", write_config(tmp_path), "--max-iter", "8", "--json"]).stdout)
    out = tmp_path / "tiny.onnx"
    result = CliRunner().invoke(cli, ["export", summary["checkpoint"], str(out)])
    assert result.exit_code == 0, result.output
    x = np.random.default_rng(5).uniform(0, 1, (3, 1, 28, 28)).astype(np.float32)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    logits = session.run(None, {session.get_inputs()[0].name: x})[0]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    want = Predictor.from_checkpoint(summary["checkpoint"]).predict(x)
    np.testing.assert_allclose(e / e.sum(axis=1, keepdims=True), want, rtol=1e-4, atol=1e-6)
