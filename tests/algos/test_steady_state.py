"""Steady state: conv and pool ops allocate nothing problem-sized after their first run."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import netrun
from netrun.core.net import SimpleNet
from netrun.kernels import jit

# (conv args, input shape, filter shape) per algorithm; every array is about 1 MB.
# Not fft: NumPy's pocketfft allocates temporaries even with out= (its rfft of a (64, 32, 20,
# 20) batch allocates ~14 MB), so the FFT algorithm is exhaustive-search-only and exempt.
CASES = {
    "im2col_gemm": (dict(kernel=3, pad=1), (16, 16, 32, 32), (16, 16, 3, 3)),
    "shift_gemm": (dict(kernel=3, pad=1), (16, 16, 32, 32), (16, 16, 3, 3)),
    "winograd_f2x2": (dict(kernel=3, pad=1), (16, 16, 32, 32), (16, 16, 3, 3)),
    "winograd_f4x4": (dict(kernel=3, pad=1), (16, 16, 32, 32), (16, 16, 3, 3)),
    "gemm_1x1": (dict(kernel=1), (16, 16, 32, 32), (16, 16, 1, 1)),
    "depthwise": (dict(kernel=3, pad=1, group=16), (16, 16, 32, 32), (16, 1, 3, 3)),
    # compiled: its scratch comes from the workspace like every algorithm's (the kernels'
    # one-image working copies come from the C heap, which tracemalloc does not see)
    "winograd_jit": (dict(kernel=3, pad=1), (16, 16, 32, 32), (16, 16, 3, 3)),
}
LIMIT = 256 << 10   # NumPy's ufunc buffers (8192 elements per operand) and Python objects


@pytest.mark.parametrize("algo", sorted(CASES))
def test_conv_and_pool_steady_state_allocates_nothing_problem_sized(algo):
    if algo == "winograd_jit" and not jit.available():
        pytest.skip("the compiled engine (Numba) is not installed")
    args, x_shape, w_shape = CASES[algo]
    rng = np.random.default_rng(0)
    ws = netrun.Workspace()
    ws.feed_blob("X", rng.standard_normal(x_shape).astype(np.float32))
    ws.feed_blob("W", rng.standard_normal(w_shape).astype(np.float32))
    ws.feed_blob("b", rng.standard_normal(w_shape[0]).astype(np.float32))
    conv = netrun.op("Conv", ["X", "W", "b"], ["Y"], algo=algo, **args)
    pools = [netrun.op("MaxPool", ["Y"], ["P"], kernel=2, stride=2),
             netrun.op("MaxPoolGradient", ["Y", "P", "P_grad"], ["Y_grad_m"], kernel=2, stride=2),
             netrun.op("AveragePool", ["Y"], ["A"], kernel=3, stride=2, legacy_pad=3),
             netrun.op("AveragePoolGradient", ["Y", "A_grad"], ["Y_grad_a"], kernel=3, stride=2,
                       legacy_pad=3)]
    ws.feed_blob("Y_grad", rng.standard_normal((16, w_shape[0], 32, 32)).astype(np.float32))
    ws.feed_blob("P_grad", rng.standard_normal((16, w_shape[0], 16, 16)).astype(np.float32))
    ws.feed_blob("A_grad", rng.standard_normal((16, w_shape[0], 16, 16)).astype(np.float32))
    net = SimpleNet(netrun.NetDef("n", [conv, *netrun.gradient_ops(conv)[0], *pools]), ws)
    net.run()
    net.run()
    assert ws.get_blob("Y").nbytes >= 1 << 20
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        net.run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [o.ctx.state.get("algo") for o in net.ops[:2]] == [algo, algo]
    assert peak < LIMIT, f"{algo}: {peak} bytes allocated during a steady-state run"


def test_first_run_allocates_and_is_detected():
    """The measurement can fail: a fresh workspace's first run allocates its buffers."""
    ws = netrun.Workspace()
    ws.feed_blob("X", np.ones((16, 16, 32, 32), np.float32))
    ws.feed_blob("W", np.ones((16, 16, 3, 3), np.float32))
    net = SimpleNet(netrun.NetDef("n", [netrun.op("Conv", ["X", "W"], ["Y"], kernel=3)]), ws)
    tracemalloc.start()
    try:
        net.run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak > LIMIT
