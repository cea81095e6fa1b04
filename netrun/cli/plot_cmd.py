"""`netrun plot RUN_DIR...`: training curves (loss, learning rate, test accuracy) of runs."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import click

from netrun.cli.console import console


def _metrics(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in value.split(",") if m.strip())
    if not names:
        raise click.BadParameter("name at least one metric, e.g. loss,lr,accuracy", ctx, param)
    return names


@click.command("plot", short_help="Training curves of runs (terminal, PNG, SVG).")
@click.argument("run_dirs", metavar="RUN_DIR...", nargs=-1, required=True,
                type=click.Path(file_okay=True, dir_okay=True))
@click.option("-o", "--output", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the chart to FILE: .png (Pillow) or .svg. Default: a chart in the "
                   "terminal (plotext), or a table of the last values when stdout is not a "
                   "terminal.")
@click.option("-m", "--metric", "metrics", default="loss,lr,accuracy", show_default=True,
              callback=_metrics, metavar="NAME[,NAME...]",
              help="Metrics to draw, one panel each: names in metrics.jsonl (loss, lr, "
                   "test_loss, ...); a name X not logged means test_X (accuracy: the test "
                   "accuracy).")
def plot(run_dirs: tuple[str, ...], output: str | None, metrics: tuple[str, ...]) -> None:
    """Plot training curves against iterations from RUN_DIRs' metrics.jsonl, runs overlaid
    (the legend names each run folder).

    \b
    Examples:
      netrun plot runs/lenet
      netrun plot runs/lenet runs/lenet_adam -o curves.png
      netrun plot runs/lenet --metric loss,test_loss -o loss.svg
    """
    from netrun.errors import NetrunError  # lazy: loaded when the command runs
    from netrun.tools import curves  # lazy

    runs = curves.read_runs(run_dirs)
    if output is not None:
        out = Path(output)
        suffix = out.suffix.lower()
        if suffix not in (".png", ".svg"):
            raise NetrunError(f"{out}: cannot draw a '{out.suffix}' file; use .png or .svg")
        chart = curves.layout(runs, metrics)
        if suffix == ".svg":
            from netrun.util.atomic import write_text_atomic  # lazy

            write_text_atomic(out, curves.svg_text(chart))
        else:
            from netrun.util.atomic import atomic_path  # lazy

            with atomic_path(out) as tmp:
                curves.write_png(chart, tmp)
        console.info(f"wrote {out}")
        return
    if not sys.stdout.isatty():
        # Piped or redirected: a chart of box characters is noise there; the numbers are not.
        columns, rows = curves.last_values(runs, metrics)
        curves.select(runs, metrics)          # the same error as a chart when nothing matches
        console.table(columns, rows, right=columns[1:])
        return
    try:
        size = shutil.get_terminal_size()
        text = curves.terminal_chart(runs, metrics, size.columns, max(size.lines - 2, 20))
    except NetrunError as e:
        if curves.INSTALL_PLOTEXT not in str(e):
            raise
        console.warn(str(e))
        columns, rows = curves.last_values(runs, metrics)
        console.table(columns, rows, right=columns[1:])
        return
    console.text(text)
