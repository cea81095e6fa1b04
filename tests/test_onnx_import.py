"""ONNX import: every supported operator agrees with onnxruntime, a PyTorch ResNet-18 runs
with onnxruntime's top-5, netrun export round-trips, unsupported models are refused with
every reason at once, and an ONNX model fine-tunes from its initializers."""
from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from netrun.cli import cli
from netrun.core.workspace import Workspace
from netrun.errors import NetrunError, ParseError
from netrun.model import load_model

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, numpy_helper  # noqa: E402
from onnx import helper as oh  # noqa: E402

ZOO = Path(__file__).resolve().parents[1] / "zoo"
N = "N"          # a symbolic batch dimension


def _w(*shape: int, seed: int = 0, positive: bool = False) -> np.ndarray:
    x = np.random.default_rng([seed, *shape]).standard_normal(shape).astype(np.float32)
    return np.abs(x) + 0.5 if positive else x


def _save(path: Path, nodes, inputs: dict, outputs: list[str], inits: dict | None = None,
          opset: int = 17) -> Path:
    """An ONNX file of one graph: float inputs {name: dims}, outputs of unknown shape."""
    graph = oh.make_graph(
        nodes, "g", [oh.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in inputs.items()],
        [oh.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    opsets = [oh.make_opsetid("", opset)]
    model = oh.make_model(graph, opset_imports=opsets)
    model.ir_version = oh.find_min_ir_version_for(opsets)
    onnx.save(model, path)
    return path


def _run_netrun(model, feeds: dict) -> list[np.ndarray]:
    ws = Workspace("cpu", memory_plan=False)
    ws.run_net_once(model.init_net)
    for name, value in zip(model.data_inputs, feeds.values()):
        ws.feed_blob(name, value)
    ws.run_net_once(model.predict_net)
    return [ws.fetch_blob(o) for o in model.outputs]


def _agree(path: Path, feeds: dict, rtol: float = 1e-4):
    """netrun's outputs against onnxruntime's; returns the Model."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    model = load_model(path)
    got = _run_netrun(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-5 * max(1.0, float(np.abs(w).max())))
    return model


def node(op_type: str, inputs: list[str], outputs: list[str], **attrs):
    return oh.make_node(op_type, inputs, outputs, name=f"{op_type.lower()}_{outputs[0]}", **attrs)


# One graph per case: (nodes, inputs {name: dims}, outputs, initializers, opset).
def _cases() -> dict:
    x4 = {"x": [N, 4, 9, 8]}
    c = {
        "conv_group_dilation_strides_pads": (
            [node("Conv", ["x", "W", "B"], ["y"], group=2, dilations=[2, 1], strides=[2, 1],
                  pads=[1, 0, 2, 1])], x4, ["y"], {"W": _w(6, 2, 3, 3), "B": _w(6)}),
        "conv_same_upper": ([node("Conv", ["x", "W"], ["y"], auto_pad="SAME_UPPER",
                                  strides=[2, 2])], x4, ["y"], {"W": _w(3, 4, 4, 4)}),
        "conv_same_lower": ([node("Conv", ["x", "W"], ["y"], auto_pad="SAME_LOWER",
                                  strides=[2, 3])], x4, ["y"], {"W": _w(3, 4, 4, 3)}),
        "conv_valid": ([node("Conv", ["x", "W"], ["y"], auto_pad="VALID", kernel_shape=[2, 3])],
                       x4, ["y"], {"W": _w(5, 4, 2, 3)}),
        "conv_transpose": ([node("ConvTranspose", ["x", "W", "B"], ["y"], strides=[2, 2],
                                 pads=[1, 1, 1, 1], output_padding=[1, 0])],
                           x4, ["y"], {"W": _w(4, 3, 3, 3), "B": _w(3)}),
        "conv_transpose_group_same": (
            [node("ConvTranspose", ["x", "W"], ["y"], group=2, strides=[2, 2],
                  auto_pad="SAME_UPPER")], x4, ["y"], {"W": _w(4, 2, 4, 4)}),
        "max_pool_pads": ([node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                pads=[1, 1, 1, 1])], x4, ["y"], {}),
        "max_pool_ceil": ([node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                ceil_mode=1)], x4, ["y"], {}),
        "max_pool_ceil_asymmetric": (
            [node("MaxPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1,
                  pads=[0, 1, 1, 0])], x4, ["y"], {}),
        "avg_pool_count_pad": ([node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3],
                                     strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)],
                               x4, ["y"], {}),
        "avg_pool_ceil_excluding_pad": (
            [node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                  pads=[1, 0, 1, 0], ceil_mode=1)], x4, ["y"], {}),
        "avg_pool_ceil_counting_pad": (
            [node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                  pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)], x4, ["y"], {}),
        "avg_pool_same_lower": ([node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2],
                                      strides=[2, 2], auto_pad="SAME_LOWER")], x4, ["y"], {}),
        "global_pools": ([node("GlobalAveragePool", ["x"], ["a"]),
                          node("GlobalMaxPool", ["x"], ["m"]), node("Add", ["a", "m"], ["y"])],
                         x4, ["y"], {}),
        "lrn": ([node("LRN", ["x"], ["y"], size=3, alpha=1e-2, beta=0.7, bias=1.5)], x4, ["y"],
                {}),
        "activations": ([node("Relu", ["x"], ["r"]), node("LeakyRelu", ["x"], ["l"], alpha=0.2),
                         node("Sigmoid", ["x"], ["s"]), node("Tanh", ["x"], ["t"]),
                         node("Elu", ["x"], ["e"], alpha=0.7),
                         node("HardSigmoid", ["x"], ["h"], alpha=0.3, beta=0.4),
                         node("Softplus", ["x"], ["p"]), node("Neg", ["x"], ["n"]),
                         node("Abs", ["x"], ["a"]), node("Exp", ["x"], ["ex"]),
                         node("Sqrt", ["a"], ["sq"]), node("Log", ["ex"], ["lg"])],
                        x4, ["r", "l", "s", "t", "e", "h", "p", "n", "a", "ex", "sq", "lg"], {}),
        "softmax_opset11_coerced": ([node("Softmax", ["x"], ["y"], axis=1)], x4, ["y"], {}, 11),
        "softmax_opset13_one_axis": ([node("Softmax", ["x"], ["y"], axis=1),
                                      node("LogSoftmax", ["x"], ["z"])], x4, ["y", "z"], {}, 13),
        "dropout_identity": ([node("Dropout", ["x", "ratio"], ["d"]),
                              node("Identity", ["d"], ["y"])], x4, ["y"],
                             {"ratio": np.array(0.3, np.float32)}),
        "dropout_opset10": ([node("Dropout", ["x"], ["y"], ratio=0.2)], x4, ["y"], {}, 10),
        "concat_and_sums": ([node("Relu", ["x"], ["r"]), node("Concat", ["x", "r"], ["c"], axis=1),
                             node("Sum", ["x", "r", "x"], ["s"]),
                             node("Sum", ["x", "C"], ["b"])], x4, ["c", "s", "b"],
                            {"C": _w(4, 1, 1)}),
        "gemm_fc_alpha_beta": ([node("Gemm", ["x", "B", "C"], ["y"], alpha=0.5, beta=2.0)],
                               {"x": [N, 6]}, ["y"], {"B": _w(6, 3), "C": _w(3)}),
        "gemm_trans_b_scalar_c": ([node("Gemm", ["x", "B", "C"], ["y"], transB=1)],
                                  {"x": [N, 6]}, ["y"], {"B": _w(3, 6), "C": _w(1)}),
        "gemm_trans_a_matrix_c": ([node("Gemm", ["x", "B", "C"], ["y"], transA=1)],
                                  {"x": [2, 6]}, ["y"], {"B": _w(2, 3), "C": _w(6, 3)}),
        "gemm_no_c": ([node("Gemm", ["x", "B"], ["y"], transB=1)], {"x": [N, 6]}, ["y"],
                      {"B": _w(4, 6)}),
        "gemm_computed_b": ([node("Transpose", ["x"], ["t"]),
                             node("Gemm", ["x", "t", "C"], ["y"], alpha=0.5, beta=0.5)],
                            {"x": [2, 6]}, ["y"], {"C": _w(2)}),
        "matmul_weight_3d": ([node("MatMul", ["x", "W"], ["m"]), node("Add", ["m", "B"], ["y"])],
                             {"x": [N, 3, 5]}, ["y"], {"W": _w(5, 4), "B": _w(4)}),
        "matmul_batched": ([node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                            node("MatMul", ["x", "t"], ["y"])], {"x": [N, 3, 5]}, ["y"], {}),
        "batch_norm_4d": ([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                                epsilon=1e-3)], x4, ["y"],
                          {"s": _w(4), "b": _w(4, seed=1), "m": _w(4, seed=2),
                           "v": _w(4, positive=True)}),
        "batch_norm_2d": ([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
                          {"x": [N, 6]}, ["y"],
                          {"s": _w(6), "b": _w(6, seed=1), "m": _w(6, seed=2),
                           "v": _w(6, positive=True)}),
        "binary_broadcasting": ([node("Add", ["x", "C"], ["a"]), node("Mul", ["K", "x"], ["m"]),
                                 node("Sub", ["x", "R"], ["s"]), node("Div", ["x", "P"], ["d"]),
                                 node("Mul", ["a", "m"], ["am"])], x4, ["a", "m", "s", "d", "am"],
                                {"C": _w(4, 1, 1), "K": np.array(1.5, np.float32), "R": _w(8),
                                 "P": _w(1, 9, 1, positive=True)}),
        "flatten_axes": ([node("Flatten", ["x"], ["a"], axis=2), node("Flatten", ["x"], ["b"],
                                                                       axis=-1)],
                         x4, ["a", "b"], {}),
        "reshape_constant": ([node("Reshape", ["x", "shape"], ["y"])], x4, ["y"],
                             {"shape": np.array([0, -1, 6], np.int64)}),
        "reshape_shape_chain": ([node("Shape", ["x"], ["sh"]),
                                 node("Gather", ["sh", "zero"], ["n"], axis=0),
                                 node("Unsqueeze", ["n", "axes"], ["n1"]),
                                 node("Concat", ["n1", "minus1"], ["target"], axis=0),
                                 node("Reshape", ["x", "target"], ["y"])], x4, ["y"],
                                {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64),
                                 "minus1": np.array([-1], np.int64)}),
        "clip_opset10_attributes": ([node("Clip", ["x"], ["y"], min=-0.5, max=0.25)], x4, ["y"],
                                    {}, 10),
        "clip_opset13_inputs": ([node("Clip", ["x", "lo", ""], ["a"]),
                                 node("Clip", ["x", "", "hi"], ["b"])], x4, ["a", "b"],
                                {"lo": np.array(-0.5, np.float32),
                                 "hi": np.array(0.5, np.float32)}),
        "pad_folded_into_conv": ([node("Pad", ["x", "pads"], ["p"]),
                                  node("Conv", ["p", "W"], ["y"], pads=[1, 0, 0, 1])], x4, ["y"],
                                 {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64),
                                  "W": _w(2, 4, 3, 3)}),
        "pad_folded_into_average_pool": (
            [node("Pad", ["x", "pads"], ["p"]),
             node("AveragePool", ["p"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                  count_include_pad=1)], x4, ["y"],
            {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}),
        "pad_op_value": ([node("Pad", ["x", "pads", "value"], ["p"]), node("Relu", ["p"], ["y"])],
                         x4, ["y"], {"pads": np.array([0, 1, 0, 2, 0, 0, 1, 0], np.int64),
                                     "value": np.array(0.5, np.float32)}),
        "pad_opset10_before_max_pool": (
            [node("Pad", ["x"], ["p"], pads=[0, 0, 1, 1, 0, 0, 1, 1]),
             node("MaxPool", ["p"], ["y"], kernel_shape=[3, 3], strides=[2, 2])],
            x4, ["y"], {}, 10),
        "transpose_squeeze_unsqueeze": ([node("Unsqueeze", ["x", "one"], ["u"]),
                                         node("Transpose", ["u"], ["t"], perm=[0, 2, 3, 4, 1]),
                                         node("Squeeze", ["t", "four"], ["y"])],
                                        x4, ["y"], {"one": np.array([1], np.int64),
                                                    "four": np.array([4], np.int64)}),
        "reductions": ([node("ReduceMean", ["x"], ["m"], axes=[2, 3]),
                        node("ReduceSum", ["x", "ax"], ["s"], keepdims=0)], x4, ["m", "s"],
                       {"ax": np.array([1], np.int64)}),
        "constant_nodes": ([oh.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
                                _w(4, 1, 1), "c")),
                            oh.make_node("Constant", [], ["k"], value_float=0.25),
                            node("Mul", ["x", "c"], ["m"]), node("Add", ["m", "k"], ["y"])],
                           x4, ["y"], {}),
        "pow_and_prelu": ([node("Abs", ["x"], ["a"]), node("Pow", ["a", "e"], ["p"]),
                           node("PRelu", ["x", "slope"], ["r"])], x4, ["p", "r"],
                          {"e": np.array(1.5, np.float32), "slope": _w(4, 1, 1)}),
    }
    return {k: v if len(v) == 5 else (*v, 17) for k, v in c.items()}


CASES = _cases()


@pytest.mark.parametrize("case", list(CASES))
def test_operator_agrees_with_onnxruntime(case, tmp_path):
    nodes, inputs, outputs, inits, opset = CASES[case]
    path = _save(tmp_path / f"{case}.onnx", nodes, inputs, outputs, inits, opset)
    shape = [2 if d == N else d for d in inputs["x"]]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    _agree(path, {"x": x})


def test_zero_pads_fold_into_convolutions(tmp_path):
    nodes, inputs, outputs, inits, opset = CASES["pad_folded_into_conv"]
    model = load_model(_save(tmp_path / "m.onnx", nodes, inputs, outputs, inits, opset))
    assert [o.type for o in model.predict_net.ops] == ["Conv"]
    assert model.predict_net.ops[0].args["pads"] == [2, 2, 2, 2]
    nodes, inputs, outputs, inits, opset = CASES["pad_op_value"]
    model = load_model(_save(tmp_path / "p.onnx", nodes, inputs, outputs, inits, opset))
    assert [o.type for o in model.predict_net.ops] == ["Pad", "Relu"]


def test_parameters_init_net_and_names(tmp_path):
    nodes = [node("Conv", ["x", "/stem/conv.weight"], ["/stem/conv/out"]),
             node("BatchNormalization", ["/stem/conv/out", "s", "b", "m", "v"], ["bn"]),
             oh.make_node("Constant", [], ["k"], value_float=2.0),
             node("Mul", ["bn", "k"], ["y"])]
    path = _save(tmp_path / "m.onnx", nodes, {"x": [N, 4, 5, 5]}, ["y"],
                 {"/stem/conv.weight": _w(3, 4, 3, 3), "s": _w(3), "b": _w(3), "m": _w(3),
                  "v": _w(3, positive=True)})
    model = load_model(path)
    params = {p.name: p for p in model.params}
    assert params["stem_conv.weight"].trainable and params["stem_conv.weight"].role == "weight"
    assert params["s"].trainable and params["s"].role == "scale"
    assert not params["m"].trainable and not params["v"].trainable
    assert not params["k"].trainable                      # a Constant node's value stays fixed
    assert {o.type for o in model.init_net.ops} == {"GivenTensorFill"}
    ws = Workspace("cpu")
    ws.run_net_once(model.init_net)
    np.testing.assert_array_equal(ws.fetch_blob("stem_conv.weight"), _w(3, 4, 3, 3))
    assert model.data_inputs == ["x"] and model.inputs["x"].shape == (4, 5, 5)
    # BatchNorm runs on batch statistics in the train net, on the running ones to predict
    bn_train = next(o for o in model.train_net.ops if o.type == "SpatialBN")
    bn_test = next(o for o in model.predict_net.ops if o.type == "SpatialBN")
    assert bn_train.args["is_test"] == 0 and bn_test.args["is_test"] == 1
    assert model.loss is None                             # 4-D output: no class scores


def test_static_batch_reshape_follows_netruns_batch(tmp_path):
    nodes = [node("Reshape", ["x", "shape"], ["r"]), node("Gemm", ["r", "B"], ["y"])]
    path = _save(tmp_path / "m.onnx", nodes, {"x": [1, 2, 3]}, ["y"],
                 {"shape": np.array([1, 6], np.int64), "B": _w(6, 4)})
    model = load_model(path)
    x = _w(5, 2, 3)
    (got,) = _run_netrun(model, {"x": x})
    np.testing.assert_allclose(got, x.reshape(5, 6) @ _w(6, 4), rtol=1e-5, atol=1e-6)


# Refusals -------------------------------------------------------------------------------------
def _bad_model(tmp_path) -> Path:
    nodes = [node("Resize", ["x", "", "scales"], ["up"], mode="nearest"),
             node("Relu", ["up"], ["r"]),                     # after an unsupported node: quiet
             node("Conv", ["x", "W1"], ["c1"], auto_pad="SAME_UPPER", strides=[1, 1]),
             node("Conv", ["x", "W"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                  foo=3),
             node("MaxPool", ["x"], ["p", "idx"], kernel_shape=[2, 2]),
             oh.make_node("Gelu", ["c"], ["g"], name="gelu1", domain="com.microsoft"),
             node("Gather", ["x", "zero"], ["row"]),
             node("Resize", ["c", "", "scales"], ["up2"], mode="nearest")]
    return _save(tmp_path / "bad.onnx", nodes, {"x": [N, 4, 6, 6]},
                 ["r", "c1", "idx", "g", "row", "up2"],
                 {"scales": np.array([1, 1, 2, 2], np.float32), "W": _w(2, 4, 3, 3),
                  "W1": _w(2, 4, 3, 3), "zero": np.array(0, np.int64)})


def test_unsupported_nodes_are_listed_at_once(tmp_path):
    with pytest.raises(NetrunError) as e:
        load_model(_bad_model(tmp_path))
    text = str(e.value)
    assert "netrun cannot run this ONNX model" in text
    assert "Resize 'resize_up', 'resize_up2': operator not supported" in text
    assert "Conv 'conv_c': attribute foo not supported" in text
    assert "MaxPool 'maxpool_p': the Indices output is not supported" in text
    assert "Gelu 'gelu1': operator domain 'com.microsoft'" in text
    assert "Gather 'gather_row'" in text and "known at load time" in text
    assert "Relu" not in text.split("netrun converts")[0]
    assert "conv_c1" not in text                          # supported: not listed
    assert "netrun converts these ONNX operators:" in text


def test_unsupported_attribute_values_say_why(tmp_path):
    nodes = [node("ConvTranspose", ["x", "W"], ["t"], strides=[2, 2], output_shape=[10, 10]),
             node("MaxPool", ["x"], ["m"], kernel_shape=[2, 2], dilations=[2, 2]),
             node("Pad", ["x", "pads"], ["p"], mode="reflect"),
             node("Conv", ["x3", "W3"], ["c"]),
             node("AveragePool", ["x"], ["a"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1,
                  count_include_pad=1, pads=[0, 0, 1, 1])]
    path = _save(tmp_path / "m.onnx", nodes, {"x": [N, 4, 5, 5], "x3": [N, 4, 5]},
                 ["t", "m", "p", "c", "a"],
                 {"W": _w(4, 3, 3, 3), "W3": _w(2, 4, 3),
                  "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)})
    with pytest.raises(NetrunError) as e:
        load_model(path)
    text = str(e.value)
    assert "ConvTranspose 'convtranspose_t': output_shape/auto_pad needs a total padding of 1" \
        in text
    assert "MaxPool 'maxpool_m': dilated pooling" in text
    assert "Pad 'pad_p': mode 'reflect' is not supported" in text
    assert "Conv 'conv_c': input is 3-D; netrun's Conv is 2-D" in text
    assert "AveragePool 'averagepool_a': ceil_mode=1 with asymmetric pads" in text


def test_data_inputs_choose_and_order_the_inputs(tmp_path):
    path = _save(tmp_path / "m.onnx", [node("Sub", ["a", "b"], ["y"])],
                 {"a": [N, 3], "b": [N, 3]}, ["y"])
    model = load_model(path, data_inputs=["b", "a"])
    assert model.data_inputs == ["b", "a"]
    a, b = _w(2, 3), _w(2, 3, seed=1)
    (got,) = _run_netrun(model, {"b": b, "a": a})
    np.testing.assert_array_equal(got, a - b)
    with pytest.raises(NetrunError, match="the graph has no input 'c'"):
        load_model(path, data_inputs=["c"])


def test_cli_inspect_refuses_with_exit_2(tmp_path):
    result = CliRunner().invoke(cli, ["inspect", str(_bad_model(tmp_path))])
    assert result.exit_code == 2, result.output
    assert "Resize 'resize_up', 'resize_up2': operator not supported" in result.output


def test_cli_inspect_an_onnx_model(tmp_path):
    nodes, inputs, outputs, inits, opset = CASES["gemm_fc_alpha_beta"]
    path = _save(tmp_path / "fc.onnx", nodes, inputs, outputs, inits, opset)
    result = CliRunner().invoke(cli, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert '"FC"' in result.output


def test_inputs_netrun_cannot_feed(tmp_path):
    graph = oh.make_graph(
        [node("Relu", ["x"], ["y"]), node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT),
         node("Add", ["y", "f"], ["z"])], "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [N, 3, "H", 4]),
         oh.make_tensor_value_info("ids", TensorProto.INT64, [N, 3])],
        [oh.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), tmp_path / "m.onnx")
    with pytest.raises(NetrunError) as e:
        load_model(tmp_path / "m.onnx")
    assert "input 'x' has dims ['?', 3, '?', 4]; netrun needs every dim after the batch" in \
        str(e.value)
    assert "input 'ids' has element type int64" in str(e.value)


def test_not_an_onnx_file(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"\x0a\xff\xff\xff\xff\x0fjunk")
    with pytest.raises(ParseError, match="not a readable ONNX model"):
        load_model(tmp_path / "junk.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(ParseError, match="not an ONNX model: it holds no graph"):
        load_model(tmp_path / "empty.onnx")


def test_missing_onnx_package(tmp_path, monkeypatch):
    nodes, inputs, outputs, inits, opset = CASES["lrn"]
    path = _save(tmp_path / "m.onnx", nodes, inputs, outputs, inits, opset)
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)   # import onnx fails
    with pytest.raises(NetrunError, match=r"pip install 'netrun\[onnx\]'"):
        load_model(path)


def _external(tmp_path: Path, location: str) -> Path:
    weight = _w(2, 4, 3, 3)
    tensor = numpy_helper.from_array(weight, "W")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    graph = oh.make_graph([node("Conv", ["x", "W"], ["y"])], "g",
                          [oh.make_tensor_value_info("x", TensorProto.FLOAT, [N, 4, 5, 5])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)], [tensor])
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (tmp_path / "outside.bin").write_bytes(weight.tobytes())
    (folder / "weights.bin").write_bytes(weight.tobytes())
    path = folder / "m.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), path)
    return path


def test_external_data_beside_the_model(tmp_path):
    model = load_model(_external(tmp_path, "weights.bin"))
    ws = Workspace("cpu")
    ws.run_net_once(model.init_net)
    np.testing.assert_array_equal(ws.fetch_blob("W"), _w(2, 4, 3, 3))


@pytest.mark.parametrize("location", ["../outside.bin", "OUTSIDE"])
def test_external_data_outside_the_folder_is_refused(tmp_path, location):
    if location == "OUTSIDE":
        location = str(tmp_path / "outside.bin")           # an absolute path
    with pytest.raises(NetrunError, match="outside the model's folder"):
        load_model(_external(tmp_path, location))


# Whole networks -------------------------------------------------------------------------------
def _torch_resnet18(torch, classes: int = 100):
    """A ResNet-18 (BasicBlocks 2-2-2-2) at a quarter of the width, random weights and
    BatchNorm statistics, in eval mode; flattened with view(x.size(0), -1) as many
    ResNets are (ONNX: Shape/Gather/Unsqueeze/Concat/Reshape)."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.down is None else self.down(x)))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 16
            for cout, stride in ((16, 1), (32, 2), (64, 2), (128, 2)):
                blocks += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(128, classes)

        def forward(self, x):
            x = self.pool(self.blocks(self.stem(x)))
            return self.fc(x.view(x.size(0), -1))

    torch.manual_seed(0)
    model = ResNet()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return model.eval()


def _export(torch, model, example, path: Path, fold: bool = True) -> Path:
    """PyTorch's TorchScript exporter (the dynamo one needs onnxscript), batch symbolic."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)    # the legacy exporter says so
        torch.onnx.export(model, example, str(path), dynamo=False, opset_version=17,
                          do_constant_folding=fold, input_names=["input"],
                          output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    return path


def test_pytorch_resnet18_has_onnxruntimes_top5(tmp_path):
    torch = pytest.importorskip("torch")
    path = _export(torch, _torch_resnet18(torch), torch.randn(1, 3, 64, 64),
                   tmp_path / "resnet18.onnx")
    x = np.random.default_rng(5).standard_normal((3, 3, 64, 64)).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"input": x})
    model = load_model(path)
    assert model.inputs["input"].shape == (3, 64, 64) and model.loss is not None
    (got,) = _run_netrun(model, {"input": x})
    top5 = lambda s: np.argsort(-s, axis=1)[:, :5]       # noqa: E731
    np.testing.assert_array_equal(top5(got), top5(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_netrun_export_round_trip(tmp_path):
    from netrun.export import source_from_model

    out = tmp_path / "resnet20.onnx"
    result = CliRunner().invoke(cli, ["export", str(ZOO / "resnet20.yaml"), str(out)])
    assert result.exit_code == 0, result.output
    src = source_from_model(ZOO / "resnet20.yaml")        # the same fillers (seed 0)
    x = np.random.default_rng(6).standard_normal((2, *src.input_shape)).astype(np.float32)
    ws = Workspace("cpu", memory_plan=False)
    for name, value in src.params.items():
        ws.feed_blob(name, value)
    ws.feed_blob(src.input_name, x)
    ws.run_net_once(src.net)
    want = ws.fetch_blob(src.outputs[0])
    model = load_model(out)
    (got,) = _run_netrun(model, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))
    # the exporter names initializers after netrun's parameters; BN statistics stay untrained
    params = {p.name: p for p in model.params}
    assert set(src.params) <= set(params)
    assert all(params[n].trainable == (params[n].role not in ("running_mean", "running_var"))
               for n in src.params)
    assert {params[n].role for n in src.params if n.endswith(("_rm", "_riv"))} == \
        {"running_mean", "running_var"}


# Fine-tuning ----------------------------------------------------------------------------------
def test_fine_tuning_lowers_the_loss_from_the_initializers(tmp_path):
    torch = pytest.importorskip("torch")
    from netrun.train.config import load_config
    from netrun.train.trainer import Trainer

    nn = torch.nn
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(1, 8, 5, 2), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.2),
                        nn.Flatten(), nn.Linear(8 * 12 * 12, 10)).eval()
    # unfolded: BatchNorm stays a node (trained on batch statistics, its running ones kept)
    path = _export(torch, net, torch.randn(1, 1, 28, 28), tmp_path / "small.onnx", fold=False)
    (tmp_path / "train.yaml").write_text(textwrap.dedent(f"""\
        model: small.onnx
        data: {{source: generated, dir: {tmp_path / 'data'}, train_count: 320, test_count: 96,
                batch_size: 16, transform: {{scale: 0.00390625}}}}
        solver: {{type: sgd, base_lr: 0.05, momentum: 0.9, max_iter: 30, display: 0, seed: 3}}
        output: {tmp_path / 'run'}
        """))
    tr = Trainer(load_config(tmp_path / "train.yaml"))
    tr.start()
    start = {n: tr.ws.fetch_blob(n) for n in tr.model.param_names}
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    assert set(weights) <= set(start)           # torch's names (1.running_mean) are netrun-safe
    for name, value in weights.items():
        np.testing.assert_array_equal(start[name], value.reshape(start[name].shape))
    before = tr.test().loss
    tr.run(30)
    after = tr.test().loss
    assert after < before - 0.2, (before, after)
    moved = [n for n in tr.model.param_names if not np.array_equal(tr.ws.fetch_blob(n), start[n])]
    assert "0.weight" in moved and "5.weight" in moved and "1.running_mean" in moved
