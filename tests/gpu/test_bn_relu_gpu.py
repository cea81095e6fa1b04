"""SpatialBNRelu's GPU kernels (the emulator, and a real GPU where there is one) against the
CPU: forward and gradients, training and is_test, and the float64 finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import netrun
from netrun.core.registry import find_kernel
from netrun.ops.gpu import batch_norm
from tests.opcheck import check_gradient, netrun_forward_backward, run_op

BN_IN = ["X", "s", "b", "rm", "rv"]


def _inputs(shape, c, dtype=np.float32):
    rng = np.random.default_rng(0)
    return {"X": rng.standard_normal(shape).astype(dtype) * 3 + 0.5,
            "s": rng.uniform(0.5, 1.5, c).astype(dtype), "b": rng.standard_normal(c).astype(dtype),
            "rm": rng.standard_normal(c).astype(dtype), "rv": rng.uniform(0.5, 2, c).astype(dtype)}


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("is_test", [0, 1])
def test_spatial_bn_relu_agrees_with_the_cpu(gpu, order, is_test):
    shape = (4, 3, 5, 2) if order == "NCHW" else (4, 5, 2, 3)
    inputs = _inputs(shape, 3)
    outs = ["Y"] if is_test else ["Y", "rm", "rv", "sm", "si"]
    op = netrun.op("SpatialBNRelu", BN_IN, outs, order=order, is_test=is_test, momentum=0.8,
                   epsilon=1e-3)
    dy = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    cpu, cg = netrun_forward_backward(op, inputs, dy, "cpu")
    got, gg = netrun_forward_backward(op, inputs, dy, gpu.device)
    assert (cpu[0] == 0).any()
    for name, c, g in zip(outs, cpu, got):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-4, err_msg=name)
    np.testing.assert_array_equal(got[0] == 0, cpu[0] == 0)
    for name in ("X", "s", "b"):
        np.testing.assert_allclose(gg[name], cg[name], rtol=1e-4, atol=1e-4, err_msg=name)


def test_spatial_bn_relu_float64_gradient_on_the_gpu(gpu):
    inputs = _inputs((3, 4, 2, 3), 4, np.float64)
    op = netrun.op("SpatialBNRelu", BN_IN, ["Y", "rm", "rv", "sm", "si"])
    assert (run_op(op, inputs, gpu.device)[0] == 0).any()
    check_gradient(op, inputs, check=["X", "s", "b"], outputs=[0], device=gpu.device,
                   atol=1e-5, rtol=1e-4)


def test_the_gpu_backend_runs_its_own_kernels(gpu):
    assert find_kernel("SpatialBNRelu", gpu.name) is batch_norm.spatial_bn_relu
    assert find_kernel("SpatialBNReluGradient", gpu.name) is batch_norm.spatial_bn_relu_gradient
