"""caffe_to_yaml: the raw-form model YAML loads back, computes the same outputs and keeps
every parameter's layer, role, lr_mult, decay_mult and whether it is trained."""
from __future__ import annotations

import numpy as np

import netrun
from netrun.caffe import caffe_to_yaml
from netrun.model.yaml_model import model_from_yaml
from tests.caffe.helpers import init_workspace, net_from_text, random_params, run, shared_model
from tests.caffe.test_torch_equivalence import BN_NET


def _same_predictions(model, feeds, seed=0):
    back = model_from_yaml(caffe_to_yaml(model), "converted.yaml")
    params = random_params(model, seed=seed)
    want = run(model, feeds, ws=init_workspace(model, params=params))
    got = run(back, feeds, ws=init_workspace(back, params=params))
    assert back.outputs == model.outputs and back.param_names == model.param_names
    for name in model.outputs:
        np.testing.assert_array_equal(got[name], want[name])
    return back


def test_lenet_train_test_round_trip():
    model = netrun.load_model(shared_model("lenet/lenet_train_test.prototxt"))
    text = caffe_to_yaml(model)
    assert "conv1_b: {layer: conv1, role: bias, lr_mult: 2}" in text
    assert "Data layer 'mnist' (TRAIN): source examples/mnist/mnist_train_lmdb" in text
    x = np.random.default_rng(0).uniform(0, 1, (3, 1, 28, 28)).astype(np.float32)
    back = _same_predictions(model, {"data": x})
    assert (back.loss, back.metrics, back.labels) == ("loss", ["accuracy"], ["label"])
    assert back.inputs["label"].dtype == "int32"
    assert _settings(back) == _settings(model)     # lr_mult 2 on biases, layers kept


def test_bn_net_round_trip(tmp_path):
    model = net_from_text(tmp_path, BN_NET)
    text = caffe_to_yaml(model)
    assert "bn1_mean: {layer: bn1, role: running_mean, trainable: false}" in text
    x = np.random.default_rng(1).standard_normal((4, 3, 6, 6)).astype(np.float32)
    back = _same_predictions(model, {"data": x}, seed=3)
    assert _settings(back) == _settings(model)
    assert [p.name for p in back.params if not p.trainable] == [
        f"{bn}_{s}" for bn in ("bn1", "bn2") for s in ("mean", "var", "factor")]


def _settings(model):
    return [(p.name, p.layer, p.role, p.lr_mult, p.decay_mult, p.trainable)
            for p in model.params]
