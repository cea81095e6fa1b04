"""Per-operator timing of a bound net (Caffe's `caffe time`), and what a trace is made of.

Each op is timed between two device markers (CUDA events on a GPU, timestamps on the CPU),
one taken just before it runs and one just after; the iteration total is measured in
separate runs without per-op markers, so they cannot inflate it. Medians throughout.
With trace=True the readings of every timed iteration are kept (netrun.profile.trace).
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from netrun.core.dag import DagNet
from netrun.core.net import SimpleNet
from netrun.core.schema import Cost
from netrun.kernels.parallel import recording
from netrun.profile.trace import IterationMarks, Span, Timeline, trace_document, write_trace

# progress(stage, done, total): stage 'warm-up' or 'timing'.
Progress = Callable[[str, int, int], None]


@dataclass
class OpTiming:
    """One op's measurements: median milliseconds and the costs from inference."""

    index: int
    name: str
    type: str
    phase: str                       # forward | backward | update | other
    times_ms: list[float] = field(default_factory=list)
    flops: int = 0
    output_bytes: int = 0
    algo: str = ""
    # Shapes of the op's blobs when it ran, by name (filled when tracing; None: not an array).
    input_shapes: dict[str, list[int] | None] = field(default_factory=dict)
    output_shapes: dict[str, list[int] | None] = field(default_factory=dict)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms) if self.times_ms else 0.0

    @property
    def gflops(self) -> float:
        ms = self.median_ms
        return self.flops / (ms * 1e6) if ms > 0 else 0.0


@dataclass
class ProfileResult:
    """Per-op timings, the separately measured iteration time, and per-type totals."""

    ops: list[OpTiming]
    iteration_ms: list[float]
    timeline: Timeline | None = None      # the clock readings, when traced

    @property
    def total_ms(self) -> float:
        return statistics.median(self.iteration_ms) if self.iteration_ms else 0.0

    @property
    def sum_of_ops_ms(self) -> float:
        return sum(o.median_ms for o in self.ops)

    def by_type(self) -> list[tuple[str, float, int]]:
        """(op type, summed median ms, count), slowest first."""
        acc: dict[str, list] = {}
        for o in self.ops:
            entry = acc.setdefault(o.type, [0.0, 0])
            entry[0] += o.median_ms
            entry[1] += 1
        return sorted(((t, ms, n) for t, (ms, n) in acc.items()), key=lambda r: -r[1])

    def by_phase(self) -> dict[str, float]:
        """Summed median ms per phase (forward, backward, update), in the net's order."""
        out: dict[str, float] = {}
        for o in self.ops:
            out[o.phase] = out.get(o.phase, 0.0) + o.median_ms
        return out

    def to_json(self) -> dict:
        return {
            "iteration_ms": self.total_ms, "sum_of_ops_ms": self.sum_of_ops_ms,
            "phases": self.by_phase(),
            "ops": [{"index": o.index, "name": o.name, "type": o.type, "phase": o.phase,
                     "median_ms": o.median_ms, "flops": o.flops, "gflops": o.gflops,
                     "output_bytes": o.output_bytes, "algo": o.algo} for o in self.ops],
            "by_type": [{"type": t, "ms": ms, "count": n} for t, ms, n in self.by_type()],
        }

    def trace(self, process: str, other: dict[str, Any] | None = None) -> dict:
        """The timed iterations as a Chrome trace document (netrun.profile.trace); `process`
        names the process track, e.g. 'netrun profile zoo/lenet.yaml'."""
        if self.timeline is None:
            raise ValueError("this profile was not traced: run profile_net(..., trace=True)")
        return trace_document(self.timeline, self.ops, process, other)

    def write_trace(self, path, process: str, other: dict[str, Any] | None = None) -> None:
        """Write `trace(process, other)` to `path` (open it in Perfetto or chrome://tracing)."""
        write_trace(path, self.trace(process, other))


def profile_net(net: SimpleNet, iters: int = 20, warmup: int = 3,
                phases: Sequence[str] | None = None, costs: Sequence[Cost | None] | None = None,
                before_iteration: Callable[[], None] | None = None,
                progress: Progress | None = None, trace: bool = False) -> ProfileResult:
    """Time every op of `net` over `iters` iterations after `warmup` untimed ones.

    `before_iteration` (e.g. feeding a new batch) runs outside all timers. `progress` hears
    of each stage as it starts (done 0) and of each finished iteration in it. trace=True
    keeps every timed iteration's readings, the ops' shapes and the worker threads' chunks
    for ProfileResult.trace.
    """
    backend = net.ws.backend
    timings = [OpTiming(i, o.def_.name or f"{o.def_.type}_{i}", o.def_.type,
                        phases[i] if phases else "forward",
                        flops=(costs[i].flops if costs and costs[i] else 0),
                        output_bytes=(costs[i].bytes_written if costs and costs[i] else 0))
               for i, o in enumerate(net.ops)]
    # On the CPU a marker is a host timestamp; elsewhere ops run asynchronously on a device
    # stream, timed by its events, and the host readings only say when each was queued.
    on_device = backend.name != "cpu"
    timeline = (Timeline(backend.device, backend.device_name, _executor(net),
                         threading.get_ident()) if trace else None)
    if progress and warmup:
        progress("warm-up", 0, warmup)
    for w in range(warmup):
        if before_iteration:
            before_iteration()
        net.run()
        if progress:
            progress("warm-up", w + 1, warmup)
    iteration_ms: list[float] = []
    if progress:
        progress("timing", 0, iters)
    # Alternate timed-per-op and whole-iteration runs so both see the same machine state.
    for it in range(iters):
        if before_iteration:
            before_iteration()
        t0 = backend.now()
        net.run()
        t1 = backend.now()
        iteration_ms.append((t1 - t0) * 1e3)

        if before_iteration:
            before_iteration()
        backend.synchronize()
        if timeline is None:
            host, device = _marked_run(net, backend, on_device)
        else:
            with recording(timeline.chunks):
                host, device = _marked_run(net, backend, on_device,
                                           timings if it == 0 else None)
            timeline.iterations.append(IterationMarks((t0, t1), host, device))
        for t, (start, end) in zip(timings, device or host):
            t.times_ms.append((end - start) * 1e3)
        if progress:
            progress("timing", it + 1, iters)
    for i, o in enumerate(net.ops):
        algo = o.ctx.state.get("algo")
        if algo:
            timings[i].algo = str(algo)
    return ProfileResult(timings, iteration_ms, timeline)


def _marked_run(net: SimpleNet, backend, on_device: bool,
                shapes_into: list[OpTiming] | None = None
                ) -> tuple[list[Span], list[Span] | None]:
    """Run `net` once with a marker just before and just after each op: each op's (start,
    end) on the host clock, and on a device the same from its stream's events, placed on the
    host clock where the stream was last idle (the caller synchronized). `shapes_into`, if
    given, gets the shapes of each op's blobs, read between the marks."""
    # The first event goes into an idle stream (the caller synchronized), so the device
    # passes it as it is queued: the clock read just after is the device's time zero.
    events = [backend.record_event()] if on_device else None
    starts, ends = [time.perf_counter()], []
    ws = net.ws

    def hook(i, op):
        ends.append(time.perf_counter())
        if events is not None:
            events.append(backend.record_event())
        if shapes_into is not None:
            shapes_into[i].input_shapes = _shapes(ws, op.def_.inputs)
            shapes_into[i].output_shapes = _shapes(ws, op.def_.outputs)
        starts.append(time.perf_counter())
        if events is not None:
            events.append(backend.record_event())

    net.run(hook)
    host = list(zip(starts, ends))
    if events is None:
        return host, None
    # events: start 0, end 0, start 1, end 1, ..., start n (unused)
    anchor, first = starts[0], events[0]
    offsets = [anchor + backend.elapsed_s(first, e) for e in events]
    return host, list(zip(offsets[0:-1:2], offsets[1::2]))


def _shapes(ws, names: Sequence[str]) -> dict[str, list[int] | None]:
    """Each blob's shape (None where it is not an array or not there)."""
    out: dict[str, list[int] | None] = {}
    for name in names:
        shape = getattr(ws.get_blob(name), "shape", None) if ws.has_blob(name) else None
        out[name] = [int(d) for d in shape] if shape is not None else None
    return out


def _executor(net: SimpleNet) -> str:
    """'simple' or 'dag' (the executor's name, as --executor takes it)."""
    return "dag" if isinstance(net, DagNet) else "simple"
