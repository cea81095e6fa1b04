"""ModelBuilder: params and fillers in the init net, train vs test-mode ops, errors."""
from __future__ import annotations

import numpy as np
import pytest

import netrun
from netrun.model.builder import LAYERS, ModelBuilder, filler_op, options
from netrun.errors import NetrunError, ShapeError


def _lenet() -> ModelBuilder:
    b = ModelBuilder("LeNet")
    b.add_input("data", (1, 28, 28))
    b.add_input("label", ())
    b.conv("data", "conv1", num_output=20, kernel=5, lr_mult=[1, 2])
    b.max_pool(None, "pool1", kernel=2, stride=2)
    b.conv(None, "conv2", num_output=50, kernel=5)
    b.max_pool(None, "pool2", kernel=2, stride=2)
    b.fc(None, "ip1", num_output=500)
    b.relu(None, "relu1", output="ip1")  # in place, as in Caffe's prototxt
    b.fc(None, "ip2", num_output=10)
    b.softmax_cross_entropy("ip2", "label")
    b.accuracy("ip2", "label")
    return b


def test_params_get_fillers_shapes_and_solver_metadata():
    m = _lenet().build()
    init = m.init_net.ops
    assert [(o.type, o.outputs[0], o.args["shape"]) for o in init[:4]] == [
        ("XavierFill", "conv1_w", [20, 1, 5, 5]), ("ConstantFill", "conv1_b", [20]),
        ("XavierFill", "conv2_w", [50, 20, 5, 5]), ("ConstantFill", "conv2_b", [50])]
    assert m.init_net.external_outputs == m.param_names
    by_name = {p.name: p for p in m.params}
    assert (by_name["conv1_w"].lr_mult, by_name["conv1_b"].lr_mult) == (1.0, 2.0)
    assert (by_name["ip1_w"].shape, by_name["ip1_w"].role, by_name["ip1_b"].role) == (
        (500, 800), "weight", "bias")
    assert by_name["ip1_b"].layer == "ip1" and by_name["ip1_b"].trainable


def test_train_predict_and_test_nets():
    m = _lenet().build()
    assert m.train_net.external_inputs == ["data", "label"] + m.param_names
    assert m.train_net.external_outputs == ["loss", "accuracy"]
    assert m.predict_net.external_inputs == ["data"] + m.param_names
    assert m.predict_net.external_outputs == ["ip2"] and m.outputs == ["ip2"]
    assert [o.type for o in m.predict_net.ops] == ["Conv", "MaxPool", "Conv", "MaxPool", "FC",
                                                  "Relu", "FC"]
    assert m.test_net.ops == m.train_net.ops  # no layer here behaves differently in test mode
    relu = m.predict_net.ops[5]
    assert relu.inputs == relu.outputs == ("ip1",)
    conv = m.predict_net.ops[0]
    assert conv.inputs == ("data", "conv1_w", "conv1_b") and conv.args == {"kernel": 5}
    assert m.net("test") is m.test_net
    with pytest.raises(NetrunError, match="did you mean 'train'"):
        m.net("trian")


def test_dropout_spatial_bn_and_lrn_differ_between_training_and_test_mode():
    b = ModelBuilder("m")
    b.add_input("x", (3, 6, 6))
    b.spatial_bn(None, "bn", epsilon=1e-3)
    b.lrn(None, "norm", size=3)
    b.dropout(None, "drop", ratio=0.3)
    m = b.build()
    (bn_t, lrn_t, drop_t), (bn_p, lrn_p, drop_p) = m.train_net.ops, m.predict_net.ops
    assert bn_t.inputs == ("x", "bn_s", "bn_b", "bn_rm", "bn_riv")
    assert bn_t.outputs == ("bn", "bn_rm", "bn_riv", "bn_sm", "bn_siv")
    assert bn_t.args["is_test"] == 0
    assert bn_p.outputs == ("bn",) and bn_p.args["is_test"] == 1 and bn_p.args["epsilon"] == 1e-3
    assert lrn_t.outputs == ("norm", "norm_scale") and lrn_p.outputs == ("norm",)
    assert drop_t.outputs == ("drop", "drop_mask") and drop_t.args == {"ratio": 0.3, "is_test": 0}
    assert drop_p.outputs == ("drop",) and drop_p.args["is_test"] == 1
    assert m.test_net.ops == m.predict_net.ops
    params = {p.name: p for p in m.params}
    assert [p.trainable for p in m.params] == [True, True, False, False]
    assert params["bn_riv"].role == "running_var" and params["bn_riv"].lr_mult == 0.0
    fills = {o.outputs[0]: o for o in m.init_net.ops}
    assert fills["bn_s"].args["value"] == 1.0 and fills["bn_riv"].args["value"] == 1.0
    assert "value" not in fills["bn_rm"].args  # ConstantFill's default, 0


def test_conv_and_pool_arguments_map_to_caffe2_names():
    b = ModelBuilder("m")
    b.add_input("x", (4, 9, 11))
    b.conv(None, "c", num_output=6, kernel=[3, 1], stride=[2, 1], pad=[1, 0], group=2,
           bias=False)
    b.average_pool(None, "p", kernel=3, pad=[1, 1, 0, 0])
    b.max_pool(None, "g", global_pooling=True)
    c, p, g = b.build().predict_net.ops
    assert c.inputs == ("x", "c_w") and c.args == {"kernels": [3, 1], "strides": [2, 1],
                                                   "pads": [1, 0, 1, 0], "group": 2,
                                                   "no_bias": 1}
    assert b.params[0].shape == (6, 2, 3, 1)
    assert b.shape("c") == (1, 6, 5, 11)
    assert p.args == {"kernel": 3, "pads": [1, 1, 0, 0]}
    assert g.args == {"global_pooling": 1} and b.shape("g") == (1, 6, 1, 1)


@pytest.mark.parametrize("filler, op_type, args", [
    ("xavier", "XavierFill", {}),
    ("msra", "MSRAFill", {}),
    ({"type": "gaussian", "std": 0.01}, "GaussianFill", {"std": 0.01}),
    ({"type": "uniform", "min": -1, "max": 1}, "UniformFill", {"min": -1, "max": 1}),
    ({"type": "constant", "value": 0.5}, "ConstantFill", {"value": 0.5}),
])
def test_fillers_by_name_or_mapping(filler, op_type, args):
    o = filler_op(filler, "w", (2, 3), "test")
    assert (o.type, o.outputs, o.args) == (op_type, ("w",), {"shape": [2, 3], **args})
    ws = netrun.Workspace(seed=0)
    ws.run_operator_once(o)
    assert ws.fetch_blob("w").shape == (2, 3)


@pytest.mark.parametrize("filler, message", [
    ("xavir", "unknown filler 'xavir', did you mean 'xavier'?"),
    ({"type": "gaussian", "sdt": 1.0},
     "filler 'gaussian' has no option 'sdt', did you mean 'std'?"),
    ({"std": 1.0}, "a filler is a name"),
])
def test_bad_fillers(filler, message):
    with pytest.raises(NetrunError, match=message.replace("?", r"\?").replace("(", r"\(")):
        filler_op(filler, "w", (2,), "layer 'x'")


def test_builder_errors_name_the_layer_and_the_blob():
    b = ModelBuilder("m")
    b.add_input("data", (3, 8, 8))
    b.conv(None, "conv1", num_output=4, kernel=3)
    with pytest.raises(NetrunError,
                       match="input blob 'conv2' does not exist, did you mean 'conv1'"):
        b.relu("conv2", "r")
    with pytest.raises(NetrunError, match="two layers are named 'conv1'"):
        b.relu(None, "conv1", output="other")
    with pytest.raises(NetrunError, match="writes blob 'data', which exists already"):
        b.relu("conv1", "r2", output="data")
    with pytest.raises(NetrunError, match="needs a 4-d input"):
        b.fc(None, "f", num_output=2)
        b.conv("f", "c2", num_output=2, kernel=1)
    with pytest.raises(ShapeError, match="1×4×6×6"):
        b.conv("conv1", "big", num_output=2, kernel=7)
    with pytest.raises(NetrunError, match="label 'lbl' is not a declared input"):
        b.softmax_cross_entropy(None, "lbl")


def test_layer_options_come_from_the_method_signatures():
    required, optional = options(LAYERS["conv"])
    assert required == ["num_output", "kernel"]
    assert {"stride", "pad", "weight_filler", "lr_mult", "output"} <= set(optional)
    assert options(LAYERS["relu"]) == ([], ["output"])


def test_every_layer_runs_and_shape_inference_matches_the_real_blobs():
    b = ModelBuilder("all")
    b.add_input("x", (3, 8, 8))
    b.add_input("y", ())
    b.conv(None, "c1", num_output=4, kernel=3, pad=1, weight_filler="msra")
    b.spatial_bn(None, "bn")
    b.relu(None, "r", output="bn")
    b.conv("x", "c2", num_output=4, kernel=1, bias=False,
           weight_filler={"type": "gaussian", "std": 0.1})
    b.add(["bn", "c2"], "sum")
    b.lrn(None, "lrn", size=3)
    b.max_pool(None, "mp", kernel=2, stride=2)
    b.average_pool("lrn", "ap", kernel=2, stride=2)
    b.concat(["mp", "ap"], "cat")
    b.tanh(None, "t")
    b.dropout(None, "d", ratio=0.25)
    b.flatten(None, "flat")
    b.reshape(None, "rs", shape=[0, 8, 16])
    b.sigmoid(None, "s")
    b.fc(None, "f", num_output=5, axis=1, weight_filler={"type": "uniform", "min": -0.1,
                                                        "max": 0.1})
    b.softmax(None, "sm")
    b.softmax_cross_entropy("f", "y")
    b.accuracy("f", "y", top_k=2)
    m = b.build()
    assert m.metrics == ["accuracy_top2"]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32),
             "y": np.array([1, 4], dtype=np.int32)}
    for which in ("train", "test", "predict"):
        ws = netrun.Workspace(seed=0)
        ws.run_net_once(m.init_net)
        for k, v in feeds.items():
            ws.feed_blob(k, v)
        ws.run_net_once(m.net(which))
        shapes = m.infer_shapes(which, batch_size=2)
        for blob, spec in shapes.blobs.items():
            got = ws.fetch_blob(blob)
            assert got.shape == spec.shape, f"{which}: {blob}"
            assert str(got.dtype) == spec.dtype, f"{which}: {blob}"
    assert shapes["f"].shape == (2, 5) and shapes["rs"].shape == (2, 8, 16)
    assert m.outputs == ["f"]
