"""Compiled pooling (netrun.kernels.jit.pool) against the NumPy path: the same bits for max pooling
(ties and NaN included), the same values within rounding for averages."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("numba")

import netrun  # noqa: E402
from netrun.core.operator import Operator  # noqa: E402
from netrun.kernels import jit  # noqa: E402
from netrun.kernels.jit import pool as jit_pool  # noqa: E402
from tests.opcheck import netrun_forward_backward, run_op  # noqa: E402
from tests.ops.test_pool import TYPES, pool_cases  # noqa: E402

if not jit.available():
    pytest.skip("the compiled engine is switched off (NETRUN_JIT=0)", allow_module_level=True)

FEW = settings(max_examples=30, deadline=None)
KERNELS = ("max_forward", "max_backward", "avg_forward", "avg_backward")


def _inputs(shape, dtype, values: str, nans: int, seed: int):
    """X with many ties ("ints": small integers) or none ("normal"), a few NaN if asked."""
    rng = np.random.default_rng(seed)
    if values == "ints":
        x = rng.integers(-2, 3, shape).astype(dtype)
    else:
        x = rng.standard_normal(shape).astype(dtype)
    x.reshape(-1)[rng.integers(0, x.size, nans)] = np.nan
    return x


def _both_engines(op, x, seed: int):
    """(NumPy path, compiled path) results of op and its gradient for the same X and dY."""
    with jit.disabled():
        y_shape = run_op(op, {"X": x})[0].shape
        dy = np.random.default_rng(seed + 1).standard_normal(y_shape).astype(x.dtype)
        numpy_path = netrun_forward_backward(op, {"X": x}, dy)
    return numpy_path, netrun_forward_backward(op, {"X": x}, dy)


def _assert_same(kind: str, numpy_path, compiled) -> None:
    (y0,), g0 = numpy_path
    (y1,), g1 = compiled
    assert y1.dtype == y0.dtype and g1["X"].dtype == g0["X"].dtype
    if kind == "max":
        np.testing.assert_array_equal(y1, y0)          # NaN == NaN here
        np.testing.assert_array_equal(g1["X"], g0["X"])
    else:
        tol = 1e-5 if y0.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(y1, y0, rtol=tol, atol=tol)
        np.testing.assert_allclose(g1["X"], g0["X"], rtol=tol, atol=tol)


@FEW
@given(pool_cases(max_side=9), st.sampled_from(["ints", "normal"]), st.integers(0, 2))
def test_compiled_pooling_equals_numpy_path(case, values, nans):
    """float32, the dtype the kernels are built for (float64 runs the NumPy path)."""
    kind, args, shape, seed = case
    x = _inputs(shape, "float32", values, nans, seed)
    op = netrun.op(TYPES[kind], ["X"], ["Y"], **args)
    _assert_same(kind, *_both_engines(op, x, seed))


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("args", [dict(kernel=3, stride=2, legacy_pad=3),    # cifar10_quick
                                  dict(kernel=2, stride=2),                  # LeNet
                                  dict(kernel=3, stride=1, pad=1),
                                  dict(kernel_h=2, kernel_w=3, stride_h=3, stride_w=2,
                                       pads=[1, 0, 0, 2])])
def test_many_planes_in_several_groups(kind, args):
    """More planes than one group holds, and a partial last group: no state leaks between
    groups (netrun.kernels.jit.pool.GROUP_ELEMENTS)."""
    x = _inputs((3, 150, 9, 11), "float32", "ints", 3, 0)
    op = netrun.op(TYPES[kind], ["X"], ["Y"], **args)
    _assert_same(kind, *_both_engines(op, x, 0))


@pytest.mark.parametrize("shape", [(2, 3, 8, 6), (1, 4, 24, 24), (2, 2, 7, 9)],
                         ids=["even", "lenet", "odd: the general kernel"])
def test_the_2x2_kernel_gives_the_general_kernels_bits(shape, monkeypatch):
    """LeNet's 2×2 stride-2 windows (max_2x2) against the separable kernel: ties, NaN and
    -inf included; sizes that do not split into whole windows take the general kernel."""
    x = _inputs(shape, "float32", "ints", 5, 1)
    x.reshape(-1)[::7] = -np.inf
    op = netrun.op("MaxPool", ["X"], ["Y"], kernel=2, stride=2)
    used, real = [], jit_pool.max_2x2

    def spy(*arrays):
        used.append(1)
        real(*arrays)
    spy.prepare = real.prepare
    monkeypatch.setattr(jit_pool, "max_2x2", spy)
    (got,) = run_op(op, {"X": x})
    planes = x.reshape(-1, shape[2], shape[3])
    want = np.empty((planes.shape[0], got.shape[2], got.shape[3]), np.float32)
    jit_pool.forward(planes, want, np.ones(want.shape[1:], np.float32), False, 2, 2, 2, 2,
                     0, 0)
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    assert bool(used) == (shape[2] % 2 == 0 and shape[3] % 2 == 0)


def _first_equal_reference(x, y, dy, k, s, pad):
    """dX by a loop: each dY at the first in-image tap (row-major) equal to Y, if any."""
    dx = np.zeros_like(x)
    for n, c, u, v in np.ndindex(*y.shape):
        done = False
        for i in range(k):
            for j in range(k):
                r, q = u * s - pad + i, v * s - pad + j
                if (not done and 0 <= r < x.shape[2] and 0 <= q < x.shape[3]
                        and x[n, c, r, q] == y[n, c, u, v]):
                    dx[n, c, r, q] += dy[n, c, u, v]
                    done = True
    return dx


def test_max_gradient_with_a_y_that_is_not_the_maximum():
    """Y is an input of MaxPoolGradient: windows whose Y is another tap's value, no tap's
    value, NaN or -inf route to the first tap equal to Y, or nowhere."""
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, (2, 3, 7, 7)).astype(np.float32)
    x[1, 2, :3, :3] = -np.inf
    args = dict(kernel=3, stride=2, pad=1)
    (y,) = run_op(netrun.op("MaxPool", ["X"], ["Y"], **args), {"X": x})
    y = y.copy()
    y[0, 0, 1, 1] = x[0, 0, 2, 2]            # another tap of that window
    y[0, 1, 2, 0] = 100.0                    # no tap
    y[1, 0, 0, 2] = np.nan
    dy = rng.standard_normal(y.shape).astype(np.float32)
    (dx,) = run_op(netrun.op("MaxPoolGradient", ["X", "Y", "dY"], ["dX"], **args),
                   {"X": x, "Y": y, "dY": dy})
    ref = _first_equal_reference(x, y, dy, 3, 2, 1)
    np.testing.assert_allclose(dx, ref, rtol=1e-6, atol=1e-6)
    assert dx[1, 2, 0, 0] == dy[1, 2, 0, 0]  # -inf window: its first in-image tap, not pad


@pytest.mark.parametrize("order,dtype,runs", [("NCHW", "float32", True),
                                              ("NCHW", "float64", False),
                                              ("NHWC", "float32", False),
                                              ("NCHW", "float16", False)])
def test_which_ops_run_compiled(order, dtype, runs, monkeypatch):
    """NCHW float32 with the engine on takes the compiled kernels; NHWC, other dtypes and
    jit.disabled() the NumPy path."""
    calls = []

    class Spy:
        def __init__(self, name):
            self.name, self.real = name, getattr(jit_pool, name)

        def __call__(self, *args):
            calls.append(self.name)
            return self.real(*args)

        def prepare(self, *signatures):
            self.real.prepare(*signatures)

    for name in KERNELS:
        monkeypatch.setattr(jit_pool, name, Spy(name))
    x = _inputs((2, 3, 6, 6), dtype, "normal", 0, 0)
    x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if order == "NHWC" else x
    dy = np.ones((2, 3, 3, 3), dtype)        # the pooled shape in either order
    for kind in ("max", "avg"):
        netrun_forward_backward(netrun.op(TYPES[kind], ["X"], ["Y"], kernel=2, stride=2,
                                          order=order), {"X": x}, dy)
    assert sorted(calls) == (sorted(KERNELS) if runs else [])
    calls.clear()
    with jit.disabled():
        netrun_forward_backward(netrun.op("MaxPool", ["X"], ["Y"], kernel=2, stride=2,
                                          order=order), {"X": x}, dy)
    assert calls == []


@pytest.mark.parametrize("type", ["MaxPool", "MaxPoolGradient", "AveragePool",
                                  "AveragePoolGradient"])
def test_preparer_compiles_the_float32_kernel_at_bind_time(type, monkeypatch):
    prepared = []
    real = jit_pool.prepare
    monkeypatch.setattr(jit_pool, "prepare", lambda t: prepared.append(t) or real(t))
    inputs = ["X"] if type in TYPES.values() else ["X", "Y", "dY"]
    ws = netrun.Workspace()
    Operator(netrun.op(type, inputs, ["Z"], kernel=2), ws)
    assert prepared == [type]
    kernel = {"MaxPool": jit_pool.forward, "MaxPoolGradient": jit_pool.max_backward,
              "AveragePool": jit_pool.forward,
              "AveragePoolGradient": jit_pool.avg_backward}[type]
    assert any(str(sig[0]).startswith("array(float32, 3d, C")
               for sig in kernel.compiled.signatures)
    with jit.disabled():
        Operator(netrun.op(type, inputs, ["Z"], kernel=2), ws)
    Operator(netrun.op(type, inputs, ["Z"], kernel=2, order="NHWC"), ws)
    assert prepared == [type]
