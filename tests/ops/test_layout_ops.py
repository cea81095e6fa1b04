"""The layout reorders (NCHWToBlocked, BlockedToNCHW) and Conv's channel-blocked arrays
(its `blocked` argument, a 5-D X, a blocked residual S): against NumPy's own reorder and
the NCHW conv, on the compiled and the NumPy paths, and the reorders' gradients against
float64 finite differences."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import netrun
from netrun.errors import ShapeError
from netrun.kernels import jit, onednn
from tests.checks import checks_ops
from tests.opcheck import check_gradient, run_op

needs_onednn = pytest.mark.skipif(not onednn.available(),
                                  reason="oneDNN is not installed (pip install 'netrun[onednn]')")


def blocked_reference(x: np.ndarray, block: int) -> np.ndarray:
    """x (NCHW) in blocks of `block` channels, by NumPy indexing (the layout's definition)."""
    n, c, h, w = x.shape
    out = np.zeros((n, -(-c // block), h, w, block), x.dtype)
    for ch in range(c):
        out[:, ch // block, :, :, ch % block] = x[:, ch]
    return out


def _engines():
    return [pytest.param(False, id="compiled"), pytest.param(True, id="numpy")]


@checks_ops("NCHWToBlocked", "BlockedToNCHW", kind="reference")
@pytest.mark.parametrize("numpy_only", _engines())
@pytest.mark.parametrize("c,block", [(13, 8), (16, 8), (3, 16), (32, 16)])
def test_reorders_match_the_layout_and_round_trip(numpy_only, c, block):
    rng = np.random.default_rng(c)
    x = rng.standard_normal((3, c, 5, 7)).astype(np.float32)
    with jit.disabled() if numpy_only else contextlib.nullcontext():
        (b,) = run_op(netrun.op("NCHWToBlocked", ["X"], ["Y"], block=block), {"X": x})
        (y,) = run_op(netrun.op("BlockedToNCHW", ["X"], ["Y"], channels=c), {"X": b})
        (like,) = run_op(netrun.op("BlockedToNCHW", ["X", "L"], ["Y"]), {"X": b, "L": x})
    np.testing.assert_array_equal(b, blocked_reference(x, block))
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(like, x)


@checks_ops("NCHWToBlocked", "BlockedToNCHW", kind="finite_differences")
def test_reorder_gradients():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3, 2))
    check_gradient(netrun.op("NCHWToBlocked", ["X"], ["Y"], block=8), {"X": x})
    b = blocked_reference(x, 8)
    check_gradient(netrun.op("BlockedToNCHW", ["X"], ["Y"], channels=5), {"X": b})


def test_reorder_shape_errors():
    x = np.zeros((2, 5, 3, 3), np.float32)
    with pytest.raises(ShapeError, match="4-D"):
        run_op(netrun.op("NCHWToBlocked", ["X"], ["Y"]), {"X": x[0]})
    with pytest.raises(ShapeError, match="do not fill"):
        run_op(netrun.op("BlockedToNCHW", ["X"], ["Y"], channels=9),
               {"X": blocked_reference(x, 8)})


def _conv_case(rng, n, c, k, size, kernel, stride, pad):
    x = rng.standard_normal((n, c, size, size)).astype(np.float32)
    w = (rng.standard_normal((k, c, kernel, kernel)) / np.sqrt(c * kernel * kernel)).astype(
        np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    return x, w, b, dict(kernel=kernel, stride=stride, pad=pad)


# batch 1 runs as one call on an OpenMP team, bigger batches in netrun's fixed chunks
CONV_CASES = [(1, 16, 16, 8, 3, 1, 1), (1, 3, 20, 9, 3, 2, 1), (6, 12, 24, 15, 3, 1, 1),
              (8, 32, 64, 14, 1, 1, 0), (4, 24, 8, 9, 1, 2, 0),
              (2, 128, 136, 7, 3, 1, 1)]   # 128+ channels, 3×3: oneDNN's BRGEMM kernels


@needs_onednn
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("x_blocked,y_block", [
    (True, 0), (False, 8), (True, 8), ("last", "last"), (True, "last"), ("last", 8),
    (False, "last")], ids=["x_blocked", "y_blocked", "both_blocked", "channels_last",
                           "blocked_to_last", "last_to_blocked", "nchw_to_last"])
def test_blocked_conv_matches_the_nchw_conv(case, x_blocked, y_block):
    """Every combination of layouts, with bias, ReLU and a residual, computes the NCHW conv's
    values (to float32 rounding: oneDNN sums in its own order). "last": channels-last, one
    block of every channel (NHWC's memory; oneDNN's BRGEMM kernels)."""
    rng = np.random.default_rng(sum(case))
    x, w, b, args = _conv_case(rng, *case)
    if y_block == "last":
        y_block = w.shape[0]
    x_block = x.shape[1] if x_blocked == "last" else 8
    (y,) = run_op(netrun.op("Conv", ["X", "W", "b"], ["Y"], relu=1, **args),
                  {"X": x, "W": w, "b": b})
    s = rng.standard_normal(y.shape).astype(np.float32)
    (ys,) = run_op(netrun.op("Conv", ["X", "W", "b", "S"], ["Y"], relu=1, **args),
                   {"X": x, "W": w, "b": b, "S": s})
    xin = blocked_reference(x, x_block) if x_blocked else x
    sin = blocked_reference(s, y_block) if y_block else s
    (got,) = run_op(netrun.op("Conv", ["X", "W", "b"], ["Y"], relu=1, blocked=y_block, **args),
                    {"X": xin, "W": w, "b": b})
    (got_s,) = run_op(netrun.op("Conv", ["X", "W", "b", "S"], ["Y"], relu=1, blocked=y_block,
                                **args), {"X": xin, "W": w, "b": b, "S": sin})
    want = blocked_reference(y, y_block) if y_block else y
    want_s = blocked_reference(ys, y_block) if y_block else ys
    assert got.shape == want.shape and got_s.shape == want_s.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-5, atol=1e-5)
    if y_block:   # the padding channels of the last block are written, as zeros
        k = w.shape[0]
        assert not got[:, -1, ..., k % y_block or y_block:].any()


def _conv_over_residual(op, inputs: dict, mode: str = "heuristic") -> tuple[np.ndarray, bool]:
    """Run op, whose output is its residual S's name (the memory plan's in-place pair), with
    the conv algorithms chosen in `mode`; (its output, whether it was written into S's own
    array)."""
    from netrun import conv as algos

    ws = netrun.Workspace()
    algos.configure(ws, mode=mode, persist=False)   # a search on every run: none cached
    for name, value in inputs.items():
        ws.feed_blob(name, value.copy())
    before = ws.get_blob("S")
    ws.run_operator_once(op)
    return ws.fetch_blob("S"), ws.get_blob("S") is before


@pytest.mark.parametrize("case", CONV_CASES[:5], ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("y_block,algo,mode", [
    (8, "", "heuristic"), ("last", "", "heuristic"), (0, "", "heuristic"),
    (0, "im2col_gemm", "heuristic"), (0, "", "exhaustive")],
    ids=["blocked", "channels_last", "nchw", "nchw_unfused", "nchw_timed"])
def test_a_conv_written_over_its_residual(case, y_block, algo, mode):
    """Y over S (the memory plan gives Y the buffer of an S that the conv reads last): every
    path reads S before writing over it (oneDNN adds what the output holds; an exhaustive
    search times its candidates elsewhere), and the bits are those of a separate output."""
    if not onednn.available() and not algo:
        pytest.skip("oneDNN is not installed (pip install 'netrun[onednn]')")
    rng = np.random.default_rng(sum(case))
    x, w, b, args = _conv_case(rng, *case)
    if algo:
        args["algo"] = algo
    (y,) = run_op(netrun.op("Conv", ["X", "W", "b"], ["Y"], **args), {"X": x, "W": w, "b": b})
    s = rng.standard_normal(y.shape).astype(np.float32)
    if y_block == "last":
        y_block = w.shape[0]
    xin = blocked_reference(x, 8) if y_block else x
    sin = blocked_reference(s, y_block) if y_block else s
    inputs = {"X": xin, "W": w, "b": b, "S": sin}
    (apart,) = run_op(netrun.op("Conv", ["X", "W", "b", "S"], ["Y"], relu=1, blocked=y_block,
                                **args), inputs)
    over, in_place = _conv_over_residual(
        netrun.op("Conv", ["X", "W", "b", "S"], ["S"], relu=1, blocked=y_block, **args), inputs,
        mode)
    assert in_place
    if mode == "exhaustive":   # the search may pick another algorithm: its own rounding
        np.testing.assert_allclose(over, apart, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(over, apart)


@needs_onednn
def test_blocked_conv_shape_errors():
    rng = np.random.default_rng(0)
    x, w, b, args = _conv_case(rng, 1, 12, 8, 6, 3, 1, 1)
    with pytest.raises(ShapeError, match="blocks of 8"):   # 12 channels are 2 blocks, not 3
        run_op(netrun.op("Conv", ["X", "W"], ["Y"], **args),
               {"X": np.zeros((1, 3, 6, 6, 8), np.float32), "W": w})
    with pytest.raises(ShapeError, match="group 1"):
        run_op(netrun.op("Conv", ["X", "W"], ["Y"], blocked=8, group=2, **args),
               {"X": np.zeros((1, 12, 6, 6), np.float32), "W": w[:, :6]})
    # a block that is neither oneDNN's nor every channel (channels-last)
    with pytest.raises(ShapeError, match="Y's channel block 4 is neither"):
        run_op(netrun.op("Conv", ["X", "W"], ["Y"], blocked=4, **args),
               {"X": np.zeros((1, 12, 6, 6), np.float32), "W": w})
    with pytest.raises(ShapeError, match="X's channel block 12 is neither"):
        run_op(netrun.op("Conv", ["X", "W"], ["Y"], **args),
               {"X": np.zeros((1, 1, 6, 6, 12), np.float32), "W": w[:, :8]})


@pytest.mark.parametrize("type_", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("way", ["team", "workers"])
def test_global_pooling_in_image_chunks_gives_the_one_calls_bits(type_, way, monkeypatch):
    """Past `POOL_ONE_CALL` elements, blocked global pooling runs in image chunks, on the
    OpenMP team where it runs or on netrun's worker threads: each image's result is the one
    call's."""
    from netrun.kernels import layout, omp, parallel

    if not jit.available():
        pytest.skip("the compiled engine (Numba) is not installed")
    if way == "team" and not omp.usable(np):
        pytest.skip("Numba's OpenMP threading layer does not load here")
    rng = np.random.default_rng(5)
    x = blocked_reference(rng.standard_normal((8, 12, 4, 5)).astype(np.float32), 8)
    op = netrun.op(type_, ["X"], ["Y"], global_pooling=1)
    (one,) = run_op(op, {"X": x})
    monkeypatch.setattr(layout, "POOL_ONE_CALL", 0)
    monkeypatch.setattr(parallel, "MIN_ELEMENTS", 1)      # several chunks even when small
    monkeypatch.setattr(parallel, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(parallel, "thread_count", lambda: 2)
    # the team takes the chunks where its threads spin briefly (PyTorch, imported by the
    # tests, may have loaded libgomp with its long spin)
    monkeypatch.setattr(omp, "_SPIN", {"short": way == "team"})
    launched, launch = [], omp.launch
    monkeypatch.setattr(omp, "launch", lambda k, *a: launched.append(k.__name__) or launch(k, *a))
    (chunked,) = run_op(op, {"X": x})
    assert launched == (["global_pool_team"] if way == "team" else [])
    np.testing.assert_array_equal(chunked, one)


@pytest.mark.parametrize("type_", ["MaxPool", "AveragePool"])
def test_global_pooling_of_blocked_arrays(type_):
    """The layout plan's global pooling: a blocked X pools into a blocked N×⌈C/B⌉×1×1×B
    (the padding channels stay 0); other pooling refuses a blocked X."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 12, 5, 6)).astype(np.float32)
    (want,) = run_op(netrun.op(type_, ["X"], ["Y"], global_pooling=1), {"X": x})
    (got,) = run_op(netrun.op(type_, ["X"], ["Y"], global_pooling=1),
                    {"X": blocked_reference(x, 8)})
    np.testing.assert_allclose(got, blocked_reference(want, 8), rtol=1e-6, atol=1e-6)
    with pytest.raises(ShapeError, match="global_pooling=1"):
        run_op(netrun.op(type_, ["X"], ["Y"], kernel=2), {"X": blocked_reference(x, 8)})
