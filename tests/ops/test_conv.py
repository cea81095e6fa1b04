"""Conv, ConvTranspose and the conv algorithms: references, finite differences, shapes, errors."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.conv.algorithm import algorithms, applicable_algorithms
from netrun.conv.problem import ConvProblem
from netrun.conv.rules import rule_choice
from netrun.core.operator import Operator
from netrun.core.schema import TensorSpec, get_schema
from netrun.errors import SchemaError, ShapeError
from netrun.kernels import jit
from tests.algos.reference import ref_conv
from tests.opcheck import check_gradient, netrun_forward_backward, run_op, torch_forward_backward
from tests.checks import checks_ops

FEW = settings(max_examples=15, deadline=None)


def _torch():
    return pytest.importorskip("torch", reason="PyTorch is the reference for this comparison")


def assert_close32(actual, expected, what=""):
    """float32 results against a reference: relative 1e-4, absolute relative to the magnitude."""
    scale = max(1.0, float(np.abs(expected).max()) if expected.size else 1.0)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=2e-5 * scale, err_msg=what)


@st.composite
def conv_cases(draw, max_side=6, max_ch=2):
    """Random Conv arguments and matching float inputs (NCHW)."""
    group = draw(st.sampled_from([1, 1, 2, 3]))
    cg, kg, n = (draw(st.integers(1, max_ch)) for _ in range(3))
    kh, kw, sh, sw = (draw(st.integers(1, 3)) for _ in range(4))
    dh, dw = (draw(st.integers(1, 2)) for _ in range(2))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    dkh, dkw = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    h = draw(st.integers(max(1, dkh - pads[0] - pads[2]), max(dkh, max_side)))
    w = draw(st.integers(max(1, dkw - pads[1] - pads[3]), max(dkw, max_side)))
    bias = draw(st.booleans())
    args = dict(kernels=[kh, kw], strides=[sh, sw], dilations=[dh, dw], pads=pads, group=group)
    shapes = dict(X=(n, cg * group, h, w), W=(kg * group, cg, kh, kw))
    if bias:
        shapes["b"] = (kg * group,)
    return args, shapes, draw(st.integers(0, 2**16))


def _inputs(shapes, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}


def _op(type, inputs, **args):
    return netrun.op(type, [k for k in ("X", "W", "b") if k in inputs], ["Y"], **args)


def _geometry_args(args):
    return (tuple(args["strides"]), tuple(args["pads"]), tuple(args["dilations"]), args["group"])


# Conv -------------------------------------------------------------------------------------
@checks_ops("Conv", kind="torch_gradient")
@FEW
@given(conv_cases(max_side=7, max_ch=3))
def test_conv_forward_and_gradient_match_torch_float32(case):
    torch = _torch()
    F = torch.nn.functional
    args, shapes, seed = case
    inputs = _inputs(shapes, seed, np.float32)
    (sh, sw), (pt, pl, pb, pr), dil, group = _geometry_args(args)

    def fn(x, w, b=None):   # torch pads symmetrically only: pad first for [t, l, b, r]
        return F.conv2d(F.pad(x, (pl, pr, pt, pb)), w, b, stride=(sh, sw), dilation=dil,
                        groups=group)

    ys, grads, dy = torch_forward_backward(fn, list(inputs.values()), seed=seed)
    outs, ours = netrun_forward_backward(_op("Conv", inputs, **args), inputs, dy)
    assert_close32(outs[0], ys[0], "Y")
    for name, ref in zip(inputs, grads):
        assert_close32(ours[name], ref, f"d{name}")


@checks_ops("Conv", kind="finite_differences")
@FEW
@given(conv_cases(max_side=5))
def test_conv_gradient_matches_finite_differences(case):
    args, shapes, seed = case
    inputs = _inputs(shapes, seed)
    check_gradient(_op("Conv", inputs, **args), inputs, atol=1e-6, rtol=1e-5)


EDGE_CASES = {
    "1x1 image, 1x1 kernel": (dict(kernel=1), (2, 2, 1, 1), (3, 2, 1, 1)),
    "1x1 image, padded 3x3": (dict(kernel=3, pad=1), (2, 2, 1, 1), (3, 2, 3, 3)),
    "kernel equals input": (dict(kernel_h=4, kernel_w=5), (2, 2, 4, 5), (3, 2, 4, 5)),
    "stride larger than kernel": (dict(kernel=2, stride=3), (1, 2, 7, 8), (2, 2, 2, 2)),
    "depthwise": (dict(kernel=3, pad=1, group=3), (2, 3, 4, 4), (3, 1, 3, 3)),
    "depthwise multiplier 2": (dict(kernel=3, group=3), (1, 3, 4, 5), (6, 1, 3, 3)),
    "batch 1": (dict(kernel=3), (1, 2, 5, 4), (2, 2, 3, 3)),
    "dilation": (dict(kernel=3, dilation=2, pad=1), (2, 1, 7, 6), (2, 1, 3, 3)),
    "asymmetric pads": (dict(kernel=3, pads=[0, 2, 1, 0], stride=2), (2, 2, 5, 5), (2, 2, 3, 3)),
    "1x1 strided": (dict(kernel=1, stride=2), (2, 3, 5, 4), (4, 3, 1, 1)),
    "legacy SAME": (dict(kernel=3, stride=2, legacy_pad="SAME"), (1, 2, 6, 5), (2, 2, 3, 3)),
    "legacy VALID as int": (dict(kernel=2, legacy_pad=1), (1, 2, 4, 3), (2, 2, 2, 2)),
}


@checks_ops("Conv", kind="finite_differences")
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_conv_edge_cases_finite_differences(name, bias, order, device):
    args, x_shape, w_shape = EDGE_CASES[name]
    shapes = dict(X=x_shape, W=w_shape, **({"b": (w_shape[0],)} if bias else {}))
    inputs = _inputs(shapes, 7)
    if order == "NHWC":
        inputs["X"] = np.ascontiguousarray(inputs["X"].transpose(0, 2, 3, 1))
        inputs["W"] = np.ascontiguousarray(inputs["W"].transpose(0, 2, 3, 1))
    check_gradient(_op("Conv", inputs, order=order, **args), inputs, device=device)


@FEW
@given(conv_cases(max_side=6))
def test_conv_nhwc_equals_nchw(case):
    args, shapes, seed = case
    inputs = _inputs(shapes, seed)
    nchw_y, nchw_g = netrun_forward_backward(_op("Conv", inputs, **args), inputs,
                                             _dy_for("Conv", args, inputs, seed))
    to_nhwc = {k: (np.ascontiguousarray(v.transpose(0, 2, 3, 1)) if v.ndim == 4 else v)
               for k, v in inputs.items()}
    dy = np.ascontiguousarray(_dy_for("Conv", args, inputs, seed).transpose(0, 2, 3, 1))
    nhwc_y, nhwc_g = netrun_forward_backward(_op("Conv", inputs, order="NHWC", **args), to_nhwc,
                                             dy)
    np.testing.assert_allclose(nhwc_y[0], nchw_y[0].transpose(0, 2, 3, 1), rtol=1e-12, atol=1e-12)
    for name in inputs:
        back = nhwc_g[name].transpose(0, 3, 1, 2) if nhwc_g[name].ndim == 4 else nhwc_g[name]
        np.testing.assert_allclose(back, nchw_g[name], rtol=1e-12, atol=1e-12, err_msg=name)


def _dy_for(type, args, inputs, seed):
    spec = _infer(_op(type, inputs, **args), inputs)[0]
    return np.random.default_rng(seed + 3).standard_normal(spec.shape)


def _infer(op, inputs):
    schema = get_schema(op.type)
    specs = [TensorSpec(inputs[n].shape, str(inputs[n].dtype)) for n in op.inputs]
    return schema.infer_shapes(op, schema.verify(op), specs)


@FEW
@given(conv_cases(max_side=6))
def test_conv_shape_inference_equals_real_shapes(case):
    args, shapes, seed = case
    inputs = _inputs(shapes, seed)
    op = _op("Conv", inputs, **args)
    (y,) = run_op(op, inputs)
    assert _infer(op, inputs)[0].shape == y.shape
    grad_ops, _ = netrun.gradient_ops(op)
    ws = netrun.Workspace()
    for k, v in {**inputs, "Y_grad": np.ones(y.shape)}.items():
        ws.feed_blob(k, v)
    for g in grad_ops:
        ws.run_operator_once(g)
        blobs = {n: ws.fetch_blob(n) for n in g.inputs}
        inferred = _infer(g, blobs)
        assert [s.shape for s in inferred[:len(g.outputs)]] == \
            [ws.fetch_blob(o).shape for o in g.outputs]


def test_ref_conv_matches_torch():
    """The NumPy reference the algorithm tests use is itself checked against torch."""
    torch = _torch()
    F = torch.nn.functional
    x, w = _inputs(dict(X=(2, 4, 7, 6), W=(6, 2, 3, 2)), 3).values()
    y, grads = ref_conv(x, w, (2, 1), (1, 0, 2, 1), (2, 1), 2)
    dy = np.random.default_rng(0).standard_normal(y.shape)
    tx, tw = (torch.tensor(a, requires_grad=True) for a in (x, w))
    ty = F.conv2d(F.pad(tx, (0, 1, 1, 2)), tw, stride=(2, 1), dilation=(2, 1), groups=2)
    ty.backward(torch.tensor(dy))
    dx, dw = grads(dy)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_conv_first_layer_skips_the_data_gradient():
    net = netrun.NetDef("n", [netrun.op("Conv", ["data", "W", "b"], ["Y"], kernel=3)])
    grads = netrun.add_gradient_ops(net, ["Y"], params=["W", "b"])
    conv_grad = [o for o in net.ops if o.type == "ConvGradient"]
    assert len(conv_grad) == 1 and conv_grad[0].outputs == ("W_grad", "b_grad")
    assert "data" not in grads
    inputs = _inputs(dict(data=(2, 2, 5, 5), W=(3, 2, 3, 3), b=(3,)), 1)
    ws = netrun.Workspace()
    for k, v in {**inputs, "Y_grad": np.ones((2, 3, 3, 3))}.items():
        ws.feed_blob(k, v)
    ws.run_operator_once(conv_grad[0])
    assert not ws.has_blob("data_grad")
    _, ref_grads = ref_conv(inputs["data"], inputs["W"], (1, 1), (0,) * 4, (1, 1), 1)
    np.testing.assert_allclose(ws.fetch_blob("W_grad"), ref_grads(np.ones((2, 3, 3, 3)))[1])
    np.testing.assert_allclose(ws.fetch_blob("b_grad"), np.full(3, 18.0))


def test_conv_without_bias_gradient_op_uses_no_bias():
    ops, grad_of = netrun.gradient_ops(netrun.op("Conv", ["X", "W"], ["Y"], kernel=3))
    assert ops[0].args["no_bias"] == 1 and ops[0].outputs == ("W_grad", "X_grad")
    assert grad_of == {"X": "X_grad", "W": "W_grad"}


def test_conv_cost_inference():
    op = netrun.op("Conv", ["X", "W", "b"], ["Y"], kernel=3, pad=1, group=2)
    specs = [TensorSpec((2, 4, 5, 5)), TensorSpec((6, 2, 3, 3)), TensorSpec((6,))]
    schema = get_schema("Conv")
    args = schema.verify(op)
    outs = schema.infer_shapes(op, args, specs)
    cost = schema.cost(args, specs, outs)
    assert outs[0].shape == (2, 6, 5, 5)
    assert cost.flops == 2 * 2 * 6 * 2 * 9 * 25 + 2 * 6 * 25
    assert cost.bytes_read == 4 * (2 * 4 * 25 + 6 * 2 * 9 + 6)
    assert cost.bytes_written == 4 * 2 * 6 * 25


# ConvTranspose ----------------------------------------------------------------------------
@st.composite
def conv_transpose_cases(draw, max_side=5):
    group = draw(st.sampled_from([1, 1, 2]))
    cg, kg, n = (draw(st.integers(1, 2)) for _ in range(3))
    kh, kw, sh, sw = (draw(st.integers(1, 3)) for _ in range(4))
    dh, dw = (draw(st.integers(1, 2)) for _ in range(2))
    ah, aw = draw(st.integers(0, sh - 1)), draw(st.integers(0, sw - 1))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    dkh, dkw = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    # smallest input whose output (in-1)·s + dk + adj - pads is at least 1
    min_h = max(1, 1 - (dkh + ah - pads[0] - pads[2] - 1) // sh)
    min_w = max(1, 1 - (dkw + aw - pads[1] - pads[3] - 1) // sw)
    h = draw(st.integers(min_h, max(min_h, max_side)))
    w = draw(st.integers(min_w, max(min_w, max_side)))
    bias = draw(st.booleans())
    args = dict(kernels=[kh, kw], strides=[sh, sw], dilations=[dh, dw], pads=pads, group=group,
                adjs=[ah, aw])
    shapes = dict(X=(n, cg * group, h, w), W=(cg * group, kg, kh, kw))
    if bias:
        shapes["b"] = (kg * group,)
    return args, shapes, draw(st.integers(0, 2**16))


@checks_ops("ConvTranspose", kind="torch_gradient")
@FEW
@given(conv_transpose_cases())
def test_conv_transpose_matches_torch_float32(case):
    torch = _torch()
    F = torch.nn.functional
    args, shapes, seed = case
    inputs = _inputs(shapes, seed, np.float32)
    (sh, sw), (pt, pl, pb, pr), dil, group = _geometry_args(args)
    ah, aw = args["adjs"]
    (oh, ow, *_), = [s.shape[2:] for s in _infer(_op("ConvTranspose", inputs, **args), inputs)]

    def fn(x, w, b=None):   # full transposed conv, then adj zero rows, then crop the pads
        y = F.conv_transpose2d(x, w, None, stride=(sh, sw), groups=group, dilation=dil)
        y = F.pad(y, (0, aw, 0, ah))[:, :, pt:pt + oh, pl:pl + ow]
        return y if b is None else y + b.reshape(1, -1, 1, 1)

    ys, grads, dy = torch_forward_backward(fn, list(inputs.values()), seed=seed)
    outs, ours = netrun_forward_backward(_op("ConvTranspose", inputs, **args), inputs, dy)
    assert_close32(outs[0], ys[0], "Y")
    for name, ref in zip(inputs, grads):
        assert_close32(ours[name], ref, f"d{name}")


def test_conv_transpose_adj_is_torch_output_padding():
    torch = _torch()
    x, w, b = _inputs(dict(X=(2, 4, 3, 4), W=(4, 3, 3, 3), b=(6,)), 5, np.float32).values()
    op = netrun.op("ConvTranspose", ["X", "W", "b"], ["Y"], kernel=3, stride=2, pad=1, adj=1,
                   group=2)
    (y,) = run_op(op, {"X": x, "W": w, "b": b})
    ref = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(w), torch.tensor(b),
                                               stride=2, padding=1, output_padding=1, groups=2)
    assert y.shape == (2, 6, 6, 8)
    assert_close32(y, ref.numpy())


@checks_ops("ConvTranspose", kind="finite_differences")
@FEW
@given(conv_transpose_cases(max_side=4))
def test_conv_transpose_gradient_matches_finite_differences(case):
    args, shapes, seed = case
    inputs = _inputs(shapes, seed)
    check_gradient(_op("ConvTranspose", inputs, **args), inputs)


@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose_nhwc_finite_differences(bias, device):
    shapes = dict(X=(2, 3, 3, 4), W=(4, 3, 3, 2), **({"b": (4,)} if bias else {}))  # NHWC
    inputs = _inputs(shapes, 11)
    op = _op("ConvTranspose", inputs, kernel_h=3, kernel_w=3, stride=2, pads=[1, 0, 0, 1],
             group=2, adj=1, order="NHWC")
    check_gradient(op, inputs, device=device)


def test_conv_transpose_shape_inference():
    inputs = _inputs(dict(X=(1, 2, 3, 3), W=(2, 3, 3, 3), b=(3,)), 0)
    op = netrun.op("ConvTranspose", ["X", "W", "b"], ["Y"], kernel=3, stride=2, pads=[1, 0, 2, 1],
                   adj=1)
    (y,) = run_op(op, inputs)
    # (3-1)·2 + 3 + 1 - pads: height 8 - 3 = 5, width 8 - 1 = 7
    assert y.shape == _infer(op, inputs)[0].shape == (1, 3, 5, 7)


# Algorithm selection by the op (the algorithms themselves: tests/algos) -------------------
def heuristic_choice(p: ConvProblem):
    """The rules' pick among every applicable CPU algorithm."""
    return rule_choice(p, applicable_algorithms(p))


def test_heuristic_and_applicability(monkeypatch):
    monkeypatch.setenv("NETRUN_ONEDNN", "off")   # NumPy's rules (oneDNN's: tests/algos/test_onednn.py)
    one = ConvProblem(2, 4, 5, 5, 8, 1, 1, 2, 2)
    three = ConvProblem(2, 4, 5, 5, 8, 3, 3, pt=1, pl=1, pb=1, pr=1)
    # C·kw = 48 >= 32, and 2·24·24 output pixels >= SHIFT_MIN_PIXELS
    wide = ConvProblem(2, 16, 24, 24, 8, 3, 3, pt=1, pl=1, pb=1, pr=1)
    strided = ConvProblem(2, 4, 5, 5, 8, 3, 3, 2, 2)
    depthwise = ConvProblem(2, 4, 5, 5, 8, 3, 3, group=4)
    assert heuristic_choice(one).name == "gemm_1x1"
    assert heuristic_choice(three).name == "im2col_gemm"    # C·kw = 12: too thin for shift
    assert heuristic_choice(wide).name == "shift_gemm"
    assert heuristic_choice(strided).name == "im2col_gemm"
    assert heuristic_choice(depthwise).name == ("depthwise_jit" if jit.available()
                                                else "depthwise")
    assert [a.name for a in applicable_algorithms(strided)] == ["im2col_gemm"]
    assert {a.name for a in applicable_algorithms(one)} == {"im2col_gemm", "gemm_1x1"}
    compiled = {"winograd_jit"} if jit.available() else set()
    assert {a.name for a in applicable_algorithms(three)} == {
        "im2col_gemm", "shift_gemm", "fft", "dft_gemm", "winograd_f2x2", "winograd_f4x4"} | compiled
    # a 3×3 layer with enough channels and 4×4 tiles runs compiled Winograd (dilated too: the
    # benchmark's shape f) ...
    for p in (ConvProblem(32, 64, 56, 56, 64, 3, 3, pt=1, pl=1, pb=1, pr=1),
              ConvProblem(16, 256, 14, 14, 256, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2)):
        assert heuristic_choice(p).name == ("winograd_jit" if jit.available() else "shift_gemm")
    # ... but not a batch-1 7×7 one of 512 channels (4 tiles: streaming the filter spectrum
    # costs more than the multiplications saved) nor thin layers
    # (and 49 output pixels are too few for shifted rows: one im2col GEMM)
    assert heuristic_choice(ConvProblem(1, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 1, 1)).name \
        == "im2col_gemm"
    assert heuristic_choice(replace(wide, h=8, w=8)).name == "im2col_gemm"
    assert heuristic_choice(ConvProblem(32, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1)).name \
        == "shift_gemm"
    # 5×5 on small images: the Fourier form needs a quarter of the flops (CIFAR's conv2) ...
    assert heuristic_choice(ConvProblem(100, 32, 16, 16, 32, 5, 5, 1, 1, 2, 2, 2, 2)).name \
        == "dft_gemm"
    # ... but not with 3 input channels, where the inverse transforms dominate (its conv1)
    assert heuristic_choice(ConvProblem(100, 3, 32, 32, 32, 5, 5, 1, 1, 2, 2, 2, 2)).name \
        == "im2col_gemm"
    assert all(a.deterministic for a in algorithms("cpu").values())


def test_op_remembers_its_algorithm_per_shape(monkeypatch):
    from netrun.ops import conv as conv_ops

    calls = []   # the op's own choices: those that may time on its buffers (a run is given)
    real = conv_ops.choose

    def spy(state, p, d, backend, fixed="", run=None):
        if run is not None:
            calls.append((p, d))
        return real(state, p, d, backend, fixed, run)

    monkeypatch.setattr(conv_ops, "choose", spy)
    ws = netrun.Workspace()
    rng = np.random.default_rng(0)
    ws.feed_blob("X", rng.standard_normal((2, 4, 5, 5)).astype(np.float32))
    ws.feed_blob("W", rng.standard_normal((3, 4, 1, 1)).astype(np.float32))
    op = Operator(netrun.op("Conv", ["X", "W"], ["Y"], kernel=1), ws)
    op.run()
    op.run()
    assert len(calls) == 1 and op.ctx.state["algo"] == "gemm_1x1"
    plan = op.ctx.state["plan"]
    assert plan.problem == calls[0][0] and plan.algos == {"forward": algorithms("cpu")["gemm_1x1"]}
    ws.feed_blob("X", rng.standard_normal((3, 4, 6, 5)).astype(np.float32))
    op.run()
    assert len(calls) == 2 and ws.fetch_blob("Y").shape == (3, 3, 6, 5)
    assert calls[1] == (op.ctx.state["plan"].problem, "forward") and calls[1][0].n == 3


def test_fixed_algorithm_is_used_and_agrees():
    inputs = _inputs(dict(X=(2, 4, 5, 5), W=(3, 4, 1, 1)), 2)
    ws = netrun.Workspace()
    for k, v in inputs.items():
        ws.feed_blob(k, v)
    results = {}
    for algo in ("", "im2col_gemm", "gemm_1x1"):
        op = Operator(netrun.op("Conv", ["X", "W"], ["Y"], kernel=1, stride=2, algo=algo), ws)
        op.run()
        results[op.ctx.state["algo"] + ("(auto)" if not algo else "")] = ws.fetch_blob("Y")
    assert set(results) == {"gemm_1x1(auto)", "im2col_gemm", "gemm_1x1"}
    np.testing.assert_allclose(results["im2col_gemm"], results["gemm_1x1"], rtol=1e-12)


def test_inapplicable_algorithm_fails_at_run_time():
    inputs = _inputs(dict(X=(1, 2, 5, 5), W=(3, 2, 3, 3)), 0)
    with pytest.raises(ShapeError, match=r"'gemm_1x1' cannot run .*applicable: im2col_gemm"):
        run_op(netrun.op("Conv", ["X", "W"], ["Y"], kernel=3, algo="gemm_1x1", name="c1"), inputs)


# Errors -----------------------------------------------------------------------------------
BAD_ARGS = [
    ("Conv", dict(kernel=0), "argument 'kernel' must be at least 1"),
    ("Conv", dict(kernel=3, pads=[1, 1, 1]), "argument 'pads' needs 4 values"),
    ("Conv", dict(kernel=3, algo="im2col"), "unknown algorithm, did you mean 'im2col_gemm'"),
    ("Conv", dict(), "missing argument 'kernel'"),
    ("Conv", dict(kernel=3, kernel_h=3), "'kernel' and 'kernel_h/_w' both"),
    ("Conv", dict(kernel_h=3), "missing argument 'kernel_w'"),
    ("Conv", dict(kernels=[3, 3, 3]), "argument 'kernels' needs 2 values"),
    ("Conv", dict(kernel=3, stride=0), "argument 'stride' must be at least 1"),
    ("Conv", dict(kernel=3, dilations=[1, 0]), "argument 'dilations' must be at least 1"),
    ("Conv", dict(kernel=3, pad_t=-1, pad_l=0, pad_b=0, pad_r=0), "argument 'pad_t' must not be"),
    ("Conv", dict(kernel=3, pad_t=1), "missing argument 'pad_l'"),
    ("Conv", dict(kernel=3, pad=1, pads=[1, 1, 1, 1]), "'pad' and 'pads' both"),
    ("Conv", dict(kernel=3, legacy_pad="SAMEISH"), "argument 'legacy_pad'"),
    ("Conv", dict(kernel=3, legacy_pad=3), "CAFFE_LEGACY_POOLING, which is for pooling"),
    ("Conv", dict(kernel=3, legacy_pad="SAME", pad=1), "'pad' conflicts with legacy_pad=SAME"),
    ("Conv", dict(kernel=3, group=0), "argument 'group' must be at least 1"),
    ("Conv", dict(kernel=3, order="CHWN"), "argument 'order'"),
    ("ConvTranspose", dict(kernel=3, stride=2, adj=2), "argument 'adj' must be smaller"),
    ("ConvTranspose", dict(kernel=3, algo="gemm"), "argument 'algo'"),
]


@pytest.mark.parametrize("type,args,message", BAD_ARGS)
def test_bad_arguments_fail_at_build_time(type, args, message):
    op = netrun.op(type, ["X", "W"], ["Y"], name="conv1", **args)
    ws = netrun.Workspace()
    with pytest.raises(SchemaError) as e:
        ws.create_net(netrun.NetDef("n", [op]))   # build only: no blob exists
    assert "'conv1' (" + type + ")" in str(e.value)
    assert message in str(e.value)


def test_gradient_output_count_is_checked():
    op = netrun.op("ConvGradient", ["X", "W", "dY"], ["dW"], kernel=3, name="g")
    with pytest.raises(SchemaError, match="no_bias=0 the outputs are dW, db"):
        get_schema("ConvGradient").verify(op)
    get_schema("ConvGradient").verify(op.with_(args={"kernel": 3, "no_bias": 1}))


def test_shape_errors_name_the_blobs_and_shapes():
    inputs = _inputs(dict(X=(2, 3, 5, 5), W=(4, 2, 3, 3)), 0)
    with pytest.raises(ShapeError, match=r"3 channels but W expects 2.* X 2×3×5×5, W 4×2×3×3"):
        run_op(netrun.op("Conv", ["X", "W"], ["Y"], kernel=3), inputs)
    with pytest.raises(ShapeError, match=r"W has a 3×3 kernel but the op's kernel argument is 2"):
        run_op(netrun.op("Conv", ["X", "W"], ["Y"], kernel=2), inputs)
    small = _inputs(dict(X=(1, 2, 2, 2), W=(4, 2, 3, 3)), 0)
    with pytest.raises(ShapeError, match=r"X 1×2×2×2 is 2×2 .* smaller than the 3×3"):
        run_op(netrun.op("Conv", ["X", "W"], ["Y"], kernel=3), small)


@pytest.mark.parametrize("mode", ["VALID", "SAME", 1, 2])
def test_conv_transpose_legacy_pad_means_no_padding(mode):
    inputs = _inputs(dict(X=(1, 2, 3, 4), W=(2, 3, 3, 3)), 0)
    legacy = netrun.op("ConvTranspose", ["X", "W"], ["Y"], kernel=3, stride=2, legacy_pad=mode)
    plain = netrun.op("ConvTranspose", ["X", "W"], ["Y"], kernel=3, stride=2)
    (y,) = run_op(legacy, inputs)
    assert y.shape == (1, 3, 7, 9)   # Caffe2 (conv_transpose_unpool_op_base.h): pads 0
    np.testing.assert_array_equal(y, run_op(plain, inputs)[0])
