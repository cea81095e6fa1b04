"""`netrun profile --trace`: a Chrome Trace Event timeline of the timed iterations (iteration,
phase and op slices, op args, worker-thread chunks, the device stream), and profile's progress."""
from __future__ import annotations

import json
import threading
from collections import defaultdict

import numpy as np
import pytest

import netrun
from netrun.kernels import parallel
from netrun.profile.timing import profile_net
from netrun.profile.trace import (
    MAIN_TID,
    STREAM_TID,
    WORKER_TID,
    ChunkLog,
    IterationMarks,
    Timeline,
    trace_document,
)
from netrun.proto.defs import NetDef
from tests.test_cli import LENET, run

TICKS_PER_US = 8      # the trace writes eighths of a microsecond


def _ticks(value: float) -> int:
    """A written time in ticks; it must be a whole number of them (exact in binary)."""
    ticks = value * TICKS_PER_US
    assert ticks == int(ticks), value
    return int(ticks)


def _slices(events, tid=None, cat=None):
    return [e for e in events if e["ph"] == "X" and (tid is None or e["tid"] == tid)
            and (cat is None or e["cat"] == cat)]


def _inside(child, parent) -> bool:
    c0, p0 = _ticks(child["ts"]), _ticks(parent["ts"])
    return p0 <= c0 and c0 + _ticks(child["dur"]) <= p0 + _ticks(parent["dur"])


def _thread_names(events) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"}


def check_well_formed(doc: dict) -> None:
    """What any viewer needs: known phases, times ≥ 0 in ticks, and on every track slices
    that either nest or follow each other (never overlap partly)."""
    events = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ms"
    assert {e["ph"] for e in events} <= {"X", "M"}
    pids = {e["pid"] for e in events}
    assert len(pids) == 1
    tracks = defaultdict(list)
    for e in _slices(events):
        assert _ticks(e["ts"]) >= 0 and _ticks(e["dur"]) >= 0
        tracks[e["tid"]].append(e)
    named = _thread_names(events)
    for tid, slices in tracks.items():
        assert tid in named, f"track {tid} has no thread_name"
        slices.sort(key=lambda e: (_ticks(e["ts"]), -_ticks(e["dur"])))
        stack: list[dict] = []
        for e in slices:
            while stack and _ticks(e["ts"]) >= _ticks(stack[-1]["ts"]) + _ticks(stack[-1]["dur"]):
                stack.pop()
            assert not stack or _inside(e, stack[-1]), (e, stack[-1])
            stack.append(e)


def check_iterations(doc: dict, ops: list[dict], iters: int, tid: int = MAIN_TID) -> None:
    """`iters` iteration slices in order, each holding its phases in the net's order, each
    phase holding its ops (with the profile's names, types, phases and FLOPs), in order."""
    events = _slices(doc["traceEvents"], tid)
    iterations = sorted(_slices(events, cat="iteration"), key=lambda e: e["ts"])
    assert [e["name"] for e in iterations] == [f"iteration {k}" for k in range(1, iters + 1)]
    for earlier, later in zip(iterations, iterations[1:]):
        assert _ticks(earlier["ts"]) + _ticks(earlier["dur"]) <= _ticks(later["ts"])
    phases_in_order = [p for i, p in enumerate(o["phase"] for o in ops)
                       if i == 0 or ops[i - 1]["phase"] != p]
    for k, it in enumerate(iterations, 1):
        phases = sorted((e for e in _slices(events, cat="phase") if _inside(e, it)),
                        key=lambda e: e["ts"])
        assert [p["name"] for p in phases] == phases_in_order
        slices = sorted((e for e in _slices(events, cat="op") if e["args"]["iteration"] == k),
                        key=lambda e: (e["ts"], e["args"]["index"]))
        assert [e["name"] for e in slices] == [o["name"] for o in ops]
        for e, o in zip(slices, ops):
            assert _inside(e, it)
            assert e["args"]["type"] == o["type"] and e["args"]["phase"] == o["phase"]
            assert e["args"]["flops"] == o["flops"] and e["args"]["index"] == o["index"]
            assert len([p for p in phases if _inside(e, p) and p["name"] == o["phase"]]) == 1
        for a, b in zip(slices, slices[1:]):     # each op from its own start to its own end
            assert _ticks(a["ts"]) + _ticks(a["dur"]) <= _ticks(b["ts"])


def test_lenet_trace_from_the_cli(tmp_path):
    trace, report = tmp_path / "lenet.json", tmp_path / "lenet-profile.json"
    result = run("profile", LENET, "-b", "8", "--iters", "3", "--warmup", "1",
                 "--trace", str(trace), "--json", str(report))
    assert "trace of 3 iterations written to" in result.stderr
    doc = json.loads(trace.read_text())
    ops = json.loads(report.read_text())["ops"]
    check_well_formed(doc)
    check_iterations(doc, ops, 3)
    events = doc["traceEvents"]
    (process,) = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert process.startswith(f"netrun profile {LENET} (cpu")
    assert _thread_names(events)[MAIN_TID] == "main thread"
    assert STREAM_TID not in _thread_names(events)      # the CPU has no device stream
    assert doc["otherData"]["iterations"] == 3 and doc["otherData"]["batch"] == 8
    # the op args: the algorithm chosen, the shapes each op saw, in every iteration
    conv1 = [e for e in _slices(events, MAIN_TID, "op") if e["name"] == "conv1"]
    assert len(conv1) == 3
    profiled = next(o for o in ops if o["name"] == "conv1")
    for e in conv1:
        assert e["args"]["algo"] == profiled["algo"] and e["args"]["algo"]
        assert e["args"]["inputs"] == {"data": [8, 1, 28, 28], "conv1_w": [20, 1, 5, 5],
                                       "conv1_b": [20]}
        assert e["args"]["outputs"] == {"conv1": [8, 20, 24, 24]}
    # the runs without per-op marks (the iteration time) sit before their marked run
    unmarked = sorted(_slices(events, MAIN_TID, "unmarked"), key=lambda e: e["ts"])
    marked = sorted(_slices(events, MAIN_TID, "iteration"), key=lambda e: e["ts"])
    assert len(unmarked) == 3
    for u, m in zip(unmarked, marked):
        assert _ticks(u["ts"]) + _ticks(u["dur"]) <= _ticks(m["ts"])


def test_trace_with_json_on_stdout_and_the_dag_executor(tmp_path):
    trace = tmp_path / "dag.json"
    result = run("profile", LENET, "-b", "4", "--iters", "2", "--warmup", "0", "--forward-only",
                 "--executor", "dag", "--trace", str(trace), "--json", "-")
    ops = json.loads(result.stdout)["ops"]
    doc = json.loads(trace.read_text())
    check_well_formed(doc)
    check_iterations(doc, ops, 2)
    assert doc["otherData"]["executor"] == "dag"


def _big_fc_net(ws) -> tuple:
    """One FC op big enough for parallel.matmul to cut into blocks (2·256·512·1024 flops)."""
    rng = np.random.default_rng(0)
    ws.feed_blob("X", rng.standard_normal((256, 1024)).astype(np.float32))
    ws.feed_blob("W", rng.standard_normal((512, 1024)).astype(np.float32))
    ws.feed_blob("b", np.zeros(512, np.float32))
    net = NetDef("big_fc", [netrun.op("FC", ["X", "W", "b"], ["Y"], name="fc"),
                            netrun.op("Relu", ["Y"], ["Z"], name="relu")])
    return ws.create_net(net)


def test_worker_threads_show_each_chunk(monkeypatch):
    monkeypatch.setenv(parallel.ENV, "2")
    ws = netrun.Workspace("cpu")
    net = _big_fc_net(ws)
    result = profile_net(net, iters=2, warmup=1, phases=["forward", "forward"], trace=True)
    doc = result.trace("netrun profile big_fc", {"model": "big_fc"})
    check_well_formed(doc)
    events = doc["traceEvents"]
    names = _thread_names(events)
    assert names[WORKER_TID] == "worker 0 (main thread)" and names[WORKER_TID + 1] == "worker 1"
    fc = {e["args"]["iteration"]: e for e in _slices(events, MAIN_TID, "op") if e["name"] == "fc"}
    assert fc[1]["args"]["inputs"] == {"X": [256, 1024], "W": [512, 1024], "b": [512]}
    assert fc[1]["args"]["outputs"] == {"Y": [256, 512]}
    chunks = _slices(events, cat="chunk")
    # A track per thread that ran chunks: the caller's, and the pool's (a pool made larger
    # by an earlier caller may hand worker 1's blocks to a different thread each iteration).
    tids = {e["tid"] for e in chunks}
    assert WORKER_TID in tids and len(tids) >= 2 and all(t > WORKER_TID for t in tids - {WORKER_TID})
    assert {e["args"]["kind"] for e in chunks} == {"gemm block"}
    count = chunks[0]["args"]["of"]
    assert count >= 2 and len(chunks) == 2 * count        # every block of both iterations
    for e in chunks:
        # each block lies within the FC op of its iteration, on the worker its index says
        assert any(_inside(e, op) for op in fc.values()), e
        assert e["args"]["worker"] == e["args"]["chunk"] % 2
        assert (e["tid"] == WORKER_TID) == (e["args"]["worker"] == 0)
        assert e["name"] == f"gemm block {e['args']['chunk'] + 1}/{count}"
    json.loads(json.dumps(doc))       # plain JSON, nothing a json reader cannot load


def test_untraced_profiles_keep_nothing(monkeypatch):
    monkeypatch.setenv(parallel.ENV, "2")
    ws = netrun.Workspace("cpu")
    net = _big_fc_net(ws)
    calls = []
    result = profile_net(net, iters=2, warmup=1, progress=lambda *a: calls.append(a))
    assert result.timeline is None and result.ops[0].input_shapes == {}
    assert all(len(o.times_ms) == 2 for o in result.ops)
    assert calls == [("warm-up", 0, 1), ("warm-up", 1, 1), ("timing", 0, 2), ("timing", 1, 2),
                     ("timing", 2, 2)]
    with pytest.raises(ValueError, match="not traced"):
        result.trace("netrun profile big_fc")


def test_the_recorder_hears_only_its_own_context(monkeypatch):
    monkeypatch.setenv(parallel.ENV, "2")
    a = np.ones((512, 2048), np.float32)
    b = np.ones((2048, 512), np.float32)
    out = np.empty((512, 512), np.float32)
    log, elsewhere = ChunkLog(), []

    def other_thread():
        parallel.matmul(np, a, b, out)
        elsewhere.append(True)

    with parallel.recording(log):
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert elsewhere and not log.records      # another thread's split: not this run's
        parallel.matmul(np, a, b, out)
        count = len(log.records)
        assert count >= 2
    np.testing.assert_array_equal(out, 2048)
    parallel.matmul(np, a, b, out)          # after the block: nothing more recorded
    assert len(log.records) == count

    # chunks: every chunk reported once, the commits still added in chunk order
    total, seen = [0.0], []

    def fn(i, n0, n1):
        return lambda: (seen.append(i), total.__setitem__(0, total[0] + (n1 - n0)))

    log = ChunkLog()
    with parallel.recording(log):
        parallel.chunks(np, 64, fn, work=1 << 22)
    n = parallel.chunk_count(64, 1 << 22)
    assert n >= 2 and seen == list(range(n)) and total[0] == 64
    assert sorted(r.index for r in log.records) == list(range(n))
    assert {r.kind for r in log.records} == {"chunk"} and {r.count for r in log.records} == {n}
    assert all(r.end >= r.start for r in log.records)


class _Op:
    def __init__(self, index, name, phase):
        self.index, self.name, self.type, self.phase = index, name, "Relu", phase
        self.algo, self.flops, self.output_bytes = "", 10, 40
        self.input_shapes, self.output_shapes = {"x": [10]}, {"y": [10]}


def test_the_device_stream_gets_its_own_track():
    """A GPU timeline (built from readings, so it runs without a GPU): the device's op
    slices, anchored on the host clock, get a '<device> stream' track of their own."""
    ops = [_Op(0, "a", "forward"), _Op(1, "b", "backward"), _Op(2, "c", "update")]
    timeline = Timeline("gpu:0", "NVIDIA H100", "simple", threading.get_ident())
    for k in range(2):
        base = 1000.0 + k
        host = [(base + 0.001 * i, base + 0.001 * i + 0.0002) for i in range(3)]
        device = [(base + 0.0005 + 0.002 * i, base + 0.0015 + 0.002 * i) for i in range(3)]
        timeline.iterations.append(IterationMarks((base - 0.1, base - 0.05), host, device))
    doc = trace_document(timeline, ops, "netrun profile tiny")
    check_well_formed(doc)
    opdicts = [{"name": o.name, "type": o.type, "phase": o.phase, "flops": o.flops,
                "index": o.index} for o in ops]
    check_iterations(doc, opdicts, 2, MAIN_TID)
    check_iterations(doc, opdicts, 2, STREAM_TID)
    names = _thread_names(doc["traceEvents"])
    assert names[STREAM_TID] == "gpu:0 stream"
    (process,) = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert process == "netrun profile tiny (gpu:0, NVIDIA H100)"
    stream_ops = _slices(doc["traceEvents"], STREAM_TID, "op")
    # 0.0005 s after 0.1 s before the first unmarked run began: 100500 µs from time zero
    assert stream_ops[0]["ts"] == 100500 and stream_ops[0]["dur"] == 1000


def test_progress_on_a_terminal_only():
    args = ("profile", LENET, "-b", "2", "--iters", "2", "--warmup", "1", "--forward-only")
    piped = run(*args).stderr
    assert "timing" not in piped and "2/2" not in piped
    shown = run("--color", *args).stderr       # --color: stderr taken for a terminal
    assert "timing" in shown and "2/2" in shown
    assert "--trace FILE" in run("profile", "--help").stdout
    help_text = " ".join(run("profile", "--help").stdout.split())
    assert "ui.perfetto.dev" in help_text and "Examples:" in help_text
