"""The backward-pass builder: accumulation, in-place versions, stopping, pruning, errors."""
from __future__ import annotations

import numpy as np
import pytest

import netrun
from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import register_schema
from netrun.errors import GradientError
from netrun.ops.common import same_as_input

# Test-only ops: a square (gradient reads its input) and one with no gradient maker.
register_schema("TestSquare", shape_fn=same_as_input(0), inplace=((0, 0),))
register_schema("TestSquareGradient", inputs=2, shape_fn=same_as_input(0))
register_schema("TestNoGrad", shape_fn=same_as_input(0))


@register_kernel("TestSquare")
def _square(ctx, X):
    return X * X


@register_kernel("TestSquareGradient")
def _square_grad(ctx, X, dY):
    return 2 * X * dY


@register_kernel("TestNoGrad")
def _nograd(ctx, X):
    return X + 0


@register_gradient("TestSquare")
def _square_maker(g):
    return [g.op("TestSquareGradient", [g.I(0), g.GO(0)], [g.GI(0)])]


def run(net, feeds, fetch):
    ws = netrun.Workspace()
    for k, v in feeds.items():
        ws.feed_blob(k, v)
    ws.run_net_once(net)
    return {k: ws.fetch_blob(k) for k in fetch}


def test_blob_used_twice_accumulates():
    # L = sum(relu(x)) + sum(x^2)  =>  dL/dx = (x > 0) + 2x
    x = np.array([-1.5, 0.5, 2.0])
    net = netrun.NetDef("n", [netrun.op("Relu", ["x"], ["a"]), netrun.op("TestSquare", ["x"], ["b"]),
                              netrun.op("Sum", ["a", "b"], ["s"]), netrun.op("ReduceSum", ["s"], ["L"], keepdims=0)])
    grads = netrun.add_gradient_ops(net, ["L"])
    assert grads["x"] == "x_grad"
    assert any(o.type == "Sum" and o.outputs == ("x_grad",) for o in net.ops[4:])
    out = run(net, {"x": x}, ["x_grad"])
    np.testing.assert_allclose(out["x_grad"], (x > 0) + 2 * x)


def test_in_place_chain_uses_outputs():
    # y = relu(3 * (2 * x)), every op after the first in place on y.
    x = np.array([-1.0, 0.5, 3.0])
    net = netrun.NetDef("n", [netrun.op("Scale", ["x"], ["y"], scale=2.0),
                              netrun.op("Scale", ["y"], ["y"], scale=3.0),
                              netrun.op("Relu", ["y"], ["y"]),
                              netrun.op("ReduceSum", ["y"], ["L"], keepdims=0)])
    netrun.add_gradient_ops(net, ["L"])
    out = run(net, {"x": x}, ["x_grad", "y"])
    np.testing.assert_allclose(out["y"], np.maximum(6 * x, 0))
    np.testing.assert_allclose(out["x_grad"], 6.0 * (x > 0))


def test_output_overwritten_by_a_later_in_place_op_is_refused():
    # The first Relu's gradient needs its output, which the in-place Scale then overwrites.
    net = netrun.NetDef("n", [netrun.op("Relu", ["x"], ["y"]), netrun.op("Scale", ["y"], ["y"], scale=2.0),
                              netrun.op("ReduceSum", ["y"], ["L"], keepdims=0)])
    with pytest.raises(GradientError, match="reads 'y'"):
        netrun.add_gradient_ops(net, ["L"])


def test_gradient_reading_an_overwritten_input_is_refused():
    net = netrun.NetDef("n", [netrun.op("TestSquare", ["x"], ["x"]),
                              netrun.op("ReduceSum", ["x"], ["L"], keepdims=0)])
    with pytest.raises(GradientError, match="overwrites"):
        netrun.add_gradient_ops(net, ["L"])


def test_missing_gradients_reported_for_whole_net():
    net = netrun.NetDef("n", [netrun.op("TestNoGrad", ["x"], ["a"], name="first"),
                              netrun.op("TestNoGrad", ["a"], ["b"], name="second"),
                              netrun.op("ReduceSum", ["b"], ["L"], keepdims=0)])
    with pytest.raises(GradientError) as err:
        netrun.add_gradient_ops(net, ["L"])
    assert "'first'" in str(err.value) and "'second'" in str(err.value)


def test_stop_gradient_stops():
    net = netrun.NetDef("n", [netrun.op("TestNoGrad", ["x"], ["a"]), netrun.op("StopGradient", ["a"], ["a2"]),
                              netrun.op("Mul", ["a2", "w"], ["b"]), netrun.op("ReduceSum", ["b"], ["L"], keepdims=0)])
    grads = netrun.add_gradient_ops(net, ["L"])
    assert "w" in grads and "x" not in grads and "a" not in grads


def test_params_prune_data_gradient():
    x, w, b = np.random.randn(2, 3), np.random.randn(4, 3), np.random.randn(4)
    net = netrun.NetDef("n", [netrun.op("FC", ["x", "w", "b"], ["y"]),
                              netrun.op("ReduceSum", ["y"], ["L"], keepdims=0)])
    grads = netrun.add_gradient_ops(net, ["L"], params=["w", "b"])
    assert {"w", "b"} <= set(grads) and "x" not in grads
    assert not any("x_grad" in o.outputs for o in net.ops)  # the data gradient is never computed
    out = run(net, {"x": x, "w": w, "b": b}, ["w_grad", "b_grad"])
    np.testing.assert_allclose(out["w_grad"], np.ones((4, 2)) @ x)
    np.testing.assert_allclose(out["b_grad"], np.full(4, 2.0))


def test_gradient_ops_for_one_op():
    ops, grad_of = netrun.gradient_ops(netrun.op("Relu", ["X"], ["Y"]))
    assert [o.type for o in ops] == ["ReluGradient"]
    assert ops[0].inputs == ("Y", "Y_grad") and grad_of == {"X": "X_grad"}
    ops, grad_of = netrun.gradient_ops(netrun.op("StopGradient", ["X"], ["Y"]))
    assert ops == [] and grad_of == {"X": None}


def test_unknown_loss_blob():
    net = netrun.NetDef("n", [netrun.op("Relu", ["x"], ["y"])])
    with pytest.raises(GradientError, match="'nope'"):
        netrun.add_gradient_ops(net, ["nope"])


@pytest.mark.parametrize("same_shape", [0, 1])
def test_a_shared_gradient_blob_is_never_accumulated_in_place(same_shape):
    """AddRelu(a, b) with same_shape=1 gives a and b one gradient blob (the masked dY, no
    copy). a and b are read earlier too, so their second contributions come after it: each
    sum goes into a blob of its own, and neither changes the other's gradient. Without
    same_shape, AddGradient writes copies."""
    # L = Σ relu(a + b)² + Σ a² + Σ b², a = x², b = relu(x)
    x = np.array([-1.5, 0.5, 2.0, -0.25])
    net = netrun.NetDef("n", [
        netrun.op("TestSquare", ["x"], ["a"]), netrun.op("Relu", ["x"], ["b"]),
        netrun.op("TestSquare", ["a"], ["a2"]), netrun.op("TestSquare", ["b"], ["b2"]),
        netrun.op("AddRelu", ["a", "b"], ["y"], same_shape=same_shape),
        netrun.op("TestSquare", ["y"], ["y2"]),
        netrun.op("Sum", ["y2", "a2", "b2"], ["s"]),
        netrun.op("ReduceSum", ["s"], ["L"], keepdims=0)])
    grads = netrun.add_gradient_ops(net, ["L"])
    types = [o.type for o in net.ops]
    assert ("AddGradient" in types) == (not same_shape)
    out = run(net, {"x": x}, [grads["x"]])
    a, b = x * x, np.maximum(x, 0)
    y = np.maximum(a + b, 0)
    da, db = 2 * y * (y > 0) + 2 * a, 2 * y * (y > 0) + 2 * b
    np.testing.assert_allclose(out[grads["x"]], da * 2 * x + db * (x > 0))


def test_parameters_never_share_a_gradient_blob():
    """AddRelu(p, q) of two parameters: the masked dY stands for both gradients, but update
    ops may write a parameter's gradient in place, so the second gets a copy of its own."""
    net = netrun.NetDef("n", [netrun.op("AddRelu", ["p", "q"], ["y"], same_shape=1),
                              netrun.op("ReduceSum", ["y"], ["L"], keepdims=0)])
    grads = netrun.add_gradient_ops(net, ["L"], params=["p", "q"])
    assert grads["p"] != grads["q"]
    p, q = np.array([1.0, -2.0, 0.5]), np.array([0.5, 1.0, -1.0])
    out = run(net, {"p": p, "q": q}, [grads["p"], grads["q"]])
    for name in ("p", "q"):
        np.testing.assert_array_equal(out[grads[name]], (p + q > 0).astype(float))
