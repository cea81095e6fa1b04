"""Choosing a convolution algorithm: rules, or a timing search remembered in the disk cache.

`choose` is what a conv op calls once per input shape and direction. In exhaustive mode it
looks the problem up in the cache; on a miss it times every applicable algorithm that fits
the workspace limit on the op's own buffers (one untimed run first, so page faults of new
scratch and other first-call costs are not counted), keeps the fastest and writes the times
to the cache. `STATS` counts searches, timed runs and cache hits, so tests can assert that a
warm cache performs no search.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from netrun.algos.cache import Entry, cache_key, environment, get_cache
from netrun.algos.settings import AlgoSettings, settings_of
from netrun.ops.conv_algos import (ConvAlgorithm, ConvProblem, applicable_algorithms,
                                   heuristic_choice, select_algorithm)

DIRECTIONS = ("forward", "backward_data", "backward_filter")
MIN_REPS = 2            # timed runs per algorithm at least ...
BUDGET_S = 0.05         # ... and more (up to MAX_REPS) while they take less than this in total
MAX_REPS = 5


@dataclass
class SearchStats:
    """Counters of the selection machinery since the process started (or `reset`)."""

    searches: int = 0      # timing searches (one per problem and direction)
    timed_runs: int = 0    # algorithm runs inside searches, warm-up runs included
    cache_hits: int = 0    # exhaustive-mode answers found in the cache

    def reset(self) -> None:
        self.searches = self.timed_runs = self.cache_hits = 0


STATS = SearchStats()


def candidates(p: ConvProblem, settings: AlgoSettings) -> list[ConvAlgorithm]:
    """Applicable algorithms within the workspace limit (deterministic ones in that mode).

    When none fits the limit, the one needing the least scratch is the only candidate: a
    convolution always runs.
    """
    applicable = applicable_algorithms(p)
    if settings.mode == "deterministic":
        applicable = [a for a in applicable if a.deterministic]
    fits = [a for a in applicable if settings.allows(a.workspace_bytes(p))]
    return fits or [min(applicable, key=lambda a: a.workspace_bytes(p))]


def choose(ws: Any, p: ConvProblem, direction: str, backend: Any, fixed: str = "",
           run: Callable[[ConvAlgorithm], None] | None = None) -> ConvAlgorithm:
    """The algorithm for one direction of p on `backend` under the workspace's settings.

    `fixed` (the op's `algo` argument) wins over every mode. In exhaustive mode `run(algo)`
    executes the direction on the op's buffers for timing; without it the rules decide.
    """
    if fixed:
        return select_algorithm(p, fixed)
    settings = settings_of(ws)
    if settings.mode != "exhaustive" or run is None:
        return _ruled(ws, p, direction, backend, settings)
    pool = candidates(p, settings)
    if len(pool) == 1:
        return pool[0]
    cache = get_cache(settings.cache_dir, backend.name, backend.device_name)
    key = cache_key(direction, p, environment(backend.name, backend.device_name))
    entry = cache.get(key) if settings.persist else cache.entries.get(key)
    if entry is not None and all(a.name in entry.times_ms for a in pool):
        STATS.cache_hits += 1
        return min(pool, key=lambda a: entry.times_ms[a.name])
    times = {a.name: time_algorithm(run, a, backend) for a in pool}
    STATS.searches += 1
    skipped = sorted(a.name for a in applicable_algorithms(p) if a.name not in times)
    cache.put(key, Entry(times, skipped, settings.workspace_limit, time.time()),
              persist=settings.persist)
    return min(pool, key=lambda a: times[a.name])


def _ruled(ws: Any, p: ConvProblem, direction: str, backend: Any,
           settings: AlgoSettings) -> ConvAlgorithm:
    """The rules' pick, remembered on the workspace: a net's bind-time memory plan asks for
    the same problems its first run then needs (0.3 ms each to work out)."""
    from netrun import jit

    key = (p, direction, backend.name, settings.mode, settings.workspace_limit, jit.available())
    picks = getattr(ws, "algo_picks", None)
    if picks is None:
        picks = {}
        if ws is not None:
            ws.algo_picks = picks
    if key not in picks:
        picks[key] = heuristic_choice(p, direction, candidates(p, settings))
    return picks[key]


def time_algorithm(run: Callable[[ConvAlgorithm], None], algo: ConvAlgorithm,
                   backend: Any) -> float:
    """Milliseconds of one run: the minimum over a few, after one untimed warm-up run.

    The minimum, not the median: on a shared machine noise only ever adds time.
    """
    run(algo)
    times: list[float] = []
    while len(times) < MIN_REPS or (sum(times) < BUDGET_S and len(times) < MAX_REPS):
        t0 = backend.now()
        run(algo)
        times.append(backend.now() - t0)
    STATS.timed_runs += len(times) + 1
    return min(times) * 1e3


# Comparing algorithms (netrun profile --compare-algos) --------------------------------------
def directions_of(op: Any) -> list[str]:
    """The algorithm directions a bound conv Operator runs, in its order."""
    return op_directions(op.def_, op.args)


def op_directions(def_: Any, args: Any) -> list[str]:
    """The algorithm directions a conv OperatorDef with these resolved args runs, in order."""
    type_, outputs = def_.type, def_.outputs
    with_dx = len(outputs) == (2 if args.no_bias else 3) if type_.endswith("Gradient") else False
    if type_ == "Conv":
        return ["forward"]
    if type_ == "ConvTranspose":
        return ["backward_data"]
    if type_ == "ConvGradient":
        return ["backward_filter"] + (["backward_data"] if with_dx else [])
    if type_ == "ConvTransposeGradient":
        return ["backward_filter"] + (["forward"] if with_dx else [])
    raise ValueError(f"op {def_.label} is not a convolution")


def compare_algorithms(target: Any, backend: Any = None, direction: str | None = None,
                       workspace_limit: int | None = None) -> list[tuple[str, float]]:
    """(algorithm, ms) for every algorithm of the backend that applies, fastest first; nothing
    is cached.

    `target` is a ConvProblem, or a conv Operator of a bound net that has run once (its
    problem and directions come from its state; the times are summed over its directions).
    `direction` restricts to one direction (default: forward for a problem). Algorithms over
    `workspace_limit` bytes are left out.
    """
    from netrun.backends import get_backend

    scratch_owner = None
    if isinstance(target, ConvProblem):
        p = target
        directions = [direction or "forward"]
        backend = get_backend(backend) if isinstance(backend, str) or backend is None else backend
    else:
        setup = target.ctx.state.get("setup")
        if setup is None:
            raise ValueError(f"op {target.def_.label} has not run yet: run the net once first")
        p = setup[1]
        directions = [direction] if direction else directions_of(target)
        backend = target.ws.backend
        scratch_owner = target.ws
    if scratch_owner is None:
        from netrun.core.workspace import Workspace

        scratch_owner = Workspace(backend.device)
    buffers = _buffers(p, backend)
    settings = AlgoSettings(workspace_limit=workspace_limit)
    results = []
    for algo in applicable_algorithms(p):
        if backend.name not in algo.backends or not settings.allows(algo.workspace_bytes(p)):
            continue
        total = 0.0
        for d in directions:
            total += time_algorithm(_runner(p, d, buffers, scratch_owner.scratch, backend.xp),
                                    algo, backend)
        results.append((algo.name, total))
    return sorted(results, key=lambda r: r[1])


def _buffers(p: ConvProblem, backend: Any) -> dict[str, Any]:
    """Random inputs and output buffers of the problem's three directions on the backend."""
    import numpy as np

    rng = np.random.default_rng(0)
    shapes = {"x": (p.n, p.c, p.h, p.w), "w": (p.k, p.cg, p.kh, p.kw),
              "dy": (p.n, p.k, p.oh, p.ow)}
    out = {k: backend.to_device(rng.standard_normal(s).astype(p.dtype))
           for k, s in shapes.items()}
    out.update({f"out_{k}": backend.empty(s, p.dtype) for k, s in shapes.items()})
    return out


def _runner(p: ConvProblem, direction: str, b: dict[str, Any], scratch: Callable,
            xp: Any) -> Callable[[ConvAlgorithm], None]:
    if direction == "forward":
        return lambda a: a.forward(xp, b["x"], b["w"], p, b["out_dy"], scratch)
    if direction == "backward_data":
        return lambda a: a.backward_data(xp, b["dy"], b["w"], p, b["out_x"], scratch)
    return lambda a: a.backward_filter(xp, b["x"], b["dy"], p, b["out_w"], scratch)


_WARMED: set[tuple] = set()


def warm_up(algo: ConvAlgorithm, p: ConvProblem, direction: str, xp: Any) -> None:
    """Run one direction of `algo` once on a one-image copy of p, on throwaway arrays.

    What an algorithm builds per shape on its first call (DFT matrices, column maps, the
    compiled kernels' type dispatch) does not depend on the batch, so a net's bind-time
    plan calls this and the first iteration finds it ready. Once per process and problem.
    """
    one = replace(p, n=1)
    key = (algo.name, one, direction, id(xp))
    if key in _WARMED:
        return
    _WARMED.add(key)
    x, w = xp.zeros((1, p.c, p.h, p.w), p.dtype), xp.zeros((p.k, p.cg, p.kh, p.kw), p.dtype)
    dy = xp.zeros((1, p.k, p.oh, p.ow), p.dtype)
    args, out = {"forward": ((x, w), dy), "backward_data": ((dy, w), x),
                 "backward_filter": ((x, dy), w)}[direction]
    from netrun.algos.parallel import blas_threads

    with blas_threads(1):
        run_for(direction, one, args, out,
                lambda key, shape, dtype="float32": xp.empty(shape, dtype), xp)(algo)


def run_for(direction: str, p: ConvProblem, args: Sequence[Any], out: Any, scratch: Callable,
            xp: Any) -> Callable[[ConvAlgorithm], None]:
    """run(algo) for `choose`: the direction on the op's own arrays (inputs, output)."""
    method = {"forward": "forward", "backward_data": "backward_data",
              "backward_filter": "backward_filter"}[direction]
    return lambda a: getattr(a, method)(xp, *args, p, out, scratch)
