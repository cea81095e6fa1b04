"""The ops and arguments the bind-time rewrites make: AddRelu, Conv's relu argument and its
residual input S, each against float64 finite differences and PyTorch, and on every CPU conv
algorithm."""
from __future__ import annotations

import numpy as np
import pytest

import netrun
from netrun.conv import ConvProblem
from netrun.conv.algorithm import applicable_algorithms
from netrun.kernels.geometry import ConvGeometry
from tests.checks import checks_ops
from tests.opcheck import check_gradient, netrun_forward_backward, run_op, torch_forward_backward


def _away_from_kink(rng, shape, dtype=np.float64):
    """Values whose sums stay clear of ReLU's kink at 0 (finite differences cross it otherwise)."""
    x = rng.standard_normal(shape)
    return (x + np.sign(x) * 0.2).astype(dtype)


@checks_ops("AddRelu", kind="finite_differences")
@pytest.mark.parametrize("b_shape", [(2, 3, 4, 5), (3, 1, 1)])
def test_add_relu_gradient(b_shape):
    rng = np.random.default_rng(0)
    a = _away_from_kink(rng, (2, 3, 4, 5))
    b = np.zeros(b_shape) + 0.05     # small: A + B keeps A's signs, away from the kink
    check_gradient(netrun.op("AddRelu", ["A", "B"], ["Y"]), {"A": a, "B": b})


def test_add_relu_in_place_gradient_matches_out_of_place():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3, 4, 4)), rng.standard_normal((2, 3, 4, 4))
    dy = rng.standard_normal(a.shape)
    ops = {}
    for out in ("Y", "A"):
        outs, grads = netrun_forward_backward(netrun.op("AddRelu", ["A", "B"], [out]),
                                              {"A": a, "B": b}, dy)
        ops[out] = (outs[0], grads["B"])
    np.testing.assert_array_equal(ops["Y"][0], ops["A"][0])
    np.testing.assert_array_equal(ops["Y"][1], ops["A"][1])


@checks_ops("AddRelu", kind="torch_gradient")
@pytest.mark.parametrize("shape", [(4, 8, 6, 6), (64, 16, 32, 32)])
def test_add_relu_matches_torch_float32(shape, monkeypatch):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    ys, tgrads, dy = torch_forward_backward(lambda x, y: torch.relu(x + y), [a, b])
    for threads in ("1", "3"):       # the large case runs on several chunks
        monkeypatch.setenv("NETRUN_THREADS", threads)
        outs, grads = netrun_forward_backward(netrun.op("AddRelu", ["A", "B"], ["Y"]),
                                              {"A": a, "B": b}, dy)
        np.testing.assert_array_equal(outs[0], ys[0])     # one rounding: the same bits
        np.testing.assert_allclose(grads["A"], tgrads[0], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(grads["B"], tgrads[1], rtol=1e-6, atol=1e-7)


def _conv(relu: int, bias: bool = True, **args):
    return netrun.op("Conv", ["X", "W", "b"] if bias else ["X", "W"], ["Y"], kernel=3, pad=1,
                     relu=relu, **({} if bias else {"no_bias": 1}), **args)


def test_conv_relu_gradient():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 3, 5, 5)), rng.standard_normal((4, 3, 3, 3))
    b = rng.standard_normal(4)
    y = run_op(_conv(0), {"X": x, "W": w, "b": b})[0]
    assert (y > 0).any() and (y < 0).any()
    check_gradient(_conv(1), {"X": x, "W": w, "b": b}, atol=1e-5, rtol=1e-4)


def test_conv_relu_matches_torch_float32():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 8, 9, 9)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    ys, tgrads, dy = torch_forward_backward(
        lambda x, w, b: F.relu(F.conv2d(x, w, b, stride=2, padding=1, groups=2)), [x, w, b])
    outs, grads = netrun_forward_backward(_conv(1, stride=2, group=2),
                                          {"X": x, "W": w, "b": b}, dy)
    np.testing.assert_allclose(outs[0], ys[0], rtol=1e-4, atol=1e-4)
    for name, tg in zip("XWb", tgrads):
        np.testing.assert_allclose(grads[name], tg, rtol=1e-4, atol=1e-3)


def _problem(n=2, c=8, h=10, k=6, kernel=3, stride=1, group=1) -> ConvProblem:
    geom = ConvGeometry(kernel, kernel, stride, stride, *(kernel // 2,) * 4).resolve(h, h)
    return ConvProblem.make((n, c, h, h), (k,), geom, group, "float32", "NCHW")


@pytest.mark.parametrize("nhwc", [False, True])
def test_conv_relu_every_cpu_algorithm(nhwc):
    """relu=1 equals Relu after the same algorithm's conv, bit for bit (an algorithm without
    a post-op gets the ReLU applied in place after it)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    w = rng.standard_normal((6, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    if nhwc:
        x, w = x.transpose(0, 2, 3, 1).copy(), w.transpose(0, 2, 3, 1).copy()
    names = [a.name for a in applicable_algorithms(_problem())]
    assert len(names) > 2
    order = {"order": "NHWC"} if nhwc else {}
    for algo in names:
        plain = run_op(_conv(0, algo=algo, **order), {"X": x, "W": w, "b": b})[0]
        fused = run_op(_conv(1, algo=algo, **order), {"X": x, "W": w, "b": b})[0]
        np.testing.assert_array_equal(fused, np.maximum(plain, 0), err_msg=algo)


def test_conv_passes_relu_to_an_algorithm_that_fuses_it(monkeypatch):
    """An algorithm with fuses_relu gets relu=True and the op leaves the output to it."""
    algo = next(a for a in applicable_algorithms(_problem()) if a.name == "im2col_gemm")
    seen = []
    original = type(algo).forward

    def forward(self, xp, x, w, p, out, scratch, bias=None, relu=False):
        seen.append(relu)
        original(self, xp, x, w, p, out, scratch, bias=bias)
        if relu:
            out *= 2.0           # marks that the op did not apply ReLU itself afterwards
            np.maximum(out, 0, out=out)

    monkeypatch.setattr(algo, "fuses_relu", True, raising=False)
    monkeypatch.setattr(algo, "forward", forward.__get__(algo), raising=False)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    w = rng.standard_normal((6, 8, 3, 3)).astype(np.float32)
    b = np.zeros(6, np.float32)
    fused = run_op(_conv(1, algo="im2col_gemm"), {"X": x, "W": w, "b": b})[0]
    plain = run_op(_conv(0, algo="im2col_gemm"), {"X": x, "W": w, "b": b})[0]
    assert seen == [True, False]
    np.testing.assert_allclose(fused, np.maximum(2 * plain, 0), rtol=1e-6)


def test_conv_with_a_residual_gradient():
    """relu(conv(X, W) + b + S): dS is the masked dY, the rest as Conv with relu=1."""
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((2, 3, 5, 5)), rng.standard_normal((4, 3, 3, 3))
    b, s = rng.standard_normal(4), _away_from_kink(rng, (2, 4, 5, 5)) * 3
    conv = netrun.op("Conv", ["X", "W", "b", "S"], ["Y"], kernel=3, pad=1, relu=1)
    check_gradient(conv, {"X": x, "W": w, "b": b, "S": s}, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("nhwc", [False, True])
def test_conv_with_a_residual_every_cpu_algorithm(nhwc):
    """Conv(X, W, b, S) with relu=1 equals AddRelu(conv, S) after the same algorithm, bit for
    bit (an algorithm that fuses the sum reads S while it writes the output)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    w = rng.standard_normal((6, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    s = rng.standard_normal((2, 6, 10, 10)).astype(np.float32)
    if nhwc:
        x, w, s = (a.transpose(0, 2, 3, 1).copy() for a in (x, w, s))
    order = {"order": "NHWC"} if nhwc else {}
    for algo in [a.name for a in applicable_algorithms(_problem())]:
        plain = run_op(_conv(0, algo=algo, **order), {"X": x, "W": w, "b": b})[0]
        conv = netrun.op("Conv", ["X", "W", "b", "S"], ["Y"], kernel=3, pad=1, relu=1,
                         algo=algo, **order)
        fused = run_op(conv, {"X": x, "W": w, "b": b, "S": s})[0]
        np.testing.assert_array_equal(fused, np.maximum(plain + s, 0), err_msg=algo)
