"""Whole-net backward passes built by netrun.add_gradient_ops: blobs read by several ops (and
twice by one op), Caffe-style in-place chains, and a small convnet with Concat and Add branches
against PyTorch autograd (float32) and against finite differences (float64)."""
from __future__ import annotations

import numpy as np
import pytest

import netrun
from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import register_schema
from netrun.ops.common import same_as_input
from tests.opcheck import check_gradient
from tests.checks import F, requires_torch, torch


def assert_close32(actual, expected, what=""):
    """float32 against a reference: relative 1e-4, absolute relative to the magnitude."""
    expected = np.asarray(expected)
    scale = max(float(np.abs(expected).max()) if expected.size else 0.0, 1e-3)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=2e-5 * scale, err_msg=what)


def run_with_gradients(net: netrun.NetDef, feeds: dict, loss: str = "loss", seed: int = 0,
                       params=None):
    """Append the backward pass, run forward + backward once; return (workspace, blob -> grad)."""
    net = net.copy()
    grads = netrun.add_gradient_ops(net, [loss], params=params)
    ws = netrun.Workspace("cpu", seed=seed)
    for k, v in feeds.items():
        ws.feed_blob(k, v)
    ws.run_net_once(net)
    return ws, grads


def torch_grads(fn, feeds: dict, wanted):
    """Run `fn(**tensors)` -> scalar loss and backprop; return (loss, {name: grad})."""
    ts = {k: torch.tensor(v, requires_grad=k in wanted) for k, v in feeds.items()}
    loss = fn(**ts)
    loss.backward()
    return loss.item(), {k: ts[k].grad.numpy() for k in wanted}


# A blob read by several ops, and by one op twice --------------------------------------------
@requires_torch
def test_shared_weights_and_a_blob_read_twice_match_torch():
    # Siamese FCs sharing W and b, an in-place Tanh on one branch, then Mul(d, d): W, b and d
    # each get two contributions that the builder must sum.
    rng = np.random.default_rng(0)
    feeds = {"x1": rng.standard_normal((4, 6)), "x2": rng.standard_normal((4, 6)),
             "W": rng.standard_normal((3, 6)) * 0.5, "b": rng.standard_normal(3)}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    net = netrun.NetDef("siamese", [
        netrun.op("FC", ["x1", "W", "b"], ["h1"]),
        netrun.op("Tanh", ["h1"], ["h1"]),
        netrun.op("FC", ["x2", "W", "b"], ["h2"]),
        netrun.op("Sub", ["h1", "h2"], ["d"]),
        netrun.op("Mul", ["d", "d"], ["sq"]),
        netrun.op("AveragedLoss", ["sq"], ["loss"]),
    ])
    ws, grads = run_with_gradients(net, feeds)

    def fn(x1, x2, W, b):
        d = torch.tanh(F.linear(x1, W, b)) - F.linear(x2, W, b)
        return (d * d).mean()

    loss, ref = torch_grads(fn, feeds, ["x1", "x2", "W", "b"])
    assert_close32(ws.fetch_blob("loss"), loss, "loss")
    for name, g in ref.items():
        assert_close32(ws.fetch_blob(grads[name]), g, f"d{name}")


def test_builder_sums_every_contribution_once():
    net = netrun.NetDef("n", [netrun.op("FC", ["x1", "W", "b"], ["h1"]),
                              netrun.op("FC", ["x2", "W", "b"], ["h2"]),
                              netrun.op("Mul", ["h1", "h1"], ["p"]),
                              netrun.op("Add", ["p", "h2"], ["s"]),
                              netrun.op("AveragedLoss", ["s"], ["loss"])])
    grads = netrun.add_gradient_ops(net, ["loss"])
    backward = net.ops[5:]
    written = [n for o in backward for n in o.outputs]
    for blob in ("W", "b"):
        # One gradient op writes W_grad, the other writes aside; one Sum accumulates.
        accumulate = [o for o in backward if o.type == "Sum" and o.outputs == (grads[blob],)]
        assert len(accumulate) == 1 and accumulate[0].inputs[0] == grads[blob]
    # Mul(h1, h1): both of MulGradient's outputs go aside, and a Sum writes h1_grad.
    (mul_grad,) = [o for o in backward if o.type == "MulGradient"]
    assert len(set(mul_grad.outputs)) == 2 and "h1_grad" not in mul_grad.outputs
    assert written.count("h1_grad") == 1


SAME_BLOB_TWICE = {
    "Mul": (netrun.op("Mul", ["X", "X"], ["Y"]), (3, 4)),
    "Add": (netrun.op("Add", ["X", "X"], ["Y"]), (3, 4)),
    "Sub": (netrun.op("Sub", ["X", "X"], ["Y"]), (3, 4)),
    "Div": (netrun.op("Div", ["X", "X"], ["Y"]), (3, 4)),
    "MatMul": (netrun.op("MatMul", ["X", "X"], ["Y"]), (3, 3)),
    "MatMul trans_b": (netrun.op("MatMul", ["X", "X"], ["Y"], trans_b=1), (2, 3)),
    "BatchMatMul": (netrun.op("BatchMatMul", ["X", "X"], ["Y"], trans_a=1), (2, 3, 3)),
    "FC": (netrun.op("FC", ["X", "X", "b"], ["Y"]), (3, 3)),
    "Concat": (netrun.op("Concat", ["X", "X"], ["Y", "info"], axis=0), (2, 3)),
    "SquaredL2Distance": (netrun.op("SquaredL2Distance", ["X", "X"], ["Y"]), (2, 3)),
}


@pytest.mark.parametrize("name", list(SAME_BLOB_TWICE))
def test_one_blob_through_two_inputs_finite_differences(name):
    op, shape = SAME_BLOB_TWICE[name]
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    x = np.sign(x) * (np.abs(x) + 0.5)  # Div: away from 0
    inputs = {"X": x, "b": rng.standard_normal(shape[0])}
    grad_ops, grad_of = netrun.gradient_ops(op)
    outputs = [n for o in grad_ops for n in o.outputs]
    assert len(outputs) == len(set(outputs)), f"{name}: a gradient blob is written twice"
    check_gradient(op, {k: v for k, v in inputs.items() if k in op.inputs})


# Test-only op: Y = 3·A·B, whose maker writes each input's gradient and then scales it in place.
register_schema("TestThreeAB", inputs=2, shape_fn=same_as_input(0))


@register_kernel("TestThreeAB")
def _three_ab(ctx, A, B):
    return 3 * A * B


@register_gradient("TestThreeAB")
def _three_ab_maker(g):
    return [g.op("Mul", [g.GO(0), g.I(1)], [g.GI(0)]),
            g.op("Scale", [g.GI(0)], [g.GI(0)], scale=3.0),
            g.op("Mul", [g.GO(0), g.I(0)], [g.GI(1)]),
            g.op("Scale", [g.GI(1)], [g.GI(1)], scale=3.0)]


def test_repeated_input_gradient_updated_in_place_by_its_maker():
    # TestThreeAB(X, X) = 3·X²: each of the two in-place chains is one contribution (3·X·dY);
    # the writes they replace must not be summed too.
    x = np.random.default_rng(4).standard_normal((2, 3))
    op = netrun.op("TestThreeAB", ["X", "X"], ["Y"])
    grad_ops, grad_of = netrun.gradient_ops(op)
    assert [o.type for o in grad_ops] == ["Mul", "Scale", "Mul", "Scale", "Sum"]
    assert len(grad_ops[-1].inputs) == 2 and grad_ops[-1].outputs == (grad_of["X"],)
    check_gradient(op, {"X": x})


@requires_torch
def test_one_blob_through_two_inputs_in_a_net_matches_torch():
    # X feeds Mul(X, X), MatMul(X, X), FC(X, X, b) and Relu(X): four ops, three read it twice.
    rng = np.random.default_rng(2)
    feeds = {"X": rng.standard_normal((3, 3)), "b": rng.standard_normal(3)}
    net = netrun.NetDef("n", [netrun.op("Mul", ["X", "X"], ["m"]),
                              netrun.op("MatMul", ["X", "X"], ["mm"]),
                              netrun.op("FC", ["X", "X", "b"], ["fc"]),
                              netrun.op("Relu", ["X"], ["r"]),
                              netrun.op("Sum", ["m", "mm", "fc", "r"], ["s"]),
                              netrun.op("Tanh", ["s"], ["s"]),
                              netrun.op("ReduceSum", ["s"], ["loss"], keepdims=0)])
    ws, grads = run_with_gradients(net, feeds)

    def fn(X, b):
        s = X * X + X @ X + F.linear(X, X, b) + torch.relu(X)
        return torch.tanh(s).sum()

    loss, ref = torch_grads(fn, feeds, ["X", "b"])
    np.testing.assert_allclose(ws.fetch_blob("loss"), loss, rtol=1e-12)
    for name in ("X", "b"):
        np.testing.assert_allclose(ws.fetch_blob(grads[name]), ref[name], rtol=1e-10,
                                   atol=1e-12)


# In-place chains, as Caffe prototxts write them ----------------------------------------------
@requires_torch
def test_caffe_style_in_place_chain_matches_torch():
    # conv -> dropout, scale, relu (each in place) -> fc -> softmax loss. The gradients of
    # Dropout (the mask) and Scale (nothing) read no overwritten value; Relu's reads its output.
    rng = np.random.default_rng(3)
    feeds = {"data": rng.standard_normal((4, 2, 6, 6)),
             "w": rng.standard_normal((3, 2, 3, 3)) * 0.4, "b": rng.standard_normal(3) * 0.1,
             "fw": rng.standard_normal((5, 12)) * 0.2, "fb": rng.standard_normal(5) * 0.1}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    feeds["label"] = rng.integers(0, 5, 4).astype(np.int32)
    net = netrun.NetDef("chain", [
        netrun.op("Conv", ["data", "w", "b"], ["conv"], kernel=3, stride=2),
        netrun.op("Dropout", ["conv"], ["conv", "mask"], ratio=0.3),
        netrun.op("Scale", ["conv"], ["conv"], scale=-1.5),
        netrun.op("Relu", ["conv"], ["conv"]),
        netrun.op("FC", ["conv", "fw", "fb"], ["fc"]),
        netrun.op("SoftmaxWithLoss", ["fc", "label"], ["prob", "loss"]),
    ])
    ws, grads = run_with_gradients(net, feeds, seed=5)
    assert set(grads) >= {"data", "w", "b", "fw", "fb"} and "label" not in grads
    mask = torch.tensor(ws.fetch_blob("mask"))
    assert 0 < mask.float().mean() < 1

    def fn(data, w, b, fw, fb, label):
        h = F.conv2d(data, w, b, stride=2) * mask / 0.7   # the mask netrun drew
        h = torch.relu(-1.5 * h)
        return F.cross_entropy(F.linear(h.flatten(1), fw, fb), label.long())

    loss, ref = torch_grads(fn, feeds, ["data", "w", "b", "fw", "fb"])
    assert_close32(ws.fetch_blob("loss"), loss, "loss")
    for name, g in ref.items():
        assert_close32(ws.fetch_blob(grads[name]), g, f"d{name}")


def test_in_place_op_over_a_value_a_gradient_needs_is_refused_by_name():
    # Caffe writes relu -> dropout both in place; Relu's gradient would read the dropped-out
    # values, so the builder refuses rather than compute with them.
    net = netrun.NetDef("n", [netrun.op("Relu", ["fc6"], ["fc6"], name="relu6"),
                              netrun.op("Dropout", ["fc6"], ["fc6", "mask"], name="drop6"),
                              netrun.op("AveragedLoss", ["fc6"], ["loss"])])
    with pytest.raises(netrun.NetrunError, match="'relu6'.*reads 'fc6'"):
        netrun.add_gradient_ops(net, ["loss"])


# A small convnet with Concat and Add branches ------------------------------------------------
def convnet(classes: int) -> netrun.NetDef:
    """conv -> relu (in place) -> maxpool -> [conv3x3 | conv1x1] concat -> spatialbn -> relu (in
    place) -> + conv1x1 skip -> avgpool -> fc -> softmax loss. pool1 feeds three convs."""
    return netrun.NetDef("convnet", [
        netrun.op("Conv", ["data", "w1", "b1"], ["conv1"], kernel=3, pad=1),
        netrun.op("Relu", ["conv1"], ["conv1"]),
        netrun.op("MaxPool", ["conv1"], ["pool1"], kernel=2, stride=2),
        netrun.op("Conv", ["pool1", "w2a", "b2a"], ["c2a"], kernel=3, pad=1),
        netrun.op("Conv", ["pool1", "w2b", "b2b"], ["c2b"], kernel=1),
        netrun.op("Concat", ["c2a", "c2b"], ["cat", "cat_info"], axis=1),
        netrun.op("SpatialBN", ["cat", "bn_s", "bn_b", "bn_rm", "bn_rv"],
                  ["bn", "bn_rm", "bn_rv", "bn_mean", "bn_inv_std"], epsilon=1e-5, momentum=0.9),
        netrun.op("Relu", ["bn"], ["bn"]),
        netrun.op("Conv", ["pool1", "w_skip"], ["skip"], kernel=1),
        netrun.op("Add", ["bn", "skip"], ["res"]),
        netrun.op("AveragePool", ["res"], ["pool2"], kernel=2, stride=2),
        netrun.op("FC", ["pool2", "wf", "bf"], ["fc"]),
        netrun.op("SoftmaxWithLoss", ["fc", "label"], ["prob", "loss"]),
    ])


PARAMS = ["w1", "b1", "w2a", "b2a", "w2b", "b2b", "bn_s", "bn_b", "w_skip", "wf", "bf"]


def convnet_feeds(seed: int, n: int, c: int, side: int, c1: int, c2: int, classes: int,
                  dtype) -> dict:
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.5):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    feeds = {"data": w(n, c, side, side, scale=1.0),
             "w1": w(c1, c, 3, 3), "b1": w(c1, scale=0.1),
             "w2a": w(c2, c1, 3, 3), "b2a": w(c2, scale=0.1),
             "w2b": w(c2, c1, 1, 1), "b2b": w(c2, scale=0.1),
             "bn_s": (1 + w(2 * c2, scale=0.2)), "bn_b": w(2 * c2, scale=0.1),
             "bn_rm": w(2 * c2, scale=0.1), "bn_rv": (1 + np.abs(w(2 * c2, scale=0.2))),
             "w_skip": w(2 * c2, c1, 1, 1),
             "wf": w(classes, 2 * c2 * (side // 4) ** 2), "bf": w(classes, scale=0.1),
             "label": rng.integers(0, classes, n).astype(np.int32)}
    return feeds


def torch_convnet(data, w1, b1, w2a, b2a, w2b, b2b, bn_s, bn_b, bn_rm, bn_rv, w_skip, wf, bf,
                  label):
    h = torch.relu(F.conv2d(data, w1, b1, padding=1))
    p = F.max_pool2d(h, 2, 2)
    cat = torch.cat([F.conv2d(p, w2a, b2a, padding=1), F.conv2d(p, w2b, b2b)], 1)
    # torch's momentum weighs the batch: torch 0.1 is Caffe2's 0.9.
    bn = torch.relu(F.batch_norm(cat, bn_rm, bn_rv, bn_s, bn_b, training=True, momentum=0.1,
                                 eps=1e-5))
    q = F.avg_pool2d(bn + F.conv2d(p, w_skip), 2, 2)
    return F.cross_entropy(F.linear(q.flatten(1), wf, bf), label.long())


@requires_torch
def test_convnet_backward_matches_torch_autograd_float32():
    feeds = convnet_feeds(7, n=4, c=3, side=8, c1=6, c2=4, classes=5, dtype=np.float32)
    rm0, rv0 = feeds["bn_rm"].copy(), feeds["bn_rv"].copy()
    ws, grads = run_with_gradients(convnet(5), feeds)
    assert set(PARAMS) | {"data"} <= set(grads)
    assert not {"label", "bn_rm", "bn_rv"} & set(grads)
    # pool1 feeds three convs: its gradient is accumulated with Sums.
    loss, ref = torch_grads(torch_convnet, {**feeds, "bn_rm": rm0.copy(), "bn_rv": rv0.copy()},
                            PARAMS + ["data"])
    assert ws.fetch_blob("loss").dtype == np.float32
    np.testing.assert_allclose(ws.fetch_blob("loss"), loss, rtol=1e-5)
    for name in PARAMS + ["data"]:
        got = ws.fetch_blob(grads[name])
        assert got.dtype == np.float32 and got.shape == feeds[name].shape, name
        if name in ("b2a", "b2b"):
            # Biases right before batch norm: their gradient is 0 (up to rounding) in both.
            assert np.abs(got).max() < 1e-6 and np.abs(ref[name]).max() < 1e-6, name
            continue
        assert_close32(got, ref[name], f"d{name}")
    # The running stats were updated in place, as torch's are.
    t_rm, t_rv = torch.tensor(rm0), torch.tensor(rv0)
    torch_convnet(**{k: torch.tensor(v) for k, v in feeds.items()
                     if k not in ("bn_rm", "bn_rv")}, bn_rm=t_rm, bn_rv=t_rv)
    assert_close32(ws.fetch_blob("bn_rm"), t_rm.numpy(), "running mean")
    assert_close32(ws.fetch_blob("bn_rv"), t_rv.numpy(), "running var")


def test_tiny_convnet_backward_matches_finite_differences():
    feeds = convnet_feeds(11, n=2, c=2, side=4, c1=2, c2=1, classes=3, dtype=np.float64)
    forward = convnet(3)
    ws, grads = run_with_gradients(forward, feeds)
    eval_ws = netrun.Workspace("cpu")

    def loss_at(values: dict) -> float:
        for k, v in values.items():
            eval_ws.feed_blob(k, v)   # fresh running stats each time: SpatialBN updates them
        eval_ws.run_net_once(forward)
        return float(eval_ws.fetch_blob("loss"))

    eps = 1e-6
    for name in PARAMS + ["data"]:
        x = feeds[name]
        numeric = np.zeros_like(x)
        for i in range(x.size):
            bumped = x.copy()
            bumped.reshape(-1)[i] += eps
            plus = loss_at({**feeds, name: bumped})
            bumped.reshape(-1)[i] -= 2 * eps
            minus = loss_at({**feeds, name: bumped})
            numeric.reshape(-1)[i] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(ws.fetch_blob(grads[name]), numeric, rtol=1e-5, atol=1e-7,
                                   err_msg=f"d{name}")
