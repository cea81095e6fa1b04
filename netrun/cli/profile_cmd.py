"""`netrun profile TARGET`: per-operator forward, backward and update timing."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import click

from netrun.cli.algo_options import algo_options, configure_algos
from netrun.cli.console import console, json_text
from netrun.cli.inspect_cmd import parse_inputs
from netrun.cli.memory_table import footer


@click.command(short_help="Time every operator of a model, config or checkpoint.")
@click.argument("target", metavar="MODEL|CONFIG|CHECKPOINT")
@click.option("-b", "--batch", type=click.IntRange(1),
              help="Batch size (default: the config's, else 64).")
@click.option("--iters", type=click.IntRange(1), default=20, show_default=True,
              help="Timed iterations; the table shows each op's median over them.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True,
              help="Untimed iterations first (the first picks convolution algorithms, "
                   "compiles kernels and fills caches).")
@click.option("--device", help="cpu, gpu or gpu:N (default: the config's, else cpu).")
@click.option("--forward-only", is_flag=True,
              help="Time the predict net only (a model without a loss always is).")
@click.option("--input", "inputs", multiple=True, metavar="NAME=D1,D2,...", callback=parse_inputs,
              help="Full shape of an input the model does not declare (repeatable).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False),
              help="Write the measurements as JSON to this file ('-' for stdout).")
@click.option("--trace", type=click.Path(dir_okay=False),
              help="Write a timeline of the timed iterations to this file: Chrome Trace Event "
                   "JSON for ui.perfetto.dev or chrome://tracing. Each iteration holds its "
                   "phases and ops (type, algorithm, shapes, FLOPs as args); CPU kernels "
                   "split over threads show each chunk on a worker's track; on a GPU the "
                   "device stream has its own track.")
@click.option("--top", type=click.IntRange(0), default=0,
              help="Show only the N slowest ops (0: all).")
@click.option("--compare-algos", is_flag=True,
              help="Also time every applicable algorithm of each convolution.")
@click.option("--no-fuse", is_flag=True, help="Time the nets as written, without the "
              "bind-time fusions (BN folded into convs, fused ReLUs).")
@click.option("--no-memory-plan", is_flag=True, help="Give every activation its own buffer "
              "(no sharing by lifetime).")
@click.option("--executor", type=click.Choice(["simple", "dag"]), default="simple",
              show_default=True, help="Run the net in order (simple) or as a dependency graph "
              "on worker threads (dag; each op's marks then come in the net's order, when it "
              "and every op before it are done).")
@algo_options
def profile(target, batch, iters, warmup, device, forward_only, inputs, json_file, trace, top,
            compare_algos, no_fuse, no_memory_plan, executor, algo_search, workspace_limit,
            tf32):
    """Time every operator of a model, train config or checkpoint (Caffe's `caffe time`).

    Trains by default: the forward, backward and update ops of one step, on random inputs of
    the model's shapes. Each op is timed between markers taken just before and after it (CUDA
    events on a GPU); the iteration time is measured in separate runs without them. A
    progress display shows on an interactive terminal only.

    \b
    Examples:
      netrun profile zoo/lenet.yaml --batch 64
      netrun profile zoo/resnet50.yaml -b 8 --forward-only --top 10
      netrun profile zoo/lenet.yaml --iters 5 --trace lenet.json   # open in ui.perfetto.dev
      NETRUN_THREADS=4 netrun profile zoo/resnet20.yaml --trace r20.json   # 4 worker tracks
      netrun profile configs/quickstart.yaml --json - | jq .phases
      netrun profile runs/quickstart/best.h5 --forward-only --compare-algos
    """
    import warnings  # lazy: loaded when the command runs

    from netrun.profile.targets import prepare  # lazy: loaded when the command runs
    from netrun.profile.timing import profile_net  # lazy: loaded when the command runs

    shown = console.interactive and console.verbosity >= 0 and json_file != "-"
    with _progress(shown) as step:
        step("loading and binding")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            prepared = prepare(target, batch, device, forward_only, inputs, fuse=not no_fuse,
                               memory_plan=not no_memory_plan, executor=executor)
        for w in caught:
            console.warn(str(w.message))
        configure_algos(prepared.net.ws, algo_search, workspace_limit, tf32)
        console.info(f"profiling {prepared.description}, batch {prepared.batch}, "
                     f"{iters} iterations after {warmup} warm-up")
        console.info(f"bind-time rewrites: {'off (--no-fuse)' if no_fuse else prepared.rewrites}")
        result = profile_net(prepared.net, iters, warmup, prepared.phases, prepared.costs,
                             before_iteration=prepared.feed, progress=step,
                             trace=bool(trace))
        if compare_algos:
            step("comparing algorithms")
        comparisons = _compare(prepared.net) if compare_algos else {}
        if trace:
            step("writing the trace")
            result.write_trace(trace, f"netrun profile {target}",
                               {"target": target, "batch": prepared.batch, "iters": iters,
                                "warmup": warmup, "description": prepared.description})
    if trace:
        console.info(f"trace of {iters} iteration{'s' if iters != 1 else ''} written to "
                     f"{trace} (open it in ui.perfetto.dev or chrome://tracing)")
    memory = {name: plan.summary(prepared.phases if len(prepared.phases)
                                 == len(plan.op_labels) else None)
              for name, plan in prepared.net.ws.memory.net_plans.items()}
    if json_file:
        data = {"target": target, "batch": prepared.batch, "iters": iters, "memory": memory,
                "rewrites": [{"rule": f.rule, "replaced": list(f.replaced), "made": f.made}
                             for r in prepared.rewritten for f in r.fired],
                **result.to_json()}
        if compare_algos:
            data["algorithms"] = {name: [{"algo": a, "ms": ms} for a, ms in rows]
                                  for name, rows in comparisons.items()}
        if json_file == "-":
            console.json(data)
            return
        with open(json_file, "w") as f:
            f.write(json_text(data) + "\n")
    total = result.total_ms
    ops = sorted(result.ops, key=lambda o: -o.median_ms)[:top] if top else result.ops
    rows = [(o.index, o.name, o.type, o.phase, f"{o.median_ms:.3f}",
             f"{100 * o.median_ms / total:.1f}" if total else "", _num(o.flops / 1e6),
             f"{o.gflops:.1f}" if o.flops else "", _num(o.output_bytes / 1024), o.algo)
            for o in ops]
    console.table(["#", "op", "type", "phase", "ms", "%", "MFLOP", "GFLOP/s", "out KiB", "algo"],
                  rows, right=["#", "ms", "%", "MFLOP", "GFLOP/s", "out KiB"])
    console.line()
    console.table(["type", "ms", "%", "count"],
                  [(t, f"{ms:.3f}", f"{100 * ms / total:.1f}" if total else "", n)
                   for t, ms, n in result.by_type()], right=["ms", "%", "count"])
    phases = "  ".join(f"{p} {ms:.2f} ms" for p, ms in result.by_phase().items())
    console.line()
    console.line(f"iteration {total:.3f} ms (median, measured without per-op timers); "
                 f"sum of ops {result.sum_of_ops_ms:.3f} ms "
                 f"({100 * result.sum_of_ops_ms / total:.1f}% of the iteration)" if total else "")
    console.line(f"by phase: {phases}")
    for line in footer(prepared.net.ws, prepared.phases):
        console.line(line)
    if comparisons:
        console.line()
        console.table(["op", "algorithm", "ms", "vs chosen"],
                      [(name, a, f"{ms:.3f}", f"{ms / rows_ms(rows, chosen):.2f}x")
                       for name, (rows, chosen) in _with_chosen(comparisons, result).items()
                       for a, ms in rows],
                      title="every applicable algorithm per convolution (summed over its passes)",
                      right=["ms", "vs chosen"])


@contextlib.contextmanager
def _progress(shown: bool) -> Iterator[Callable[..., None]]:
    """A step(stage, done=0, total=None) callback: a spinner with the stage (and a bar once
    there is a total) on stderr while the block runs when `shown`, else a no-op."""
    if not shown:
        yield lambda stage, done=0, total=None: None
        return
    from rich.progress import (  # lazy: loaded when the command runs
        BarColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    # The count is a text field: a stage without a total (binding) shows none, not "0/?".
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.fields[count]}"), TimeElapsedColumn(), console=console.err,
                  transient=True) as bar:
        task = bar.add_task("profile", total=None, count="")

        def step(stage: str, done: int = 0, total: int | None = None) -> None:
            bar.update(task, description=stage, completed=done, total=total,
                       count=f"{done}/{total}" if total else "")

        yield step


def _compare(net) -> dict[str, list[tuple[str, float]]]:
    """Each conv op's applicable algorithms with their times, fastest first."""
    from netrun.conv import compare_algorithms, op_directions  # lazy

    out = {}
    for i, op in enumerate(net.ops):
        plan = op.ctx.state.get("plan")
        if plan is None:   # not a conv op (every conv op has a plan once the net has run)
            continue
        directions = op_directions(op.def_.type, len(op.def_.outputs), bool(op.args.no_bias))
        out[op.def_.name or f"{op.def_.type}_{i}"] = compare_algorithms(
            plan.problem, op.ws.backend, directions, op.ws.scratch)
    return out


def _with_chosen(comparisons, result):
    chosen = {o.name: o.algo for o in result.ops}
    return {name: (rows, chosen.get(name, "")) for name, rows in comparisons.items()}


def rows_ms(rows, chosen: str) -> float:
    """The chosen algorithm's time (the fastest's when it is not in the list)."""
    for algo, ms in rows:
        if algo == chosen:
            return ms
    return rows[0][1] if rows else 1.0


def _num(value: float) -> str:
    return f"{value:,.1f}" if value else ""
