"""Net-level shape and cost inference: LeNet's shapes, errors, and agreement with real runs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.model.builder import ModelBuilder
from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import NetShapes, count_params, infer_op, infer_shapes
from netrun.errors import SchemaError, ShapeError, UnknownOpError
from netrun.proto.defs import NetDef, op

LENET = Path(__file__).resolve().parents[1] / "zoo" / "lenet.yaml"

LENET_SHAPES = {"conv1": (64, 20, 24, 24), "pool1": (64, 20, 12, 12), "conv2": (64, 50, 8, 8),
                "pool2": (64, 50, 4, 4), "ip1": (64, 500), "relu1": (64, 500), "ip2": (64, 10)}


def test_lenet_predict_shapes_params_and_costs_for_batch_64():
    m = netrun.load_model(LENET)
    shapes = m.infer_shapes("predict", batch_size=64)
    assert {b: shapes[b].shape for b in LENET_SHAPES} == LENET_SHAPES
    assert count_params(shapes, m.param_names) == 431_080
    assert [r.op.name for r in shapes.ops] == [o.name for o in m.predict_net.ops]
    conv1 = shapes.ops[0]
    assert conv1.inputs == (TensorSpec((64, 1, 28, 28)), TensorSpec((20, 1, 5, 5)),
                            TensorSpec((20,)))
    assert conv1.outputs == (TensorSpec((64, 20, 24, 24)),)
    # At least one FLOP per multiply-accumulate; every op reads and writes something.
    assert conv1.cost.flops >= 64 * 20 * 24 * 24 * 25
    assert all(r.cost.flops > 0 and r.cost.bytes_read > 0 and r.cost.bytes_written > 0
               for r in shapes.ops)
    assert shapes.flops == sum(r.cost.flops for r in shapes.ops)
    # FLOPs scale with the batch; parameters do not.
    half = m.infer_shapes("predict", batch_size=32)
    assert half.flops < shapes.flops and count_params(half, m.param_names) == 431_080


def test_train_net_shapes_include_labels_loss_and_metrics():
    m = netrun.load_model(LENET)
    shapes = m.infer_shapes("train", batch_size=8)
    assert shapes["label"] == TensorSpec((8,), "int32")
    assert shapes["loss"].shape == () and shapes["accuracy"].shape == ()
    assert shapes["loss_prob"].shape == (8, 10)


def test_init_net_shapes_are_the_param_shapes():
    m = netrun.load_model(LENET)
    shapes = infer_shapes(m.init_net, {})
    assert {p.name: shapes[p.name].shape for p in m.params} == {p.name: p.shape
                                                                 for p in m.params}


def test_inferred_shapes_match_a_real_run_of_the_train_net():
    m = netrun.load_model(LENET)
    ws = netrun.Workspace(seed=0)
    ws.run_net_once(m.init_net)
    ws.feed_blob("data", np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32))
    ws.feed_blob("label", np.array([0, 3, 9], dtype=np.int32))
    ws.run_net_once(m.train_net)
    shapes = m.infer_shapes("train", batch_size=3)
    for blob, spec in shapes.blobs.items():
        got = ws.fetch_blob(blob)
        assert (got.shape, str(got.dtype)) == (spec.shape, spec.dtype), blob


def test_missing_input_shape_suggests_the_input_option():
    m = netrun.load_model(LENET)
    specs = m.input_specs(4)
    del specs["data"]
    with pytest.raises(ShapeError) as info:
        infer_shapes(m.predict_net, specs)
    message = str(info.value)
    assert "'conv1' (Conv)" in message and "reads blob 'data'" in message
    assert "--input data=D1,D2,..." in message


def test_a_shape_mismatch_names_the_op_the_blobs_and_both_shapes():
    net = NetDef("n", [op("FC", ["x", "w", "b"], ["y"], name="fc1")])
    specs = {"x": TensorSpec((8, 30)), "w": TensorSpec((10, 20)), "b": TensorSpec((10,))}
    with pytest.raises(ShapeError) as info:
        infer_shapes(net, specs)
    message = str(info.value)
    assert "op 'fc1' (FC)" in message
    assert "x 8×30" in message and "w 10×20" in message  # blob names with both shapes


def test_schema_errors_surface_before_shapes():
    with pytest.raises(SchemaError, match="unknown argument 'kernal', did you mean 'kernel'"):
        infer_op(op("MaxPool", ["x"], ["y"], kernal=2), [TensorSpec((1, 1, 4, 4))])
    with pytest.raises(UnknownOpError):
        infer_op(op("Convolution", ["x"], ["y"]), [TensorSpec((1,))])


def test_in_place_ops_keep_the_latest_spec_and_count_params_takes_a_dict():
    net = NetDef("n", [op("Relu", ["x"], ["x"]), op("Flatten", ["x"], ["f"])])
    shapes = infer_shapes(net, {"x": TensorSpec((2, 3, 4))})
    assert isinstance(shapes, NetShapes) and shapes["f"].shape == (2, 12)
    assert shapes["x"].shape == (2, 3, 4) and len(shapes.ops) == 2
    assert count_params({"a": TensorSpec((2, 3)), "b": TensorSpec((4,))}, ["a", "b"]) == 10


@settings(max_examples=15, deadline=None)
@given(size=st.integers(5, 12), kernel=st.integers(1, 4), stride=st.integers(1, 3),
       pad=st.integers(0, 2), pool=st.sampled_from(["max_pool", "average_pool"]),
       pool_kernel=st.integers(1, 3), batch=st.integers(1, 3))
def test_inferred_shapes_equal_real_shapes_for_random_conv_pool_nets(size, kernel, stride, pad,
                                                                     pool, pool_kernel, batch):
    b = ModelBuilder("h")
    b.add_input("x", (2, size, size))
    b.conv(None, "c", num_output=3, kernel=kernel, stride=stride, pad=min(pad, kernel - 1))
    if b.shape("c")[2] >= pool_kernel:
        getattr(b, pool)(None, "p", kernel=pool_kernel, stride=pool_kernel)
    b.fc(None, "f", num_output=4)
    m = b.build()
    ws = netrun.Workspace(seed=0)
    ws.run_net_once(m.init_net)
    ws.feed_blob("x", np.ones((batch, 2, size, size), np.float32))
    ws.run_net_once(m.predict_net)
    shapes = m.infer_shapes("predict", batch_size=batch)
    for blob, spec in shapes.blobs.items():
        assert ws.fetch_blob(blob).shape == spec.shape, blob
