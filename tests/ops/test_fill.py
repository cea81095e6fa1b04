"""Fillers: statistics, Caffe's fan counts, ConstantFill's shape/dtype rules, seeds, errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

import netrun
from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import infer_op
from netrun.errors import SchemaError, ShapeError
from netrun.ops.fill import fan, fans
from tests.opcheck import run_op
from tests.checks import checks_ops

CONV = [64, 32, 3, 3]   # K×C×kh×kw: fan_in 288, fan_out 576
FC = [500, 800]         # N_out×K: fan_in 800, fan_out 500


def fill(type_, inputs=None, device="cpu", seed=0, **args):
    names = list(inputs or {})
    return run_op(netrun.op(type_, names, ["Y"], **args), inputs or {}, device, seed)[0]


# Fan counts --------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, fan_in, fan_out", [
    (CONV, 288, 576), (FC, 800, 500), ([10], 1, 10), ([], 1, 1), ([4, 6, 5], 30, 20)])
def test_fans_follow_caffe(shape, fan_in, fan_out):
    assert fans(shape) == (fan_in, fan_out)
    assert fan(shape, "FAN_IN") == fan_in and fan(shape, "FAN_OUT") == fan_out
    assert fan(shape, "AVERAGE") == (fan_in + fan_out) / 2


# Random fillers: statistics ------------------------------------------------------------------
@checks_ops("XavierFill", kind="reference")
@pytest.mark.parametrize("norm, n", [("FAN_IN", 288), ("FAN_OUT", 576), ("AVERAGE", 432)])
def test_xavier_fill(device, norm, n):
    w = fill("XavierFill", device=device, shape=CONV, variance_norm=norm)
    limit = math.sqrt(3 / n)
    assert w.shape == tuple(CONV) and w.dtype == np.float32
    assert w.min() >= -limit and w.max() <= limit
    assert w.max() > 0.99 * limit and w.min() < -0.99 * limit  # 18432 draws reach the ends
    # uniform(−a, a) has std a/√3 = 1/√n; 18432 draws pin it within ~1%.
    assert abs(w.std() * math.sqrt(n) - 1) < 0.03 and abs(w.mean()) < 0.03 * limit


@checks_ops("MSRAFill", kind="reference")
@pytest.mark.parametrize("norm, n", [("FAN_IN", 800), ("FAN_OUT", 500)])
def test_msra_fill(device, norm, n):
    w = fill("MSRAFill", device=device, shape=FC, variance_norm=norm)
    std = math.sqrt(2 / n)
    assert w.shape == tuple(FC) and w.dtype == np.float32
    assert abs(w.std() / std - 1) < 0.01 and abs(w.mean()) < 0.01 * std


@checks_ops("GaussianFill", "UniformFill", kind="reference")
def test_gaussian_and_uniform_fill(device):
    g = fill("GaussianFill", device=device, shape=[400, 500], mean=2.0, std=0.5)
    assert abs(g.mean() - 2.0) < 0.005 and abs(g.std() - 0.5) < 0.005
    u = fill("UniformFill", device=device, shape=[400, 500], min=-1.0, max=3.0,
             dtype="float64")
    assert u.dtype == np.float64 and u.min() >= -1.0 and u.max() < 3.0
    assert abs(u.mean() - 1.0) < 0.01 and abs(u.std() - 4 / math.sqrt(12)) < 0.01


def test_random_fillers_are_reproducible_from_the_seed():
    for type_ in ("XavierFill", "MSRAFill", "GaussianFill", "UniformFill"):
        a = fill(type_, shape=[3, 4], seed=5)
        np.testing.assert_array_equal(a, fill(type_, shape=[3, 4], seed=5))
        assert not np.array_equal(a, fill(type_, shape=[3, 4], seed=6))
    # Drawn in float64 on the host: the float64 fill rounds to the float32 one.
    np.testing.assert_array_equal(fill("GaussianFill", shape=[5], dtype="float64").astype(
        np.float32), fill("GaussianFill", shape=[5]))


def test_random_filler_takes_the_input_shape_but_not_its_dtype():
    w = fill("XavierFill", {"like": np.zeros((6, 4), np.float64)})
    assert w.shape == (6, 4) and w.dtype == np.float32
    assert np.abs(w).max() <= math.sqrt(3 / 4)


# ConstantFill, GivenTensorFill -----------------------------------------------------------------
@checks_ops("ConstantFill", kind="reference")
def test_constant_fill_shape_and_dtype_rules(device):
    y = fill("ConstantFill", device=device, shape=[2, 3], value=1.5)
    assert y.dtype == np.float32 and y.shape == (2, 3) and np.all(y == 1.5)
    y = fill("ConstantFill", device=device, shape=[4], value=7, dtype="int64")
    assert y.dtype == np.int64 and np.all(y == 7)
    y = fill("ConstantFill", device=device, shape=[2], value=1, dtype="bool")
    assert y.dtype == np.bool_ and y.all()
    y = fill("ConstantFill", device=device, value=3.0)
    assert y.shape == () and y == 3.0
    # With an input: its shape, and its dtype unless dtype is given.
    x = np.zeros((3, 2), np.float64)
    y = fill("ConstantFill", {"X": x}, device=device, value=2.0)
    assert y.shape == (3, 2) and y.dtype == np.float64 and np.all(y == 2.0)
    y = fill("ConstantFill", {"X": x}, device=device, value=2.0, dtype="int32")
    assert y.dtype == np.int32


def test_constant_fill_seeds_a_scalar_loss_gradient():
    # The backward builder's seeding op: ConstantFill([loss], [loss_grad], value=1.0).
    (g,) = run_op(netrun.op("ConstantFill", ["loss"], ["loss_grad"], value=1.0),
                  {"loss": np.float32(0.25)})
    assert g.shape == () and g.dtype == np.float32 and g == 1.0
    net = netrun.NetDef("n", [netrun.op("AveragedLoss", ["X"], ["loss"])])
    grads = netrun.add_gradient_ops(net, ["loss"])
    ws = netrun.Workspace("cpu")
    ws.feed_blob("X", np.ones((2, 4), np.float32))
    ws.run_net_once(net)
    np.testing.assert_array_equal(ws.fetch_blob(grads["X"]), np.full((2, 4), 0.125, np.float32))


@checks_ops("GivenTensorFill", kind="reference")
def test_given_tensor_fill():
    y = fill("GivenTensorFill", values=[1, 2, 3, 4, 5, 6], shape=[2, 3])
    np.testing.assert_array_equal(y, np.arange(1, 7, dtype=np.float32).reshape(2, 3))
    y = fill("GivenTensorFill", values=[1, 2, 3], dtype="int64")
    assert y.dtype == np.int64 and y.tolist() == [1, 2, 3]
    y = fill("GivenTensorFill", {"like": np.zeros((2, 2))}, values=[1, 2, 3, 4])
    assert y.shape == (2, 2)


def test_input_as_shape():
    y = fill("ConstantFill", {"s": np.array([2, 5], np.int64)}, input_as_shape=1, value=1.0)
    assert y.shape == (2, 5) and y.dtype == np.float32
    y = fill("UniformFill", {"s": np.array([3, 1], np.int32)}, input_as_shape=1)
    assert y.shape == (3, 1)
    with pytest.raises(ShapeError, match="input_as_shape"):
        infer_op(netrun.op("ConstantFill", ["s"], ["Y"], input_as_shape=1),
                 [TensorSpec((2,), "int64")])


def test_fillers_have_no_gradient():
    for type_ in ("ConstantFill", "GivenTensorFill", "UniformFill", "GaussianFill",
                  "XavierFill", "MSRAFill"):
        assert netrun.get_schema(type_).no_gradient


# Shape inference and build-time errors -------------------------------------------------------
@pytest.mark.parametrize("op, inputs", [
    (netrun.op("XavierFill", [], ["Y"], shape=CONV), {}),
    (netrun.op("MSRAFill", ["X"], ["Y"]), {"X": np.zeros((3, 4), np.float64)}),
    (netrun.op("ConstantFill", ["X"], ["Y"]), {"X": np.zeros((3, 4), np.int32)}),
    (netrun.op("ConstantFill", [], ["Y"], dtype="bool"), {}),
    (netrun.op("GaussianFill", [], ["Y"], shape=[2, 0]), {}),
    (netrun.op("GivenTensorFill", [], ["Y"], values=[1, 2]), {}),
], ids=lambda v: getattr(v, "type", ""))
def test_shape_inference_matches_outputs(op, inputs):
    (y,) = run_op(op, inputs)
    spec = infer_op(op, [TensorSpec(v.shape, str(v.dtype)) for v in inputs.values()])
    assert (spec.outputs[0].shape, spec.outputs[0].dtype) == (y.shape, str(y.dtype))
    assert spec.cost.bytes_written == y.nbytes


@pytest.mark.parametrize("op, message", [
    (netrun.op("UniformFill", [], ["Y"], min=2.0, max=1.0), "'min' \\(2.0\\) is above 'max'"),
    (netrun.op("GaussianFill", [], ["Y"], std=-1.0), "'std' is -1.0"),
    (netrun.op("XavierFill", [], ["Y"], shape=[2], variance_norm="fan_in"),
     "'variance_norm' is 'fan_in'"),
    (netrun.op("XavierFill", [], ["Y"], shape=[2], dtype="int32"), "'dtype' is 'int32'"),
    (netrun.op("ConstantFill", [], ["Y"], value="one"), "'value' must be a number"),
    (netrun.op("ConstantFill", ["X"], ["Y"], shape=[2]), "'shape' and an input"),
    (netrun.op("ConstantFill", [], ["Y"], input_as_shape=1), "'input_as_shape' is 1"),
    (netrun.op("GaussianFill", [], ["Y"], shape=[2, -1]), "negative size"),
    (netrun.op("GivenTensorFill", [], ["Y"], values=[1.0, 2.0, 3.0], shape=[2, 2]),
     "'values' has 3 entries but argument 'shape' \\[2, 2\\] holds 4"),
    (netrun.op("GivenTensorFill", [], ["Y"], shape=[2]), "missing required argument 'values'"),
])
def test_bad_arguments_fail_at_build_time_naming_op_and_argument(op, message):
    with pytest.raises(SchemaError, match=f"{op.type}.*{message}"):
        netrun.get_schema(op.type).verify(op)
