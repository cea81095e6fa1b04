"""Loss layers, Accuracy and loss_weight; parameters (sharing, multipliers, fillers);
propagate_down; include/exclude rules; legacy V1 nets and NetParameter inputs."""
from __future__ import annotations

import numpy as np
import pytest

from netrun.train.config import SolverConfig
from netrun.train.solver import build_training
from tests.caffe.helpers import init_workspace, input_layers, net_from_text, run, run_layers
from tests.checks import F, skip_unless_torch, torch

RNG = np.random.default_rng(0)
SCORES = RNG.standard_normal((6, 4)).astype(np.float32)
LABELS = np.array([0, 3, 1, 1, 2, 3], np.int32)


def _t(a, dtype=None):
    return torch.tensor(np.asarray(a), dtype=dtype or torch.float32)


def test_softmax_with_loss_and_accuracy(tmp_path):
    layers = """
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "label" top: "loss"
            top: "prob" loss_param { ignore_label: 3 } }
    layer { name: "acc" type: "Accuracy" bottom: "x" bottom: "label" top: "acc"
            accuracy_param { top_k: 2 } }"""
    loss, prob, acc = run_layers(tmp_path, layers, {"x": SCORES, "label": LABELS},
                                 ["loss", "prob", "acc"])
    top2 = np.argsort(-SCORES, axis=1)[:, :2]
    np.testing.assert_allclose(acc, np.mean([l in t for l, t in zip(LABELS, top2)]), rtol=1e-6)
    skip_unless_torch()
    want = F.cross_entropy(_t(SCORES), _t(LABELS, torch.long), ignore_index=3)
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
    np.testing.assert_allclose(prob, F.softmax(_t(SCORES), 1).numpy(), rtol=1e-5)


def test_euclidean_sigmoid_cross_entropy_and_multinomial_losses(tmp_path):
    target = RNG.uniform(0, 1, SCORES.shape).astype(np.float32)
    probs = np.exp(SCORES) / np.exp(SCORES).sum(1, keepdims=True)
    layers = """
    layer { name: "e" type: "EuclideanLoss" bottom: "x" bottom: "t" top: "e" }
    layer { name: "s" type: "SigmoidCrossEntropyLoss" bottom: "x" bottom: "t" top: "s" }
    layer { name: "v" type: "SigmoidCrossEntropyLoss" bottom: "x" bottom: "t" top: "v"
            loss_param { normalization: VALID } }
    layer { name: "m" type: "MultinomialLogisticLoss" bottom: "p" bottom: "label" top: "m" }"""
    e, s, v, m = run_layers(tmp_path, layers, {"x": SCORES, "t": target, "p": probs,
                                               "label": LABELS}, ["e", "s", "v", "m"])
    n = len(SCORES)
    np.testing.assert_allclose(e, ((SCORES - target) ** 2).sum() / (2 * n), rtol=1e-5)
    np.testing.assert_allclose(m, -np.log(probs[np.arange(n), LABELS]).mean(), rtol=1e-5)
    skip_unless_torch()
    bce = F.binary_cross_entropy_with_logits(_t(SCORES), _t(target), reduction="sum").item()
    np.testing.assert_allclose(s, bce / n, rtol=1e-5)                  # Caffe: BATCH_SIZE
    np.testing.assert_allclose(v, bce / SCORES.size, rtol=1e-5)


def test_contrastive_loss_layer(tmp_path):
    a, b = RNG.standard_normal((4, 3)).astype(np.float32), RNG.standard_normal((4, 3)).astype(
        np.float32)
    sim = np.array([1, 0, 0, 1], np.float32)
    layer = """layer { name: "c" type: "ContrastiveLoss" bottom: "a" bottom: "b" bottom: "y"
               top: "c" contrastive_loss_param { margin: 2 } }"""
    (c,) = run_layers(tmp_path, layer, {"a": a, "b": b, "y": sim}, ["c"])
    d = np.linalg.norm(a - b, axis=1)
    want = np.where(sim > 0, d ** 2, np.maximum(2 - d, 0) ** 2).sum() / 8
    np.testing.assert_allclose(c, want, rtol=1e-5)


def test_loss_weights_sum_into_one_loss(tmp_path):
    target = RNG.standard_normal(SCORES.shape).astype(np.float32)
    text = input_layers({"x": SCORES, "t": target, "label": LABELS}) + """
    layer { name: "ip" type: "InnerProduct" bottom: "x" top: "h"
            inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 } } }
    layer { name: "ce" type: "SoftmaxWithLoss" bottom: "h" bottom: "label" top: "ce" }
    layer { name: "l2" type: "EuclideanLoss" bottom: "h" bottom: "t" top: "l2" loss_weight: 0.25 }
    layer { name: "reg" type: "Power" bottom: "h" top: "reg" loss_weight: 0.01 }"""
    model = net_from_text(tmp_path, text)
    assert model.loss == "loss"   # "total_loss" when a Caffe blob is called loss
    out = run(model, {"x": SCORES, "t": target, "label": LABELS}, net="train",
              fetch=["ce", "l2", "h", "loss"])
    want = out["ce"] + 0.25 * out["l2"] + 0.01 * out["h"].sum()   # a non-loss top is summed
    np.testing.assert_allclose(out["loss"], want, rtol=1e-5)
    build_training(model, SolverConfig())   # one loss: the backward pass builds


def test_parameter_sharing_multipliers_and_fillers(tmp_path):
    text = input_layers({"x": SCORES}) + """
    layer { name: "a" type: "InnerProduct" bottom: "x" top: "a"
            param { name: "shared_w" lr_mult: 1 decay_mult: 0 } param { lr_mult: 2 }
            inner_product_param { num_output: 4 weight_filler { type: "xavier"
                                  variance_norm: FAN_OUT }
                                  bias_filler { type: "constant" value: 0.2 } } }
    layer { name: "b" type: "InnerProduct" bottom: "a" top: "b" param { name: "shared_w" }
            inner_product_param { num_output: 4 bias_filler { type: "uniform" min: -1 max: 1 }
                                  weight_filler { type: "gaussian" std: 3 sparse: 2 } } }
    layer { name: "c" type: "InnerProduct" bottom: "b" top: "c" param { lr_mult: 0 }
            inner_product_param { num_output: 2 bias_term: false
                                  weight_filler { type: "msra" variance_norm: AVERAGE } } }"""
    model = net_from_text(tmp_path, text)
    params = {p.name: p for p in model.params}
    assert list(params) == ["shared_w", "a_b", "b_b", "c_w"]
    assert model.layer_params == {"a": ["shared_w", "a_b"], "b": ["shared_w", "b_b"],
                                  "c": ["c_w"]}
    assert (params["shared_w"].decay_mult, params["a_b"].lr_mult) == (0.0, 2.0)
    assert not params["c_w"].trainable                                   # lr_mult: 0
    fills = {o.outputs[0]: (o.type, o.args) for o in model.init_net.ops}
    assert fills["shared_w"] == ("XavierFill", {"shape": [4, 4], "variance_norm": "FAN_OUT"})
    assert fills["a_b"] == ("ConstantFill", {"shape": [4], "value": 0.2})
    assert fills["b_b"] == ("UniformFill", {"shape": [4], "min": -1.0, "max": 1.0})
    assert fills["c_w"] == ("MSRAFill", {"shape": [2, 4], "variance_norm": "AVERAGE"})
    fc = [o for o in model.predict_net.ops if o.type == "FC"]
    assert fc[0].inputs[1] == fc[1].inputs[1] == "shared_w"


def test_propagate_down_stops_the_gradient(tmp_path):
    text = input_layers({"x": SCORES, "label": LABELS}) + """
    layer { name: "a" type: "InnerProduct" bottom: "x" top: "a"
            inner_product_param { num_output: 4 } }
    layer { name: "b" type: "InnerProduct" bottom: "a" top: "b" propagate_down: false
            inner_product_param { num_output: 4 } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "b" bottom: "label" top: "loss"
            propagate_down: true propagate_down: false } """
    model = net_from_text(tmp_path, text)
    stop = [o for o in model.train_net.ops if o.type == "StopGradient"]
    assert [(o.inputs, o.outputs) for o in stop] == [(("a",), ("a_nograd",))]
    assert [o for o in model.predict_net.ops if o.type == "FC"][1].inputs[0] == "a_nograd"
    with pytest.raises(Exception, match="no gradient reaches parameter.*a_w"):
        build_training(model, SolverConfig())


RULES = """
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "deploy_only" type: "Power" bottom: "x" top: "y" power_param { scale: 2 }
        include { stage: "deploy" } }
layer { name: "default" type: "Power" bottom: "x" top: "y" power_param { scale: 3 }
        exclude { stage: "deploy" } }
layer { name: "deep" type: "Power" bottom: "y" top: "z" power_param { scale: 5 }
        include { phase: TEST min_level: 1 } }
"""


def test_include_exclude_by_phase_stage_and_level(tmp_path):
    x = np.ones((2, 3), np.float32)
    plain = net_from_text(tmp_path, RULES)
    assert run(plain, {"x": x})["y"][0, 0] == 3.0 and plain.outputs == ["y"]
    deploy = net_from_text(tmp_path, RULES, stages=["deploy"], level=1)
    assert deploy.outputs == ["z"] and run(deploy, {"x": x})["z"][0, 0] == 10.0
    assert [o.name for o in deploy.train_net.ops] == ["deploy_only"]   # `deep` is TEST only


V1_NET = """
name: "v1"
input: "data"
input_dim: 2 input_dim: 1 input_dim: 6 input_dim: 6
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
         blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
         convolution_param { num_output: 3 kernel_size: 3 } }
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
layers { name: "pool" type: POOLING bottom: "conv" top: "pool"
         pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "pool" top: "ip" param: "w"
         inner_product_param { num_output: 2 } }
"""
V2_NET = """
name: "v2"
input: "data"
input_shape { dim: 2 dim: 1 dim: 6 dim: 6 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        convolution_param { num_output: 3 kernel_size: 3 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip" param { name: "w" }
        inner_product_param { num_output: 2 } }
"""


def test_legacy_v1_net_translates_like_its_v2_form(tmp_path):
    v1 = net_from_text(tmp_path, V1_NET, "v1.prototxt")
    v2 = net_from_text(tmp_path, V2_NET, "v2.prototxt")
    assert [(o.type, o.inputs, o.outputs, o.args) for o in v1.predict_net.ops] == \
        [(o.type, o.inputs, o.outputs, o.args) for o in v2.predict_net.ops]
    assert [(p.name, p.shape, p.lr_mult, p.decay_mult) for p in v1.params] == \
        [(p.name, p.shape, p.lr_mult, p.decay_mult) for p in v2.params]
    params = {p.name: np.random.default_rng(1).standard_normal(p.shape).astype(np.float32)
              for p in v1.params}
    x = np.random.default_rng(2).standard_normal((2, 1, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(run(v1, {"data": x}, ws=init_workspace(v1, params=params))["ip"],
                                  run(v2, {"data": x}, ws=init_workspace(v2, params=params))["ip"])


def test_v1_data_layer_transform_moves_to_transform_param(tmp_path):
    text = """layers { name: "d" type: DATA top: "data" top: "label"
                       data_param { source: "mnist_lmdb" batch_size: 8 scale: 0.5 } }"""
    model = net_from_text(tmp_path, text)
    (layer,) = [d for d in model.data_layers if d.phase == "TRAIN"]
    assert (layer.batch_size, layer.transform, layer.shape) == (8, {"scale": 0.5}, (1, 28, 28))
