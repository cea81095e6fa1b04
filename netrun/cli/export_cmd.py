"""`netrun export CHECKPOINT|MODEL out.onnx`: the predict net and its weights as ONNX."""
from __future__ import annotations

from pathlib import Path

import click

from netrun.cli.console import console

MODEL_SUFFIXES = (".prototxt", ".yaml", ".yml", ".pbtxt", ".pb.txt", ".pb")


@click.command(epilog="""\b
Examples:
  netrun export runs/lenet/checkpoint.h5 lenet.onnx
  netrun export deploy.prototxt alexnet.onnx --weights bvlc_alexnet.caffemodel
  netrun export zoo/resnet20.yaml resnet20.onnx --opset 13 --batch 1
""")
@click.argument("source", metavar="CHECKPOINT|MODEL", type=click.Path(dir_okay=False, exists=True))
@click.argument("output", metavar="OUT.onnx", type=click.Path(dir_okay=False))
@click.option("--weights", type=click.Path(dir_okay=False, exists=True),
              help="With a MODEL file: its weights (.caffemodel, a netrun checkpoint or a "
                   "Caffe2 init net). Without it a model exports its init net's fillers.")
@click.option("--opset", type=click.IntRange(13), default=17, show_default=True,
              help="ONNX opset version of the exported model (13 or newer).")
@click.option("--batch", type=click.IntRange(1),
              help="A fixed batch size for the input; default: a symbolic 'batch' dimension.")
def export(source, output, weights, opset, batch):
    """Export the predict net and its parameters to an ONNX file, checked by onnx.checker."""
    from netrun.export import export_onnx, source_from_checkpoint, source_from_model
    if source.endswith(MODEL_SUFFIXES):
        src = source_from_model(source, weights)
    else:
        if weights:
            raise click.UsageError("--weights goes with a MODEL file, not a checkpoint")
        src = source_from_checkpoint(source)
    model = export_onnx(src, output, opset=opset, batch=batch)
    size = Path(output).stat().st_size
    console.line(f"wrote {output}: {len(model.graph.node)} ONNX nodes, opset {opset}, input "
                  f"'{src.input_name}' {['batch' if batch is None else batch, *src.input_shape]}"
                  f", output(s) {', '.join(src.outputs)} ({size / 1e6:.1f} MB)")
