"""`netrun inspect MODEL|CHECKPOINT`: blobs, shapes, parameters and FLOPs of a model's nets."""
from __future__ import annotations

import re
from typing import Any

import click

from netrun.cli.console import console

NETS = ("init", "train", "test", "predict")
DTYPES = ("float32", "float64", "float16", "int32", "int64", "uint8")
CHECKPOINT_SUFFIXES = (".h5", ".hdf5")


def load_model_or_checkpoint(path: str):
    """A Model from a model file, from the nets and shapes a netrun checkpoint stores, or
    the model a train config names."""
    from pathlib import Path  # lazy: loaded when the command runs

    if Path(path).suffix.lower() not in CHECKPOINT_SUFFIXES:
        from netrun.model import load_model  # lazy
        from netrun.train.config import is_train_config, load_config  # lazy

        if is_train_config(path):
            model = load_config(path).model
            console.detail(f"{path} is a train config: its model is {model}")
            return load_model(model)
        return load_model(path)
    from netrun.train.checkpoint import model_from_checkpoint  # lazy

    return model_from_checkpoint(path)


def parse_inputs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict:
    """NAME=D1,D2,...[:DTYPE] or NAME=D1xD2x... (a full shape, batch first) ->
    {name: TensorSpec}."""
    from netrun.core.schema import TensorSpec  # lazy: loaded when the command runs

    specs = {}
    for text in values:
        name, eq, rest = text.partition("=")
        dims, _, dtype = rest.partition(":")
        try:
            shape = (tuple(int(d) for d in re.split(r"[,x×]", dims)) if dims.strip()
                     else ())
        except ValueError:
            shape = None
        if not eq or not name or shape is None or any(d <= 0 for d in shape):
            raise click.BadParameter(f"'{text}': expected NAME=D1,D2,... (positive integers, "
                                     f"batch first), e.g. data=64,1,28,28", ctx, param)
        if dtype and dtype not in DTYPES:
            raise click.BadParameter(f"'{text}': unknown dtype '{dtype}' (one of "
                                     f"{', '.join(DTYPES)})", ctx, param)
        specs[name] = TensorSpec(shape, dtype or "float32")
    return specs


@click.command("inspect", short_help="Shapes, parameters and FLOPs of a model or checkpoint.")
@click.argument("model_path", metavar="MODEL|CHECKPOINT", type=click.Path(dir_okay=False))
@click.option("-b", "--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Batch size added in front of the model's per-example input shapes.")
@click.option("-i", "--input", "inputs", multiple=True, metavar="NAME=D1,D2,...[:DTYPE]",
              callback=parse_inputs,
              help="Full shape (batch first) of an input blob, e.g. data=64,3,224,224 "
                   "(repeatable); needed for NetDef files, whose inputs have no shapes. Its "
                   "first dimension is the batch the FLOPs are counted for.")
@click.option("--init", "init_net", type=click.Path(dir_okay=False), metavar="INIT_NET",
              help="A Caffe2 init net (init_net.pb or .pbtxt) for a NetDef MODEL: the "
                   "weights' shapes come from its fill ops.")
@click.option("--net", "which", type=click.Choice(NETS), default="predict", show_default=True,
              help="Which net to analyse (a checkpoint's train net is its test net: it stores "
                   "the training step with its backward pass, not the forward net alone).")
@click.option("--nets", "show_nets", is_flag=True,
              help="Print the init, train and predict nets as NetDef text.")
@click.option("--json", "as_json", is_flag=True, help="Print the analysis as JSON (for scripts).")
@click.option("--rewritten", is_flag=True,
              help="Show the nets as netrun binds them: after the bind-time rewrites (BN "
                   "folded into convs, fused ReLUs), with the rules that fired.")
@click.option("--no-fuse", is_flag=True,
              help="With --rewritten: rewriting off, as `--no-fuse` runs the nets.")
@click.option("--memory", "memory", is_flag=True,
              help="Activation memory of the training step and the predict net as bound: "
                   "planned (shared by lifetime) against unplanned, and where the live set "
                   "peaks.")
@click.option("--no-memory-plan", is_flag=True,
              help="With --memory: planning off (every activation its own buffer).")
def inspect(model_path: str, batch: int, inputs: dict, init_net: str | None, which: str,
            show_nets: bool, as_json: bool, rewritten: bool, no_fuse: bool, memory: bool,
            no_memory_plan: bool) -> None:
    """Per-op shapes, parameters and FLOPs of one of MODEL's nets, or of the nets a netrun
    CHECKPOINT (.h5, written by train) stores, with its parameters' shapes. Shapes it cannot
    know without --input or --init are shown as ?.

    MODEL is a layer or ops YAML, a Caffe2 NetDef (.pbtxt, .pb, NetDef .yaml) or a Caffe
    .prototxt; a train config stands for the model it names.

    \b
    Examples:
      netrun inspect zoo/lenet.yaml --batch 64
      netrun inspect runs/quickstart/last.h5 --net train
      netrun inspect predict_net.pb --init init_net.pb --input data=1,3,224,224
      netrun inspect zoo/resnet20.yaml --rewritten --memory --batch 128
    """
    if init_net and model_path.lower().endswith(CHECKPOINT_SUFFIXES):
        from netrun.errors import NetrunError  # lazy: loaded when the command runs

        raise NetrunError(f"--init goes with a Caffe2 NetDef MODEL; {model_path} is a "
                          f"checkpoint, which holds its own weights")
    model = load_model_or_checkpoint(model_path)
    if init_net:
        from netrun.model.init_net import with_init_net  # lazy: loaded when the command runs
        from netrun.proto.io import load_netdef  # lazy: loaded when the command runs

        model = with_init_net(model, load_netdef(init_net), init_net)
    console.detail(f"loaded model '{model.name}' from {model_path}: {len(model.params)} "
                   f"params, nets init/train/predict of {len(model.init_net.ops)}/"
                   f"{len(model.train_net.ops)}/{len(model.predict_net.ops)} ops")
    if memory:
        from netrun.cli.memory_table import memory_plans, print_memory  # lazy

        plans = memory_plans(model, batch, inputs, not no_fuse, not no_memory_plan)
        if as_json:
            console.json({"model": model.name, "batch": batch, "memory_plan": not no_memory_plan,
                          "nets": plans})
        else:
            print_memory(plans, not no_memory_plan)
        return
    fuse = None if not rewritten else not no_fuse      # None: the nets as written
    if show_nets and not as_json:
        console.text(_nets_text(model, batch, inputs, fuse))
        return
    data = report(model, which, batch, inputs, fuse)
    if show_nets:
        data["nets"] = {w: _net_text(model, w, batch, inputs, fuse)
                        for w in ("init", "train", "predict")}
    if as_json:
        console.json(data)
    else:
        _print_report(data)
    if data["unknown_shapes"]["inputs"] or data["unknown_shapes"]["params"]:
        console.info("unknown shapes (?): " + _needs_text(data["unknown_shapes"]))


def rewritten_net(model, which: str, batch: int, overrides: dict, fuse: bool):
    """(net, Rewritten or None, input specs) of one net as netrun binds it on this CPU: the
    train net with the training rules, the test and predict nets with the inference rules
    and the layout plan."""
    # lazy: loaded when the command runs
    from netrun.rewrite import layout_block, rewrite, training_rewrite

    net, specs = model.net(which), model.input_specs(batch, overrides)
    if which == "init":
        return net, None, specs
    if which == "train":   # as the trainer rewrites it
        done = training_rewrite(model, "cpu", fuse)
        return done.net, done, {**specs, **done.derived_specs(specs.__getitem__)}
    keep = [b for b in (model.loss, *model.metrics, *model.outputs) if b]
    done = rewrite(net, "inference", keep, lambda n: specs[n].shape if n in specs else None,
                   fuse, layout_block("cpu"), lambda n: specs[n].dtype if n in specs else None)
    return done.net, done, {**specs, **done.derived_specs(specs.__getitem__)}


def report(model, which: str, batch: int, overrides: dict,
           fuse: bool | None = None) -> dict[str, Any]:
    """Everything `inspect` shows, as plain data (the --json output). fuse: None for the net
    as written, else the net after the bind-time rewrites (with rewriting on or off)."""
    from netrun.core.shape_inference import count_params  # lazy: loaded when the command runs
    from netrun.model.partial_shapes import infer_known_shapes  # lazy

    done = None
    if fuse is None:
        net, specs = model.net(which), model.input_specs(batch, overrides)
    else:
        net, done, specs = rewritten_net(model, which, batch, overrides, fuse)
    shapes = infer_known_shapes(net, specs)
    params = {p.name: p for p in model.params}
    data_inputs = set(model.data_inputs)

    def blob(name: str, spec) -> dict[str, Any]:
        if spec is None:                             # unknown: no --input or --init for it
            return {"name": name, "shape": None, "dtype": None, "param": name in params}
        return {"name": name, "shape": list(spec.shape), "dtype": spec.dtype,
                "param": name in params}

    ops = []
    for r in shapes.ops:
        known_cost = r.cost is not None             # None: an input's shape is unknown
        ops.append({
            "name": r.op.name, "type": r.op.type,
            "inputs": [blob(n, s) for n, s in zip(r.op.inputs, r.inputs)],
            "outputs": [blob(n, s) for n, s in zip(r.op.outputs, r.outputs)],
            "params": sum(s.size for n, s in zip(r.op.inputs, r.inputs)
                          if n in params and s is not None),
            "flops": r.cost.flops if known_cost else None,
            "bytes_read": r.cost.bytes_read if known_cost else None,
            "bytes_written": r.cost.bytes_written if known_cost else None})
    known = [p for p in params if p in shapes.blobs]
    # the inputs given a shape, and those the net reads without one (shown as ?)
    external = [n for n in net.external_inputs if n not in params
                and (n in shapes.blobs or n in shapes.unknown_inputs)]
    external += [n for n in shapes.unknown_inputs if n not in params and n not in external]
    inputs = [blob(n, shapes.get(n)) for n in external]
    return {
        "model": model.name, "source": model.source_path, "net": which, "net_name": net.name,
        "batch": _batch_used(inputs, data_inputs, batch),
        "inputs": inputs,
        "outputs": [blob(n, shapes.get(n)) for n in net.external_outputs],
        "unknown_shapes": {
            "inputs": [n for n in shapes.unknown_inputs if n not in params],
            "params": [n for n in shapes.unknown_inputs if n in params]},
        "params": [{**blob(n, shapes[n]), "size": shapes[n].size, "layer": params[n].layer,
                    "lr_mult": params[n].lr_mult, "decay_mult": params[n].decay_mult,
                    "trainable": params[n].trainable} for n in known],
        "total_params": count_params(shapes, known),
        "total_param_bytes": sum(shapes[n].nbytes for n in known),
        "total_flops": shapes.flops,
        "ops": ops,
        **({} if fuse is None else {"rewrites": [] if done is None else [
            {"rule": f.rule, "replaced": list(f.replaced), "made": f.made}
            for f in done.fired]}),
    }


def _batch_used(inputs: list[dict[str, Any]], data_inputs: set[str], asked: int) -> int:
    """The batch the shapes were inferred for: the first dimension of the first data input
    of known shape (an --input gives its own), else of any input; `asked` if none is known."""
    known = [b for b in inputs if b["shape"]]
    first = next((b for b in known if b["name"] in data_inputs), known[0] if known else None)
    return first["shape"][0] if first is not None else asked


def _print_report(d: dict[str, Any]) -> None:
    # The batch is a fact only where an input's shape is known (the others are shown as ?).
    known = d["net"] != "init" and any(b["shape"] for b in d["inputs"])
    batch = f", batch {d['batch']}" if known else ""
    console.line(f"{d['model']}: {d['net']} net '{d['net_name']}'{batch}", style="bold")
    console.line("inputs:  " + (", ".join(_blob_text(b) for b in d["inputs"]) or "none"))
    console.line("outputs: " + (", ".join(_blob_text(b) for b in d["outputs"]) or "none"))
    console.line()
    rows = []
    for i, o in enumerate(d["ops"]):
        ins = "\n".join(_blob_text(b) for b in o["inputs"] if not b["param"])
        outs = "\n".join(_blob_text(b) for b in o["outputs"])
        rows.append([i, o["name"], o["type"], ins, outs, f"{o['params']:,}" if o["params"] else "",
                     "?" if o["flops"] is None else _si(o["flops"])])
    console.table(["#", "name", "type", "inputs", "outputs", "params", "FLOPs"], rows,
                  right=("#", "params", "FLOPs"))
    console.line()
    unknown = d["unknown_shapes"]
    partial = " of known shape" if unknown["inputs"] or unknown["params"] else ""
    params, flops = f"parameters{partial}:", f"FLOPs{partial}:"
    console.line(f"{params:<{len(params) + 1}}{d['total_params']:,} "
                 f"({_si(d['total_param_bytes'], 'B')})")
    console.line(f"{flops:<{len(params) + 1}}{d['total_flops']:,} ({_si(d['total_flops'])})"
                 + (f" per batch of {d['batch']}" if batch else ""))
    if "rewrites" in d:
        console.line()
        console.line(f"bind-time rewrites: {len(d['rewrites']) or 'none'}", style="bold")
        for f in d["rewrites"]:
            if f["replaced"]:
                console.line(f"  {f['rule']}: {' + '.join(f['replaced'])} -> {f['made']}")
            else:   # an op the rewrite added (the layout plan's reorders)
                console.line(f"  {f['rule']}: added {f['made']}")


def _needs_text(unknown: dict[str, list[str]]) -> str:
    """What to pass for the shapes inspect could not know."""
    parts = []
    if unknown["inputs"]:
        names = unknown["inputs"]
        parts.append(f"the input{'s' if len(names) > 1 else ''} {', '.join(names)}: pass "
                     + " ".join(f"--input {n}=D1,D2,..." for n in names)
                     + " (the full shape, batch first)")
    if unknown["params"]:
        names = unknown["params"]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{len(names)} weight{'s' if len(names) > 1 else ''} ({shown}): pass the "
                     f"init net with --init INIT_NET (or --input for each)")
    return "; ".join(parts)


def _blob_text(b: dict[str, Any]) -> str:
    if b["shape"] is None:
        return f"{b['name']} ?"
    shape = "×".join(map(str, b["shape"])) if b["shape"] else "scalar"
    return f"{b['name']} {shape}" + ("" if b["dtype"] == "float32" else f" {b['dtype']}")


def _si(n: float, unit: str = "") -> str:
    """576, 1.15 M, 1.72 MB: three significant digits and an SI prefix."""
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000 or prefix == "T":
            break
        n /= 1000
    return f"{n:.3g} {prefix}{unit}".strip()


def _net_text(model, which: str, batch: int = 1, overrides: dict | None = None,
              fuse: bool | None = None) -> str:
    from netrun.proto.pbtxt import netdef_to_text  # lazy: loaded when the command runs

    if fuse is None:
        return netdef_to_text(model.net(which))
    return netdef_to_text(rewritten_net(model, which, batch, overrides or {}, fuse)[0])


def _nets_text(model, batch: int = 1, overrides: dict | None = None,
               fuse: bool | None = None) -> str:
    label = "" if fuse is None else " (rewritten)" if fuse else " (rewriting off)"
    return "\n".join(f"# {w} net{label if w != 'init' else ''}\n"
                     f"{_net_text(model, w, batch, overrides, fuse)}"
                     for w in ("init", "train", "predict"))
