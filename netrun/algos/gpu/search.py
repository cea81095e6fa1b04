"""Choosing a GPU convolution algorithm: rules, or a timing search in the shared disk cache.

The same modes and cache as on the CPU (netrun.algos.search): heuristic rules without timing,
an exhaustive search timed once per problem and direction and remembered on disk (the file
is per backend and device name; keys add the CUDA, driver, CuPy and cuDNN versions), or
deterministic rules. Only GPU algorithms are candidates. A fixed `algo` naming a CPU
algorithm selects its GPU counterpart (so nets that fix `fft` or `im2col_gemm` run on both
backends), and the rules where there is none.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from netrun.algos.cache import Entry, cache_key, get_cache
from netrun.algos.gpu.base import GPUAlgorithm, GPUConvProblem
from netrun.algos.search import STATS, time_algorithm
from netrun.algos.settings import AlgoSettings, settings_of
from netrun.errors import ShapeError
from netrun.ops.conv_algos import ALGORITHMS

# The GPU algorithm standing in for a CPU one named in an op's `algo` argument.
COUNTERPARTS = {"im2col_gemm": "gpu_im2col_gemm", "shift_gemm": "gpu_im2col_gemm",
                "gemm_1x1": "gpu_gemm_1x1", "depthwise": "gpu_depthwise",
                "winograd_f2x2": "gpu_winograd_f2x2", "winograd_f4x4": "gpu_winograd_f4x4",
                "fft": "gpu_fft", "dft_gemm": "gpu_fft", "depthwise_jit": "gpu_depthwise",
                "winograd_jit": "gpu_winograd_f4x4"}

# The rules without timing, best first: cuDNN where it is installed and has a plan; a
# depthwise conv directly; a 1×1 kernel as a plain GEMM; everything else im2col + GEMM.
# Winograd and FFT win only for some shapes; exhaustive search finds those.
PREFERENCE = ("cudnn", "gpu_depthwise", "gpu_gemm_1x1", "gpu_im2col_gemm")


def gpu_algorithms() -> list[GPUAlgorithm]:
    """The registered GPU algorithms, in registration order."""
    return [a for a in ALGORITHMS.values() if isinstance(a, GPUAlgorithm)]


def candidates(p: GPUConvProblem, settings: AlgoSettings) -> list[GPUAlgorithm]:
    """Applicable GPU algorithms within the workspace limit (deterministic ones in that mode);
    the one needing the least scratch when none fits."""
    applicable = [a for a in gpu_algorithms() if a.applicable(p)]
    if settings.mode == "deterministic":
        applicable = [a for a in applicable if a.deterministic]
    fits = [a for a in applicable if settings.allows(a.workspace_bytes(p))]
    return fits or [min(applicable, key=lambda a: a.workspace_bytes(p))]


def heuristic(xp: Any, p: GPUConvProblem, direction: str,
              pool: list[GPUAlgorithm]) -> GPUAlgorithm:
    """The rule-based pick among `pool`."""
    names = {a.name: a for a in pool}
    for name in PREFERENCE:
        algo = names.get(name)
        if algo is None:
            continue
        if name == "cudnn" and not algo.supports(xp, p, direction):
            continue
        return algo
    return pool[0]


def select(p: GPUConvProblem, fixed: str) -> GPUAlgorithm | None:
    """The algorithm a fixed `algo` names on the GPU (None: the rules decide).

    ShapeError when a GPU algorithm is named that cannot run p.
    """
    name = COUNTERPARTS.get(fixed, fixed)
    algo = ALGORITHMS.get(name)
    if not isinstance(algo, GPUAlgorithm):
        return None          # a CPU algorithm without a GPU counterpart
    if not algo.applicable(p):
        if fixed in COUNTERPARTS:
            return None      # the CPU name's counterpart cannot run it: fall back to the rules
        names = ", ".join(a.name for a in gpu_algorithms() if a.applicable(p))
        raise ShapeError(f"algorithm '{fixed}' cannot run this convolution ({p.describe()}); "
                         f"applicable: {names}")
    return algo


def environment(backend: Any) -> dict[str, str]:
    """What changes which GPU algorithm is fastest: the device and its library versions."""
    return {"backend": backend.name, "device": backend.device_name,
            **backend.library_versions()}


def choose(ws: Any, p: GPUConvProblem, direction: str, backend: Any, fixed: str = "",
           scratch: Callable | None = None) -> GPUAlgorithm:
    """The algorithm for one direction of p on a GPU backend under the workspace's settings.

    In exhaustive mode a cache miss times every candidate on scratch inputs of the problem's
    shapes (cuDNN's Find does the same) and stores the times.
    """
    xp = backend.xp
    if fixed:
        algo = select(p, fixed)
        if algo is not None:
            return algo
    settings = settings_of(ws)
    pool = candidates(p, settings)
    if settings.mode != "exhaustive" or len(pool) == 1:
        return heuristic(xp, p, direction, pool)
    cache = get_cache(settings.cache_dir, backend.name, backend.device_name)
    key = cache_key(direction, p, environment(backend))
    entry = cache.get(key) if settings.persist else cache.entries.get(key)
    if entry is not None and all(a.name in entry.times_ms for a in pool):
        STATS.cache_hits += 1
        return min(pool, key=lambda a: entry.times_ms[a.name])
    run = trial_run(xp, p, direction, backend, scratch or ws.scratch)
    times = {}
    for algo in pool:
        try:
            times[algo.name] = time_algorithm(run, algo, backend)
        except Exception:   # an optional engine (cuDNN) that fails here is simply not chosen
            continue
    if not times:
        return heuristic(xp, p, direction, pool)
    STATS.searches += 1
    skipped = sorted(a.name for a in gpu_algorithms()
                     if a.applicable(p) and a.name not in times)
    cache.put(key, Entry(times, skipped, settings.workspace_limit, time.time()),
              persist=settings.persist)
    return min((a for a in pool if a.name in times), key=lambda a: times[a.name])


def trial_run(xp: Any, p: GPUConvProblem, direction: str, backend: Any,
              scratch: Callable) -> Callable[[GPUAlgorithm], None]:
    """run(algo): the direction on device buffers of p's shapes (no host copies)."""
    shapes = {"x": (p.n, p.c, p.h, p.w), "w": (p.k, p.cg, p.kh, p.kw),
              "y": (p.n, p.k, p.oh, p.ow)}
    # Values do not change the speed of these kernels; a constant avoids any host copy.
    bufs = {k: xp.full(s, 0.125, dtype=p.dtype) for k, s in shapes.items()}
    outs = {k: backend.empty(s, p.dtype) for k, s in shapes.items()}
    if direction == "forward":
        return lambda a: a.forward(xp, bufs["x"], bufs["w"], p, outs["y"], scratch)
    if direction == "backward_data":
        return lambda a: a.backward_data(xp, bufs["y"], bufs["w"], p, outs["x"], scratch)
    return lambda a: a.backward_filter(xp, bufs["x"], bufs["y"], p, outs["w"], scratch)
