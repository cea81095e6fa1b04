"""The executor's per-op path (core/operator.py, core/net.py, core/memory.py): what binding
resolves ahead must not change what a run does or how its errors read."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import netrun
from netrun.core.operator import Operator
from netrun.errors import NetrunError
from netrun.proto.defs import NetDef


def _ws(**blobs):
    ws = netrun.Workspace("cpu")
    for name, value in blobs.items():
        ws.feed_blob(name, value)
    return ws


@pytest.mark.parametrize("op", [netrun.op("Relu", ["missing"], ["y"]),
                                netrun.op("Add", ["a", "missing"], ["y"]),
                                netrun.op("Sum", ["a", "a", "missing"], ["y"])])
def test_a_missing_input_is_named_with_its_op(op):
    ws = _ws(a=np.ones(3, np.float32))
    with pytest.raises(NetrunError, match=r"input blob 'missing' does not exist.*") as e:
        Operator(op, ws).run()
    assert op.type in str(e.value)


def test_inputs_of_zero_one_and_repeated_names():
    ws = _ws(a=np.arange(3, dtype=np.float32))
    Operator(netrun.op("ConstantFill", [], ["c"], shape=[2], value=4.0), ws).run()
    Operator(netrun.op("Add", ["a", "a"], ["twice"]), ws).run()
    Operator(netrun.op("Relu", ["a"], ["r"]), ws).run()
    np.testing.assert_array_equal(ws.fetch_blob("c"), [4, 4])
    np.testing.assert_array_equal(ws.fetch_blob("twice"), [0, 2, 4])
    np.testing.assert_array_equal(ws.fetch_blob("r"), [0, 1, 2])


def test_outputs_are_reused_while_they_fit_and_replaced_when_not():
    ws = _ws(x=np.ones((2, 3), np.float32))
    op = Operator(netrun.op("Relu", ["x"], ["y"]), ws)
    op.run()
    first = ws._blobs["y"]
    op.run()
    assert ws._blobs["y"] is first                                   # steady state
    assert op.ctx.output(0, [2, 3], np.float32) is first             # a list shape fits too
    assert op.ctx.output(0, (np.int64(2), np.int64(3)), "float32") is first
    ws.feed_blob("x", np.ones((4, 3), np.float32))
    op.run()
    assert ws._blobs["y"] is not first and ws._blobs["y"].shape == (4, 3)
    ws.feed_blob("x", np.ones((4, 3), np.float64))
    op.run()
    assert ws._blobs["y"].dtype == np.float64
    view = np.zeros((8, 3), np.float64)[:4]                          # a view is never written
    ws._blobs["y"] = view
    op.run()
    assert ws._blobs["y"] is not view and not view.any()


def test_a_net_runs_its_ops_in_order_and_forgets_their_scratch_with_them():
    ws = _ws(x=np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 6))
    net = NetDef(name="n", ops=[netrun.op("Relu", ["x"], ["y"]), netrun.op("Scale", ["y"], ["z"],
                                                                             scale=2.0)])
    ws.create_net(net)
    ws.run_net("n", 2)
    np.testing.assert_allclose(ws.fetch_blob("z"), 2 * np.maximum(ws.fetch_blob("x"), 0))
    arena = ws.memory.arena
    assert len(arena._ops) == 2
    ws._nets.clear()
    gc.collect()
    assert len(arena._ops) == 0
