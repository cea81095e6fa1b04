"""Pointwise, Scale/Bias and blob layers (Eltwise, Concat, Slice, Split, Flatten, Reshape,
Softmax, Dropout) against NumPy/PyTorch references."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tests.caffe.helpers import net_from_text, input_layers, run_layers
from tests.checks import F, requires_torch, torch


def _t(a):
    return torch.tensor(np.asarray(a), dtype=torch.float32)


X = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
POS = np.random.default_rng(1).uniform(0.2, 2.0, (2, 3, 4)).astype(np.float32)

# References look torch up when a case runs, so the table builds without torch.
POINTWISE = [
    ("ReLU", "relu_param { negative_slope: 0.1 }", X, lambda x: F.leaky_relu(x, 0.1)),
    ("ReLU", "", X, lambda x: F.relu(x)),
    ("ELU", "elu_param { alpha: 0.5 }", X, lambda x: F.elu(x, 0.5)),
    ("Sigmoid", "", X, lambda x: torch.sigmoid(x)),
    ("TanH", "", X, lambda x: torch.tanh(x)),
    ("AbsVal", "", X, lambda x: torch.abs(x)),
    ("BNLL", "", X, lambda x: F.softplus(x)),
    ("Power", "power_param { power: 2 scale: 0.5 shift: 1 }", X, lambda x: (1 + 0.5 * x) ** 2),
    ("Power", "power_param { scale: -3 }", X, lambda x: -3 * x),
    ("Exp", "", X, lambda x: torch.exp(x)),
    ("Exp", "exp_param { base: 2 scale: 0.5 shift: 1 }", X, lambda x: 2 ** (1 + 0.5 * x)),
    ("Log", "", POS, lambda x: torch.log(x)),
    ("Log", "log_param { base: 10 scale: 2 shift: 0.5 }", POS, lambda x: torch.log10(0.5 + 2 * x)),
]


@requires_torch
@pytest.mark.parametrize("type_, param, x, reference", POINTWISE,
                         ids=[f"{t}-{i}" for i, (t, *_) in enumerate(POINTWISE)])
def test_pointwise_layers(tmp_path, type_, param, x, reference):
    layer = f'layer {{ name: "l" type: "{type_}" bottom: "x" top: "y" {param} }}'
    (y,) = run_layers(tmp_path, layer, {"x": x}, ["y"])
    np.testing.assert_allclose(y, reference(_t(x)).numpy(), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("shared", [False, True])
def test_prelu(tmp_path, shared):
    layer = f"""layer {{ name: "pr" type: "PReLU" bottom: "x" top: "y"
      prelu_param {{ channel_shared: {str(shared).lower()} }} }}"""
    (y,) = run_layers(tmp_path, layer, {"x": X}, ["y"])
    np.testing.assert_allclose(y, np.where(X > 0, X, 0.25 * X), rtol=1e-6)   # Caffe's 0.25
    model = net_from_text(tmp_path, input_layers({"x": X}) + layer)
    assert model.params[0].shape == ((1,) if shared else (3,))


def test_scale_and_bias_layers(tmp_path):
    rng = np.random.default_rng(2)
    g, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(3).astype(
        np.float32)
    s = rng.standard_normal((2, 3)).astype(np.float32)
    layers = """
    layer { name: "sc" type: "Scale" bottom: "x" top: "a"
            scale_param { axis: 1 num_axes: 2 bias_term: true } }
    layer { name: "bi" type: "Bias" bottom: "x" top: "b" }
    layer { name: "s2" type: "Scale" bottom: "x" bottom: "s" top: "c" scale_param { axis: 0 } }
    """
    params = {"sc_w": g, "sc_b": g * 2, "bi_b": b}
    a, bb, c = run_layers(tmp_path, layers, {"x": X, "s": s}, ["a", "b", "c"], params=params)
    np.testing.assert_allclose(a, X * g[None, :, :, None] + 2 * g[None, :, :, None], rtol=1e-6)
    np.testing.assert_allclose(bb, X + b[None, :, None, None], rtol=1e-6)
    np.testing.assert_allclose(c, X * s[:, :, None, None], rtol=1e-6)
    model = net_from_text(tmp_path, input_layers({"x": X, "s": s}) + layers)
    fills = {o.outputs[0]: o for o in model.init_net.ops}
    assert fills["sc_w"].args["value"] == 1.0 and fills["sc_b"].args["value"] == 0.0
    assert model.layer_params["sc"] == ["sc_w", "sc_b"]


def test_eltwise_operations(tmp_path):
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    layers = """
    layer { name: "s" type: "Eltwise" bottom: "a" bottom: "b" bottom: "c" top: "sum"
            eltwise_param { operation: SUM coeff: 1 coeff: -0.5 coeff: 2 } }
    layer { name: "p" type: "Eltwise" bottom: "a" bottom: "b" bottom: "c" top: "prod"
            eltwise_param { operation: PROD } }
    layer { name: "m" type: "Eltwise" bottom: "a" bottom: "b" bottom: "c" top: "max"
            eltwise_param { operation: MAX } }"""
    s, p, m = run_layers(tmp_path, layers, {"a": a, "b": b, "c": c}, ["sum", "prod", "max"])
    np.testing.assert_allclose(s, a - 0.5 * b + 2 * c, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(p, a * b * c, rtol=1e-6)
    np.testing.assert_array_equal(m, np.maximum(np.maximum(a, b), c))


def test_concat_slice_and_split(tmp_path):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal(
        (2, 2, 4)).astype(np.float32)
    layers = """
    layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" top: "cat" }
    layer { name: "sl" type: "Slice" bottom: "cat" top: "s1" top: "s2" top: "s3"
            slice_param { axis: 1 slice_point: 1 slice_point: 4 } }
    layer { name: "eq" type: "Slice" bottom: "a" top: "e1" top: "e2" slice_param { slice_dim: 2 } }
    layer { name: "sp" type: "Split" bottom: "cat" top: "left" top: "right" }
    layer { name: "relu" type: "ReLU" bottom: "left" top: "left" }
    """
    outs = run_layers(tmp_path, layers, {"a": a, "b": b},
                      ["cat", "s1", "s2", "s3", "e1", "e2", "left", "right"])
    cat = np.concatenate([a, b], axis=1)
    for got, want in zip(outs, [cat, cat[:, :1], cat[:, 1:4], cat[:, 4:], a[..., :2], a[..., 2:],
                                np.maximum(cat, 0), cat]):
        np.testing.assert_array_equal(got, want)   # in place on one Split top leaves the other


def test_flatten_and_reshape(tmp_path):
    layers = """
    layer { name: "f" type: "Flatten" bottom: "x" top: "f" }
    layer { name: "f2" type: "Flatten" bottom: "x" top: "f2" flatten_param { axis: 1 end_axis: 2 } }
    layer { name: "r" type: "Reshape" bottom: "x" top: "r"
            reshape_param { shape { dim: 0 dim: -1 dim: 10 } } }
    layer { name: "r2" type: "Reshape" bottom: "x" top: "r2"
            reshape_param { axis: 2 num_axes: 1 shape { dim: 2 dim: 2 } } }"""
    f, f2, r, r2 = run_layers(tmp_path, layers, {"x": X}, ["f", "f2", "r", "r2"])
    assert f.shape == (2, 60) and f2.shape == (2, 12, 5)
    assert r.shape == (2, 6, 10) and r2.shape == (2, 3, 2, 2, 5)
    for got in (f, f2, r, r2):
        np.testing.assert_array_equal(got.ravel(), X.ravel())


@requires_torch
def test_softmax_over_channels_of_an_image(tmp_path):
    layer = 'layer { name: "sm" type: "Softmax" bottom: "x" top: "p" }'
    (p,) = run_layers(tmp_path, layer, {"x": X}, ["p"])
    np.testing.assert_allclose(p, F.softmax(_t(X), dim=1).numpy(), rtol=1e-5, atol=1e-7)


def test_dropout_trains_with_a_mask_and_tests_as_identity(tmp_path):
    layer = """layer { name: "d" type: "Dropout" bottom: "x" top: "y"
               dropout_param { dropout_ratio: 0.25 } }"""
    (test,) = run_layers(tmp_path, layer, {"x": X}, ["y"], net="test")
    np.testing.assert_array_equal(test, X)
    (train,) = run_layers(tmp_path, layer, {"x": X}, ["y"], net="train")
    kept = train != 0
    np.testing.assert_allclose(train[kept], X[kept] / 0.75, rtol=1e-6)
    assert 0.5 < kept.mean() < 0.95


def test_dummy_data_fills_inside_the_net(tmp_path):
    text = """
    layer { name: "dd" type: "DummyData" top: "a" top: "b"
            dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 4 }
                               data_filler { type: "constant" value: 1.5 }
                               data_filler { type: "gaussian" std: 0.1 } } }
    layer { name: "s" type: "Power" bottom: "a" top: "y" power_param { scale: 2 } }"""
    model = net_from_text(tmp_path, text)
    assert model.inputs == {}
    from tests.caffe.helpers import run

    out = run(model, {}, fetch=["y", "b"])
    np.testing.assert_array_equal(out["y"], np.full((2, 3), 3.0, np.float32))
    assert out["b"].shape == (4,) and 0 < np.abs(out["b"]).max() < 1
    assert math.isclose(float(np.asarray(out["y"]).sum()), 18.0)


def test_image_data_shape_and_silence(tmp_path):
    text = """
    layer { name: "img" type: "ImageData" top: "data" top: "label"
            transform_param { crop_size: 24 mirror: true mean_value: 104 mean_value: 117
                              mean_value: 123 }
            image_data_param { source: "list.txt" batch_size: 5 new_height: 32 new_width: 32 } }
    layer { name: "gray" type: "ImageData" top: "g" top: "gl" include { phase: TEST }
            image_data_param { source: "list.txt" batch_size: 2 is_color: false
                               new_height: 20 new_width: 30 } }
    layer { name: "quiet" type: "Silence" bottom: "label" }
    layer { name: "r" type: "ReLU" bottom: "data" top: "r" }"""
    model = net_from_text(tmp_path, text)
    assert model.inputs["data"].shape == (3, 24, 24)
    assert model.inputs["g"].shape == (1, 20, 30)
    (img,) = [d for d in model.data_layers if d.name == "img" and d.phase == "TRAIN"]
    assert img.transform == {"mirror": True, "crop_size": 24, "mean_value": [104.0, 117.0, 123.0]}
    assert model.outputs == ["r"] and "label" in model.labels
