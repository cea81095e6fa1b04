"""Workspace, operator creation and the sequential executor."""
from __future__ import annotations

import numpy as np
import pytest

import netrun
from netrun.errors import BackendError, NetrunError, SchemaError, UnknownOpError


def test_feed_fetch_copies_both_ways(device):
    ws = netrun.Workspace(device)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ws.feed_blob("X", x)
    x[0, 0] = 100
    out = ws.fetch_blob("X")
    assert out[0, 0] == 0 and out.dtype == np.float32
    out[0, 1] = 100
    assert ws.fetch_blob("X")[0, 1] == 1
    assert ws.blobs() == ["X"] and ws.has_blob("X")


def test_fetch_unknown_blob_suggests():
    ws = netrun.Workspace()
    ws.feed_blob("conv1", np.zeros(2))
    with pytest.raises(NetrunError, match="did you mean 'conv1'"):
        ws.fetch_blob("conv2")


def test_run_operator_once_and_missing_input():
    ws = netrun.Workspace()
    ws.feed_blob("X", np.array([-1.0, 2.0], dtype=np.float32))
    ws.run_operator_once(netrun.op("Relu", ["X"], ["Y"]))
    np.testing.assert_array_equal(ws.fetch_blob("Y"), [0.0, 2.0])
    with pytest.raises(NetrunError, match="input blob 'Z' does not exist"):
        ws.run_operator_once(netrun.op("Relu", ["Z"], ["Y"]))


def test_net_reuses_output_buffers_across_runs():
    ws = netrun.Workspace()
    ws.feed_blob("X", np.random.randn(4, 5).astype(np.float32))
    net = netrun.NetDef(name="n", ops=[netrun.op("Relu", ["X"], ["Y"]), netrun.op("Relu", ["Y"], ["Y"])])
    ws.create_net(net)
    ws.run_net("n")
    first = ws.get_blob("Y")
    ws.run_net("n", iterations=3)
    assert ws.get_blob("Y") is first  # steady state allocates nothing
    assert ws.nets() == ["n"]


def test_create_net_reports_every_invalid_op_at_once():
    ws = netrun.Workspace()
    net = netrun.NetDef(name="bad", ops=[netrun.op("Relu", ["X"], ["Y"], alpha=1),
                                         netrun.op("Relu", ["X"], ["Y"], beta=2)])
    with pytest.raises(SchemaError) as err:
        ws.create_net(net)
    assert "2 invalid ops" in str(err.value) and "alpha" in str(err.value) and "beta" in str(err.value)


def test_unknown_op_and_unknown_net_suggest():
    ws = netrun.Workspace()
    with pytest.raises(UnknownOpError, match="did you mean 'Relu'"):
        ws.run_operator_once(netrun.op("Rleu", ["X"], ["Y"]))
    ws.create_net(netrun.NetDef(name="train"))
    with pytest.raises(NetrunError, match="did you mean 'train'"):
        ws.run_net("trian")


def test_bad_device_strings():
    with pytest.raises(BackendError, match="unknown device"):
        netrun.Workspace("tpu")
    with pytest.raises(BackendError, match="unknown device"):
        netrun.Workspace("gpu:x")


def test_gpu_without_cupy_is_a_clear_error():
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed; covered by the GPU suite")
    except ImportError:
        pass
    with pytest.raises(BackendError, match="needs CuPy"):
        netrun.Workspace("gpu")


def test_scratch_is_shared_and_grows():
    ws = netrun.Workspace()
    a = ws.scratch("col", (2, 3))
    b = ws.scratch("col", (3, 2))
    assert np.shares_memory(a, b)
    c = ws.scratch("col", (10, 10))
    assert c.shape == (10, 10)
