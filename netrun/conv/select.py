"""Choosing a convolution algorithm: rules, or a timing search remembered in the disk cache.

One stack for every backend: the candidates are the backend's own algorithms (its registry in
netrun.conv.algorithm). `choose` is what a conv op calls once per input shape and direction.
A fixed `algo` wins over every mode. In exhaustive mode it looks the problem up in the cache;
on a miss it times every applicable algorithm that fits the workspace limit on the op's own
buffers (one untimed run first, so page faults of new scratch and other first-call costs are
not counted), keeps the fastest and writes the times to the cache. The workspace's
`ConvState.stats` counts searches, timed runs and cache hits.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from netrun.conv.algorithm import ConvAlgorithm, applicable_algorithms
from netrun.conv.cache import Entry, cache_key, environment, get_cache
from netrun.conv.problem import ConvProblem
from netrun.conv.rules import fixed_algorithm, rule_choice
from netrun.conv.settings import AlgoSettings
from netrun.conv.state import ConvState, SearchStats
from netrun.kernels import jit

MIN_REPS = 2            # timed runs per algorithm at least ...
BUDGET_S = 0.05         # ... and more (up to MAX_REPS) while they take less than this in total
MAX_REPS = 5

Run = Callable[[ConvAlgorithm], None]   # run(algo): one direction on real buffers


def candidates(p: ConvProblem, settings: AlgoSettings, backend: str = "cpu",
               ) -> list[ConvAlgorithm]:
    """The backend's applicable algorithms within the workspace limit (deterministic ones in
    that mode). When none fits the limit, the one needing the least scratch is the only
    candidate: a convolution always runs."""
    applicable = [a for a in applicable_algorithms(p, backend)
                  if settings.tf32 or not a.reduced_precision]
    if settings.mode == "deterministic":
        applicable = [a for a in applicable if a.deterministic]
    fits = [a for a in applicable if settings.allows(a.workspace_bytes(p))]
    return fits or [min(applicable, key=lambda a: a.workspace_bytes(p))]


def choose(state: ConvState | None, p: ConvProblem, direction: str, backend: Any,
           fixed: str = "", run: Run | None = None) -> ConvAlgorithm:
    """The algorithm for one direction of p on `backend` under the workspace's conv state.

    `fixed` (the op's `algo` argument) wins over every mode. In exhaustive mode `run(algo)`
    executes the direction on the op's buffers for timing; without it the rules decide, and
    nothing runs.
    """
    if fixed:
        algo = fixed_algorithm(p, fixed, backend.name)
        if algo is not None:
            return algo
    state = state or ConvState()
    settings = state.settings
    if settings.mode != "exhaustive" or run is None:
        return _ruled(state, p, direction, backend, settings)
    pool = candidates(p, settings, backend.name)
    if len(pool) == 1:
        return pool[0]
    cache = get_cache(settings.cache_dir, backend.name, backend.device_name)
    key = cache_key(direction, p, environment(backend.name, backend.device_name,
                                              backend.library_versions()))
    entry = cache.get(key) if settings.persist else cache.entries.get(key)
    if entry is not None and all(a.name in entry.times_ms for a in pool):
        state.stats.cache_hits += 1
        return min(pool, key=lambda a: entry.times_ms[a.name])
    times = {}
    for algo in pool:
        try:
            times[algo.name] = time_algorithm(run, algo, backend, state.stats)
        except Exception:
            if not algo.optional_engine:
                raise
            # An optional engine (cuDNN) that fails here is simply not chosen.
    if not times:
        return _ruled(state, p, direction, backend, settings)
    state.stats.searches += 1
    skipped = sorted(a.name for a in applicable_algorithms(p, backend.name)
                     if a.name not in times)
    cache.put(key, Entry(times, skipped, settings.workspace_limit, time.time()),
              persist=settings.persist)
    return min((a for a in pool if a.name in times), key=lambda a: times[a.name])


def _ruled(state: ConvState, p: ConvProblem, direction: str, backend: Any,
           settings: AlgoSettings) -> ConvAlgorithm:
    """The rules' pick, remembered in the workspace's conv state: a net's bind-time memory
    plan asks for the same problems its first run then needs."""
    # Every setting that changes the candidates is in the key (a bind-time pick made before
    # `configure(tf32=True)` must not outlive it).
    key = (p, direction, backend.name, settings.mode, settings.workspace_limit, settings.tf32,
           jit.available())
    if key not in state.picks:
        state.picks[key] = rule_choice(p, candidates(p, settings, backend.name), direction,
                                       backend.name, backend.xp)
    return state.picks[key]


def time_algorithm(run: Run, algo: ConvAlgorithm, backend: Any,
                   stats: SearchStats | None = None) -> float:
    """Milliseconds of one run: the minimum over a few, after one untimed warm-up run.

    The minimum, not the median: on a shared machine noise only ever adds time.
    """
    run(algo)
    times: list[float] = []
    while len(times) < MIN_REPS or (sum(times) < BUDGET_S and len(times) < MAX_REPS):
        t0 = backend.now()
        run(algo)
        times.append(backend.now() - t0)
    if stats is not None:
        stats.timed_runs += len(times) + 1
    return min(times) * 1e3


def run_direction(direction: str, p: ConvProblem, args: tuple, out: Any, scratch: Callable,
                  xp: Any) -> Run:
    """run(algo): one direction on given arrays (inputs `args`, output `out`)."""
    return lambda a: getattr(a, direction)(xp, *args, p, out, scratch)
