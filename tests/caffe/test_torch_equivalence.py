"""Caffe-translated nets against PyTorch reconstructions on the same weights: LeNet, and a
small net with BatchNorm + Scale (in place), an Eltwise residual sum, global pooling and a
loss, in test mode and in a training step (loss, gradients, statistics update)."""
from __future__ import annotations

import numpy as np

import netrun
from netrun.train.config import SolverConfig
from netrun.train.solver import build_training
from tests.caffe.helpers import init_workspace, net_from_text, random_params, run, shared_model
from tests.checks import F, requires_torch, torch


def _t(a):
    return torch.tensor(np.asarray(a), dtype=torch.float32)


@requires_torch
def test_lenet_matches_torch():
    model = netrun.load_model(shared_model("lenet/lenet.prototxt"))
    params = random_params(model, seed=0, scale=0.1)
    x = np.random.default_rng(1).uniform(0, 1, (5, 1, 28, 28)).astype(np.float32)
    got = run(model, {"data": x}, ws=init_workspace(model, params=params))["prob"]
    p = {k: _t(v) for k, v in params.items()}
    y = F.conv2d(_t(x), p["conv1_w"], p["conv1_b"])
    y = F.max_pool2d(y, 2, 2, ceil_mode=True)
    y = F.conv2d(y, p["conv2_w"], p["conv2_b"])
    y = F.max_pool2d(y, 2, 2, ceil_mode=True)
    y = F.relu(F.linear(y.flatten(1), p["ip1_w"], p["ip1_b"]))
    y = F.softmax(F.linear(y, p["ip2_w"], p["ip2_b"]), dim=1)
    np.testing.assert_allclose(got, y.numpy(), rtol=1e-4, atol=1e-6)


BN_NET = """
name: "bn_net"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 4 dim: 3 dim: 6 dim: 6 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 4 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false
                            weight_filler { type: "msra" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1"
        batch_norm_param { moving_average_fraction: 0.9 } }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "bn2" type: "BatchNorm" bottom: "conv2" top: "conv2"
        batch_norm_param { moving_average_fraction: 0.9 } }
layer { name: "scale2" type: "Scale" bottom: "conv2" top: "conv2" scale_param { bias_term: true } }
layer { name: "sum" type: "Eltwise" bottom: "conv1" bottom: "conv2" top: "sum" }
layer { name: "relu2" type: "ReLU" bottom: "sum" top: "sum" }
layer { name: "pool" type: "Pooling" bottom: "sum" top: "pool"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc"
        inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def _torch_bn_net(p, x, training: bool):
    """The same net in PyTorch; Caffe's statistics are blob / factor."""
    def bn(y, name):
        f = p[f"{name}_factor"][0]
        mean, var = p[f"{name}_mean"] / f, p[f"{name}_var"] / f
        return F.batch_norm(y, None if training else mean, None if training else var,
                            training=training, eps=1e-5)

    def scale(y, name):
        return y * p[f"{name}_w"][None, :, None, None] + p[f"{name}_b"][None, :, None, None]

    a = F.relu(scale(bn(F.conv2d(x, p["conv1_w"], padding=1), "bn1"), "scale1"))
    b = scale(bn(F.conv2d(a, p["conv2_w"], p["conv2_b"], padding=1), "bn2"), "scale2")
    y = F.relu(a + b).mean(dim=(2, 3))
    return F.linear(y, p["fc_w"], p["fc_b"])


def _data(seed=3):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((4, 3, 6, 6)).astype(np.float32),
            np.array([0, 3, 1, 4], np.int32))


@requires_torch
def test_bn_scale_eltwise_net_in_test_mode_matches_torch(tmp_path):
    model = net_from_text(tmp_path, BN_NET)
    params = random_params(model, seed=2)
    x, label = _data()
    got = run(model, {"data": x}, ws=init_workspace(model, params=params))["fc"]
    want = _torch_bn_net({k: _t(v) for k, v in params.items()}, _t(x), training=False)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-5)


@requires_torch
def test_bn_scale_eltwise_net_training_step_matches_torch(tmp_path):
    model = net_from_text(tmp_path, BN_NET)
    nets = build_training(model, SolverConfig())
    params = random_params(model, seed=4)
    ws = init_workspace(model, params=params)
    x, label = _data(5)
    ws.feed_blob("data", x)
    ws.feed_blob("label", label)
    ws.run_net_once(nets.step)
    tp = {k: _t(v).requires_grad_(model.params[i].trainable)
          for i, (k, v) in enumerate(params.items())}
    logits = _torch_bn_net(tp, _t(x), training=True)
    loss = F.cross_entropy(logits, torch.tensor(label, dtype=torch.long))
    loss.backward()
    np.testing.assert_allclose(ws.fetch_blob("loss"), loss.item(), rtol=1e-5)
    for name in nets.params:
        np.testing.assert_allclose(ws.fetch_blob(nets.grads[name]), tp[name].grad.numpy(),
                                   rtol=1e-3, atol=1e-5, err_msg=name)
    # Caffe's statistics update: sums decayed by 0.9 plus the batch's, factor 0.9·f + 1.
    conv1 = F.conv2d(_t(x), tp["conv1_w"], padding=1).detach().numpy().astype(np.float64)
    m = conv1.size // 4
    np.testing.assert_allclose(ws.fetch_blob("bn1_mean"),
                               0.9 * params["bn1_mean"] + conv1.mean(axis=(0, 2, 3)), rtol=1e-4)
    np.testing.assert_allclose(ws.fetch_blob("bn1_var"), 0.9 * params["bn1_var"]
                               + conv1.var(axis=(0, 2, 3)) * m / (m - 1), rtol=1e-4)
    np.testing.assert_allclose(ws.fetch_blob("bn1_factor"), [0.9 * 2.0 + 1], rtol=1e-6)


def test_bn_layers_in_place_are_renamed_where_the_gradient_needs_it(tmp_path):
    model = net_from_text(tmp_path, BN_NET)
    ops = {o.name: o for o in model.train_net.ops if o.name}
    assert ops["bn1"].outputs[0] == "conv1_bn1"          # its gradient reads conv1
    assert ops["relu1"].inputs == ops["relu1"].outputs  # in place: nothing reads the input
    assert model.blob_names["train"]["conv1"] == "conv1_scale1"
    # Test mode needs no batch statistics: BatchNorm runs in place there.
    test_bn = next(o for o in model.test_net.ops if o.name == "bn1")
    assert test_bn.outputs == ("conv1",) and test_bn.args["is_test"] == 1
    assert model.params[1].name == "bn1_mean" and not model.params[1].trainable


@requires_torch
def test_alexnet_style_relu_dropout_in_place_trains(tmp_path):
    net = """
    layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 6 dim: 8 } } }
    layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 6 } } }
    layer { name: "fc6" type: "InnerProduct" bottom: "data" top: "fc6"
            inner_product_param { num_output: 7 weight_filler { type: "gaussian" std: 0.3 } } }
    layer { name: "relu6" type: "ReLU" bottom: "fc6" top: "fc6" }
    layer { name: "drop6" type: "Dropout" bottom: "fc6" top: "fc6"
            dropout_param { dropout_ratio: 0.5 } }
    layer { name: "fc7" type: "InnerProduct" bottom: "fc6" top: "fc7"
            inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc7" bottom: "label" top: "loss" }
    """
    model = net_from_text(tmp_path, net)
    nets = build_training(model, SolverConfig())
    ws = init_workspace(model, seed=1)
    rng = np.random.default_rng(0)
    x, label = rng.standard_normal((6, 8)).astype(np.float32), rng.integers(0, 3, 6)
    ws.feed_blob("data", x)
    ws.feed_blob("label", label.astype(np.int32))
    ws.run_net_once(nets.step)
    mask = torch.tensor(ws.fetch_blob("drop6_mask").astype(np.float32))
    p = {n: _t(ws.fetch_blob(n)).requires_grad_() for n in model.param_names}
    h = F.relu(F.linear(_t(x), p["fc6_w"], p["fc6_b"])) * mask / 0.5
    loss = F.cross_entropy(F.linear(h, p["fc7_w"], p["fc7_b"]), torch.tensor(label))
    loss.backward()
    np.testing.assert_allclose(ws.fetch_blob("loss"), loss.item(), rtol=1e-5)
    for name in model.param_names:
        np.testing.assert_allclose(ws.fetch_blob(nets.grads[name]), p[name].grad.numpy(),
                                   rtol=1e-4, atol=1e-6, err_msg=name)
