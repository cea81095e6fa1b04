"""MaxPool and AveragePool: Caffe's rules, PyTorch, finite differences, shapes, errors.

Tests that take `engine` run twice: in float32 with the default engine (netrun.kernels.jit's compiled
kernels when Numba is installed) and in float64 with the pure NumPy path, each against a
reference. Finite-difference checks need float64, which always runs the NumPy path.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.kernels import jit
from netrun.core.schema import TensorSpec, get_schema
from netrun.errors import SchemaError, ShapeError
from tests.opcheck import check_gradient, netrun_forward_backward, run_op, torch_forward_backward
from tests.checks import checks_ops

FEW = settings(max_examples=20, deadline=None)
TYPES = {"max": "MaxPool", "avg": "AveragePool"}
ENGINES = pytest.mark.parametrize("engine", ["compiled", "numpy"])


def _engine(name: str):
    """The context that runs the NumPy path ("numpy") or the default engine ("compiled")."""
    return jit.disabled() if name == "numpy" else contextlib.nullcontext()


def _as(engine: str, *arrays):
    """The arrays in the engine's dtype: float32 for the compiled kernels, else float64."""
    dtype = np.float32 if engine == "compiled" else np.float64
    return tuple(np.asarray(a).astype(dtype) for a in arrays)


def _tol(engine: str) -> dict:
    """Tolerances against float64 references for the engine's dtype."""
    return dict(rtol=1e-5, atol=1e-5) if engine == "compiled" else dict(rtol=1e-12, atol=1e-12)


def ref_pool(x, kind, kernel, stride, pads, ceil, count_include_pad=True):
    """Caffe's pooling_layer.cpp loops (NCHW): Y and a function giving dX for a dY."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = kernel, stride, pads
    if ceil:   # Caffe: round up, then the last window must start inside image + pad
        oh = math.ceil((h + 2 * pt - kh) / sh) + 1
        ow = math.ceil((w + 2 * pl - kw) / sw) + 1
        oh -= (oh - 1) * sh >= h + pt
        ow -= (ow - 1) * sw >= w + pl
        pb, pr = pt, pl
    else:
        oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    windows = []   # (r, s, image rows, image cols, divisor)
    for r in range(oh):
        for s in range(ow):
            hs, ws = r * sh - pt, s * sw - pl
            he, we = min(hs + kh, h + pb), min(ws + kw, w + pr)
            size = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            if not count_include_pad:
                size = (he - hs) * (we - ws)
            windows.append((r, s, slice(hs, he), slice(ws, we), size))
    y = np.zeros((n, c, oh, ow))
    for r, s, rows, cols, size in windows:
        part = x[:, :, rows, cols]
        y[:, :, r, s] = part.max(axis=(2, 3)) if kind == "max" else part.sum(axis=(2, 3)) / size

    def grad(dy):
        dx = np.zeros_like(x)
        for r, s, rows, cols, size in windows:
            if kind == "avg":
                dx[:, :, rows, cols] += (dy[:, :, r, s] / size)[:, :, None, None]
                continue
            part = x[:, :, rows, cols].reshape(n, c, -1)
            first = part.argmax(axis=2)          # first maximum in row-major window order
            hits = np.zeros_like(part)
            np.put_along_axis(hits, first[:, :, None], 1.0, axis=2)
            dx[:, :, rows, cols] += (hits * dy[:, :, r, s][:, :, None]).reshape(
                n, c, rows.stop - rows.start, cols.stop - cols.start)
        return dx

    return y, grad


@st.composite
def pool_cases(draw, max_side=7):
    kind = draw(st.sampled_from(["max", "avg"]))
    kh, kw, sh, sw = (draw(st.integers(1, 3)) for _ in range(4))
    ceil = draw(st.booleans())
    if ceil:
        pt, pl = draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))
        pads = [pt, pl, pt, pl]
    else:
        pads = [draw(st.integers(0, k - 1)) for k in (kh, kw, kh, kw)]
    h = draw(st.integers(max(1, kh - pads[0] - pads[2]), max_side))
    w = draw(st.integers(max(1, kw - pads[1] - pads[3]), max_side))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), h, w)
    args = dict(kernels=[kh, kw], strides=[sh, sw], pads=pads)
    if ceil:
        args["legacy_pad"] = "CAFFE_LEGACY_POOLING"
    if kind == "avg":
        args["count_include_pad"] = draw(st.sampled_from([0, 1]))
    return kind, args, shape, draw(st.integers(0, 2**16))


def _untied(shape, seed):
    """Distinct values at least 0.01 apart (far beyond the FD step), so no max is a tie."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    return (rng.permutation(size) * 0.01 + rng.uniform(0, 0.002, size)).reshape(shape) - size / 200


def _ref_for(kind, args, x):
    return ref_pool(x, kind, args["kernels"], args["strides"], args["pads"],
                    "legacy_pad" in args, args.get("count_include_pad", 1))


def _nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


@ENGINES
@FEW
@given(pool_cases(), st.sampled_from(["NCHW", "NHWC"]))
def test_pool_matches_caffe_reference(engine, case, order):
    kind, args, shape, seed = case
    x = _untied(shape, seed)
    y_ref, grad = _ref_for(kind, args, x)
    dy = np.random.default_rng(seed).standard_normal(y_ref.shape)
    x, dy = _as(engine, x, dy)          # the references stay float64
    op = netrun.op(TYPES[kind], ["X"], ["Y"], order=order, **args)
    with _engine(engine):
        if order == "NHWC":
            outs, grads = netrun_forward_backward(op, {"X": _nhwc(x)}, _nhwc(dy))
            y, dx = outs[0].transpose(0, 3, 1, 2), grads["X"].transpose(0, 3, 1, 2)
        else:
            outs, grads = netrun_forward_backward(op, {"X": x}, dy)
            y, dx = outs[0], grads["X"]
    np.testing.assert_allclose(y, y_ref, **_tol(engine))
    np.testing.assert_allclose(dx, grad(dy.astype(np.float64)), **_tol(engine))


@checks_ops("MaxPool", "AveragePool", kind="torch_gradient")
@FEW
@given(pool_cases(max_side=8))
def test_pool_matches_torch_float32(case):
    torch = pytest.importorskip("torch", reason="PyTorch is the reference for this comparison")
    F = torch.nn.functional
    kind, args, shape, seed = case
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = args["kernels"], args["strides"], args["pads"]
    ceil = "legacy_pad" in args
    # torch pads symmetrically, at most half the kernel: map our pads onto what it accepts
    pt, pl = min(pt, kh // 2), min(pl, kw // 2)
    args = dict(args, pads=[pt, pl, pt, pl])
    if shape[2] + 2 * pt < kh or shape[3] + 2 * pl < kw:
        shape = (shape[0], shape[1], max(shape[2], kh), max(shape[3], kw))
    x = _untied(shape, seed).astype(np.float32)
    if kind == "max":
        def fn(t):
            return F.max_pool2d(t, (kh, kw), (sh, sw), (pt, pl), ceil_mode=ceil)
    else:
        def fn(t):
            return F.avg_pool2d(t, (kh, kw), (sh, sw), (pt, pl), ceil_mode=ceil,
                                count_include_pad=bool(args["count_include_pad"]))
    ys, grads, dy = torch_forward_backward(fn, [x], seed=seed)
    outs, ours = netrun_forward_backward(netrun.op(TYPES[kind], ["X"], ["Y"], **args), {"X": x}, dy)
    np.testing.assert_allclose(outs[0], ys[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours["X"], grads[0], rtol=1e-5, atol=1e-5)


@checks_ops("MaxPool", "AveragePool", kind="finite_differences")
@FEW
@given(pool_cases(max_side=5))
def test_pool_gradient_matches_finite_differences(case):
    kind, args, shape, seed = case
    check_gradient(netrun.op(TYPES[kind], ["X"], ["Y"], **args), {"X": _untied(shape, seed)})


EDGE_CASES = {
    "1x1 image": (dict(kernel=1), (2, 2, 1, 1)),
    "global pooling": (dict(global_pooling=1), (2, 3, 4, 5)),
    "global pooling of 1x1": (dict(global_pooling=1), (1, 2, 1, 1)),
    "kernel equals input": (dict(kernel_h=4, kernel_w=3), (1, 2, 4, 3)),
    "stride larger than kernel": (dict(kernel=2, stride=3), (2, 1, 8, 7)),
    "batch 1, asymmetric pads": (dict(kernel=3, stride=2, pads=[2, 0, 1, 2]), (1, 2, 5, 6)),
    "ceil mode overhang": (dict(kernel=3, stride=2, pad=1, legacy_pad=3), (1, 2, 6, 6)),
    "legacy SAME": (dict(kernel=3, stride=2, legacy_pad="SAME"), (2, 2, 6, 5)),
}


@checks_ops("MaxPool", "AveragePool", kind="finite_differences")
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_pool_edge_cases_finite_differences(name, kind, order, device):
    args, shape = EDGE_CASES[name]
    x = _untied(shape, 3)
    check_gradient(netrun.op(TYPES[kind], ["X"], ["Y"], order=order, **args),
                   {"X": _nhwc(x) if order == "NHWC" else x}, device=device)


def test_global_pooling_reduces_the_whole_image():
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    for kind, reduce in (("max", np.max), ("avg", np.mean)):
        (y,) = run_op(netrun.op(TYPES[kind], ["X"], ["Y"], global_pooling=1), {"X": x})
        np.testing.assert_allclose(y, reduce(x, axis=(2, 3), keepdims=True), rtol=1e-12)
        (y,) = run_op(netrun.op(TYPES[kind], ["X"], ["Y"], global_pooling=1, order="NHWC"),
                      {"X": _nhwc(x)})
        np.testing.assert_allclose(y, reduce(_nhwc(x), axis=(1, 2), keepdims=True), rtol=1e-12)


@ENGINES
def test_max_pool_ties_go_to_the_first_tap(engine):
    x, dy = _as(engine, np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)))
    op = netrun.op("MaxPool", ["X"], ["Y"], kernel=2, stride=1)
    with _engine(engine):
        _, grads = netrun_forward_backward(op, {"X": x}, dy)
    # each of the 4 overlapping windows routes to its top-left element
    np.testing.assert_array_equal(grads["X"][0, 0], [[1, 1, 0], [1, 1, 0], [0, 0, 0]])


@ENGINES
@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 2), (2, 3), (3, 3)])
def test_max_pool_gradient_with_some_tied_windows(kernel, stride, engine):
    """A few tied windows (ReLU zeros) among distinct values: disjoint and overlapping
    windows, and uncovered pixels, against a loop that routes to the first maximum."""
    x = _untied((2, 3, 8, 7), 5)
    x[0, 0, :4, :4] = 0.0
    x[1, 2, 2:5, 1:6] = -3.0
    op = netrun.op("MaxPool", ["X"], ["Y"], kernel=kernel, stride=stride)
    dy_shape = (2, 3, (8 - kernel) // stride + 1, (7 - kernel) // stride + 1)
    x, dy = _as(engine, x, np.random.default_rng(2).standard_normal(dy_shape))
    with _engine(engine):
        _, grads = netrun_forward_backward(op, {"X": x}, dy)
    ref = np.zeros_like(x)
    for n, c, r, q in np.ndindex(*dy_shape):
        window = x[n, c, r * stride:r * stride + kernel, q * stride:q * stride + kernel]
        i, j = np.unravel_index(np.argmax(window), window.shape)   # first maximum, row-major
        ref[n, c, r * stride + i, q * stride + j] += dy[n, c, r, q]
    np.testing.assert_allclose(grads["X"], ref, **_tol(engine))


@ENGINES
def test_max_pool_padding_never_wins(engine):
    x, dy = _as(engine, -1.0 - np.random.default_rng(1).random((1, 2, 3, 3)),
                np.ones((1, 2, 3, 3)))
    op = netrun.op("MaxPool", ["X"], ["Y"], kernel=3, stride=1, pad=2 - 1)
    with _engine(engine):
        outs, grads = netrun_forward_backward(op, {"X": x}, dy)
    assert (outs[0] < -1).all()
    assert grads["X"].sum() == 2 * 9   # every window's gradient lands inside the image


def test_average_pool_caffe_divisor():
    """Ceil mode on a 6×6 image, kernel 3, stride 2, pad 1: windows start at -1, 1, 3, 5.

    Caffe's window sizes clipped to the padded extent [-1, 7) are 3, 3, 3, 2 per axis; the
    in-image counts are 2, 3, 3, 1. On an image of ones the average is count / size.
    """
    x = np.ones((1, 1, 6, 6))
    op = netrun.op("AveragePool", ["X"], ["Y"], kernel=3, stride=2, pad=1,
                   legacy_pad="CAFFE_LEGACY_POOLING")
    (y,) = run_op(op, {"X": x})
    factor = np.array([2 / 3, 1, 1, 1 / 2])
    np.testing.assert_allclose(y[0, 0], np.outer(factor, factor), rtol=1e-12)
    (y,) = run_op(op.with_(args={**op.args, "count_include_pad": 0}), {"X": x})
    np.testing.assert_allclose(y[0, 0], np.ones((4, 4)), rtol=1e-12)


def test_ceil_mode_never_starts_a_window_past_the_image():
    # 5 pixels, kernel 1, stride 3: ceil gives 3 windows, but the third would start at pixel 6.
    # Caffe keeps it when pad = 0 (an empty window); we drop it, as PyTorch does.
    x = np.arange(25.0).reshape(1, 1, 5, 5)
    (y,) = run_op(netrun.op("MaxPool", ["X"], ["Y"], kernel=1, stride=3, legacy_pad=3), {"X": x})
    np.testing.assert_array_equal(y[0, 0], x[0, 0, ::3, ::3])


def test_average_pool_gradient_accepts_caffe2_inputs():
    x = _untied((1, 2, 4, 4), 0)
    dy = np.random.default_rng(0).standard_normal((1, 2, 2, 2))
    args = dict(kernel=2, stride=2)
    ws = netrun.Workspace()
    for k, v in {"X": x, "dY": dy}.items():
        ws.feed_blob(k, v)
    ws.run_operator_once(netrun.op("AveragePool", ["X"], ["Y"], **args))
    ws.run_operator_once(netrun.op("AveragePoolGradient", ["X", "Y", "dY"], ["dX3"], **args))
    ws.run_operator_once(netrun.op("AveragePoolGradient", ["X", "dY"], ["dX2"], **args))
    np.testing.assert_array_equal(ws.fetch_blob("dX3"), ws.fetch_blob("dX2"))
    np.testing.assert_allclose(ws.fetch_blob("dX2"), np.repeat(np.repeat(dy, 2, 2), 2, 3) / 4)


@FEW
@given(pool_cases(), st.sampled_from(["NCHW", "NHWC"]))
def test_pool_shape_inference_equals_real_shapes(case, order):
    kind, args, shape, seed = case
    x = _untied(shape, seed)
    x = _nhwc(x) if order == "NHWC" else x
    op = netrun.op(TYPES[kind], ["X"], ["Y"], order=order, **args)
    schema = get_schema(op.type)
    resolved = schema.verify(op)
    (y,) = run_op(op, {"X": x})
    outs = schema.infer_shapes(op, resolved, [TensorSpec(x.shape, "float64")])
    assert outs[0].shape == y.shape
    cost = schema.cost(resolved, [TensorSpec(x.shape, "float64")], outs)
    kh, kw = args["kernels"]
    assert cost.flops == y.size * (kh * kw + (kind == "avg"))
    grad_ops, _ = netrun.gradient_ops(op)
    g_schema = get_schema(grad_ops[0].type)
    specs = [TensorSpec(x.shape if n == "X" else y.shape) for n in grad_ops[0].inputs]
    assert g_schema.infer_shapes(grad_ops[0], g_schema.verify(grad_ops[0]), specs)[0].shape == \
        x.shape


BAD_ARGS = [
    ("MaxPool", dict(kernel=0), "argument 'kernel' must be at least 1"),
    ("MaxPool", dict(kernel=2, pads=[0, 0, 0]), "argument 'pads' needs 4 values"),
    ("MaxPool", dict(), "missing argument 'kernel'"),
    ("MaxPool", dict(kernel=2, global_pooling=1), "'kernel' cannot be combined with global"),
    ("AveragePool", dict(global_pooling=1, stride=2), "'stride' cannot be combined with global"),
    ("MaxPool", dict(kernel=3, dilation=2), "'dilation' is not supported"),
    ("MaxPool", dict(kernel=2, pad=2), "'pad' must be smaller than the kernel 2×2"),
    ("AveragePool", dict(kernel=3, pads=[1, 1, 0, 0], legacy_pad=3), "must be symmetric"),
    ("AveragePool", dict(kernel=3, count_include_pad=2), "argument 'count_include_pad'"),
    ("MaxPool", dict(kernel=3, legacy_pad=7), "argument 'legacy_pad'"),
    ("MaxPool", dict(kernel=3, count_include_pad=1), "unknown argument 'count_include_pad'"),
]


@pytest.mark.parametrize("type,args,message", BAD_ARGS)
def test_bad_arguments_fail_at_build_time(type, args, message):
    op = netrun.op(type, ["X"], ["Y"], name="pool1", **args)
    with pytest.raises(SchemaError) as e:
        netrun.Workspace().create_net(netrun.NetDef("n", [op]))
    assert f"'pool1' ({type})" in str(e.value) and message in str(e.value)


def test_too_small_input_is_a_shape_error():
    with pytest.raises(ShapeError, match=r"op 'p' \(MaxPool\): X 1×1×2×2 is 2×2 .*smaller than"):
        run_op(netrun.op("MaxPool", ["X"], ["Y"], kernel=3, name="p"),
               {"X": np.ones((1, 1, 2, 2))})


@ENGINES
@pytest.mark.parametrize("kind,args", [("max", dict(kernel=3, stride=2, legacy_pad=3)),
                                       ("max", dict(kernel=2, stride=2)),
                                       ("avg", dict(kernel=3, stride=2, pad=1)),
                                       ("avg", dict(kernel=3, stride=1, pad=1))])
def test_pooling_split_across_threads_gives_the_same_bits(kind, args, engine, monkeypatch):
    """Blocks of images on worker threads (an uneven split, tiny blocks) change nothing."""
    from netrun.kernels import parallel
    from netrun.ops import pool as pool_module

    x = _untied((5, 3, 9, 8), 2)
    x[1, 1, :3, :3] = 0.0    # a few tied windows: the exact path runs for some blocks
    op = netrun.op(TYPES[kind], ["X"], ["Y"], **args)
    y_shape = run_op(op, {"X": x})[0].shape
    x, dy = _as(engine, x, np.random.default_rng(4).standard_normal(y_shape))
    with _engine(engine):
        plain = netrun_forward_backward(op, {"X": x}, dy)
        monkeypatch.setattr(parallel, "thread_count", lambda: 3)
        monkeypatch.setattr(parallel, "MIN_ELEMENTS", 0)
        monkeypatch.setattr(pool_module, "BLOCK_BYTES", 1)     # one image per block
        split = netrun_forward_backward(op, {"X": x}, dy)
    np.testing.assert_array_equal(split[0][0], plain[0][0])
    np.testing.assert_array_equal(split[1]["X"], plain[1]["X"])


# Tiled max pooling (kernel == stride, no pads: netrun.kernels.tiled_pool) ---------------------
def _first_max_reference(x, dy, kh, kw):
    """dX by a loop: each dY at the first maximum (row-major) of its kh×kw tile."""
    ref = np.zeros_like(x)
    for n, c, r, q in np.ndindex(*dy.shape):
        tile = x[n, c, r * kh:(r + 1) * kh, q * kw:(q + 1) * kw]
        i, j = np.unravel_index(np.argmax(tile), tile.shape)
        ref[n, c, r * kh + i, q * kw + j] += dy[n, c, r, q]
    return ref


@ENGINES
@pytest.mark.parametrize("kh,kw", [(2, 2), (3, 3), (2, 3), (1, 2), (3, 1)])
def test_tiled_max_pool_ties_go_to_the_first_tap_in_row_major_order(kh, kw, engine):
    """Tiles with ties, including the case that separable routing in the wrong order gets
    wrong: the maximum at (0, 1) and (1, 0) but not (0, 0) must go to (0, 1)."""
    from netrun.kernels import tiled_pool
    from netrun.kernels.geometry import ConvGeometry

    assert tiled_pool.applies(ConvGeometry(kh, kw, kh, kw), (2, 3, 2 * kh, 3 * kw), 2, 3, "NCHW")
    x = _untied((2, 3, 2 * kh, 3 * kw), 7)
    x[0, 0, :kh, :kw] = 0.0                          # a fully tied tile
    x[0, 1, :kh, :kw] = -5.0
    if kh > 1 and kw > 1:
        x[0, 1, 0, 1] = x[0, 1, 1, 0] = 9.0          # tie between (0, 1) and (1, 0)
    x[1, 2, :, kw:2 * kw] = 4.0                      # a column of tied tiles
    op = netrun.op("MaxPool", ["X"], ["Y"], kernel_h=kh, kernel_w=kw, stride_h=kh, stride_w=kw)
    x, dy = _as(engine, x, np.random.default_rng(3).standard_normal((2, 3, 2, 3)))
    with _engine(engine):
        outs, grads = netrun_forward_backward(op, {"X": x}, dy)
    np.testing.assert_array_equal(outs[0], x.reshape(2, 3, 2, kh, 3, kw).max(axis=(3, 5)))
    np.testing.assert_array_equal(grads["X"], _first_max_reference(x, dy, kh, kw))


def test_tiled_max_pool_matches_torch_float32():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(4).standard_normal((5, 4, 12, 8)).astype(np.float32)
    dy = np.random.default_rng(5).standard_normal((5, 4, 6, 4)).astype(np.float32)
    op = netrun.op("MaxPool", ["X"], ["Y"], kernel=2, stride=2)
    outs, grads = netrun_forward_backward(op, {"X": x}, dy)
    t_outs, t_grads, _ = torch_forward_backward(
        lambda t: torch.nn.functional.max_pool2d(t, 2, 2), [x], dy)
    assert outs[0].dtype == np.float32 and grads["X"].dtype == np.float32
    np.testing.assert_array_equal(outs[0], t_outs[0])
    np.testing.assert_array_equal(grads["X"], t_grads[0])


def test_tiled_path_only_for_exact_tiles():
    from netrun.kernels import tiled_pool
    from netrun.kernels.geometry import ConvGeometry

    g = ConvGeometry(2, 2, 2, 2)
    assert tiled_pool.applies(g, (1, 1, 24, 24), 12, 12, "NCHW")
    assert not tiled_pool.applies(g, (1, 1, 24, 25), 12, 12, "NCHW")     # a leftover column
    assert not tiled_pool.applies(g, (1, 24, 24, 1), 12, 12, "NHWC")
    assert not tiled_pool.applies(ConvGeometry(3, 3, 2, 2), (1, 1, 7, 7), 3, 3, "NCHW")
    assert not tiled_pool.applies(ConvGeometry(2, 2, 2, 2, 1, 1, 1, 1), (1, 1, 4, 4), 3, 3,
                                  "NCHW")
