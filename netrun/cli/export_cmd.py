"""`netrun export CHECKPOINT|MODEL out.onnx`: the predict net and its weights as ONNX."""
from __future__ import annotations

from pathlib import Path

import click

from netrun.cli.console import console

MODEL_SUFFIXES = (".prototxt", ".yaml", ".yml", ".pbtxt", ".pb.txt", ".pb", ".onnx")


@click.command(short_help="Export a checkpoint or model to ONNX.", epilog="""\b
Examples:
  netrun export runs/quickstart/best.h5 lenet.onnx
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
    """Export the predict net of CHECKPOINT (a netrun .h5) or MODEL (with --weights) and its
    parameters to the ONNX file OUT.onnx, checked by onnx.checker. Needs the onnx extra."""
    from netrun.export import export_onnx, source_from_checkpoint, source_from_model
    from netrun.train.config import is_train_config  # lazy: loaded when the command runs

    if is_train_config(source):
        raise click.UsageError(f"{source} is a train config: export the checkpoint its run "
                               f"wrote (e.g. its output folder's best.h5), or its model with "
                               f"--weights")
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
