"""HardSigmoid: Y = clip(alpha·X + beta, 0, 1) and its gradient, against NumPy, finite
differences and PyTorch (whose hardsigmoid is alpha = 1/6, beta = 1/2)."""
from __future__ import annotations

import numpy as np
import pytest

import netrun
from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import infer_op
from tests.checks import checks_ops
from tests.opcheck import check_gradient, netrun_forward_backward, run_op, torch_forward_backward


def _away_from_kinks(x, alpha, beta, margin=1e-3):
    """x nudged so alpha·x + beta is not within margin of 0 or 1 (where the slope jumps)."""
    v = alpha * x + beta
    for kink in (0.0, 1.0):
        near = np.abs(v - kink) < margin
        x = np.where(near, x + np.sign(alpha) * 4 * margin, x)
        v = alpha * x + beta
    return x


@checks_ops("HardSigmoid", kind="reference")
@pytest.mark.parametrize("alpha,beta", [(0.2, 0.5), (1.5, -0.25), (-0.3, 0.4)])
def test_forward_matches_numpy_reference(alpha, beta, device):
    x = np.random.default_rng(0).standard_normal((3, 4, 5)) * 4
    x = np.concatenate([x.ravel(), [np.nan, np.inf, -np.inf]])
    (y,) = run_op(netrun.op("HardSigmoid", ["X"], ["Y"], alpha=alpha, beta=beta), {"X": x},
                  device)
    with np.errstate(invalid="ignore"):
        want = np.clip(alpha * x + beta, 0, 1)
    np.testing.assert_array_equal(y, want)


def test_defaults_are_caffe2s_and_onnxs():
    (y,) = run_op(netrun.op("HardSigmoid", ["X"], ["Y"]), {"X": np.array([-3.0, 0.0, 1.0, 3.0])})
    np.testing.assert_allclose(y, [0.0, 0.5, 0.7, 1.0])


@checks_ops("HardSigmoid", kind="finite_differences")
@pytest.mark.parametrize("alpha,beta", [(0.2, 0.5), (1.5, -0.25), (-0.3, 0.4)])
def test_gradient_matches_finite_differences(alpha, beta):
    x = _away_from_kinks(np.random.default_rng(1).standard_normal((4, 6)) * 3, alpha, beta)
    check_gradient(netrun.op("HardSigmoid", ["X"], ["Y"], alpha=alpha, beta=beta), {"X": x})


def test_gradient_reads_the_output_so_the_op_may_run_in_place():
    op = netrun.op("HardSigmoid", ["X"], ["X"], alpha=0.4)
    grad_ops, grad_of = netrun.gradient_ops(netrun.op("HardSigmoid", ["X"], ["Y"], alpha=0.4))
    assert [o.type for o in grad_ops] == ["HardSigmoidGradient"]
    assert grad_ops[0].inputs == ("Y", "Y_grad") and grad_of == {"X": "X_grad"}
    x = np.random.default_rng(2).standard_normal((5, 5)).astype(np.float32)
    dy = np.random.default_rng(3).standard_normal((5, 5)).astype(np.float32)
    (y_out,), g_out = netrun_forward_backward(netrun.op("HardSigmoid", ["X"], ["Y"], alpha=0.4),
                                              {"X": x}, dy)
    (y_in,), g_in = netrun_forward_backward(op, {"X": x}, dy)
    np.testing.assert_array_equal(y_in, y_out)
    np.testing.assert_array_equal(g_in["X"], g_out["X"])


def test_gradient_is_zero_on_the_clipped_parts_and_keeps_nan():
    y = np.array([0.0, 1.0, 0.5, 1e-30, 1 - 2 ** -24, 2.0, -1.0, 0.5], np.float32)
    dy = np.array([1, 1, 1, 1, 1, 1, 1, np.nan], np.float32)
    (dx,) = run_op(netrun.op("HardSigmoidGradient", ["Y", "dY"], ["dX"], alpha=0.25),
                   {"Y": y, "dY": dy})
    np.testing.assert_array_equal(dx, np.array([0, 0, 0.25, 0.25, 0.25, 0, 0, np.nan],
                                                np.float32))


def test_shape_and_cost_inference():
    inferred = infer_op(netrun.op("HardSigmoid", ["X"], ["Y"]),
                        [TensorSpec((2, 3, 4), "float64")])
    assert list(inferred.outputs) == [TensorSpec((2, 3, 4), "float64")]
    assert inferred.cost.flops == 3 * 24


@checks_ops("HardSigmoid", kind="torch_gradient")
def test_matches_torch_float32(device):
    torch = pytest.importorskip("torch", reason="PyTorch is the reference for this comparison")
    x = _away_from_kinks(np.random.default_rng(4).standard_normal((4, 3, 5)) * 4, 1 / 6, 0.5)
    x = x.astype(np.float32)
    (ty,), (tdx,), dy = torch_forward_backward(lambda t: torch.nn.functional.hardsigmoid(t), [x])
    (y,), grads = netrun_forward_backward(
        netrun.op("HardSigmoid", ["X"], ["Y"], alpha=1 / 6, beta=0.5), {"X": x}, dy, device)
    np.testing.assert_allclose(y, ty, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(grads["X"], tdx, rtol=2e-6, atol=1e-6)
