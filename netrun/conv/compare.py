"""Running algorithms outside a net: timing them side by side (`netrun profile
--compare-algos`) and warming them up at bind time on a one-image copy of the problem."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np

from netrun.conv.algorithm import ConvAlgorithm, applicable_algorithms
from netrun.conv.problem import ConvProblem
from netrun.conv.select import run_direction, time_algorithm
from netrun.conv.settings import AlgoSettings
from netrun.conv.state import ConvState


def op_directions(type_: str, outputs: int, no_bias: bool) -> list[str]:
    """The algorithm directions a conv op of this type with `outputs` outputs runs, in order
    (a gradient op computes dX only when dX is one of its outputs)."""
    with_dx = outputs == (2 if no_bias else 3)
    if type_ == "Conv":
        return ["forward"]
    if type_ == "ConvTranspose":
        return ["backward_data"]
    if type_ == "ConvGradient":
        return ["backward_filter"] + (["backward_data"] if with_dx else [])
    if type_ == "ConvTransposeGradient":
        return ["backward_filter"] + (["forward"] if with_dx else [])
    raise ValueError(f"{type_} is not a convolution op")


def compare_algorithms(p: ConvProblem, backend: Any, directions: list[str],
                       scratch: Callable | None = None, workspace_limit: int | None = None,
                       ) -> list[tuple[str, float]]:
    """(algorithm, ms summed over `directions`) for every algorithm of the backend that
    applies to p and fits `workspace_limit`, fastest first; nothing is cached."""
    if scratch is None:
        def scratch(key, shape, dtype="float32"):
            return backend.empty(shape, dtype)
    buffers = _buffers(p, backend)
    settings = AlgoSettings(workspace_limit=workspace_limit)
    results = []
    for algo in applicable_algorithms(p, backend.name):
        if not settings.allows(algo.workspace_bytes(p)):
            continue
        total = sum(time_algorithm(_runner(p, d, buffers, scratch, backend.xp), algo, backend)
                    for d in directions)
        results.append((algo.name, total))
    return sorted(results, key=lambda r: r[1])


def _buffers(p: ConvProblem, backend: Any) -> dict[str, Any]:
    """Random inputs and output buffers of the problem's three directions on the backend."""
    rng = np.random.default_rng(0)
    shapes = {"x": (p.n, p.c, p.h, p.w), "w": (p.k, p.cg, p.kh, p.kw),
              "dy": (p.n, p.k, p.oh, p.ow)}
    out = {k: backend.to_device(rng.standard_normal(s).astype(p.dtype))
           for k, s in shapes.items()}
    out.update({f"out_{k}": backend.empty(s, p.dtype) for k, s in shapes.items()})
    return out


def _runner(p: ConvProblem, direction: str, b: dict[str, Any], scratch: Callable,
            xp: Any) -> Callable[[ConvAlgorithm], None]:
    args, out = {"forward": ((b["x"], b["w"]), b["out_dy"]),
                 "backward_data": ((b["dy"], b["w"]), b["out_x"]),
                 "backward_filter": ((b["x"], b["dy"]), b["out_w"])}[direction]
    return run_direction(direction, p, args, out, scratch, xp)


def warm_up(state: ConvState, algo: ConvAlgorithm, p: ConvProblem, direction: str,
            xp: Any, bias: bool = False, relu: bool = False) -> None:
    """Let `algo` build what p's pass needs (`prepare`), then run one direction of it once
    on a one-image copy of p, on throwaway arrays.

    What an algorithm builds per shape on its first call (DFT matrices, column maps, the
    compiled kernels' type dispatch) does not depend on the batch, so a net's bind-time
    plan calls this and the first iteration finds it ready. Once per workspace and problem.
    What does depend on the batch (oneDNN's primitives) is built by `prepare` for p itself.
    """
    algo.prepare(p, direction, bias=bias, relu=relu)
    one = replace(p, n=1)
    key = (algo.name, one, direction)
    if key in state.warmed:
        return
    state.warmed.add(key)
    state.stats.warm_ups += 1
    x, w = xp.zeros((1, p.c, p.h, p.w), p.dtype), xp.zeros((p.k, p.cg, p.kh, p.kw), p.dtype)
    dy = xp.zeros((1, p.k, p.oh, p.ow), p.dtype)
    args, out = {"forward": ((x, w), dy), "backward_data": ((dy, w), x),
                 "backward_filter": ((x, dy), w)}[direction]
    run_direction(direction, one, args, out,
                  lambda key, shape, dtype="float32": xp.empty(shape, dtype), xp)(algo)
