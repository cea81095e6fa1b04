"""CPU and GPU agree, op by op: forward outputs and, through the gradient ops, input gradients.

Runs on every GPU backend the `gpu` fixture offers: the host emulator (always, with g++) and
a real CUDA device when there is one. GPU-specific kernels (conv algorithms, pooling, LRN,
SpatialBN, the label readers, updates) and the shared array-module kernels running on CuPy
are both covered. float32 comparisons allow float32 rounding (sums in another order, a
different pow); float64 ones are tight.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from tests.opcheck import check_gradient, netrun_forward_backward, run_op

FEW = settings(max_examples=12, deadline=None)


def _x(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _close(got, want, what: str, rtol=2e-5) -> None:
    want = np.asarray(want)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=what)


def agree(op, inputs, grad: bool = True, rtol: float = 2e-5, seed: int = 0) -> None:
    """Outputs (and gradients when `grad`) of op on CPU and GPU match."""
    cpu = run_op(op, inputs, "cpu", seed)
    gpu = run_op(op, inputs, "gpu", seed)
    for name, c, g in zip(op.outputs, cpu, gpu):
        assert g.shape == c.shape and g.dtype == c.dtype, f"{op.type} output {name}"
        _close(g, c, f"{op.type} output {name}", rtol)
    if not grad:
        return
    grad_out = np.random.default_rng(seed + 7).standard_normal(cpu[0].shape).astype(cpu[0].dtype)
    _, cg = netrun_forward_backward(op, inputs, grad_out, "cpu", seed)
    _, gg = netrun_forward_backward(op, inputs, grad_out, "gpu", seed)
    assert cg.keys() == gg.keys()
    for name in cg:
        if cg[name] is not None:
            _close(gg[name], cg[name], f"{op.type} gradient of {name}", rtol)


# Convolution ----------------------------------------------------------------------------------
CONV = {
    "3x3 pad 1": ((2, 3, 7, 6), (4, 3, 3, 3), dict(kernel=3, pad=1)),
    "5x5 stride 2 no bias": ((2, 3, 9, 9), (4, 3, 5, 5), dict(kernel=5, stride=2, pad=2)),
    "dilation 2": ((1, 2, 9, 8), (3, 2, 3, 3), dict(kernel=3, dilation=2, pad=1)),
    "group 2": ((2, 4, 6, 6), (6, 2, 3, 3), dict(kernel=3, group=2, pad=1)),
    "depthwise x2 stride 2": ((2, 4, 7, 7), (8, 1, 3, 3), dict(kernel=3, group=4, stride=2, pad=1)),
    "1x1 stride 2": ((2, 5, 6, 6), (3, 5, 1, 1), dict(kernel=1, stride=2)),
    "asymmetric pads": ((1, 2, 6, 5), (3, 2, 3, 2), dict(kernel_h=3, kernel_w=2,
                                                        pads=[1, 0, 2, 1])),
    "rectangular strides": ((2, 2, 8, 9), (3, 2, 2, 3), dict(kernel_h=2, kernel_w=3,
                                                            stride_h=2, stride_w=1)),
}


@pytest.mark.parametrize("name", sorted(CONV))
def test_conv(gpu, name):
    xs, ws, args = CONV[name]
    bias = "no bias" not in name
    inputs = {"X": _x(*xs), "W": _x(*ws, seed=1)}
    if bias:
        inputs["b"] = _x(ws[0], seed=2)
    op = netrun.op("Conv", list(inputs), ["Y"], **args)
    agree(op, inputs)


def test_conv_nhwc_and_float64(gpu):
    x, w, b = _x(2, 6, 5, 3), _x(4, 3, 3, 3, seed=1), _x(4, seed=2)
    agree(netrun.op("Conv", ["X", "W", "b"], ["Y"], kernel=3, pad=1, order="NHWC"),
          {"X": x, "W": w, "b": b})
    agree(netrun.op("Conv", ["X", "W", "b"], ["Y"], kernel=3, pad=1),
          {"X": _x(2, 3, 5, 5, dtype=np.float64), "W": _x(4, 3, 3, 3, seed=1, dtype=np.float64),
           "b": _x(4, seed=2, dtype=np.float64)}, rtol=1e-12)


def test_conv_transpose(gpu):
    inputs = {"X": _x(2, 4, 4, 5), "W": _x(4, 3, 3, 3, seed=1), "b": _x(3, seed=2)}
    agree(netrun.op("ConvTranspose", ["X", "W", "b"], ["Y"], kernel=3, stride=2, pad=1, adj=1),
          inputs)


@FEW
@given(n=st.integers(1, 3), c=st.integers(1, 4), k=st.integers(1, 4), h=st.integers(3, 8),
       w=st.integers(3, 8), kernel=st.integers(1, 3), stride=st.integers(1, 2),
       pad=st.integers(0, 1), dilation=st.integers(1, 2))
def test_conv_random_geometry(gpu, n, c, k, h, w, kernel, stride, pad, dilation):
    if h + 2 * pad < dilation * (kernel - 1) + 1 or w + 2 * pad < dilation * (kernel - 1) + 1:
        return
    inputs = {"X": _x(n, c, h, w), "W": _x(k, c, kernel, kernel, seed=1), "b": _x(k, seed=2)}
    agree(netrun.op("Conv", ["X", "W", "b"], ["Y"], kernel=kernel, stride=stride, pad=pad,
                    dilation=dilation), inputs)


def test_conv_gradient_finite_differences_on_gpu(gpu):
    x = _x(1, 2, 5, 4, dtype=np.float64)
    w = _x(3, 2, 3, 2, seed=1, dtype=np.float64)
    check_gradient(netrun.op("Conv", ["X", "W", "b"], ["Y"], kernel_h=3, kernel_w=2, pad=1,
                             stride=2),
                   {"X": x, "W": w, "b": _x(3, seed=2, dtype=np.float64)}, device="gpu")


# Pooling --------------------------------------------------------------------------------------
POOL = {
    "max 2x2 s2": ("MaxPool", (2, 3, 6, 6), dict(kernel=2, stride=2)),
    "max 3x3 s2 pad 1": ("MaxPool", (2, 3, 7, 6), dict(kernel=3, stride=2, pad=1)),
    "max ceil mode": ("MaxPool", (2, 2, 8, 7), dict(kernel=3, stride=2, legacy_pad=3)),
    "max nhwc": ("MaxPool", (2, 5, 6, 3), dict(kernel=3, stride=2, pad=1, order="NHWC")),
    "max global": ("MaxPool", (2, 3, 5, 4), dict(global_pooling=1)),
    "avg 3x3 s2 pad 1": ("AveragePool", (2, 3, 7, 7), dict(kernel=3, stride=2, pad=1)),
    "avg exclude pad": ("AveragePool", (2, 3, 6, 7), dict(kernel=3, stride=2, pad=1,
                                                          count_include_pad=0)),
    "avg ceil mode": ("AveragePool", (2, 2, 8, 7), dict(kernel=3, stride=2, pad=1,
                                                        legacy_pad=3)),
    "avg nhwc": ("AveragePool", (2, 5, 6, 3), dict(kernel=2, stride=1, order="NHWC")),
    "avg global": ("AveragePool", (2, 3, 5, 4), dict(global_pooling=1)),
}


@pytest.mark.parametrize("name", sorted(POOL))
def test_pool(gpu, name):
    type_, shape, args = POOL[name]
    agree(netrun.op(type_, ["X"], ["Y"], **args), {"X": _x(*shape)})


def test_max_pool_ties_go_to_the_first_tap(gpu):
    # Integer values: many windows hold their maximum twice; Caffe routes to the first.
    x = np.random.default_rng(3).integers(0, 3, (2, 2, 7, 7)).astype(np.float32)
    for args in (dict(kernel=3, stride=2, pad=1), dict(kernel=2, stride=1)):
        agree(netrun.op("MaxPool", ["X"], ["Y"], **args), {"X": x})


def test_max_pool_nan_gives_nan_and_no_gradient(gpu):
    # A NaN maximum equals no tap, so its window routes nothing (the CPU's general path; its
    # tiled 2×2/s2 fast path routes such a window to its first tap instead).
    x = _x(1, 1, 5, 5)
    x[0, 0, 1, 1] = np.nan
    op = netrun.op("MaxPool", ["X"], ["Y"], kernel=3, stride=2, pad=1)
    cpu, gpu_out = run_op(op, {"X": x}, "cpu"), run_op(op, {"X": x}, "gpu")
    np.testing.assert_array_equal(np.isnan(gpu_out[0]), np.isnan(cpu[0]))
    g = np.ones(cpu[0].shape, np.float32)
    _, cg = netrun_forward_backward(op, {"X": x}, g, "cpu")
    _, gg = netrun_forward_backward(op, {"X": x}, g, "gpu")
    np.testing.assert_array_equal(gg["X"], cg["X"])
    assert gg["X"].sum() == np.isfinite(gpu_out[0]).sum()


def test_pool_gradient_finite_differences_on_gpu(gpu):
    x = np.random.default_rng(4).permutation(60).reshape(1, 3, 4, 5).astype(np.float64) / 7
    for type_ in ("MaxPool", "AveragePool"):
        check_gradient(netrun.op(type_, ["X"], ["Y"], kernel=3, stride=2, pad=1), {"X": x},
                       device="gpu")


# Normalization --------------------------------------------------------------------------------
LRN = {
    "across": ((2, 7, 4, 3), dict(size=5, alpha=0.5, beta=0.75, bias=2.0)),
    "within": ((2, 3, 5, 6), dict(size=3, alpha=0.4, beta=0.75,
                                  norm_region="WITHIN_CHANNEL")),
    "across nhwc": ((2, 4, 3, 6), dict(size=3, alpha=0.3, order="NHWC")),
    "within nhwc": ((1, 5, 4, 3), dict(size=3, norm_region="WITHIN_CHANNEL", order="NHWC")),
    "3-d fallback": ((3, 6, 5), dict(size=3, alpha=0.2)),
}


@pytest.mark.parametrize("name", sorted(LRN))
@pytest.mark.parametrize("keep_scale", [True, False])
def test_lrn(gpu, name, keep_scale):
    shape, args = LRN[name]
    outs = ["Y", "scale"] if keep_scale else ["Y"]
    agree(netrun.op("LRN", ["X"], outs, **args), {"X": _x(*shape)}, rtol=1e-5)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_spatial_bn_training(gpu, order):
    shape = (4, 3, 5, 2) if order == "NCHW" else (4, 5, 2, 3)
    c = shape[1] if order == "NCHW" else shape[3]
    inputs = {"X": _x(*shape) * 3 + 1, "s": _x(c, seed=1), "b": _x(c, seed=2),
              "rm": _x(c, seed=3), "rv": np.abs(_x(c, seed=4)) + 0.5}
    op = netrun.op("SpatialBN", ["X", "s", "b", "rm", "rv"], ["Y", "rm", "rv", "sm", "si"],
                   order=order, momentum=0.8, epsilon=1e-3)
    agree(op, inputs, rtol=1e-4)


def test_spatial_bn_inference_and_float64_gradient(gpu):
    inputs = {"X": _x(3, 4, 2, 3), "s": _x(4, seed=1), "b": _x(4, seed=2), "rm": _x(4, seed=3),
              "rv": np.abs(_x(4, seed=4)) + 0.5}
    agree(netrun.op("SpatialBN", ["X", "s", "b", "rm", "rv"], ["Y"], is_test=1), inputs)
    f64 = {k: v.astype(np.float64) for k, v in inputs.items()}
    check_gradient(netrun.op("SpatialBN", ["X", "s", "b", "rm", "rv"],
                             ["Y", "rm", "rv", "sm", "si"]), f64, check=["X", "s", "b"],
                   outputs=[0], device="gpu", atol=1e-5, rtol=1e-4)


# Labels: softmax loss, cross entropy, accuracy ------------------------------------------------
def _labels(n, d, seed=5, dtype=np.int32):
    return np.random.default_rng(seed).integers(0, d, n).astype(dtype)


@pytest.mark.parametrize("case", ["plain", "weights", "ignore", "float labels", "scale 4d"])
def test_softmax_with_loss(gpu, case):
    x, lab = _x(6, 10), _labels(6, 10)
    ins, args = ["X", "L"], {}
    inputs = {"X": x, "L": lab}
    if case == "weights":
        inputs["W"] = np.abs(_x(6, seed=9))
        ins.append("W")
    elif case == "ignore":
        lab[[1, 4]] = 3
        args["ignore_label"] = 3
    elif case == "float labels":
        inputs["L"] = lab.astype(np.float32)
    elif case == "scale 4d":
        inputs["X"] = _x(6, 2, 2, 3)
        inputs["L"] = _labels(6, 12, dtype=np.int64)
        args["scale"] = 2.5
    op = netrun.op("SoftmaxWithLoss", ins, ["P", "loss"], **args)
    agree(op, inputs, rtol=1e-5)


def test_softmax_with_loss_all_ignored_is_zero(gpu):
    op = netrun.op("SoftmaxWithLoss", ["X", "L"], ["P", "loss"], ignore_label=2)
    inputs = {"X": _x(3, 4), "L": np.full(3, 2, np.int32)}
    assert run_op(op, inputs, "gpu")[1] == 0.0
    agree(op, inputs)


def test_label_cross_entropy_and_accuracy(gpu):
    p = np.abs(_x(5, 7)) + 1e-3
    p /= p.sum(axis=1, keepdims=True)
    p[2, :] = 0.0                                   # clamped at 1e-20 before the log
    lab = _labels(5, 7, dtype=np.int64)
    agree(netrun.op("LabelCrossEntropy", ["P", "L"], ["Y"]), {"P": p, "L": lab}, rtol=1e-5)
    x = np.round(_x(8, 6), 1)                       # ties: Caffe counts them as hits
    for args in (dict(), dict(top_k=3), dict(ignore_label=1)):
        agree(netrun.op("Accuracy", ["X", "L"], ["acc"], **args),
              {"X": x, "L": _labels(8, 6)}, grad=False)


def test_bad_label_is_reported_at_the_next_fetch(gpu):
    ws = netrun.Workspace("gpu")
    ws.feed_blob("X", _x(3, 4))
    ws.feed_blob("L", np.array([0, 7, 1], np.int32))
    ws.run_operator_once(netrun.op("SoftmaxWithLoss", ["X", "L"], ["P", "loss"]))
    with pytest.raises(netrun.NetrunError, match=r"label 7 is outside \[0, 4\)"):
        ws.fetch_blob("loss")
    # reported once: the flag is cleared, and a good batch runs normally
    ws.feed_blob("L", np.array([0, 3, 1], np.int32))
    ws.run_operator_once(netrun.op("SoftmaxWithLoss", ["X", "L"], ["P", "loss"]))
    assert np.isfinite(ws.fetch_blob("loss"))


# Updates --------------------------------------------------------------------------------------
def _update_case(type_, seed=0, **args):
    n = 37
    r = np.random.default_rng(seed)

    def v(*shape):
        return r.standard_normal(shape).astype(np.float32)

    lr, it = np.array([-0.05], np.float32), np.array([6], np.int64)
    if type_ == "MomentumSGDUpdate":
        return netrun.op(type_, ["g", "m", "lr", "p"], ["g", "m", "p"], **args), \
            {"g": v(n), "m": v(n), "lr": lr, "p": v(n)}
    if type_ == "Adam":
        return netrun.op(type_, ["p", "m1", "m2", "g", "lr", "it"], ["p", "m1", "m2"], **args), \
            {"p": v(n), "m1": v(n), "m2": np.abs(v(n)), "g": v(n), "lr": lr, "it": it}
    if type_ == "Adagrad":
        return netrun.op(type_, ["p", "h", "g", "lr"], ["p", "h"], **args), \
            {"p": v(n), "h": np.abs(v(n)), "g": v(n), "lr": lr}
    if type_ == "RmsProp":
        return netrun.op(type_, ["g", "ms", "mom", "lr", "p"], ["g", "ms", "mom", "p"],
                         **args), {"g": v(n), "ms": np.abs(v(n)), "mom": v(n), "lr": lr,
                                   "p": v(n)}
    return netrun.op("WeightedSum", ["x0", "w0", "x1", "w1"], ["x0"]), \
        {"x0": v(n), "w0": np.ones(1, np.float32), "x1": v(n), "w1": lr}


@pytest.mark.parametrize("type_, args", [
    ("MomentumSGDUpdate", {}), ("MomentumSGDUpdate", {"nesterov": 1, "momentum": 0.8}),
    ("Adam", {}), ("Adam", {"beta1": 0.5, "epsilon": 1e-4}), ("Adagrad", {"decay": 0.9}),
    ("RmsProp", {"momentum": 0.5}), ("WeightedSum", {})])
def test_update_ops_match_bit_for_bit(gpu, type_, args):
    op, inputs = _update_case(type_, **args)
    cpu, gpu_out = run_op(op, inputs, "cpu"), run_op(op, inputs, "gpu")
    rtol = 0 if gpu.device_name.startswith("Emulated") else 1e-6   # the same IEEE steps
    for name, c, g in zip(op.outputs, cpu, gpu_out):
        np.testing.assert_allclose(g, c, rtol=rtol, atol=0, err_msg=f"{type_} {name}")


def test_weighted_sum_other_arities_and_rmsprop_without_param(gpu):
    r = np.random.default_rng(1)
    ins = {f"x{i}": r.standard_normal(9).astype(np.float32) for i in range(3)}
    ins.update({f"w{i}": np.array([0.5 * i - 0.3], np.float32) for i in range(3)})
    agree(netrun.op("WeightedSum", ["x0", "w0", "x1", "w1", "x2", "w2"], ["y"]), ins, grad=False)
    op, inputs = _update_case("RmsProp")
    inputs.pop("p")
    agree(netrun.op("RmsProp", ["g", "ms", "mom", "lr"], ["g", "ms", "mom"]), inputs, grad=False)


@pytest.mark.parametrize("policy", [
    dict(policy="fixed"), dict(policy="step", gamma=0.5, stepsize=3),
    dict(policy="multistep", gamma=0.1, stepvalues=[2, 5, 9]), dict(policy="exp", gamma=0.97),
    dict(policy="inv", gamma=1e-4, power=0.75), dict(policy="poly", power=2.0, max_iter=10),
    dict(policy="sigmoid", gamma=-0.5, stepsize=4),
    dict(policy="step", gamma=0.5, stepsize=3, warmup_iters=4, warmup_start=0.2)])
def test_learning_rate_on_the_device(gpu, policy):
    op = netrun.op("LearningRate", ["it"], ["lr"], base_lr=0.1, **policy)
    for it in (0, 1, 3, 7, 12):
        inputs = {"it": np.array([it], np.int64)}
        cpu, gpu_out = run_op(op, inputs, "cpu")[0], run_op(op, inputs, "gpu")[0]
        assert gpu_out.dtype == np.float32 and gpu_out.shape == ()
        np.testing.assert_allclose(gpu_out, cpu, rtol=2e-7, err_msg=f"{policy} at {it}")


# Shared array-module kernels running on the GPU -----------------------------------------------
SHARED = {
    "Relu": (netrun.op("Relu", ["X"], ["Y"]), {"X": _x(3, 4)}),
    "LeakyRelu": (netrun.op("LeakyRelu", ["X"], ["Y"], alpha=0.2), {"X": _x(3, 4)}),
    "Elu": (netrun.op("Elu", ["X"], ["Y"]), {"X": _x(3, 4)}),
    "Sigmoid": (netrun.op("Sigmoid", ["X"], ["Y"]), {"X": _x(3, 4)}),
    "Tanh": (netrun.op("Tanh", ["X"], ["Y"]), {"X": _x(3, 4)}),
    "Softplus": (netrun.op("Softplus", ["X"], ["Y"]), {"X": _x(3, 4)}),
    "PRelu": (netrun.op("PRelu", ["X", "S"], ["Y"]), {"X": _x(2, 3, 2, 2), "S": _x(3, seed=1)}),
    "Softmax": (netrun.op("Softmax", ["X"], ["Y"]), {"X": _x(4, 5)}),
    "LogSoftmax": (netrun.op("LogSoftmax", ["X"], ["Y"]), {"X": _x(4, 5)}),
    "FC": (netrun.op("FC", ["X", "W", "b"], ["Y"]),
           {"X": _x(4, 2, 3), "W": _x(5, 6, seed=1), "b": _x(5, seed=2)}),
    "MatMul": (netrun.op("MatMul", ["A", "B"], ["Y"], trans_b=1),
               {"A": _x(3, 4), "B": _x(5, 4, seed=1)}),
    "BatchMatMul": (netrun.op("BatchMatMul", ["A", "B"], ["Y"]),
                    {"A": _x(2, 3, 4), "B": _x(1, 4, 5, seed=1)}),
    "Add broadcast": (netrun.op("Add", ["A", "B"], ["Y"]),
                      {"A": _x(2, 3, 4), "B": _x(3, 1, seed=1)}),
    "Mul legacy": (netrun.op("Mul", ["A", "B"], ["Y"], broadcast=1, axis=1),
                   {"A": _x(2, 3, 4), "B": _x(3, seed=1)}),
    "Div": (netrun.op("Div", ["A", "B"], ["Y"]),
            {"A": _x(3, 4), "B": np.abs(_x(3, 4, seed=1)) + 1}),
    "Sum": (netrun.op("Sum", ["A", "B", "C"], ["Y"]),
            {"A": _x(3, 4), "B": _x(3, 4, seed=1), "C": _x(3, 4, seed=2)}),
    "Concat": (netrun.op("Concat", ["A", "B"], ["Y", "info"], axis=1),
               {"A": _x(2, 3), "B": _x(2, 5, seed=1)}),
    "Split": (netrun.op("Split", ["X"], ["A", "B"], axis=1, split=[2, 3]), {"X": _x(2, 5)}),
    "Slice": (netrun.op("Slice", ["X"], ["Y"], starts=[0, 1], ends=[-1, 4]), {"X": _x(3, 5)}),
    "Transpose": (netrun.op("Transpose", ["X"], ["Y"], axes=[2, 0, 1]), {"X": _x(2, 3, 4)}),
    "Flatten": (netrun.op("Flatten", ["X"], ["Y"]), {"X": _x(2, 3, 4)}),
    "Reshape": (netrun.op("Reshape", ["X"], ["Y", "old"], shape=[4, -1]), {"X": _x(2, 3, 4)}),
    "ReduceMean": (netrun.op("ReduceMean", ["X"], ["Y"], axes=[1], keepdims=0),
                   {"X": _x(2, 3, 4)}),
    "AveragedLoss": (netrun.op("AveragedLoss", ["X"], ["Y"]), {"X": _x(4, 3)}),
    "SquaredL2Distance": (netrun.op("SquaredL2Distance", ["X", "Y"], ["D"]),
                          {"X": _x(3, 4), "Y": _x(3, 4, seed=1)}),
    "SigmoidCrossEntropyWithLogits": (
        netrun.op("SigmoidCrossEntropyWithLogits", ["X", "T"], ["Y"]),
        {"X": _x(3, 4), "T": (_x(3, 4, seed=1) > 0).astype(np.float32)}),
    "Clip": (netrun.op("Clip", ["X"], ["Y"], min=-0.5, max=0.7), {"X": _x(3, 4)}),
    "Scale": (netrun.op("Scale", ["X"], ["Y"], scale=-1.5), {"X": _x(3, 4)}),
    "Copy": (netrun.op("Copy", ["X"], ["Y"]), {"X": _x(3, 4)}),
}


@pytest.mark.parametrize("name", sorted(SHARED))
def test_shared_kernels_on_the_gpu(gpu, name):
    op, inputs = SHARED[name]
    agree(op, inputs, grad=not netrun.get_schema(op.type).no_gradient)


def test_fillers_and_clipping_agree(gpu):
    for op in (netrun.op("XavierFill", [], ["Y"], shape=[4, 3, 2]),
               netrun.op("MSRAFill", [], ["Y"], shape=[5, 2]),
               netrun.op("GivenTensorFill", [], ["Y"], values=[1.0, 2.0, 3.0], shape=[3]),
               netrun.op("ConstantFill", [], ["Y"], shape=[2, 2], value=3.0)):
        agree(op, {}, grad=False)
    ins = {"a": _x(5), "b": _x(3, 2, seed=1)}
    agree(netrun.op("ClipGradientsByNorm", ["a", "b"], ["a", "b"], max_norm=0.5), ins, grad=False)
    agree(netrun.op("Iter", ["it"], ["it"]), {"it": np.array([4], np.int64)}, grad=False)
