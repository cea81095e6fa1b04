"""netrun models as Caffe prototxt (netrun.caffe.prototxt_export, `netrun convert ...
OUT.prototxt`), and Caffe prototxt as model YAML that trains like it.

Round trips: a model -> prototxt (+ caffemodel of random weights) -> netrun loads both ->
the same outputs, for the real Caffe files and every zoo YAML; train_val files keep the
data layers, phases, loss weights and param multipliers; ops with no Caffe layer are all
listed in one error (exit status 2 from the CLI).
"""
from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import netrun
from netrun.caffe import caffe_to_yaml, load_caffe_model, load_caffe_weights, solver_to_config
from netrun.caffe.caffemodel_export import write_caffemodel
from netrun.caffe.prototxt_export import CaffeExportError, to_caffe
from netrun.cli import cli
from netrun.errors import ParseError
from netrun.model.yaml_model import model_from_yaml
from netrun.proto.blobproto import blob_bytes
from netrun.proto.textformat import parse
from tests.caffe.helpers import init_workspace, random_params, run, shared_model
from tests.caffe.test_torch_equivalence import BN_NET
from tests.caffe_proto import parse_caffemodel, parse_net

REPO = Path(__file__).resolve().parents[1]
ZOO = sorted((REPO / "zoo").glob("*.yaml"))


def _export(model, tmp_path: Path, net: str = "predict", batch: int = 2, seed: int = 1):
    """Write the model as prototxt + caffemodel of random weights (both read back by the
    protobuf library with caffe.proto's types too); load both back."""
    params = random_params(model, seed=seed, scale=0.1)
    caffe = to_caffe(model, net, batch)
    path = tmp_path / f"{net}.prototxt"
    path.write_text(caffe.text("test"))
    write_caffemodel(path.with_suffix(".caffemodel"), caffe, params)
    _check_with_protobuf(path, caffe, params)
    back = load_caffe_model(path)
    ws = init_workspace(back)
    if params:
        load_caffe_weights(ws, path.with_suffix(".caffemodel"), back)
    return back, ws, params, path


def _check_with_protobuf(path: Path, caffe, params: dict) -> None:
    """The files as Caffe's own protobuf code reads them: every layer and every blob."""
    net = parse_net(path.read_text())
    assert [layer.name for layer in net.layer] == [layer.name for layer in caffe.layers]
    weights = parse_caffemodel(path.with_suffix(".caffemodel").read_bytes())
    owners = caffe.weight_layers()
    assert [layer.name for layer in weights.layer] == [layer.name for layer in owners]
    for stored, layer in zip(weights.layer, owners):
        for blob, ref in zip(stored.blobs, layer.params, strict=True):
            want = params[ref.blob] if ref.blob else np.full(1, ref.constant, np.float32)
            assert tuple(blob.shape.dim) == want.shape
            np.testing.assert_array_equal(np.asarray(blob.data, np.float32), want.reshape(-1))


def _feeds(model, batch: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal((batch, *model.inputs[n].shape)).astype(np.float32)
             for n in model.data_inputs}
    feeds.update({n: rng.integers(0, 5, (batch, *model.inputs[n].shape)).astype(np.int32)
                  for n in model.labels})
    return feeds


def _same_predictions(model, tmp_path: Path) -> None:
    back, ws, params, _ = _export(model, tmp_path)
    feeds = _feeds(model)
    want = run(model, feeds, ws=init_workspace(model, params=params))
    got = run(back, feeds, ws=ws, fetch=[n for n in model.outputs])
    for name in model.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


# Deploy files ---------------------------------------------------------------------------
@pytest.mark.parametrize("relative", [
    "lenet/lenet_train_test.prototxt", "lenet/lenet.prototxt",
    "cifar10_quick/cifar10_quick_train_test.prototxt", "cifar10_quick/cifar10_quick.prototxt",
    "resnet50/ResNet-50-deploy.prototxt",
    pytest.param("bvlc_alexnet/deploy.prototxt", marks=pytest.mark.slow)])
def test_caffe_files_round_trip_as_deploy_files(tmp_path, relative):
    model = netrun.load_model(shared_model(relative))
    _same_predictions(model, tmp_path)
    text = to_caffe(model).text()
    assert not re.search(r'type: "(Data|SoftmaxWithLoss|Accuracy)"', text)
    assert 'type: "Input"' in text


@pytest.mark.parametrize("path", ZOO, ids=[p.stem for p in ZOO])
def test_zoo_models_round_trip(tmp_path, path):
    _same_predictions(netrun.load_model(path), tmp_path)


def test_caffe_layer_names_survive_so_the_original_weights_still_load(tmp_path):
    model = netrun.load_model(shared_model("resnet50/ResNet-50-deploy.prototxt"))
    back = load_caffe_model(_write(tmp_path, to_caffe(model)))
    assert back.layer_params == model.layer_params
    assert [(o.type, o.args) for o in back.predict_net.ops] == \
        [(o.type, o.args) for o in model.predict_net.ops]
    text = to_caffe(model).text()
    assert text.count("use_global_stats: true") == 53      # a deploy file says it


def _write(tmp_path: Path, caffe, name: str = "out.prototxt") -> Path:
    path = tmp_path / name
    path.write_text(caffe.text())
    return path


def test_floor_pooling_gets_round_mode_and_a_note(tmp_path):
    model = model_from_yaml("""
name: floor
inputs: {data: [2, 8, 8]}
layers:
  - {type: max_pool, name: pool, kernel: 3, stride: 2, pad: 1}
  - {type: average_pool, name: ceil, input: pool, kernel: 2, stride: 2, legacy_pad: 3}
""", "floor.yaml")
    caffe = to_caffe(model)
    assert caffe.text().count("    round_mode: FLOOR") == 1
    assert any("pool (8×8 -> 4×4, not 5×5)" in n for n in caffe.notes)
    assert model.infer_shapes().blobs["ceil"].shape == (1, 2, 2, 2)
    _same_predictions(model, tmp_path)


# train_val files --------------------------------------------------------------------------
def _same_training_nets(model, tmp_path: Path):
    back, ws, params, path = _export(model, tmp_path, "train", batch=4)
    feeds = _feeds(model, batch=4)
    for which in ("train", "test"):
        heads = model.net(which).external_outputs
        want = run(model, feeds, which, ws=init_workspace(model, params=params), fetch=heads)
        ws_back = init_workspace(back)
        load_caffe_weights(ws_back, path.with_suffix(".caffemodel"), back)
        got = run(back, feeds, which, ws=ws_back, fetch=heads)
        for name in heads:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, err_msg=(which, name))
    return back, path


def _layers(path: Path) -> dict:
    return {(m.get("name"), m.get("include").get("phase") if m.has("include") else None): m
            for m in parse(path.read_text()).get_all("layer")}


def test_lenet_train_val_keeps_data_layers_phases_and_multipliers(tmp_path):
    model = netrun.load_model(shared_model("lenet/lenet_train_test.prototxt"))
    back, path = _same_training_nets(model, tmp_path)
    layers = _layers(path)
    assert layers[("mnist", "TRAIN")].get("data_param").get("source") == \
        "examples/mnist/mnist_train_lmdb"
    assert layers[("mnist", "TEST")].get("data_param").get("batch_size") == 100
    assert ("accuracy", "TEST") in layers and ("loss", None) in layers
    assert [p.get("lr_mult") for p in layers[("conv1", None)].get_all("param")] == [1, 2]
    settings = [(p.layer, p.lr_mult, p.decay_mult, p.trainable) for p in model.params]
    assert [(p.layer, p.lr_mult, p.decay_mult, p.trainable) for p in back.params] == settings
    assert back.metrics == ["accuracy"] and back.loss == "loss"


def test_cifar10_quick_train_val_round_trips(tmp_path):
    model = netrun.load_model(shared_model("cifar10_quick/cifar10_quick_train_test.prototxt"))
    _same_training_nets(model, tmp_path)


def test_yaml_train_val_has_an_input_layer_and_batchnorm_statistics_frozen(tmp_path):
    model = netrun.load_model(REPO / "zoo" / "resnet20.yaml")
    back, path = _same_training_nets(model, tmp_path)
    text = path.read_text()
    assert "Input layer 'input' stands for the data (data, label, batch 4)" in text
    layers = _layers(path)
    bn = layers[("bn1", None)]
    assert [(p.get("lr_mult"), p.get("decay_mult")) for p in bn.get_all("param")] == [(0, 0)] * 3
    assert not bn.get("batch_norm_param").has("use_global_stats")   # each phase's default
    assert layers[("bn1_scale", None)].get("scale_param").get("bias_term") is True
    batch_norms = {name for name, _ in layers if layers[(name, None)].get("type") == "BatchNorm"}
    assert len(batch_norms) == 21
    assert {p.layer for p in back.params if not p.trainable} == batch_norms
    assert all(p.trainable for p in back.params if p.layer not in batch_norms)


MANY = """
name: "many"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 4 dim: 9 dim: 9 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 2 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        convolution_param { num_output: 6 kernel_h: 3 kernel_w: 2 pad_h: 1 pad_w: 0 stride_h: 2
                            stride_w: 1 group: 2 weight_filler { type: "gaussian" std: 0.1 }
                            bias_filler { type: "constant" value: 0.1 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1"
        batch_norm_param { moving_average_fraction: 0.9 } }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "prelu" type: "PReLU" bottom: "conv1" top: "conv1" }
layer { name: "deconv" type: "Deconvolution" bottom: "conv1" top: "up"
        convolution_param { num_output: 4 kernel_size: 2 stride: 2 bias_term: false
                            weight_filler { type: "bilinear" } } }
layer { name: "slice" type: "Slice" bottom: "up" top: "s1" top: "s2"
        slice_param { slice_point: 1 } }
layer { name: "sum" type: "Eltwise" bottom: "s2" bottom: "s2" top: "ssum"
        eltwise_param { coeff: 0.5 coeff: 2 } }
layer { name: "prod" type: "Eltwise" bottom: "ssum" bottom: "ssum" top: "sprod"
        eltwise_param { operation: PROD } }
layer { name: "pow" type: "Power" bottom: "sprod" top: "spow"
        power_param { power: 2 scale: 0.5 shift: 1 } }
layer { name: "pool" type: "Pooling" bottom: "spow" top: "pool"
        pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "drop" type: "Dropout" bottom: "pool" top: "pool"
        dropout_param { dropout_ratio: 0.3 } }
layer { name: "flat" type: "Flatten" bottom: "pool" top: "flat" }
layer { name: "ip1" type: "InnerProduct" bottom: "flat" top: "ip1"
        inner_product_param { num_output: 7 transpose: true bias_term: false
                              weight_filler { type: "xavier" } } }
layer { name: "sig" type: "Sigmoid" bottom: "ip1" top: "sig" }
layer { name: "tanh" type: "TanH" bottom: "sig" top: "tanh" }
layer { name: "ip2" type: "InnerProduct" bottom: "tanh" top: "ip2" param { name: "shared_w" }
        inner_product_param { num_output: 7 bias_term: false } }
layer { name: "ip3" type: "InnerProduct" bottom: "ip2" top: "ip3" param { name: "shared_w" }
        inner_product_param { num_output: 7 bias_term: false } }
layer { name: "elu" type: "ELU" bottom: "ip3" top: "ip3" elu_param { alpha: 0.5 } }
layer { name: "lrelu" type: "ReLU" bottom: "ip3" top: "ip3" relu_param { negative_slope: 0.1 } }
layer { name: "ip4" type: "InnerProduct" bottom: "ip3" top: "ip4"
        inner_product_param { num_output: 5 } propagate_down: false }
layer { name: "loss1" type: "SoftmaxWithLoss" bottom: "ip4" bottom: "label" top: "loss1"
        loss_weight: 0.3 }
layer { name: "loss2" type: "SoftmaxWithLoss" bottom: "ip1" bottom: "label" top: "loss2" }
layer { name: "acc" type: "Accuracy" bottom: "ip4" bottom: "label" top: "acc"
        accuracy_param { top_k: 2 } include { phase: TEST } }
"""


def test_many_caffe_layers_round_trip(tmp_path):
    (tmp_path / "many.prototxt").write_text(MANY)
    model = load_caffe_model(tmp_path / "many.prototxt")
    back, path = _same_training_nets(model, tmp_path)
    layers = _layers(path)
    assert [n for n, phase in layers if phase] == ["acc"]
    assert layers[("sum", None)].get("eltwise_param").get_all("coeff") == [0.5, 2.0]
    assert layers[("ip1", None)].get("inner_product_param").get("transpose") is True
    assert layers[("loss1", None)].get("loss_weight") == 0.3
    assert not layers[("loss2", None)].has("loss_weight")
    assert layers[("ip4", None)].get_all("propagate_down") == [False]
    assert [p.get("name") for p in layers[("ip3", None)].get_all("param")] == ["shared_w"]
    assert layers[("conv1", None)].get("convolution_param").get("kernel_h") == 3
    assert [(p.get("lr_mult"), p.get("decay_mult")) for p in
            layers[("conv1", None)].get_all("param")] == [(1, None), (2, 0)]
    assert ("scale1", None) in layers and layers[("scale1", None)].get("type") == "Scale"
    assert {(p.layer, p.lr_mult, p.decay_mult, p.trainable) for p in back.params
            if p.trainable} == {(p.layer, p.lr_mult, p.decay_mult, True) for p in model.params
                                if p.trainable}
    predict = tmp_path / "deploy"
    predict.mkdir()
    _same_predictions(model, predict)


def test_caffe_batchnorm_train_val(tmp_path):
    (tmp_path / "bn.prototxt").write_text(BN_NET)
    model = load_caffe_model(tmp_path / "bn.prototxt")
    back, path = _same_training_nets(model, tmp_path)
    assert [p.name for p in back.params if not p.trainable] == \
        [p.name for p in model.params if not p.trainable]


# What Caffe cannot say -----------------------------------------------------------------------
UNSUPPORTED = """
name: odd
inputs: {data: [2, 3, 4]}
ops:
  - {type: Transpose, inputs: [data], outputs: [t], args: {axes: [0, 1, 3, 2]}}
  - {type: Softmax, inputs: [t], outputs: [sm], args: {axis: 1}}
  - {type: Relu, inputs: [sm], outputs: [r]}
  - {type: AveragePool, inputs: [r], outputs: [p],
     args: {kernel: 2, pad: 1, count_include_pad: 0}}
"""


def test_ops_without_a_caffe_layer_are_listed_at_once(tmp_path):
    model = model_from_yaml(UNSUPPORTED, "odd.yaml")
    with pytest.raises(CaffeExportError) as err:
        to_caffe(model)
    problems = err.value.problems
    assert len(problems) == 3, problems
    assert "Transpose" in problems[0] and "no Caffe layer computes it" in problems[0]
    assert "Softmax" in problems[1] and "over dim 1 alone" in problems[1]
    assert "AveragePool" in problems[2] and "count_include_pad" in problems[2]
    path = tmp_path / "odd.yaml"
    path.write_text(UNSUPPORTED)
    result = _cli("convert", path, tmp_path / "odd.prototxt", code=2)
    assert all(t in result.output for t in ("Transpose", "Softmax", "AveragePool"))
    assert "Traceback" not in result.output and not (tmp_path / "odd.prototxt").exists()


# The CLI --------------------------------------------------------------------------------------
def _cli(*args, code: int = 0):
    result = CliRunner().invoke(cli, [str(a) for a in args], prog_name="netrun")
    assert result.exit_code == code, result.output + repr(result.exception)
    return result


def test_convert_help_describes_every_option_with_examples():
    text = _cli("convert", "--help").output
    for option in ("--net", "--batch", "--weights"):
        assert option in text
    for example in ("lenet.yaml", ".pb", "deploy.prototxt", "--net train", "--weights"):
        assert example in text


def test_cli_writes_prototxt_and_caffemodel(tmp_path):
    source = shared_model("lenet/lenet_train_test.prototxt")
    model = netrun.load_model(source)
    params = random_params(model, seed=5)
    weights = tmp_path / "given.caffemodel"
    write_caffemodel(weights, to_caffe(model), params)
    out = tmp_path / "lenet_deploy.prototxt"
    result = _cli("convert", source, out, "--weights", weights, "--batch", 3)
    assert "deploy net 'LeNet'" in result.output
    assert "dim: 3" in out.read_text()
    back = load_caffe_model(out)
    ws = init_workspace(back)
    load_caffe_weights(ws, out.with_suffix(".caffemodel"), back)
    feeds = _feeds(model)
    np.testing.assert_array_equal(run(back, feeds, ws=ws)["ip2"],
                                  run(model, feeds, ws=init_workspace(model, params=params))["ip2"])
    _cli("convert", source, tmp_path / "tv.prototxt", "--net", "train")
    assert 'phase: TEST' in (tmp_path / "tv.prototxt").read_text()


def test_cli_weights_from_a_netrun_checkpoint(tmp_path, shared_data):
    from netrun.caffe import read_caffe_weights
    from netrun.weights import load_weights

    lenet = REPO / "zoo" / "lenet.yaml"
    _cli("train", REPO / "configs" / "lenet_mnist10k.yaml", "--max-iter", 2, "--output",
         tmp_path / "run", "--data-dir", shared_data / "mnist", "--set",
         "solver.test_interval=0")
    checkpoint = tmp_path / "run" / "last.h5"
    _cli("convert", lenet, tmp_path / "lenet.prototxt", "--weights", checkpoint)
    model = netrun.load_model(lenet)
    ws = init_workspace(model)
    load_weights(ws, checkpoint, model)
    blobs = read_caffe_weights(tmp_path / "lenet.caffemodel")
    assert list(blobs) == ["conv1", "conv2", "ip1", "ip2"]
    for layer, arrays in blobs.items():
        for suffix, array in zip(("w", "b"), arrays):
            np.testing.assert_array_equal(array, ws.fetch_blob(f"{layer}_{suffix}"))


def test_cli_refuses_what_a_prototxt_cannot_hold(tmp_path):
    lenet = REPO / "zoo" / "lenet.yaml"
    assert "not --net init" in _cli("convert", lenet, tmp_path / "x.prototxt", "--net", "init",
                                    code=2).output
    assert "--batch goes with a Caffe .prototxt" in _cli(
        "convert", lenet, tmp_path / "x.pbtxt", "--batch", "4", code=2).output
    _cli("convert", lenet, tmp_path / "lenet.pbtxt")     # a NetDef declares no input shapes
    assert "gives no shape for its input(s) data" in _cli(
        "convert", tmp_path / "lenet.pbtxt", tmp_path / "x.prototxt", code=2).output


# prototxt -> YAML keeps lr_mult and frozen statistics --------------------------------------
def test_yaml_params_section():
    text = """
name: p
inputs: {data: [3]}
init_ops:
  - {type: XavierFill, outputs: [w], args: {shape: [2, 3]}}
  - {type: ConstantFill, outputs: [b], args: {shape: [2]}}
  - {type: ConstantFill, outputs: [m], args: {shape: [2]}}
params:
  b: {layer: ip, role: bias, lr_mult: 2, decay_mult: 0}
  m: {trainable: false, role: running_mean}
  w: {lr_mult: 0}
ops:
  - {type: FC, inputs: [data, w, b], outputs: [y]}
"""
    model = model_from_yaml(text, "p.yaml")
    got = {p.name: (p.layer, p.role, p.lr_mult, p.decay_mult, p.trainable) for p in model.params}
    assert got == {"w": ("", "weight", 0.0, 1.0, False), "b": ("ip", "bias", 2.0, 0.0, True),
                   "m": ("", "running_mean", 1.0, 1.0, False)}
    with pytest.raises(ParseError, match=r"p.yaml:9:3: 'bb' is not a parameter .*did you mean 'b'"):
        model_from_yaml(text.replace("  b: {layer", "  bb: {layer"), "p.yaml")
    with pytest.raises(ParseError, match=r"unknown role 'biass', did you mean 'bias'"):
        model_from_yaml(text.replace("role: bias,", "role: biass,"), "p.yaml")
    with pytest.raises(ParseError, match=r"'lr_mult' must be a number"):
        model_from_yaml(text.replace("lr_mult: 2", "lr_mult: two"), "p.yaml")


def _losses(cfg, tmp_path: Path, out: str, data_dir) -> list[float]:
    from netrun.train.trainer import Trainer

    cfg.solver.max_iter, cfg.solver.test_iter, cfg.solver.display = 5, 1, 1
    cfg.solver.test_interval, cfg.solver.snapshot = 0, 0
    trainer = Trainer(cfg, output=str(tmp_path / out), data_dir=str(data_dir))
    trainer.run()
    return [h["loss"] for h in trainer.history if "loss" in h]


def _yaml_config(cfg, tmp_path: Path, strip_params: bool = False):
    text = caffe_to_yaml(load_caffe_model(cfg.model))
    if strip_params:   # what the YAML was before it kept the multipliers
        text = re.sub(r"\nparams:.*?\nops:", "\nops:", text, flags=re.S)
    path = tmp_path / ("stripped.yaml" if strip_params else "converted.yaml")
    path.write_text(text)
    return dataclasses.replace(cfg, model=str(path))


def test_lenet_trains_the_same_from_the_converted_yaml(tmp_path, shared_data):
    solver = shared_model("lenet/lenet_solver.prototxt")
    data = {"source": "mnist", "split": "mnist-10k"}
    want = _losses(solver_to_config(solver, data), tmp_path, "prototxt", shared_data)
    got = _losses(_yaml_config(solver_to_config(solver, data), tmp_path), tmp_path, "yaml",
                  shared_data)
    assert got == want and len(want) == 5
    # lr_mult 2 on the biases matters: without the params section the steps differ.
    stripped = _losses(_yaml_config(solver_to_config(solver, data), tmp_path, True), tmp_path,
                       "stripped", shared_data)
    assert stripped != want


def test_cifar10_quick_trains_the_same_from_the_converted_yaml(tmp_path):
    for name in ("cifar10_quick_solver.prototxt", "cifar10_quick_train_test.prototxt"):
        shutil.copy(shared_model(f"cifar10_quick/{name}"), tmp_path / name)
    mean = np.random.default_rng(0).uniform(0, 255, (1, 3, 32, 32)).astype(np.float32)
    (tmp_path / "examples" / "cifar10").mkdir(parents=True)
    (tmp_path / "examples" / "cifar10" / "mean.binaryproto").write_bytes(blob_bytes(mean))
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "cifar.npz", x_train=rng.integers(0, 256, (64, 3, 32, 32), np.uint8),
             y_train=rng.integers(0, 10, 64), x_test=rng.integers(0, 256, (16, 3, 32, 32),
                                                                  np.uint8),
             y_test=rng.integers(0, 10, 16))
    data = {"source": "npz", "path": str(tmp_path / "cifar.npz"), "batch_size": 16,
            "test_batch_size": 16}
    solver = tmp_path / "cifar10_quick_solver.prototxt"
    want = _losses(solver_to_config(solver, data), tmp_path, "prototxt", tmp_path)
    got = _losses(_yaml_config(solver_to_config(solver, data), tmp_path), tmp_path, "yaml",
                  tmp_path)
    assert got == want and len(want) == 5


def test_a_caffemodel_loads_into_the_yaml_converted_from_its_prototxt(tmp_path):
    """The converted YAML keeps each parameter's layer, so Caffe weights load by layer name."""
    from netrun.infer import Predictor

    proto = shared_model("lenet/lenet.prototxt")
    model = netrun.load_model(proto)
    (tmp_path / "lenet.yaml").write_text(caffe_to_yaml(model))
    rng = np.random.default_rng(0)
    values = {p.name: (rng.standard_normal(p.shape) * 0.1).astype(np.float32)
              for p in model.params}
    write_caffemodel(tmp_path / "w.caffemodel", to_caffe(model), values)
    x = rng.random((2, 1, 28, 28)).astype(np.float32)
    want = Predictor.from_model(proto, tmp_path / "w.caffemodel").predict(x)
    got = Predictor.from_model(tmp_path / "lenet.yaml", tmp_path / "w.caffemodel").predict(x)
    np.testing.assert_array_equal(got, want)
