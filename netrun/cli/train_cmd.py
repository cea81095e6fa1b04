"""`netrun train CONFIG`: train, test, checkpoint and resume."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import click

from netrun.cli.algo_options import algo_options, configure_algos
from netrun.cli.console import abort, console


@click.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--device", help="cpu, gpu or gpu:N (default: the config's).")
@click.option("-o", "--output", help="Run folder for checkpoints and metrics.jsonl.")
@click.option("--resume", metavar="PATH|auto",
              help="Continue from a checkpoint; 'auto' takes OUTPUT/last.h5 when it exists.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Override a config value, e.g. --set solver.base_lr=0.1 (repeatable).")
@click.option("--max-iter", type=int, help="Stop after this many iterations in all.")
@click.option("--data-dir", envvar="NETRUN_DATA_DIR", help="Folder holding the dataset.")
@click.option("--data", "data_spec", metavar="SOURCE[:SPLIT]",
              help="Train on this data source instead, e.g. mnist-10k or mnist:standard "
                   "(maps a Caffe net's LMDB Data layers to a netrun source).")
@click.option("--weights", type=click.Path(dir_okay=False),
              help="Start from these weights: a netrun checkpoint or a Caffe .caffemodel(.h5).")
@click.option("--weights-partial", is_flag=True,
              help="Let --weights leave some layers at their initial values and skip file "
                   "layers the model lacks (fine-tuning with renamed layers).")
@algo_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def train(config, device, output, resume, overrides, max_iter, data_dir, data_spec, weights,
          weights_partial, algo_search, workspace_limit, as_json):
    """Train the model of CONFIG: a train-config YAML or a Caffe solver .prototxt."""
    from netrun.train.config import load_config, with_overrides  # lazy
    from netrun.train.trainer import Callbacks, Trainer  # lazy: loaded when the command runs

    data = _data_override(data_spec)
    if config.endswith(".prototxt"):
        from netrun.caffe import is_solver_file, solver_to_config  # lazy

        if not is_solver_file(config):
            abort(f"{config} is a Caffe net, not a solver: train with its solver .prototxt "
                  f"(or a train-config YAML whose model is this net)")
        cfg = with_overrides(solver_to_config(config, data, weights), list(overrides))
        for note in cfg.raw.get("notes", []):
            console.detail(f"note: {note}")
    else:
        cfg = with_overrides(load_config(config), list(overrides), data)
    weights = weights or cfg.raw.get("weights")
    if max_iter is not None:
        cfg.solver.max_iter = max_iter
    trainer = Trainer(cfg, device=device, output=output, data_dir=data_dir)
    mode = algo_search or (cfg.algo_search if cfg.algo_search != "heuristic" else None)
    configure_algos(trainer.ws, mode, workspace_limit)
    if resume == "auto":
        last = Path(trainer.output) / "last.h5"
        resume = str(last) if last.exists() else None
    console.info(f"training {trainer.model.name} on {trainer.source.describe()} "
                 f"({trainer.ws.device}), {cfg.solver.max_iter} iterations -> {trainer.output}")
    trainer.start(resume)
    if resume:
        console.info(f"resumed from {resume} at iteration {trainer.iteration}")
    elif weights:
        from netrun.weights import load_weights  # lazy: loaded when the command runs

        console.info(f"initial weights: {load_weights(trainer.ws, weights, trainer.model, weights_partial)}")

    state = {"start": time.perf_counter(), "examples": 0, "loss": None, "test": None}
    progress = _progress(cfg.solver.max_iter, trainer.iteration, as_json)

    def on_step(r):
        state["examples"] += r.examples
        state["loss"] = r.loss
        rate = state["examples"] / max(time.perf_counter() - state["start"], 1e-9)
        if progress is not None:
            progress.update(progress.task, completed=r.iteration,
                            info=f"loss {r.loss:.4f}  lr {r.lr:.2e}  {rate:,.0f} ex/s")
        elif cfg.solver.display and r.iteration % cfg.solver.display == 0 and not as_json:
            console.info(f"iter {r.iteration:>6}  loss {r.loss:.4f}  lr {r.lr:.3g}  {rate:,.0f} ex/s")

    def on_test(t):
        state["test"] = t
        metrics = "  ".join(f"{k} {v:.4f}" for k, v in t.metrics.items())
        line = f"test @ {t.iteration}: loss {t.loss:.4f}  {metrics}  ({t.examples} examples)"
        (progress.console.print(line) if progress is not None else
         (None if as_json else console.info(line)))

    def on_checkpoint(path, why):
        console.detail(f"checkpoint ({why}): {path}")

    # Ctrl-C and a kill (SIGTERM) ask the loop to stop after the current step, where it writes
    # a checkpoint and exits cleanly; a second one stops at once. SIGINT is set explicitly: a
    # process started in the background by a shell inherits it as ignored.
    stop = _StopRequest()
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with (progress or _Null()):
            trainer.run(cfg.solver.max_iter, Callbacks(on_step, on_test, on_checkpoint,
                                                       should_stop=stop.requested))
    except KeyboardInterrupt:
        console.warn(f"interrupted at iteration {trainer.iteration}; checkpoint saved to "
                     f"{Path(trainer.output) / 'last.h5'}")
        raise click.exceptions.Exit(130)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    seconds = time.perf_counter() - state["start"]
    test = state["test"]
    summary = {
        "iterations": trainer.iteration, "seconds": round(seconds, 3),
        "examples_per_second": round(state["examples"] / max(seconds, 1e-9), 1),
        "final_loss": state["loss"], "test_loss": test.loss if test else None,
        "test_metrics": test.metrics if test else {}, "best_accuracy": trainer.best_accuracy,
        "checkpoint": str(Path(trainer.output) / "last.h5"), "output": str(trainer.output),
    }
    if as_json:
        console.json(summary)
    else:
        acc = test.accuracy if test else None
        console.line(f"done: {trainer.iteration} iterations in {seconds:.1f} s"
                     + (f", test accuracy {acc:.2%}" if acc is not None else "")
                     + f"; checkpoint {summary['checkpoint']}")


def _data_override(spec: str | None) -> dict | None:
    """--data mnist-10k -> {'source': 'mnist-10k'}; mnist:standard -> with a split."""
    if not spec:
        return None
    source, _, split = spec.partition(":")
    return {"source": source, **({"split": split} if split else {})}


class _StopRequest:
    """A signal handler that asks the training loop to stop; a second signal interrupts."""

    def __init__(self):
        self.count = 0

    def __call__(self, signum, frame):
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt

    def requested(self) -> bool:
        return self.count > 0


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _progress(total: int, done: int, as_json: bool):
    """A rich progress bar on an interactive stderr; None when piped or with --json."""
    if as_json or not console.interactive or console.verbosity < 0:
        return None
    from rich.progress import (  # lazy: loaded when the command runs
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                        console=console.err, transient=False)
    progress.task = progress.add_task("train", total=total, completed=done, info="")
    return progress


__all__ = ["train", "abort"]
