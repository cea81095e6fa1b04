"""The operators Caffe models add: Power, Max, CaffeBatchNorm, ContrastiveLoss and the Caffe
fillers, against finite differences (float64), PyTorch (float32) and Caffe's formulas."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import infer_op
from netrun.errors import SchemaError, ShapeError
from tests.opcheck import check_gradient, run_op
from tests.checks import checks_ops, requires_torch, torch

FAST = settings(max_examples=12, deadline=None)
# One reference per run of a mixed test: without torch, its NumPy half still runs.
FD_OR_TORCH = pytest.mark.parametrize(
    "reference", ["finite_differences", pytest.param("torch", marks=requires_torch)])


# Power --------------------------------------------------------------------------------------
@checks_ops("Power", kind="finite_differences")
@checks_ops("Power", kind="torch")
@FD_OR_TORCH
@FAST
@given(power=st.sampled_from([0.0, 1.0, 2.0, 0.5, 3.0, -1.0]), scale=st.floats(0.5, 2.0),
       shift=st.floats(0.5, 2.0), seed=st.integers(0, 2**16))
def test_power_matches_torch_and_finite_differences(reference, power, scale, shift, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.1, 2.0, (3, 4))                 # shift + scale·x > 0: any power is real
    op = netrun.op("Power", ["X"], ["Y"], power=power, scale=scale, shift=shift)
    if reference == "finite_differences":
        check_gradient(op, {"X": x})
        return
    (y,) = run_op(op, {"X": x.astype(np.float32)})
    want = (shift + scale * torch.tensor(x, dtype=torch.float32)) ** power
    np.testing.assert_allclose(y, want.numpy(), rtol=2e-5, atol=1e-6)
    assert y.dtype == np.float32


def test_power_constant_derivatives():
    x = np.array([[1.0, -2.0, 3.0]])
    for power, scale, want in ((0.0, 2.0, 0.0), (1.0, -3.0, -3.0)):
        op = netrun.op("Power", ["X"], ["Y"], power=power, scale=scale, shift=0.5)
        grads, grad_of = netrun.gradient_ops(op)
        ws = netrun.Workspace()
        ws.feed_blob("X", x)
        ws.feed_blob("Y_grad", np.ones_like(x))
        for g in grads:
            ws.run_operator_once(g)
        np.testing.assert_array_equal(ws.fetch_blob(grad_of["X"]), np.full_like(x, want))


# Max ----------------------------------------------------------------------------------------
@checks_ops("Max", kind="finite_differences")
@checks_ops("Max", kind="torch")
@FD_OR_TORCH
@FAST
@given(n=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_max_matches_torch_and_finite_differences(reference, n, seed):
    rng = np.random.default_rng(seed)
    # distinct values at least 0.01 apart, so no tie is within the finite-difference step
    flat = rng.permutation(n * 12) * 0.01
    xs = {f"X{i}": flat[i * 12:(i + 1) * 12].reshape(3, 4) for i in range(n)}
    op = netrun.op("Max", list(xs), ["Y"])
    if reference == "finite_differences":
        check_gradient(op, xs)
        return
    (y,) = run_op(op, {k: v.astype(np.float32) for k, v in xs.items()})
    want = torch.stack([torch.tensor(v, dtype=torch.float32) for v in xs.values()]).amax(0)
    np.testing.assert_array_equal(y, want.numpy())


def _caffe_max_routing(xs: list[np.ndarray]) -> np.ndarray:
    """Caffe's EltwiseLayer MAX mask, element by element (a slow reference)."""
    mask = np.empty(xs[0].shape, int)
    for idx in np.ndindex(xs[0].shape):
        top, arg = (xs[0][idx], 0) if xs[0][idx] > xs[1][idx] else (xs[1][idx], 1)
        for k in range(2, len(xs)):
            if xs[k][idx] > top:
                top, arg = xs[k][idx], k
        mask[idx] = arg
    return mask


def test_max_gradient_breaks_ties_as_caffe_does():
    rng = np.random.default_rng(3)
    xs = [rng.integers(0, 3, (4, 5)).astype(np.float64) for _ in range(3)]  # many ties
    op = netrun.op("Max", ["A", "B", "C"], ["Y"])
    grads, grad_of = netrun.gradient_ops(op)
    ws = netrun.Workspace()
    for name, x in zip("ABC", xs):
        ws.feed_blob(name, x)
    ws.run_operator_once(op)
    dy = rng.standard_normal((4, 5))
    ws.feed_blob("Y_grad", dy)
    for g in grads:
        ws.run_operator_once(g)
    mask = _caffe_max_routing(xs)
    for k, name in enumerate("ABC"):
        np.testing.assert_array_equal(ws.fetch_blob(grad_of[name]), np.where(mask == k, dy, 0))


def test_max_shape_error_names_both_shapes():
    with pytest.raises(ShapeError, match=r"input 1 has shape 2×3 but input 0 has shape 2×4"):
        infer_op(netrun.op("Max", ["A", "B"], ["Y"]), [TensorSpec((2, 4)), TensorSpec((2, 3))])


# CaffeBatchNorm -----------------------------------------------------------------------------
def _bn_inputs(rng, shape, dtype=np.float64):
    c = shape[1]
    return {"X": (rng.standard_normal(shape) * 2 + 1).astype(dtype),
            "mean": rng.standard_normal(c).astype(dtype),
            "var": rng.uniform(0.5, 2.0, c).astype(dtype),
            "factor": np.array([1.7], dtype)}


TRAIN_OUT = ["Y", "mean", "var", "factor", "saved_mean", "saved_inv_std"]


@checks_ops("CaffeBatchNorm", kind="torch")
@checks_ops("CaffeBatchNorm", kind="reference")
@pytest.mark.parametrize("reference", ["caffe_update", pytest.param("torch", marks=requires_torch)])
@FAST
@given(shape=st.sampled_from([(4, 3), (2, 3, 2, 2), (3, 2, 5)]), seed=st.integers(0, 2**16))
def test_caffe_batch_norm_training_matches_torch_and_caffe_update(reference, shape, seed):
    inputs = _bn_inputs(np.random.default_rng(seed), shape, np.float32)
    op = netrun.op("CaffeBatchNorm", ["X", "mean", "var", "factor"], TRAIN_OUT, is_test=0,
                   moving_average_fraction=0.9, epsilon=1e-5)
    y, mean, var, factor, saved_mean, saved_inv_std = run_op(op, inputs)
    if reference == "torch":
        x = torch.tensor(inputs["X"])
        want = torch.nn.functional.batch_norm(x, None, None, training=True, eps=1e-5)
        np.testing.assert_allclose(y, want.numpy(), rtol=1e-4, atol=2e-5)
        return
    axes = tuple(i for i in range(len(shape)) if i != 1)
    m = inputs["X"].size // shape[1]
    batch_mean = inputs["X"].astype(np.float64).mean(axis=axes)
    batch_var = inputs["X"].astype(np.float64).var(axis=axes)
    np.testing.assert_allclose(mean, 0.9 * inputs["mean"] + batch_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, 0.9 * inputs["var"] + batch_var * m / (m - 1), rtol=1e-5)
    np.testing.assert_allclose(factor, 0.9 * 1.7 + 1, rtol=1e-6)
    np.testing.assert_allclose(saved_inv_std, 1 / np.sqrt(batch_var + 1e-5), rtol=1e-5)


def test_caffe_batch_norm_global_stats_divide_by_the_factor():
    rng = np.random.default_rng(0)
    inputs = _bn_inputs(rng, (2, 3, 2, 2))
    op = netrun.op("CaffeBatchNorm", ["X", "mean", "var", "factor"], ["Y"], is_test=1)
    (y,) = run_op(op, inputs)
    mu, var = inputs["mean"] / 1.7, inputs["var"] / 1.7
    want = (inputs["X"] - mu[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-12)
    # A zero factor (a fresh net) gives zero statistics, as Caffe's 1/s guard does.
    (y0,) = run_op(op, {**inputs, "factor": np.zeros(1)})
    np.testing.assert_allclose(y0, inputs["X"] / np.sqrt(1e-5), rtol=1e-12)


@checks_ops("CaffeBatchNorm", kind="finite_differences")
@FAST
@given(shape=st.sampled_from([(4, 3), (2, 3, 2, 2)]), is_test=st.booleans(),
       seed=st.integers(0, 2**16))
def test_caffe_batch_norm_gradient(shape, is_test, seed):
    inputs = _bn_inputs(np.random.default_rng(seed), shape)
    outs = ["Y"] if is_test else TRAIN_OUT
    op = netrun.op("CaffeBatchNorm", ["X", "mean", "var", "factor"], outs, is_test=int(is_test))
    check_gradient(op, inputs, check=["X"], outputs=[0], atol=1e-5, rtol=1e-4)


def test_caffe_batch_norm_checks_outputs_and_shapes():
    with pytest.raises(SchemaError, match="training .* makes 6 output"):
        infer_op(netrun.op("CaffeBatchNorm", ["X", "m", "v", "f"], ["Y"], name="bn1"),
                 [TensorSpec((2, 3))] * 4)
    with pytest.raises(ShapeError, match=r"mean has shape 4 but X has 3 channels"):
        infer_op(netrun.op("CaffeBatchNorm", ["X", "m", "v", "f"], ["Y"], is_test=1),
                 [TensorSpec((2, 3, 4, 4)), TensorSpec((4,)), TensorSpec((3,)),
                  TensorSpec((1,))])


# ContrastiveLoss ----------------------------------------------------------------------------
def _contrastive_reference(a, b, y, margin, legacy):
    d2 = ((a - b) ** 2).reshape(len(a), -1).sum(1)
    apart = np.maximum(margin - d2, 0) if legacy else np.maximum(margin - np.sqrt(d2), 0) ** 2
    return np.where(y != 0, d2, apart).sum() / (2 * len(a))


@checks_ops("ContrastiveLoss", kind="finite_differences")
@FAST
@given(legacy=st.booleans(), seed=st.integers(0, 2**16))
def test_contrastive_loss_value_and_gradient(legacy, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
    y = np.array([1, 0, 1, 0, 0, 1], np.float64)
    d = np.sqrt(((a - b) ** 2).sum(1))
    margin = float(np.median(d) ** (2 if legacy else 1)) + 0.05   # some pairs inside, some out
    edge = d ** 2 if legacy else d
    if np.min(np.abs(edge - margin)) < 1e-3:                     # off the max(·, 0) kink
        margin += 0.01
    op = netrun.op("ContrastiveLoss", ["A", "B", "Y"], ["loss"], margin=margin,
                   legacy_version=int(legacy))
    (loss,) = run_op(op, {"A": a, "B": b, "Y": y})
    assert loss.shape == ()
    np.testing.assert_allclose(loss, _contrastive_reference(a, b, y, margin, legacy), rtol=1e-12)
    check_gradient(op, {"A": a, "B": b, "Y": y}, check=["A", "B"])


@checks_ops("ContrastiveLoss", kind="torch")
@requires_torch
def test_contrastive_loss_matches_torch_float32():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(
        np.float32)
    y = np.array([1, 0, 0, 1, 0], np.int32)
    (loss,) = run_op(netrun.op("ContrastiveLoss", ["A", "B", "Y"], ["loss"], margin=2.0),
                     {"A": a, "B": b, "Y": y})
    ta, tb = torch.tensor(a), torch.tensor(b)
    d = torch.linalg.vector_norm(ta - tb, dim=1)
    ty = torch.tensor(y, dtype=torch.float32)
    want = (ty * d ** 2 + (1 - ty) * torch.clamp(2.0 - d, min=0) ** 2).sum() / (2 * 5)
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)


# Fillers ------------------------------------------------------------------------------------
def _caffe_bilinear(shape):
    """Caffe's BilinearFiller loop, verbatim."""
    w = np.empty(int(np.prod(shape)))
    k = shape[3]
    f = math.ceil(k / 2.0)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    for i in range(w.size):
        x, y = i % k, (i // k) % k
        w[i] = (1 - abs(x / f - c)) * (1 - abs(y / f - c))
    return w.reshape(shape)


@checks_ops("BilinearFill", kind="reference")
@pytest.mark.parametrize("shape", [(2, 1, 4, 4), (3, 2, 3, 3), (1, 1, 5, 5)])
def test_bilinear_fill_matches_caffe(shape):
    (w,) = run_op(netrun.op("BilinearFill", [], ["W"], shape=list(shape)), {})
    np.testing.assert_allclose(w, _caffe_bilinear(shape), rtol=1e-6)


def test_bilinear_fill_needs_a_square_kernel():
    with pytest.raises(SchemaError, match="square kernel"):
        infer_op(netrun.op("BilinearFill", [], ["W"], shape=[2, 2, 3, 4], name="up"), [])


@checks_ops("SparseGaussianFill", "PositiveUnitballFill", kind="reference")
def test_sparse_gaussian_and_positive_unitball_fills():
    (w,) = run_op(netrun.op("SparseGaussianFill", [], ["W"], shape=[40, 500], std=2.0,
                            sparse=10), {})
    kept = np.count_nonzero(w) / w.size
    assert abs(kept - 10 / 40) < 0.02                   # Bernoulli(sparse / shape[0])
    assert abs(w[w != 0].std() - 2.0) < 0.1
    (u,) = run_op(netrun.op("PositiveUnitballFill", [], ["U"], shape=[3, 2, 4]), {})
    assert (u >= 0).all()
    np.testing.assert_allclose(u.reshape(3, -1).sum(1), 1.0, rtol=1e-6)


# Every backend ------------------------------------------------------------------------------
def _backend_cases(rng):
    x = rng.uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)
    a, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(
        np.float32)
    bn = _bn_inputs(rng, (2, 3, 4), np.float32)
    sim = np.array([1, 0, 0, 1], np.float32)
    return [
        (netrun.op("Power", ["X"], ["Y"], power=1.5, scale=0.5, shift=1.0), {"X": x},
         (1 + 0.5 * x.astype(np.float64)) ** 1.5),
        (netrun.op("Max", ["A", "B"], ["Y"]), {"A": a, "B": b}, np.maximum(a, b)),
        (netrun.op("CaffeBatchNorm", ["X", "mean", "var", "factor"], ["Y"], is_test=1), bn,
         (bn["X"] - bn["mean"][None, :, None] / 1.7)
         / np.sqrt(bn["var"][None, :, None] / 1.7 + 1e-5)),
        (netrun.op("ContrastiveLoss", ["A", "B", "S"], ["loss"]), {"A": a, "B": b, "S": sim},
         _contrastive_reference(a, b, sim, 1.0, False)),
    ]


def test_caffe_ops_on_every_backend(device):
    """The shared kernels against NumPy references, on each backend (GPU when present)."""
    for op, inputs, want in _backend_cases(np.random.default_rng(7)):
        (got,) = run_op(op, inputs, device)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6, err_msg=op.type)
        grads, grad_of = netrun.gradient_ops(op)
        ws = netrun.Workspace(device)
        for name, value in inputs.items():
            ws.feed_blob(name, value)
        ws.run_operator_once(op)
        ws.feed_blob(f"{op.outputs[0]}_grad", np.ones_like(np.asarray(want), np.float32))
        for g in grads:
            ws.run_operator_once(g)
        cpu = netrun.Workspace("cpu")
        for name, value in inputs.items():
            cpu.feed_blob(name, value)
        cpu.run_operator_once(op)
        cpu.feed_blob(f"{op.outputs[0]}_grad", np.ones_like(np.asarray(want), np.float32))
        for g in grads:
            cpu.run_operator_once(g)
        for name, g in grad_of.items():
            if g:
                np.testing.assert_allclose(ws.fetch_blob(g), cpu.fetch_blob(g), rtol=1e-5,
                                           atol=1e-6, err_msg=f"{op.type} d{name}")
                assert np.isfinite(cpu.fetch_blob(g)).all()
