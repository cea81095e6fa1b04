"""`netrun convert IN OUT`: write one net of a model as a NetDef (.pbtxt, binary .pb or
NetDef .yaml).

IN is anything `netrun.load_model` reads (layer/ops YAML, NetDef .pbtxt, .pb or .yaml, Caffe
.prototxt); OUT's extension picks the format. A layer model holds several nets: `--net`
chooses which one (predict by default, as Caffe2 shipped predict_net + init_net; convert
twice for both).
"""
from __future__ import annotations

import click

from netrun.cli.console import console


@click.command("convert")
@click.argument("source", metavar="IN", type=click.Path(dir_okay=False))
@click.argument("target", metavar="OUT", type=click.Path(dir_okay=False))
@click.option("--net", "which", type=click.Choice(["init", "train", "test", "predict"]),
              default="predict", show_default=True, help="Which net of the model to write.")
def convert(source: str, target: str, which: str) -> None:
    """Convert between model YAML, NetDef YAML, NetDef text (.pbtxt), Caffe2's binary NetDef
    (.pb) and Caffe .prototxt.

    A Caffe .prototxt converts to a netrun model YAML (all nets); other inputs write the
    net chosen by --net.
    """
    from netrun.model import load_model  # lazy: loaded when the command runs
    from netrun.proto.io import save_netdef  # lazy: loaded when the command runs

    model = load_model(source)
    if source.endswith(".prototxt") and target.endswith((".yaml", ".yml")):
        from pathlib import Path  # lazy: loaded when the command runs

        from netrun.caffe import caffe_to_yaml  # lazy: loaded when the command runs

        # A whole Caffe net becomes a netrun model YAML (ops, init_ops, predict_ops).
        Path(target).write_text(caffe_to_yaml(model))
        console.info(f"wrote model '{model.name}' as netrun model YAML to {target}")
        return
    net = model.net(which)
    save_netdef(net, target)
    console.info(f"wrote {which} net '{net.name}' ({len(net.ops)} ops) to {target}")
