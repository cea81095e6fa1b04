"""`netrun draw MODEL|CHECKPOINT`: a picture of a net (Graphviz DOT, SVG or PNG)."""
from __future__ import annotations

from pathlib import Path

import click

from netrun.cli.console import console


@click.command("draw", short_help="Draw a net as a picture (DOT, SVG, PNG).")
@click.argument("model_path", metavar="MODEL|CHECKPOINT", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write FILE: .dot (DOT text), .svg or .png (drawn by Graphviz's `dot`; "
                   "without it the .dot text is written beside). Default: DOT text on stdout.")
@click.option("--net", "which", type=click.Choice(("predict", "train")), default="predict",
              show_default=True,
              help="Which net to draw (a checkpoint's train net is its test-mode forward net "
                   "with loss and metrics).")
@click.option("-b", "--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Batch size in front of the inputs' shapes.")
def draw(model_path: str, output: str | None, which: str, batch: int) -> None:
    """Draw a net of MODEL (a model file) or CHECKPOINT (a netrun .h5): one box per layer
    with its type, output shapes and parameter count.

    \b
    Examples:
      netrun draw zoo/lenet.yaml -o lenet.svg
      netrun draw runs/lenet/best.h5 --net train -o lenet.dot
      netrun draw zoo/lenet.yaml | dot -Tpng -o lenet.png
    """
    from netrun.cli.inspect_cmd import load_model_or_checkpoint, report  # lazy
    from netrun.errors import NetrunError  # lazy
    from netrun.tools.net_drawing import GET_DOT, net_dot, render  # lazy

    model = load_model_or_checkpoint(model_path)
    text = net_dot(report(model, which, batch, {}))
    if output is None:
        console.text(text)
        return
    out = Path(output)
    suffix = out.suffix.lower()
    if suffix not in (".dot", ".gv", ".svg", ".png"):
        raise NetrunError(f"{out}: cannot draw a '{out.suffix}' file; use .dot, .svg or .png")
    if suffix in (".dot", ".gv"):
        _write(out, text)
        console.info(f"wrote {out}")
        return
    if render(text, out) is not None:
        console.info(f"wrote {out}")
        return
    # No `dot`: the DOT text still holds the whole drawing, and any Graphviz renders it later.
    dot_path = out.with_suffix(".dot")
    _write(dot_path, text)
    console.warn(f"{GET_DOT}. Wrote the DOT text to {dot_path} instead; draw it later with "
                 f"`dot -T{suffix[1:]} {dot_path} -o {out}`.")


def _write(path: Path, text: str) -> None:
    from netrun.util.atomic import write_text_atomic  # lazy: loaded when the command runs

    write_text_atomic(path, text)
