"""`netrun train CONFIG`: train, test, checkpoint and resume.

SIGINT, SIGTERM and SIGHUP finish the current step, write a checkpoint and exit with
128 + the signal's number; a second signal stops at once (see netrun.cli.signals). Every
message about checkpoints says what is on disk, never more.
"""
from __future__ import annotations

import time
from pathlib import Path

import click

from netrun.cli.algo_options import algo_options, configure_algos
from netrun.cli.console import abort, console
from netrun.cli.signals import StopRequest, signal_name


def _existing_file(ctx: click.Context, param: click.Parameter, path: str) -> str:
    """`path` if it is a file, else a usage error that names the closest file beside it."""
    if path is None:         # missing: said by the command, which knows why (--tensorboard)
        return path
    where = Path(path)
    if where.is_file():
        return path
    import difflib  # lazy: loaded when the command runs

    folder = where.parent
    names = [p.name for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
    close = difflib.get_close_matches(where.name, names, n=1, cutoff=0.6)
    hint = f", did you mean '{where.with_name(close[0])}'?" if close else ""
    raise click.BadParameter(f"no such file '{path}'{hint}", ctx, param)


@click.command(short_help="Train a model from a train config (or a Caffe solver).")
@click.argument("config", metavar="CONFIG", type=click.Path(dir_okay=False),
                callback=_existing_file,
                required=False)
@click.option("--device", help="cpu, gpu or gpu:N (default: the config's).")
@click.option("-o", "--output", help="Run folder for checkpoints and metrics.jsonl (default: "
              "the config's `output`, relative to the config file).")
@click.option("--resume", metavar="PATH|auto",
              help="Continue from a checkpoint; 'auto' takes OUTPUT/last.h5 (else its newest "
                   "iter_<N>.h5) when there is one, else starts a new run.")
@click.option("--force", is_flag=True,
              help="Start a new run in an output folder that holds another run's checkpoints: "
                   "deletes its last.h5, best.h5 and iter_<N>.h5 (metrics.jsonl is kept).")
@click.option("--allow-changes", is_flag=True,
              help="Resume even where the config's batch size, solver, lr policy or data "
                   "settings differ from the checkpoint's (each is shown as a warning).")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Override a config value, e.g. --set solver.base_lr=0.1 (repeatable).")
@click.option("--max-iter", type=int, help="Stop after this many iterations in all.")
@click.option("--data-dir", envvar="NETRUN_DATA_DIR",
              help="Folder holding the dataset (default: the config's data.dir, else "
                   "$NETRUN_DATA/<source>, else ~/.cache/netrun/<source>). [env: "
                   "NETRUN_DATA_DIR]")
@click.option("--data", "data_spec", metavar="SOURCE[:SPLIT]",
              help="Train on this data source instead, e.g. mnist-10k or mnist:standard "
                   "(maps a Caffe net's LMDB Data layers to a netrun source).")
@click.option("--weights", type=click.Path(dir_okay=False),
              help="Start from these weights: a netrun checkpoint or a Caffe .caffemodel(.h5).")
@click.option("--weights-partial", is_flag=True,
              help="Let --weights leave some layers at their initial values and skip file "
                   "layers the model lacks (fine-tuning with renamed layers).")
@click.option("--no-fuse", is_flag=True, help="Run the nets as written, without the bind-time "
              "fusions (as `fuse: false` in the config).")
@click.option("--no-memory-plan", is_flag=True, help="Give every activation its own buffer "
              "(as `memory_plan: false` in the config).")
@click.option("--executor", type=click.Choice(["simple", "dag"]), default=None,
              help="Run nets in order (simple) or as a dependency graph on worker threads "
                   "(dag); as `executor:` in the config.")
@algo_options
@click.option("--nproc", type=click.IntRange(min=1), metavar="N",
              help="Train as N data-parallel processes on this machine: the same command "
                   "run N times by MPI's mpiexec, each with cores/N threads (NETRUN_THREADS "
                   "unless set). Needs the dist extra. Across machines: mpiexec -n N -hosts "
                   "a,b netrun train CONFIG.")
@click.option("--tensorboard", "tensorboard", is_flag=False, flag_value="", default=None,
              metavar="[DIR]",
              help="Write TensorBoard scalars (loss, learning rate, test metrics, examples/s) "
                   "to DIR, default the run folder's tensorboard/ (as `tensorboard: true|DIR` "
                   "in the config). Needs the tensorboard extra. Put it after CONFIG, or write "
                   "--tensorboard=DIR.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def train(config, device, output, resume, force, allow_changes, overrides, max_iter, data_dir,
          data_spec, weights, weights_partial, no_fuse, no_memory_plan, executor, algo_search,
          workspace_limit, tf32, nproc, tensorboard, as_json):
    """Train the model of CONFIG: a train-config YAML or a Caffe solver .prototxt.

    Tests every solver.test_interval iterations, writes checkpoints (last.h5, best.h5,
    iter_<N>.h5) and metrics.jsonl to the run folder, and resumes exactly where a run
    stopped. Ctrl-C finishes the current step and writes a checkpoint.

    \b
    Examples:
      netrun train configs/quickstart.yaml
      netrun train configs/quickstart.yaml --resume auto --max-iter 1600
      netrun train configs/quickstart.yaml --tensorboard   # then: tensorboard --logdir runs
      netrun train lenet_solver.prototxt --data mnist-10k
      netrun train configs/resnet20_cifar10.yaml --nproc 2     # 2 data-parallel ranks
    """
    if config is None:
        _missing_config(tensorboard)
    if nproc is not None and nproc > 1:
        # Before anything else (signal handlers, data): this process only starts the ranks.
        from netrun.train.dist import launch  # lazy

        status = launch.launch(nproc, _command_line(click.get_current_context(), "nproc"),
                               note=console.detail)
        note = launch.failure_note(status, nproc)
        if note:
            console.warn(note)
        raise click.exceptions.Exit(status)
    from netrun.train import run_folder  # lazy
    from netrun.train.config import load_config, with_overrides  # lazy
    from netrun.train.dist import launched_rank  # lazy
    from netrun.train.trainer import Callbacks, Interrupted, Trainer  # lazy

    # Installed first, as set-up (data, model, resume) can take a while too; restored when
    # the command's context closes.
    holder: dict = {}
    stop = StopRequest(lambda name: _abrupt_stop(holder.get("trainer"), name)).install()
    click.get_current_context().call_on_close(stop.restore)
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
    if no_fuse:
        cfg.fuse = False
    if no_memory_plan:
        cfg.memory_plan = False
    if executor:
        cfg.executor = executor
    folder = Path(output or cfg.output)
    if force and resume:
        abort("--force starts a new run and --resume continues one: give only one of them")
    if resume and resume != "auto" and not Path(resume).is_file():    # before the data loads
        abort(f"--resume {resume}: no such checkpoint (--resume auto takes the newest in the "
              f"run folder, {folder})")
    root = launched_rank() == 0       # the rank that writes the run folder
    for p in (run_folder.remove_stale_temps(folder) if root else []):
        console.detail(f"removed {p}, left behind by a stopped run")
    auto = resume == "auto"
    if auto:
        found = run_folder.newest(folder)
        resume = str(found) if found else None
        if resume is None:
            console.detail(f"--resume auto: no checkpoint in {folder}; starting a new run")
    if not force:
        run_folder.check_new_run(folder, resume, auto)
    trainer = Trainer(cfg, device=device, output=str(folder), data_dir=data_dir,
                      tensorboard=None if tensorboard is None else (tensorboard or True))
    holder["trainer"] = trainer
    mode = algo_search or (cfg.algo_search if cfg.algo_search != "heuristic" else None)
    configure_algos(trainer.ws, mode, workspace_limit, tf32 or cfg.tf32)
    console.info(f"training {trainer.model.name} on {trainer.source.describe()} "
                 f"({trainer.ws.device}), {cfg.solver.max_iter} iterations -> {trainer.output}")
    if trainer.tensorboard_dir is not None:
        console.info(f"TensorBoard scalars -> {trainer.tensorboard_dir} (view them with "
                     f"`tensorboard --logdir {trainer.tensorboard_dir}`)")
    changes = trainer.start(resume, allow_changes=allow_changes)
    # after start: the test net's layout plan needs the parameters the init net made
    for which, done in trainer.rewrites.items():
        console.detail(f"bind-time rewrites of the {which} net: {done.summary()}")
    for change in changes:
        console.warn(f"resuming with a changed setting (--allow-changes): {change}")
    if resume:
        console.info(f"resumed from {resume} at iteration {trainer.iteration}")
    elif weights:
        from netrun.weights import load_weights  # lazy: loaded when the command runs

        loaded = load_weights(trainer.ws, weights, trainer.model, weights_partial)
        console.info(f"initial weights: {loaded}")
    if stop.requested():      # before --force deletes anything: nothing has changed yet
        console.warn(f"stopped by {signal_name(stop.first)} before training started; "
                     f"nothing was written")
        raise click.exceptions.Exit(128 + stop.first)
    if force and root:
        removed = run_folder.clear(folder)
        if removed:
            console.info(f"--force: deleted {len(removed)} checkpoint(s) of the previous run "
                         f"in {folder}")

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
            console.info(f"iter {r.iteration:>6}  loss {r.loss:.4f}  lr {r.lr:.3g}  "
                         f"{rate:,.0f} ex/s")

    def on_test(t):
        state["test"] = t
        metrics = "  ".join(f"{k} {v:.4f}" for k, v in t.metrics.items())
        line = f"test @ {t.iteration}: loss {t.loss:.4f}  {metrics}  ({t.examples} examples)"
        (progress.console.print(line) if progress is not None else
         (None if as_json else console.info(line)))

    def on_checkpoint(path, why):
        console.detail(f"checkpoint ({why}): {path}")

    # Waits inside the loop (the first test renders the test part) are told on the bar's
    # own line: a second live display beside the bar is not possible.
    shown = None if progress is None else (
        lambda words: progress.update(progress.task, note=f"({words})" if words else ""))
    try:
        with (progress or _Null()), console.waits(shown):
            trainer.run(cfg.solver.max_iter, Callbacks(on_step, on_test, on_checkpoint,
                                                       should_stop=stop.requested))
    except Interrupted as e:
        by = f" by {signal_name(stop.first)}" if stop.first else ""
        if e.checkpoint is not None:
            console.warn(f"interrupted at iteration {e.iteration}{by}; checkpoint saved: "
                         f"{folder / 'last.h5'} (iteration {e.iteration})")
        else:
            console.warn(f"interrupted at iteration {e.iteration}{by}; no checkpoint written "
                         f"({e.reason}){_newest(trainer)}")
        raise click.exceptions.Exit(128 + (stop.first or 2))
    except KeyboardInterrupt:    # not through the handlers (e.g. raised by other code)
        console.warn(f"interrupted at iteration {trainer.iteration}; no checkpoint was written "
                     f"for it{_newest(trainer)}")
        raise click.exceptions.Exit(130)
    seconds = time.perf_counter() - state["start"]
    test = state["test"]
    summary = {
        "iterations": trainer.iteration, "seconds": round(seconds, 3),
        "examples_per_second": round(state["examples"] / max(seconds, 1e-9), 1),
        "final_loss": state["loss"], "test_loss": test.loss if test else None,
        "test_metrics": test.metrics if test else {}, "best_accuracy": trainer.best_accuracy,
        "checkpoint": str(Path(trainer.output) / "last.h5"), "output": str(trainer.output),
    }
    if not trainer.is_root:
        return                        # rank 0 reports for the job
    if as_json:
        console.json(summary)
    else:
        acc = test.accuracy if test else None
        console.line(f"done: {trainer.iteration} iterations in {seconds:.1f} s"
                     + (f", test accuracy {acc:.2%}" if acc is not None else "")
                     + f"; checkpoint {summary['checkpoint']}")


def _missing_config(tensorboard: str | None) -> None:
    """Stop with the usage error for a missing CONFIG; name --tensorboard when it took it."""
    ctx = click.get_current_context()
    if tensorboard and Path(tensorboard).is_file():
        raise click.UsageError(f"--tensorboard took '{tensorboard}' as its folder, leaving no "
                               f"CONFIG: put --tensorboard after CONFIG, or write "
                               f"--tensorboard=DIR", ctx)
    param = next(p for p in ctx.command.params if p.name == "config")
    raise click.MissingParameter(ctx=ctx, param=param)


def _command_line(ctx: click.Context, drop: str) -> list[str]:
    """The arguments that gave `ctx` (from `netrun`'s options on), without option `drop`:
    rebuilt from what click parsed, so it holds under CliRunner too (no sys.argv there)."""
    chain = []
    while ctx is not None:
        chain.append(ctx)
        ctx = ctx.parent
    args: list[str] = []
    for level, c in enumerate(reversed(chain)):
        if level:
            args.append(c.info_name)
        positional: list[str] = []
        for p in c.command.params:
            if p.name == drop or not p.expose_value or p.name not in c.params:
                continue
            if c.get_parameter_source(p.name) is not click.core.ParameterSource.COMMANDLINE:
                continue
            value = c.params[p.name]
            if isinstance(p, click.Argument):
                positional += [str(v) for v in (value if p.nargs != 1 else [value])]
                continue
            name = max(p.opts, key=len)
            if p.is_flag and p.secondary_opts and not value:
                args.append(max(p.secondary_opts, key=len))
            elif p.is_flag:
                args += [name] if value else []
            elif p.count:
                args += [name] * value
            elif p.multiple:
                for v in value:
                    args += [name, str(v)]
            else:
                args += [name, str(value)]
        if any(a.startswith("-") for a in positional):
            args.append("--")     # so a path like -x.yaml is not read as an option
        args += positional
    return args


def _data_override(spec: str | None) -> dict | None:
    """--data mnist-10k -> {'source': 'mnist-10k'}; mnist:standard -> with a split."""
    if not spec:
        return None
    source, _, split = spec.partition(":")
    return {"source": source, **({"split": split} if split else {})}


def _newest(trainer) -> str:
    """'; the newest checkpoint ... ' from what this process itself wrote."""
    if trainer.saved is not None:
        iteration, path = trainer.saved
        return f"; the newest checkpoint this run wrote is {path} (iteration {iteration})"
    return "; this run wrote no checkpoint"


def _abrupt_stop(trainer, name: str) -> str:
    """What a second signal leaves on disk, in one sentence (see StopRequest)."""
    head = f"second signal ({name}): stopped at once"
    if trainer is None:
        return f"{head} during set-up; no checkpoint was written"
    out = Path(trainer.output)
    if trainer.writing is not None:
        return (f"{head} while writing {trainer.writing} in {out}: each holds either its new "
                f"or its previous contents, never a partial file")
    if trainer.at_boundary and trainer.saved is not None and trainer.saved[0] == trainer.iteration:
        return (f"{head} after iteration {trainer.iteration}, whose checkpoint had been "
                f"written: {out / 'last.h5'}")
    where = (f"after iteration {trainer.iteration}" if trainer.at_boundary else
             f"during iteration {trainer.iteration + 1}")
    return f"{head} {where}, without writing a checkpoint of it{_newest(trainer)}"


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
                        TextColumn("{task.fields[note]}", style="dim"),
                        console=console.err, transient=False)
    progress.task = progress.add_task("train", total=total, completed=done, info="", note="")
    return progress


__all__ = ["train", "abort"]
