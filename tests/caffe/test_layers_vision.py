"""Convolution, Deconvolution, Pooling, InnerProduct and LRN layers against PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netrun.errors import ParseError
from tests.caffe.helpers import input_layers, net_from_text, run_layers
from tests.checks import F, requires_torch, skip_unless_torch, torch

FAST = settings(max_examples=10, deadline=None)


def _t(a):
    return torch.tensor(np.asarray(a), dtype=torch.float32)


@requires_torch
@FAST
@given(k=st.integers(1, 3), s=st.integers(1, 2), p=st.integers(0, 1), group=st.sampled_from([1, 2]),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_convolution(tmp_path_factory, k, s, p, group, bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 4, 6, 5)).astype(np.float32)
    w = rng.standard_normal((6, 4 // group, k, k)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    layer = f"""layer {{ name: "c" type: "Convolution" bottom: "x" top: "y"
      convolution_param {{ num_output: 6 kernel_size: {k} stride: {s} pad: {p} group: {group}
                           bias_term: {str(bias).lower()} }} }}"""
    params = {"c_w": w, **({"c_b": b} if bias else {})}
    (y,) = run_layers(tmp_path_factory.mktemp("c"), layer, {"x": x}, ["y"], params=params)
    want = F.conv2d(_t(x), _t(w), _t(b) if bias else None, stride=s, padding=p, groups=group)
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-4, atol=1e-5)


@requires_torch
def test_convolution_rectangular_and_dilated(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 9, 8)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 2)).astype(np.float32)
    layer = """layer { name: "c" type: "Convolution" bottom: "x" top: "y"
      convolution_param { num_output: 3 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1
                          pad_h: 1 pad_w: 0 dilation: 2 bias_term: false } }"""
    (y,) = run_layers(tmp_path, layer, {"x": x}, ["y"], params={"c_w": w})
    want = F.conv2d(_t(x), _t(w), stride=(2, 1), padding=(1, 0), dilation=2)
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-4, atol=1e-5)


def test_deconvolution_with_bilinear_filler(tmp_path):
    """Caffe's standard upsampling: a grouped deconvolution with bilinear weights."""
    x = np.random.default_rng(1).standard_normal((1, 3, 4, 4)).astype(np.float32)
    layer = """layer { name: "up" type: "Deconvolution" bottom: "x" top: "y"
      param { lr_mult: 0 }
      convolution_param { num_output: 3 group: 3 kernel_size: 4 stride: 2 pad: 1
                          bias_term: false weight_filler { type: "bilinear" } } }"""
    model = net_from_text(tmp_path, input_layers({"x": x}) + layer)
    assert model.init_net.ops[0].type == "BilinearFill"
    assert not model.params[0].trainable                     # lr_mult: 0
    (y,) = run_layers(tmp_path, layer, {"x": x}, ["y"])
    f, c = 2, 3 / 4
    row = 1 - np.abs(np.arange(4) / f - c)
    w = np.broadcast_to(np.outer(row, row), (3, 1, 4, 4)).astype(np.float32)
    assert y.shape == (1, 3, 8, 8)
    skip_unless_torch()
    want = F.conv_transpose2d(_t(x), _t(w), stride=2, padding=1, groups=3)
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-5, atol=1e-6)


@requires_torch
@FAST
@given(pool=st.sampled_from(["MAX", "AVE"]), k=st.integers(2, 3), s=st.integers(1, 2),
       p=st.integers(0, 1), size=st.integers(5, 8), seed=st.integers(0, 2**16))
def test_pooling_ceil_mode_matches_torch(tmp_path_factory, pool, k, s, p, size, seed):
    x = np.random.default_rng(seed).standard_normal((2, 3, size, size + 1)).astype(np.float32)
    layer = f"""layer {{ name: "p" type: "Pooling" bottom: "x" top: "y"
      pooling_param {{ pool: {pool} kernel_size: {k} stride: {s} pad: {p} }} }}"""
    (y,) = run_layers(tmp_path_factory.mktemp("p"), layer, {"x": x}, ["y"])
    fn = F.max_pool2d if pool == "MAX" else F.avg_pool2d
    want = fn(_t(x), k, s, p, ceil_mode=True)   # Caffe's rounding and divisor
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-5, atol=1e-6)


def test_global_pooling_and_floor_round_mode(tmp_path):
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 6)).astype(np.float32)
    layers = """
    layer { name: "g" type: "Pooling" bottom: "x" top: "g"
            pooling_param { pool: AVE global_pooling: true } }
    layer { name: "f" type: "Pooling" bottom: "x" top: "f"
            pooling_param { pool: MAX kernel_size: 2 stride: 2 round_mode: FLOOR } }"""
    g, f = run_layers(tmp_path, layers, {"x": x}, ["g", "f"])
    np.testing.assert_allclose(g, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(f, x[:, :, :4, :6].reshape(2, 3, 2, 2, 3, 2).max(axis=(3, 5)))


@requires_torch
@pytest.mark.parametrize("field, ceil", [("ceil_mode: false", False), ("ceil_mode: true", True),
                                         ("round_mode: FLOOR", False), ("", True)])
def test_pooling_rounding_fields_of_forks_are_honoured(tmp_path, field, ceil):
    """`ceil_mode` (Caffe forks) and `round_mode` (BVLC) pick the output size; 7 -> 3 or 4."""
    x = np.random.default_rng(4).standard_normal((1, 2, 7, 7)).astype(np.float32)
    layer = f"""layer {{ name: "p" type: "Pooling" bottom: "x" top: "y"
      pooling_param {{ pool: MAX kernel_size: 3 stride: 2 pad: 0 {field} }} }}"""
    (y,) = run_layers(tmp_path, layer, {"x": x}, ["y"])
    want = F.max_pool2d(_t(x), 3, 2, 0, ceil_mode=ceil).numpy()
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want)


def test_pooling_rounding_fields_that_disagree_are_refused(tmp_path):
    layer = """layer { name: "p" type: "Pooling" bottom: "x" top: "y"
      pooling_param { pool: MAX kernel_size: 3 stride: 2 ceil_mode: false round_mode: CEIL } }"""
    with pytest.raises(ParseError, match="round_mode and ceil_mode disagree"):
        run_layers(tmp_path, layer, {"x": np.zeros((1, 1, 7, 7), np.float32)}, ["y"])


def test_pooling_with_an_empty_last_window_is_refused(tmp_path):
    """Stride > kernel without padding: Caffe keeps a window past the image, netrun does not."""
    layer = """layer { name: "p" type: "Pooling" bottom: "x" top: "y"
      pooling_param { pool: MAX kernel_size: 1 stride: 2 } }"""
    with pytest.raises(ParseError, match=r"layer 'p' \(Pooling\): Caffe pools this 4×4 input "
                                         r"to 3×3 but netrun to 2×2"):
        run_layers(tmp_path, layer, {"x": np.zeros((1, 1, 4, 4), np.float32)}, ["y"])


@pytest.mark.parametrize("axis, transpose, bias", [(1, False, True), (2, False, True),
                                                   (1, True, True), (1, False, False)])
def test_inner_product(tmp_path, axis, transpose, bias):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    k = int(np.prod(x.shape[axis:]))
    w = rng.standard_normal((k, 6) if transpose else (6, k)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    layer = f"""layer {{ name: "ip" type: "InnerProduct" bottom: "x" top: "y"
      inner_product_param {{ num_output: 6 axis: {axis} transpose: {str(transpose).lower()}
                             bias_term: {str(bias).lower()} }} }}"""
    params = {"ip_w": w, **({"ip_b": b} if bias else {})}
    (y,) = run_layers(tmp_path, layer, {"x": x}, ["y"], params=params)
    flat = x.reshape(int(np.prod(x.shape[:axis])), k)
    want = flat @ (w if transpose else w.T) + (b if bias else 0)
    np.testing.assert_allclose(y, want.reshape(*x.shape[:axis], 6), rtol=1e-4, atol=1e-5)


@requires_torch
def test_lrn_across_and_within_channels(tmp_path):
    x = np.random.default_rng(4).standard_normal((2, 6, 5, 5)).astype(np.float32)
    layers = """
    layer { name: "a" type: "LRN" bottom: "x" top: "a"
            lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 2 } }
    layer { name: "w" type: "LRN" bottom: "x" top: "w"
            lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 norm_region: WITHIN_CHANNEL } }"""
    across, within = run_layers(tmp_path, layers, {"x": x}, ["a", "w"])
    want = F.local_response_norm(_t(x), 3, alpha=0.5, beta=0.75, k=2.0)
    np.testing.assert_allclose(across, want.numpy(), rtol=1e-5, atol=1e-6)
    # Caffe: 1 + alpha/size² · (sum of x² over a size×size window, zero padded)
    sq = F.avg_pool2d(_t(x) ** 2, 3, 1, 1, count_include_pad=True)
    np.testing.assert_allclose(within, (_t(x) / (1 + 0.5 * sq) ** 0.75).numpy(), rtol=1e-5,
                               atol=1e-6)
