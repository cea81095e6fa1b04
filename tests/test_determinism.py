"""Same inputs, same seed: the same bits, whatever the thread settings (netrun.kernels.parallel).

Training runs in fresh processes with the BLAS's and netrun's thread counts changed must write
bitwise-identical checkpoints; every CPU convolution algorithm and the split GEMMs give the
same bits on 1, 2 and 3 worker threads; and the chunk machinery keeps its promises (a
partition that ignores the thread count, commits in chunk order, no hang on errors).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import netrun
from netrun.conv.algorithm import ConvProblem, algorithms
from netrun.conv.cpu import onednn as onednn_conv
from netrun.kernels import jit, onednn, parallel
from tests.train.conftest import write_config

REPO = Path(__file__).resolve().parents[1]

# Big enough that the conv passes are cut into several chunks (conv2's filter gradient sums
# partial results across them) and the FC products into blocks; small enough to train in
# about a second.
MODEL = """\
name: Small
inputs: {data: [1, 28, 28], label: []}
layers:
  - {type: conv, name: c1, input: data, num_output: 20, kernel: 5}
  - {type: max_pool, name: p1, kernel: 2, stride: 2}
  - {type: conv, name: c2, num_output: 32, kernel: 3}
  - {type: relu, name: r1}
  - {type: fc, name: f1, num_output: 256}
  - {type: dropout, name: d1, ratio: 0.3}
  - {type: fc, name: f2, num_output: 10}
loss: {type: softmax_cross_entropy, input: f2, label: label}
metrics: [{type: accuracy, input: f2, label: label}]
"""
THREAD_VARS = ("NETRUN_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def small_config(tmp_path, solver: str = "") -> str:
    """The tests' tiny training config with the wider MODEL, batches of 64."""
    config = write_config(tmp_path, solver, train_count=640)
    (tmp_path / "tiny.yaml").write_text(MODEL)
    text = Path(config).read_text().replace("batch_size: 16", "batch_size: 64")
    Path(config).write_text(text)
    return config


def _train_in_fresh_process(config: str, output: Path, env: dict[str, str]) -> dict:
    """Train 12 iterations with `netrun train` in a new process; the checkpoint's arrays."""
    clean = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    clean["PYTHONPATH"] = os.pathsep.join([str(REPO), clean.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "netrun.cli", "-q", "train", config,
                           "-o", str(output), "--max-iter", "12"],
                          env={**clean, **env}, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    arrays = {}
    with h5py.File(output / "last.h5", "r") as f:
        for group in ("params", "optimizer"):
            f[group].visititems(lambda name, d, g=group: arrays.__setitem__(
                f"{g}/{name}", d[()]) if isinstance(d, h5py.Dataset) else None)
    return arrays


def test_checkpoints_are_bitwise_identical_whatever_the_thread_settings(tmp_path):
    config = small_config(tmp_path)
    settings = {"default": {}, "default again": {}, "OPENBLAS_NUM_THREADS=1":
                {"OPENBLAS_NUM_THREADS": "1"}, "NETRUN_THREADS=1": {"NETRUN_THREADS": "1"},
                "NETRUN_THREADS=2": {"NETRUN_THREADS": "2"}}
    runs = {name: _train_in_fresh_process(config, tmp_path / f"run{i}", env)
            for i, (name, env) in enumerate(settings.items())}
    first = runs.pop("default")
    assert len(first) >= 12 and any(k.startswith("optimizer/") for k in first)
    for name, arrays in runs.items():
        assert arrays.keys() == first.keys(), name
        for key in first:
            assert np.array_equal(arrays[key], first[key]), f"{key} differs with {name}"


# Operators and algorithms on 1, 2 and 3 worker threads --------------------------------------
PROBLEMS = {   # per algorithm: a float32 problem it applies to, big enough for several chunks
    "im2col_gemm": ConvProblem(8, 6, 9, 8, 10, 3, 3, 1, 1, 1, 0, 2, 1, group=2),
    "gemm_1x1": ConvProblem(8, 6, 9, 8, 10, 1, 1, 2, 1, 0, 0, 0, 0, group=2),
    "shift_gemm": ConvProblem(8, 6, 9, 8, 10, 3, 3, 1, 2, 1, 0, 2, 1),
    "fft": ConvProblem(8, 6, 9, 8, 10, 3, 3, 1, 1, 1, 0, 2, 1),
    "dft_gemm": ConvProblem(8, 6, 9, 8, 10, 3, 3, 1, 1, 1, 0, 2, 1),
    "winograd_f2x2": ConvProblem(8, 6, 9, 8, 10, 3, 3, 1, 1, 1, 0, 2, 1),
    "winograd_f4x4": ConvProblem(8, 6, 9, 8, 10, 3, 3, 1, 1, 1, 0, 2, 1),
    "depthwise": ConvProblem(8, 6, 9, 8, 12, 3, 3, 2, 1, 1, 0, 2, 1, group=6),
    "depthwise_jit": ConvProblem(8, 6, 9, 8, 12, 3, 3, 1, 1, 1, 0, 2, 1, group=6),
    "winograd_jit": ConvProblem(8, 6, 9, 8, 10, 3, 3, 1, 1, 1, 0, 2, 1, 2, 1),
    "onednn": ConvProblem(8, 6, 9, 8, 10, 3, 3, 2, 1, 1, 0, 2, 1, 2, 1, group=2),
    # one image: the forward pass is one call on an OpenMP team of the thread count
    "onednn@batch1": ConvProblem(1, 6, 9, 8, 40, 3, 3, 1, 1, 1, 0, 2, 1),
    "onednn@batch1_1x1": ConvProblem(1, 16, 9, 8, 40, 1, 1),
    # 128+ channels: the forward pass runs oneDNN's BRGEMM kernels, on a team for one image
    "onednn@batch1_brgemm": ConvProblem(1, 128, 9, 8, 128, 3, 3, 1, 1, 1, 1, 1, 1),
    "onednn@brgemm": ConvProblem(4, 128, 9, 8, 128, 3, 3, 2, 2, 1, 1, 1, 1),
    "onednn@batch1_strided_dilated": ConvProblem(1, 8, 9, 8, 16, 3, 3, 2, 2, 1, 1, 1, 1, 2, 2),
    "onednn@batch1_depthwise": ConvProblem(1, 8, 9, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, group=8),
    # grouped: no direct kernel takes a team, so the channel split's fallback (one call)
    "onednn@batch1_grouped": ConvProblem(1, 8, 9, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, group=2),
}


def _conv_passes(name: str, p: ConvProblem, threads: int, monkeypatch) -> list[np.ndarray]:
    """Forward (with bias), backward-data, backward-filter and db of one algorithm."""
    monkeypatch.setattr(parallel, "thread_count", lambda: threads)
    algo = algorithms("cpu")[name.split("@")[0]]
    rng = np.random.default_rng(5)
    x, w, dy, b = (rng.standard_normal(s).astype(p.dtype) for s in (
        (p.n, p.c, p.h, p.w), (p.k, p.cg, p.kh, p.kw), (p.n, p.k, p.oh, p.ow), (p.k,)))
    y, dx, dw, db = (np.full(s, np.nan, p.dtype) for s in (dy.shape, x.shape, w.shape, b.shape))
    scratch = netrun.Workspace().scratch
    algo.forward(np, x, w, p, y, scratch, bias=b)
    algo.backward_data(np, dy, w, p, dx, scratch)
    algo.backward_filter(np, x, dy, p, dw, scratch, dbias=db)
    return [y, dx, dw, db]


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_every_cpu_algorithm_gives_the_same_bits_on_any_thread_count(name, monkeypatch):
    if name in ("depthwise_jit", "winograd_jit") and not jit.available():
        pytest.skip("the compiled engine (Numba) is not installed")
    if name.startswith("onednn") and not onednn.available():
        pytest.skip("the oneDNN engine is not installed")
    p = PROBLEMS[name]
    assert algorithms("cpu")[name.split("@")[0]].applicable(p)
    # every chunk and block as small as the problem allows, so the work really is cut up
    monkeypatch.setattr(parallel, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(parallel, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(parallel, "GEMM_MIN_FLOPS", 1)
    monkeypatch.setattr(parallel, "GEMM_MIN_SIDE", 1)
    monkeypatch.setattr(onednn_conv, "CHUNK_MIN_FLOPS", 1)
    monkeypatch.setattr(onednn_conv, "CHUNK_FLOPS", 1)
    one = _conv_passes(name, p, 1, monkeypatch)
    for threads in (2, 3):
        other = _conv_passes(name, p, threads, monkeypatch)
        for what, a, b in zip(("forward", "backward_data", "backward_filter", "db"), one, other):
            assert not np.isnan(a).any(), f"{name} {what} left elements unwritten"
            assert np.array_equal(a, b), f"{name} {what}: 1 and {threads} threads differ"


@pytest.mark.parametrize("problem", [ConvProblem(8, 16, 9, 9, 24, 3, 3, 1, 1, 1, 1, 1, 1),
                                     ConvProblem(4, 32, 7, 7, 64, 1, 1),
                                     ConvProblem(1, 8, 12, 12, 16, 3, 3, 2, 2, 1, 1, 1, 1),
                                     ConvProblem(3, 128, 7, 7, 136, 3, 3, 1, 1, 1, 1, 1, 1)],
                         ids=["3x3", "1x1", "strided_batch1", "brgemm_3x3"])
def test_blocked_layout_forward_gives_the_same_bits_on_any_thread_count(problem, monkeypatch):
    """Blocked arrays (the layout plan's) run one call on an OpenMP team at every batch: a
    direct kernel's output, with a blocked residual summed by the primitive, must not depend
    on the team's size."""
    if not onednn.available():
        pytest.skip("the oneDNN engine is not installed")
    from netrun.kernels.onednn.conv import Layout
    from tests.ops.test_layout_ops import blocked_reference

    p = problem
    rng = np.random.default_rng(9)
    x = blocked_reference(rng.standard_normal((p.n, p.c, p.h, p.w)).astype(np.float32), 8)
    w = rng.standard_normal((p.k, p.c, p.kh, p.kw)).astype(np.float32)
    b = rng.standard_normal(p.k).astype(np.float32)
    s = blocked_reference(rng.standard_normal((p.n, p.k, p.oh, p.ow)).astype(np.float32), 8)
    algo = algorithms("cpu")["onednn"]
    for residual in (None, s):   # without one, 128+ channels run oneDNN's BRGEMM kernels
        results = []
        for threads in (1, 2, 3):
            monkeypatch.setattr(parallel, "thread_count", lambda: threads)
            y = np.full(s.shape, np.nan, np.float32)
            algo.forward(np, x, w, p, y, netrun.Workspace().scratch, bias=b, relu=True,
                         residual=residual, layout=Layout(8, 8))
            assert not np.isnan(y).any()
            results.append(y)
        for threads, y in zip((2, 3), results[1:]):
            assert np.array_equal(results[0], y), f"1 and {threads} threads differ"


def test_fc_op_gives_the_same_bits_on_any_thread_count(monkeypatch):
    from tests.opcheck import netrun_forward_backward

    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 800)).astype(np.float32)
    w = rng.standard_normal((500, 800)).astype(np.float32)
    b = rng.standard_normal(500).astype(np.float32)
    dy = rng.standard_normal((64, 500)).astype(np.float32)
    op = netrun.op("FC", ["X", "W", "b"], ["Y"])
    results = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(parallel, "thread_count", lambda t=threads: t)
        results.append(netrun_forward_backward(op, {"X": x, "W": w, "b": b}, dy))
    for (y, grads), threads in zip(results[1:], (2, 3)):
        assert np.array_equal(y[0], results[0][0][0]), f"Y differs on {threads} threads"
        for name in ("X", "W", "b"):
            assert np.array_equal(grads[name], results[0][1][name]), f"d{name}, {threads}"


@pytest.mark.parametrize("shapes", [((64, 800), (800, 500)), ((700, 300), (300, 90)),
                                    ((6, 3, 40, 50), (3, 50, 70)), ((1, 40, 50), (9, 50, 70))])
def test_split_matmul_is_the_product_and_ignores_the_thread_count(shapes, monkeypatch):
    monkeypatch.setattr(parallel, "GEMM_MIN_FLOPS", 1)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    outs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(parallel, "thread_count", lambda t=threads: t)
        out = np.full(np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, 1))[:-1]
                      + (b.shape[-1],), np.nan, np.float32)
        parallel.matmul(np, a, b, out)
        outs.append(out)
    np.testing.assert_allclose(outs[0], a @ b, rtol=1e-4, atol=1e-3)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


# The chunk machinery ---------------------------------------------------------------------------
def test_the_partition_depends_on_the_work_not_on_the_thread_count(monkeypatch):
    seen = {}
    for threads in (1, 2, 3, 16):
        monkeypatch.setattr(parallel, "thread_count", lambda t=threads: t)
        got = []
        parallel.chunks(np, 7, lambda i, a, b, got=got: got.append((i, a, b)), work=1 << 30)
        seen[threads] = sorted(got)
    assert seen[1] == [(0, 0, 1), (1, 1, 3), (2, 3, 5), (3, 5, 7)]   # a power of two <= 7
    assert all(s == seen[1] for s in seen.values())
    assert parallel.chunk_count(100, 3 * parallel.MIN_ELEMENTS) == 2   # at least MIN per chunk
    assert parallel.chunk_count(100, 10) == 1
    assert parallel.chunk_count(1000) == parallel.MAX_CHUNKS


def test_commits_run_in_chunk_order_however_the_chunks_finish(monkeypatch):
    monkeypatch.setattr(parallel, "thread_count", lambda: 3)
    order, delays = [], [0.03, 0.0, 0.02, 0.0, 0.01, 0.0, 0.0, 0.0]

    def work(index, n0, n1):
        time.sleep(delays[index])     # later chunks finish first
        return lambda: order.append(index)

    parallel.chunks(np, 8, work)
    assert order == list(range(8))


def test_a_failing_chunk_raises_and_leaves_no_worker_waiting(monkeypatch):
    monkeypatch.setattr(parallel, "thread_count", lambda: 2)

    def work(index, n0, n1):
        if index == 0:
            raise ValueError("chunk 0 failed")
        return lambda: None           # chunk 1's commit waits for chunk 0, which never ends

    with pytest.raises(ValueError, match="chunk 0 failed"):
        parallel.chunks(np, 8, work)
    parallel.chunks(np, 8, lambda i, a, b: None)   # the pool still works


def test_chunks_running_at_once_get_private_scratch(monkeypatch):
    monkeypatch.setattr(parallel, "thread_count", lambda: 2)
    ws = netrun.Workspace()
    a = parallel.chunk_scratch(ws.scratch, 0)("k", (4,))
    b = parallel.chunk_scratch(ws.scratch, 1)("k", (4,))
    assert not np.shares_memory(a, b)
    # chunk 2 runs on chunk 0's worker after it: it may reuse chunk 0's buffers
    assert np.shares_memory(a, parallel.chunk_scratch(ws.scratch, 2)("k", (4,)))
    # and no chunk's buffers are in use by another chunk at the same time
    busy, clashes, lock = {}, [], threading.Lock()

    def work(index, n0, n1):
        buf = parallel.chunk_scratch(ws.scratch, index)("probe", (16,))
        with lock:
            if buf.ctypes.data in busy:
                clashes.append((index, busy[buf.ctypes.data]))
            busy[buf.ctypes.data] = index
        time.sleep(0.005)
        with lock:
            del busy[buf.ctypes.data]

    parallel.chunks(np, 8, work)
    assert not clashes


def test_the_blas_runs_on_one_thread_once_netrun_runs():
    from threadpoolctl import threadpool_info

    parallel.start()
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    assert blas and all(i["num_threads"] == 1 for i in blas)


def test_netrun_threads_sets_the_worker_count(monkeypatch):
    for var in THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRUN_THREADS", "3")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert parallel.thread_count() == 3
    monkeypatch.delenv("NETRUN_THREADS")
    assert parallel.thread_count() == 1       # a user limiting the BLAS limits netrun too
