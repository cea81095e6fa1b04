"""HardSigmoid's own GPU kernels agree with the CPU to the bit (same operations, same order,
no fused multiply-add), NaN and the clip points included, in place too."""
from __future__ import annotations

import numpy as np
import pytest

import netrun
from tests.opcheck import netrun_forward_backward


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("inplace", [False, True])
def test_gpu_kernels_match_cpu_bitwise(gpu, dtype, inplace):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(300) * 4, [np.nan, -2.5, 2.5, 0.0]]).astype(dtype)
    dy = np.concatenate([rng.standard_normal(303), [np.nan]]).astype(dtype)
    op = netrun.op("HardSigmoid", ["X"], ["X" if inplace else "Y"], alpha=0.2, beta=0.5)
    (y_cpu,), g_cpu = netrun_forward_backward(op, {"X": x}, dy, "cpu")
    (y_gpu,), g_gpu = netrun_forward_backward(op, {"X": x}, dy, gpu.device)
    np.testing.assert_array_equal(y_gpu, y_cpu)
    np.testing.assert_array_equal(g_gpu["X"], g_cpu["X"])


def test_the_gpu_backend_runs_its_own_kernel(gpu):
    from netrun.core.registry import find_kernel
    from netrun.ops import activation

    assert find_kernel("HardSigmoid", gpu.name) is activation.hard_sigmoid_gpu
    assert find_kernel("HardSigmoidGradient", gpu.name) is activation.hard_sigmoid_gradient_gpu
    assert find_kernel("HardSigmoid", "cpu") is not activation.hard_sigmoid_gpu
