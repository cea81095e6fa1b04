"""Model YAML: positions in YAML, the layer and raw forms, NetDef files, errors with hints."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import netrun
from netrun.core.schema import TensorSpec
from netrun.errors import NetrunError, ParseError
from netrun.model import load_model
from netrun.proto.io import save_netdef
from netrun.model.yaml_model import model_from_yaml
from netrun.proto.yaml_marks import check_keys, error_at, load_yaml

REPO = Path(__file__).resolve().parents[1]
LENET = REPO / "zoo" / "lenet.yaml"


def _yaml(text: str, name: str = "m.yaml"):
    return model_from_yaml(textwrap.dedent(text), name)


def _error(text: str, name: str = "m.yaml") -> ParseError:
    with pytest.raises(ParseError) as info:
        _yaml(text, name)
    return info.value


# yaml_marks -------------------------------------------------------------------------------
def test_marks_record_key_value_and_item_positions():
    doc = load_yaml("a: 1\nlist:\n  - x\n  - {k: 2.5}\n", "f.yaml")
    assert doc == {"a": 1, "list": ["x", {"k": 2.5}]}
    assert (doc.key_marks["list"].line, doc.key_marks["list"].column) == (2, 1)
    items = doc["list"].item_marks
    assert [(m.line, m.column) for m in items] == [(3, 5), (4, 5)]
    inner = doc["list"][1]
    assert (inner.value_marks["k"].line, inner.value_marks["k"].column) == (4, 9)
    assert inner.mark.file == "f.yaml" and inner.mark.source_line == "  - {k: 2.5}"


def test_exponent_without_dot_is_a_float():
    assert load_yaml("alpha: 1e-4\nbeta: -2E3\nname: 1e\n") == {"alpha": 1e-4, "beta": -2000.0,
                                                                "name": "1e"}


def test_syntax_error_has_file_line_column_and_caret():
    with pytest.raises(ParseError) as info:
        load_yaml("a: 1\nb: [1, 2\nc: 3\n", "bad.yaml")
    e = info.value
    assert (e.file, e.line) == ("bad.yaml", 3)
    assert e.column is not None and "invalid YAML" in e.message
    assert str(e).startswith(f"bad.yaml:3:{e.column}: ")
    assert str(e).splitlines()[-1].strip() == "^"


def test_duplicate_keys_are_refused_at_the_second_one():
    with pytest.raises(ParseError,
                       match=r"f.yaml:3:1: duplicate key 'a' \(first given at line 1\)"):
        load_yaml("a: 1\nb: 2\na: 3\n", "f.yaml")


def test_check_keys_suggests_the_closest_key_and_error_at_points_at_values():
    doc = load_yaml("nmae: x\nvalue: 3\n", "f.yaml")
    with pytest.raises(ParseError, match=r"f.yaml:1:1: unknown key 'nmae' in thing, did you "
                                         r"mean 'name'\?"):
        check_keys(doc, ["name", "value"], "thing")
    assert str(error_at(doc, "bad", "value", value=True)).startswith("f.yaml:2:8: bad")


# Layer form -------------------------------------------------------------------------------
def test_lenet_loads_with_inputs_params_loss_and_metrics():
    m = load_model(LENET)
    assert m.name == "LeNet" and m.source_path == str(LENET)
    assert m.inputs == {"data": TensorSpec((1, 28, 28)), "label": TensorSpec((), "int32")}
    assert m.labels == ["label"] and m.data_inputs == ["data"]
    assert m.param_names == ["conv1_w", "conv1_b", "conv2_w", "conv2_b", "ip1_w", "ip1_b",
                             "ip2_w", "ip2_b"]
    assert [p.shape for p in m.params][:2] == [(20, 1, 5, 5), (20,)]
    assert m.loss == "loss" and m.metrics == ["accuracy"] and m.outputs == ["ip2"]
    assert [o.type for o in m.predict_net.ops] == ["Conv", "MaxPool", "Conv", "MaxPool", "FC",
                                                  "Relu", "FC"]
    assert [o.type for o in m.train_net.ops][-2:] == ["SoftmaxWithLoss", "Accuracy"]
    assert m.param_count() == 431_080
    assert netrun.load_model(LENET).predict_net == m.predict_net  # the public entry point


def test_input_and_name_default_to_previous_output_and_type_with_position():
    m = _yaml("""
        inputs: {x: [3, 8, 8]}
        layers:
          - {type: conv, num_output: 4, kernel: 3}
          - {type: relu}
          - {type: fc, num_output: 2, input: x}
          - {type: sigmoid}
        """, "tiny.yaml")
    ops = m.predict_net.ops
    assert [o.name for o in ops] == ["conv1", "relu2", "fc3", "sigmoid4"]
    assert [o.inputs[0] for o in ops] == ["x", "conv1", "x", "fc3"]
    assert m.name == "tiny" and m.outputs == ["sigmoid4"] and m.loss is None


def test_unknown_layer_type_is_reported_at_its_value_with_a_suggestion():
    e = _error("""
        inputs: {x: [4]}
        layers:
          - {type: fc, num_output: 3}
          - {type: rleu}
        """)
    assert (e.file, e.line, e.column) == ("m.yaml", 5, 12)
    assert "unknown layer type 'rleu', did you mean 'relu'?" in e.message


def test_unknown_layer_key_is_reported_at_the_key_with_a_suggestion():
    e = _error("""
        inputs: {x: [4]}
        layers:
          - type: fc
            num_ouptut: 3
        """)
    assert (e.line, e.column) == (5, 5)
    assert "unknown key 'num_ouptut' in a fc layer, did you mean 'num_output'?" in e.message


@pytest.mark.parametrize("text, where, message", [
    ("layers:\n  - {type: fc}\n", (3, 5), "layer 'fc1' (fc) needs 'num_output'"),
    ("layers:\n  - {type: fc, num_output: three}\n", (3, 28),
     "'num_output' must be an integer, got 'three'"),
    ("layers:\n  - {type: fc, num_output: 3, input: y}\n", (3, 5),
     "input blob 'y' does not exist"),
    ("layers:\n  - {type: fc, num_output: 3, weight_filler: xavir}\n", (3, 5),
     "unknown filler 'xavir', did you mean 'xavier'?"),
    ("layers: []\nloss: {type: softmax_xent}\n", (3, 14),
     "unknown loss type 'softmax_xent', did you mean 'softmax_cross_entropy'?"),
    ("layerz: []\n", (2, 1), "unknown key 'layerz' in a model"),
    ("layers: []\ninputs: {x: [0]}\n", (2, 13), "must be a list of positive integers"),
])
def test_layer_errors_point_at_the_layer_or_key(text, where, message):
    if "inputs" not in text:
        text = "inputs: {x: [4]}\n" + text
    e = _error(text)
    assert (e.line, e.column) == where, str(e)
    assert message in e.message


def test_a_layer_shape_mismatch_names_both_shapes_at_the_layer():
    e = _error("""
        inputs: {x: [3, 8, 8]}
        layers:
          - {type: conv, name: a, num_output: 4, kernel: 3, pad: 1}
          - {type: conv, name: b, input: x, num_output: 5, kernel: 3, pad: 1}
          - {type: add, name: s, input: [a, b]}
        """)
    assert e.line == 6
    assert "'s' (Add)" in e.message and "1×4×8×8" in e.message and "1×5×8×8" in e.message


def test_predict_softmax_and_explicit_output():
    m = _yaml("""
        inputs: {x: [4], y: []}
        layers: [{type: fc, name: f, num_output: 3}]
        loss: {type: softmax_cross_entropy, label: y}
        predict: softmax
        """)
    assert m.predict_net.ops[-1].type == "Softmax" and m.outputs == ["prob"]
    assert m.predict_net.external_inputs == ["x", "f_w", "f_b"]
    assert m.inputs["y"].dtype == "int32"


def test_declared_label_dtype_is_kept():
    m = _yaml("""
        inputs: {x: [4], y: {shape: [], dtype: int64}}
        layers: [{type: fc, num_output: 3}]
        loss: {type: softmax_cross_entropy, label: y}
        """)
    assert m.inputs["y"] == TensorSpec((), "int64")


# Raw form ---------------------------------------------------------------------------------
RAW = """
    name: raw
    inputs: {data: [4], label: []}
    init_ops:
      - {type: XavierFill, outputs: [w], args: {shape: [3, 4]}}
      - {type: ConstantFill, outputs: [b], shape: [3]}
    ops:
      - {type: FC, inputs: [data, w, b], outputs: [fc], name: fc}
      - {type: SoftmaxWithLoss, inputs: [fc, label], outputs: [prob, loss]}
    loss: loss
    """


def test_raw_form_builds_nets_params_and_labels():
    m = _yaml(RAW)
    assert m.name == "raw" and m.param_names == ["w", "b"]
    assert [p.shape for p in m.params] == [(3, 4), (3,)]
    assert [o.type for o in m.predict_net.ops] == ["FC"] and m.outputs == ["fc"]
    assert m.labels == ["label"] and m.inputs["label"].dtype == "int32"
    assert m.train_net.external_outputs == ["loss"]
    assert m.infer_shapes("train", batch_size=5)["prob"].shape == (5, 3)


@pytest.mark.parametrize("old, new, where, message", [
    ("type: FC,", "type: FullyConected,", (8, 12), "unknown op type 'FullyConected'"),
    ("type: FC,", "type: Convolutoin,", (8, 12), "did you mean 'Conv'?"),
    ("name: fc}", "name: fc, axs: 1}", (8, 63), "FC has no argument 'axs', did you mean 'axis'?"),
    ("outputs: [fc]", "ouputs: [fc]", (8, 38), "did you mean 'outputs'?"),
    ("shape: [3]", "shape: [4]", (8, 5), "(inputs: data 1×4, w 3×4, b 4)"),
])
def test_raw_form_errors_have_positions_and_suggestions(old, new, where, message):
    e = _error(RAW.replace(old, new, 1))
    assert (e.line, e.column) == where, str(e)
    assert message in e.message


# NetDef files and other formats -----------------------------------------------------------
def test_pbtxt_net_is_a_model_whose_params_are_the_other_external_inputs(tmp_path):
    lenet = load_model(LENET)
    path = tmp_path / "lenet_predict.pbtxt"
    save_netdef(lenet.predict_net, path)
    m = load_model(path)
    assert m.predict_net == lenet.predict_net and m.train_net == m.predict_net
    assert m.inputs == {"data": None} and m.init_net.ops == []
    assert m.param_names == lenet.param_names and m.outputs == ["ip2"]
    shapes = {p.name: TensorSpec(p.shape) for p in lenet.params}
    assert m.param_count(shapes) == 431_080
    with pytest.raises(NetrunError, match="--input data="):
        m.infer_shapes("predict", 2)
    got = m.infer_shapes("predict", overrides={"data": TensorSpec((2, 1, 28, 28)), **shapes})
    assert got["ip2"].shape == (2, 10)
    assert load_model(path, data_inputs=["data", "conv1_w"]).param_names[0] == "conv1_b"


def test_netdef_yaml_loads_as_a_bare_net(tmp_path):
    net = load_model(LENET).train_net
    save_netdef(net, tmp_path / "train.yaml")
    m = load_model(tmp_path / "train.yaml", data_inputs=["data", "label"])
    assert m.train_net == net and "label" in m.inputs and "conv1_w" in m.param_names


def test_empty_prototxt_and_unknown_formats_fail(tmp_path):
    (tmp_path / "m.prototxt").write_text('name: "x"\n')
    with pytest.raises(ParseError, match="m.prototxt:1:1: net 'x' has no layers"):
        load_model(tmp_path / "m.prototxt")
    (tmp_path / "m.tflite").write_text("")
    with pytest.raises(NetrunError, match="unknown model format '.tflite'"):
        load_model(tmp_path / "m.tflite")
    with pytest.raises(ParseError, match="no such model file"):
        load_model(tmp_path / "missing.yaml")
