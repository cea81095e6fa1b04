"""`netrun profile --trace`: the timed iterations as a Chrome Trace Event Format timeline.

What profile_net measured, on one clock (time.perf_counter): each timed iteration's run with
per-op marks (an enclosing slice, its phases inside it, each op inside its phase, from the
op's own start and end marks), the same iteration's run without marks (the time the table
reports), and, on a GPU, the same slices again on the device stream from the CUDA events,
anchored where the host last waited for the device. CPU kernels that split their work over
netrun's thread pool (netrun.kernels.parallel) report each chunk to a ChunkLog; each chunk
becomes a slice on its thread's track: "worker 0" for the chunks the calling thread runs
itself, "worker 1", "worker 2", ... for the pool's threads in the order they first worked.

Times (ts, dur) are microseconds rounded to eighths: binary fractions, which a reader turns
into nanoseconds exactly, so a slice never pokes out of its parent by a rounding error
however the reader converts (a phase ends where its last op does). Perfetto
(ui.perfetto.dev) and chrome://tracing open the file.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, Protocol, Sequence

from netrun.util.atomic import atomic_open
from netrun.version import __version__

# Track ids: small fixed numbers rather than OS thread ids, so that every trace of the same
# net reads the same (the main thread first, then the device stream, then the workers).
MAIN_TID = 1
STREAM_TID = 2
WORKER_TID = 100       # + N for "worker N"

Span = tuple[float, float]     # (start, end), perf_counter seconds


class OpFacts(Protocol):
    """What a trace says about an op (netrun.profile.timing.OpTiming has it)."""

    index: int
    name: str
    type: str
    phase: str
    algo: str
    flops: int
    output_bytes: int
    input_shapes: dict[str, list[int] | None]
    output_shapes: dict[str, list[int] | None]


@dataclass
class IterationMarks:
    """One timed iteration's clock readings (perf_counter seconds)."""

    unmarked: Span                      # the run without per-op marks (the iteration time)
    host: list[Span]                    # each op's start and end on the host
    device: list[Span] | None = None    # the same on the device stream (GPU), host clock


@dataclass(frozen=True)
class ChunkRecord:
    """One chunk of a split kernel, as netrun.kernels.parallel reported it."""

    thread: int          # threading.get_ident() of the thread that ran it
    thread_name: str
    kind: str            # 'chunk' (of a batch) or 'gemm block'
    index: int
    count: int
    worker: int          # the pool's worker slot (chunk i runs on worker i % T)
    start: float
    end: float


class ChunkLog:
    """A recorder for netrun.kernels.parallel.recording: keeps every chunk reported while it is
    installed (chunks are reported from several threads at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[ChunkRecord] = []

    def chunk(self, kind: str, index: int, count: int, worker: int, start: float,
              end: float) -> None:
        """Keep one chunk's run (called on the thread that ran it)."""
        thread = threading.current_thread()
        record = ChunkRecord(thread.ident or 0, thread.name, kind, index, count, worker,
                             start, end)
        with self._lock:
            self.records.append(record)


@dataclass
class Timeline:
    """Everything a trace file is made of, in clock readings."""

    device: str                         # 'cpu', 'gpu:0'
    device_name: str                    # the hardware's name
    executor: str                       # 'simple' or 'dag'
    main_thread: int                    # ident of the thread that ran the nets
    iterations: list[IterationMarks] = field(default_factory=list)
    chunks: ChunkLog = field(default_factory=ChunkLog)

    @property
    def device_timed(self) -> bool:
        """Whether ops were also timed on a device stream (GPU events)."""
        return any(it.device is not None for it in self.iterations)


def trace_document(timeline: Timeline, ops: Sequence[OpFacts], process: str,
                   other: dict[str, Any] | None = None) -> dict:
    """The trace as a JSON-ready dict: {"traceEvents": [...], "displayTimeUnit": "ms", ...}.

    `process` names the process track (e.g. "netrun profile zoo/lenet.yaml"); the device is
    added to it. `other` goes into the file's otherData (what was profiled, how)."""
    origin = _origin(timeline)
    events: list[dict] = []
    for k, marks in enumerate(timeline.iterations, 1):
        start, end = marks.unmarked
        events.append(_slice(MAIN_TID, f"iteration {k} (unmarked)", "unmarked", start, end,
                             origin, {"iteration": k, "note": "the same iteration run without "
                                      "per-op marks: the iteration time profile reports"}))
        events += _iteration(MAIN_TID, k, marks.host, ops, origin)
        if marks.device is not None:
            events += _iteration(STREAM_TID, k, marks.device, ops, origin)
    workers = _worker_tracks(timeline)
    for record in timeline.chunks.records:
        events.append(_slice(workers[record.thread][0],
                             f"{record.kind} {record.index + 1}/{record.count}", "chunk",
                             record.start, record.end, origin,
                             {"kind": record.kind, "chunk": record.index, "of": record.count,
                              "worker": record.worker, "thread": record.thread_name}))
    pid = os.getpid()
    for e in events:
        e["pid"] = pid
    # Parents before children: by track, then start, then the longer first.
    events.sort(key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    meta = _metadata(timeline, process, workers, pid)
    data = {"version": __version__, "device": timeline.device,
            "device_name": timeline.device_name, "executor": timeline.executor,
            "iterations": len(timeline.iterations), **(other or {})}
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": data}


def write_trace(path: str | os.PathLike, document: dict) -> None:
    """Write a trace document (trace_document) to `path`, replacing it whole."""
    with atomic_open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(document, f, separators=(",", ":"))


# Building the events -------------------------------------------------------------------------
def _origin(timeline: Timeline) -> float:
    """The earliest reading: time zero of the trace."""
    readings = [it.unmarked[0] for it in timeline.iterations]
    readings += [it.host[0][0] for it in timeline.iterations if it.host]
    readings += [it.device[0][0] for it in timeline.iterations if it.device]
    readings += [r.start for r in timeline.chunks.records]
    return min(readings, default=0.0)


# Ticks of the written times per second: eighths of a microsecond (125 ns).
TICKS = 8e6


def _ticks(t: float, origin: float) -> int:
    return round((t - origin) * TICKS)


def _slice(tid: int, name: str, cat: str, start: float, end: float, origin: float,
           args: dict) -> dict:
    """A complete event ('X', its pid added by trace_document), its times rounded to ticks
    (a rounding that keeps their order)."""
    t0, t1 = _ticks(start, origin), _ticks(end, origin)
    scale = TICKS / 1e6
    return {"name": name, "cat": cat, "ph": "X", "tid": tid,
            "ts": t0 / scale, "dur": max(t1 - t0, 0) / scale, "args": args}


def _iteration(tid: int, k: int, spans: list[Span], ops: Sequence[OpFacts],
               origin: float) -> list[dict]:
    """Iteration k on one track: its slice, its phases inside, its ops inside those."""
    if not spans:
        return []
    events = [_slice(tid, f"iteration {k}", "iteration", spans[0][0], spans[-1][1], origin,
                     {"iteration": k, "ops": len(spans),
                      "ms": (spans[-1][1] - spans[0][0]) * 1e3})]
    # Phases are runs of consecutive ops (forward, backward, update), in the net's order.
    for phase, group in groupby(range(len(spans)), key=lambda i: ops[i].phase):
        members = list(group)
        first, last = spans[members[0]][0], spans[members[-1]][1]
        events.append(_slice(tid, phase, "phase", first, last, origin,
                             {"iteration": k, "ops": len(members),
                              "ms": (last - first) * 1e3}))
    for op, (start, end) in zip(ops, spans):
        events.append(_slice(tid, op.name, "op", start, end, origin, _op_args(op, k)))
    return events


def _op_args(op: OpFacts, k: int) -> dict:
    return {"index": op.index, "type": op.type, "phase": op.phase, "algo": op.algo or None,
            "inputs": op.input_shapes, "outputs": op.output_shapes, "flops": op.flops,
            "output_bytes": op.output_bytes, "iteration": k}


def _worker_tracks(timeline: Timeline) -> dict[int, tuple[int, str]]:
    """Thread ident -> (tid, track name): the calling thread's chunks on "worker 0", the
    other threads numbered in the order they first ran a chunk."""
    first: dict[int, float] = {}
    for r in timeline.chunks.records:
        first[r.thread] = min(first.get(r.thread, r.start), r.start)
    tracks = {timeline.main_thread: (WORKER_TID, "worker 0 (main thread)")}
    others = sorted((t for t in first if t != timeline.main_thread), key=first.__getitem__)
    for n, thread in enumerate(others, 1):
        tracks[thread] = (WORKER_TID + n, f"worker {n}")
    return {t: v for t, v in tracks.items() if t in first}


def _metadata(timeline: Timeline, process: str, workers: dict[int, tuple[int, str]],
              pid: int) -> list[dict]:
    """Names and order of the process and its tracks ('M' events)."""
    device = timeline.device + (f", {timeline.device_name}" if timeline.device_name else "")
    events = [{"name": "process_name", "ph": "M", "pid": pid, "tid": MAIN_TID,
               "args": {"name": f"{process} ({device})"}},
              {"name": "process_labels", "ph": "M", "pid": pid, "tid": MAIN_TID,
               "args": {"labels": f"{timeline.executor} executor"}}]
    tracks = [(MAIN_TID, "main thread")]
    if timeline.device_timed:
        tracks.append((STREAM_TID, f"{timeline.device} stream"))
    tracks += sorted(workers.values())
    for order, (tid, name) in enumerate(tracks):
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": name}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"sort_index": order}})
    return events
