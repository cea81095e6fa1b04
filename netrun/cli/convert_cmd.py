"""`netrun convert IN OUT`: a model in another format, chosen by OUT's extension.

IN is anything `netrun.load_model` reads (layer/ops YAML, NetDef .pbtxt, .pb or .yaml, Caffe
.prototxt). OUT may be a NetDef (.pbtxt, binary .pb, NetDef .yaml: one net, chosen by
`--net`, as Caffe2 shipped predict_net + init_net), a netrun model YAML (from a Caffe
.prototxt: every net, with each parameter's lr_mult, decay_mult and whether it is trained),
or a Caffe .prototxt (a deploy file, or with `--net train` a train_val file; `--weights`
writes the .caffemodel beside it).
"""
from __future__ import annotations

from pathlib import Path

import click

from netrun.cli.console import console

CAFFE_NETS = ("predict", "train")


@click.command("convert", short_help="Convert a model between netrun YAML, Caffe2 NetDefs and "
                                     "Caffe prototxt.",
               epilog="""\b
Examples:
  netrun convert zoo/lenet.yaml lenet_predict.pbtxt           # predict net as NetDef text
  netrun convert zoo/lenet.yaml init_net.pb --net init        # Caffe2 binary init net
  netrun convert predict_net.pb predict_net.pbtxt             # binary NetDef to text
  netrun convert lenet_train_test.prototxt lenet.yaml         # Caffe to netrun model YAML
  netrun convert zoo/resnet20.yaml resnet20_deploy.prototxt   # Caffe deploy file
  netrun convert zoo/lenet.yaml lenet_train_val.prototxt --net train --batch 64
  netrun convert zoo/lenet.yaml lenet.prototxt --weights runs/lenet/best.h5
                                            # also writes lenet.caffemodel""")
@click.argument("source", metavar="IN", type=click.Path(dir_okay=False))
@click.argument("target", metavar="OUT", type=click.Path(dir_okay=False))
@click.option("--net", "which", type=click.Choice(["init", "train", "test", "predict"]),
              default="predict", show_default=True,
              help="Which net to write. NetDef OUT: any one net of the model. Caffe .prototxt "
                   "OUT: predict (a deploy file: Input layers, no loss, accuracy or data "
                   "layers) or train (a train_val file with both phases: data layers, loss, "
                   "and accuracy under include { phase: TEST } where only testing has it).")
@click.option("--batch", type=click.IntRange(1), default=1, show_default=True,
              help="Caffe .prototxt OUT only: the batch size (first dim) of the Input layers "
                   "it declares.")
@click.option("--weights", type=click.Path(dir_okay=False, exists=True),
              help="Caffe .prototxt OUT only: also write OUT's .caffemodel beside it, holding "
                   "these weights (a netrun checkpoint, a .caffemodel(.h5) or a Caffe2 init "
                   "net).")
def convert(source: str, target: str, which: str, batch: int, weights: str | None) -> None:
    """Convert the model IN into the format OUT's extension names: a NetDef (.pbtxt, Caffe2's
    binary .pb, NetDef .yaml), a netrun model YAML (.yaml, from a Caffe .prototxt), or a Caffe
    NetParameter (.prototxt, for toolchains that take only Caffe).

    \b
    A Caffe .prototxt IN to .yaml keeps every net, each parameter's lr_mult and decay_mult,
    and BatchNorm statistics as saved-but-not-trained: training the YAML takes the same
    steps. A .prototxt OUT maps each op to its Caffe layer (Conv to Convolution, FC to
    InnerProduct, SpatialBN to BatchNorm + Scale, ...) with lr_mult/decay_mult in param { };
    ops with no Caffe layer are all listed in one error (exit status 2). What Caffe can only
    approximate is said in the file's header comment.
    """
    from netrun.model import load_model  # lazy: loaded when the command runs

    caffe_out = target.lower().endswith(".prototxt")
    ctx = click.get_current_context()
    for name in ("batch", "weights"):
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE \
                and not caffe_out:
            raise click.UsageError(f"--{name} goes with a Caffe .prototxt OUT")
    model = load_model(source)
    if caffe_out:
        _to_prototxt(model, source, target, which, batch, weights)
    elif source.lower().endswith(".prototxt") and target.lower().endswith((".yaml", ".yml")):
        from netrun.caffe import caffe_to_yaml  # lazy: loaded when the command runs

        # A whole Caffe net becomes a netrun model YAML (ops, init_ops, params, predict_ops).
        Path(target).write_text(caffe_to_yaml(model))
        console.info(f"wrote model '{model.name}' as netrun model YAML to {target}")
    else:
        from netrun.proto.io import save_netdef  # lazy: loaded when the command runs

        net = model.net(which)
        save_netdef(net, target)
        console.info(f"wrote {which} net '{net.name}' ({len(net.ops)} ops) to {target}")


def _to_prototxt(model, source: str, target: str, which: str, batch: int,
                 weights: str | None) -> None:
    """Write the Caffe prototxt (and, with weights, the caffemodel beside it)."""
    from netrun.caffe.prototxt_export import to_caffe  # lazy: loaded when the command runs
    from netrun.util.atomic import write_text_atomic  # lazy: loaded when the command runs

    if which not in CAFFE_NETS:
        raise click.UsageError(f"a Caffe .prototxt holds the predict net (a deploy file) or the "
                               f"train net with both phases (train_val), not --net {which}")
    net = to_caffe(model, which, batch)
    values = _weights(model, weights) if weights else None
    write_text_atomic(target, net.text(source))
    console.info(f"wrote Caffe {net.kind} net '{net.name}' ({len(net.layers)} layers) to "
                 f"{target}")
    if values is not None:
        from netrun.caffe.caffemodel_export import write_caffemodel  # lazy

        caffemodel = Path(target).with_suffix(".caffemodel")
        write_caffemodel(caffemodel, net, values)
        console.info(f"wrote the weights of {len(net.weight_layers())} layers to {caffemodel}")
    for note in net.notes:
        console.info(f"note: {note}")


def _weights(model, path: str) -> dict:
    """Every parameter of the model, as the weights file sets it."""
    from netrun.core.workspace import Workspace  # lazy: loaded when the command runs
    from netrun.weights import load_weights  # lazy: loaded when the command runs

    ws = Workspace("cpu", seed=0, memory_plan=False)
    ws.run_net_once(model.init_net)
    console.detail(load_weights(ws, path, model))
    return {p.name: ws.fetch_blob(p.name) for p in model.params}
