"""Dropout: mask statistics, inverted scaling, determinism from the seed, gradient, test mode."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import infer_op
from netrun.errors import SchemaError
from tests.opcheck import check_gradient, netrun_forward_backward, run_op
from tests.checks import checks_ops

DROP = netrun.op("Dropout", ["X"], ["Y", "mask"], ratio=0.3)


@checks_ops("Dropout", kind="reference")
@pytest.mark.parametrize("ratio", [0.0, 0.2, 0.5, 0.9])
def test_dropout_statistics_and_scaling(device, ratio):
    x = np.random.default_rng(0).uniform(1.0, 2.0, (200, 500)).astype(np.float32)
    y, mask = run_op(netrun.op("Dropout", ["X"], ["Y", "mask"], ratio=ratio), {"X": x}, device)
    assert mask.dtype == np.bool_ and y.dtype == np.float32
    kept = mask.mean()
    # 1e5 Bernoulli draws: the kept fraction's standard deviation is below 0.0016.
    assert abs(kept - (1 - ratio)) < 0.008
    np.testing.assert_allclose(y[mask], x[mask] / (1 - ratio), rtol=1e-6)
    assert not np.any(y[~mask])
    # Inverted dropout keeps the expectation: mean(Y) ≈ mean(X).
    assert abs(y.mean() / x.mean() - 1) < 0.05


def test_dropout_is_reproducible_from_the_seed_and_advances():
    x = np.ones((50, 40), np.float32)
    _, m1 = run_op(DROP, {"X": x}, seed=7)
    _, m2 = run_op(DROP, {"X": x}, seed=7)
    _, m3 = run_op(DROP, {"X": x}, seed=8)
    np.testing.assert_array_equal(m1, m2)
    assert np.mean(m1 != m3) > 0.2
    ws = netrun.Workspace("cpu", seed=7)
    ws.feed_blob("X", x)
    ws.run_operator_once(DROP)
    first = ws.fetch_blob("mask")
    np.testing.assert_array_equal(first, m1)
    ws.run_operator_once(DROP)  # the next iteration draws a fresh mask
    assert np.mean(ws.fetch_blob("mask") != first) > 0.2


@checks_ops("Dropout", kind="finite_differences")
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), ratio=st.sampled_from([0.0, 0.25, 0.6]))
def test_dropout_gradient_with_fixed_mask(seed, ratio):
    # check_gradient reseeds every workspace with the same seed, so the mask stays fixed.
    x = np.random.default_rng(seed).standard_normal((4, 5))
    op = netrun.op("Dropout", ["X"], ["Y", "mask"], ratio=ratio)
    check_gradient(op, {"X": x}, seed=seed)


@checks_ops("Dropout", kind="reference")
def test_dropout_gradient_uses_the_mask(device):
    x = np.random.default_rng(1).standard_normal((30, 30)).astype(np.float32)
    dy = np.random.default_rng(2).standard_normal(x.shape).astype(np.float32)
    (y, mask), grads = netrun_forward_backward(DROP, {"X": x}, dy, device)
    np.testing.assert_allclose(grads["X"], dy * mask / 0.7, rtol=1e-6)
    np.testing.assert_allclose(y, x * mask / 0.7, rtol=1e-6)


def test_dropout_in_place_forward_and_backward():
    x = np.random.default_rng(3).standard_normal((20, 20)).astype(np.float32)
    ws = netrun.Workspace("cpu", seed=4)
    ws.feed_blob("X", x)
    op = netrun.op("Dropout", ["X"], ["X", "mask"], ratio=0.5)
    ws.run_operator_once(op)
    mask = ws.fetch_blob("mask")
    np.testing.assert_allclose(ws.fetch_blob("X"), x * mask * 2.0)
    ws.feed_blob("X_grad", np.ones_like(x))
    ws.run_operator_once(netrun.op("DropoutGradient", ["X_grad", "mask"], ["X_grad"], ratio=0.5))
    np.testing.assert_allclose(ws.fetch_blob("X_grad"), mask * 2.0)


@pytest.mark.parametrize("outputs", [["Y"], ["Y", "mask"]])
def test_dropout_test_mode_is_identity(outputs):
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    op = netrun.op("Dropout", ["X"], outputs, ratio=0.5, is_test=1)
    outs = run_op(op, {"X": x})
    np.testing.assert_array_equal(outs[0], x)
    if len(outputs) == 2:
        assert outs[1].all()
    grad_ops, grad_of = netrun.gradient_ops(op)
    ws = netrun.Workspace("cpu")
    ws.feed_blob("Y_grad", x * 3)
    for g in grad_ops:
        ws.run_operator_once(g)
    np.testing.assert_array_equal(ws.fetch_blob(grad_of["X"]), x * 3)


def test_dropout_test_mode_output_is_not_an_alias_of_the_input():
    # Y = X without a copy, yet a later in-place op on Y must not write through to X.
    ws = netrun.Workspace("cpu")
    ws.feed_blob("X", -np.ones(4, np.float32))
    ws.run_operator_once(netrun.op("Dropout", ["X"], ["Y"], is_test=1))
    ws.run_operator_once(netrun.op("Relu", ["Y"], ["Y"]))
    np.testing.assert_array_equal(ws.fetch_blob("Y"), np.zeros(4))
    np.testing.assert_array_equal(ws.fetch_blob("X"), -np.ones(4))


def test_dropout_bad_arguments_fail_at_build_time():
    schema = netrun.get_schema("Dropout")
    for ratio in (1.5, 1.0, -0.1):
        with pytest.raises(SchemaError, match=f"Dropout.*'ratio' is {ratio}"):
            schema.verify(netrun.op("Dropout", ["X"], ["Y", "m"], ratio=ratio))
    with pytest.raises(SchemaError, match="needs a second output for the mask"):
        schema.verify(netrun.op("Dropout", ["X"], ["Y"]))
    with pytest.raises(SchemaError, match="needs the mask"):
        netrun.get_schema("DropoutGrad").verify(netrun.op("DropoutGrad", ["dY"], ["dX"]))


def test_dropout_shapes_and_caffe2_gradient_name():
    specs = infer_op(DROP, [TensorSpec((4, 5))]).outputs
    y, mask = run_op(DROP, {"X": np.ones((4, 5), np.float32)})
    assert [(s.shape, s.dtype) for s in specs] == [(y.shape, "float32"), (mask.shape, "bool")]
    # Caffe2 nets name the gradient op DropoutGrad; it computes the same thing.
    ws = netrun.Workspace("cpu")
    ws.feed_blob("dY", np.ones((4, 5), np.float32))
    ws.feed_blob("mask", mask)
    ws.run_operator_once(netrun.op("DropoutGrad", ["dY", "mask"], ["dX"], ratio=0.3))
    np.testing.assert_allclose(ws.fetch_blob("dX"), mask / 0.7)
