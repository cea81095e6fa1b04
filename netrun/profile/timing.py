"""Per-operator timing of a bound net (Caffe's `caffe time`), and Chrome trace export.

Each op is timed between two device markers (CUDA events on a GPU, timestamps on the CPU);
the iteration total is measured in separate runs without per-op markers, so they cannot
inflate it. Medians throughout.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from netrun.core.net import SimpleNet
from netrun.core.schema import Cost


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
    trace_events: list[dict] = field(default_factory=list)

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

    def write_trace(self, path) -> None:
        """A Chrome trace (open it in Perfetto or chrome://tracing)."""
        with open(path, "w") as f:
            json.dump({"traceEvents": self.trace_events, "displayTimeUnit": "ms"}, f)


def profile_net(net: SimpleNet, iters: int = 20, warmup: int = 3,
                phases: Sequence[str] | None = None, costs: Sequence[Cost | None] | None = None,
                before_iteration: Callable[[], None] | None = None,
                progress: Callable[[int], None] | None = None) -> ProfileResult:
    """Time every op of `net` over `iters` iterations after `warmup` untimed ones.

    `before_iteration` (e.g. feeding a new batch) runs outside all timers.
    """
    backend = net.ws.backend
    timings = [OpTiming(i, o.def_.name or f"{o.def_.type}_{i}", o.def_.type,
                        phases[i] if phases else "forward",
                        flops=(costs[i].flops if costs and costs[i] else 0),
                        output_bytes=(costs[i].bytes_written if costs and costs[i] else 0))
               for i, o in enumerate(net.ops)]
    for _ in range(warmup):
        if before_iteration:
            before_iteration()
        net.run()
    iteration_ms: list[float] = []
    events: list[dict] = []
    # Alternate timed-per-op and whole-iteration runs so both see the same machine state.
    for it in range(iters):
        if before_iteration:
            before_iteration()
        t0 = backend.now()
        net.run()
        iteration_ms.append((backend.now() - t0) * 1e3)

        if before_iteration:
            before_iteration()
        backend.synchronize()
        # Markers in the device's queue (CUDA events on GPU, timestamps on CPU): each op is
        # timed on the device without stalling it between ops.
        marks = [backend.record_event()]

        def hook(i, _op, marks=marks):
            marks.append(backend.record_event())

        net.run(hook)
        offsets = [0.0] + [backend.elapsed_s(marks[0], m) for m in marks[1:]]
        for i, t in enumerate(timings):
            t.times_ms.append((offsets[i + 1] - offsets[i]) * 1e3)
            if it == iters - 1:
                events.append({"name": t.name, "cat": t.phase, "ph": "X", "pid": 0, "tid": 0,
                               "ts": offsets[i] * 1e6, "dur": (offsets[i + 1] - offsets[i]) * 1e6,
                               "args": {"type": t.type, "flops": t.flops}})
        if progress:
            progress(it + 1)
    for i, o in enumerate(net.ops):
        algo = o.ctx.state.get("algo")
        if algo:
            timings[i].algo = str(algo)
    return ProfileResult(timings, iteration_ms, events)
