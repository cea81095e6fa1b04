"""`netrun infer CHECKPOINT INPUT`: predictions (and accuracy when labels are known)."""
from __future__ import annotations

from pathlib import Path

import click

from netrun.cli.console import console, json_text
from netrun.errors import NetrunError

SHOWN = 20
MODEL_SUFFIXES = (".prototxt", ".yaml", ".yml", ".pbtxt", ".pb.txt", ".pb", ".onnx")


@click.command(short_help="Predict with a checkpoint (or a model and its weights).")
@click.argument("checkpoint", metavar="CHECKPOINT|MODEL", type=click.Path(dir_okay=False))
@click.argument("input", metavar="INPUT")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write predictions to .npy (probabilities), .npz, .json or .csv.")
@click.option("-k", "--top-k", type=click.IntRange(1), default=1, show_default=True,
              help="How many of the most probable classes to show per example.")
@click.option("-b", "--batch-size", type=click.IntRange(1), default=256, show_default=True,
              help="Examples per forward pass (memory, not results, depends on it).")
@click.option("--device", default="cpu", show_default=True, help="cpu, gpu or gpu:N.")
@click.option("--data-dir", help="Folder holding the dataset of a SOURCE:PART input.")
@click.option("--raw", is_flag=True, help="Feed INPUT as is, without the training config's "
              "test-time transform (scale, mean, crop).")
@click.option("--scale", type=float,
              help="Multiply the inputs by this after any transform (e.g. 0.00390625 for a "
                   "Caffe deploy net trained on 0..1 pixels).")
@click.option("--weights", type=click.Path(dir_okay=False),
              help="With a MODEL file (.prototxt, .yaml, .pbtxt, .pb): its weights, a "
                   ".caffemodel(.h5), a netrun checkpoint or a Caffe2 init net.")
@click.option("--init", "init_net", type=click.Path(dir_okay=False), metavar="INIT_NET",
              help="With a Caffe2 predict net (predict_net.pb or .pbtxt): its init net "
                   "(init_net.pb or .pbtxt), whose fill ops hold the weights.")
@click.option("--json", "as_json", is_flag=True, help="Print predictions as JSON on stdout.")
@click.option("--no-fuse", is_flag=True,
              help="Run the predict net as written, without the bind-time fusions.")
@click.option("--no-memory-plan", is_flag=True,
              help="Give every activation its own buffer (no sharing by lifetime).")
@click.option("--executor", type=click.Choice(["simple", "dag"]), default="simple",
              show_default=True, help="Run the net in order (simple) or as a dependency graph "
              "on worker threads (dag).")
def infer(checkpoint, input, output, top_k, batch_size, device, data_dir, raw, scale, weights,
          init_net, as_json, no_fuse, no_memory_plan, executor):
    """Predict on INPUT with a netrun CHECKPOINT, or with a MODEL file and --weights (e.g. a
    Caffe deploy.prototxt and its .caffemodel), or a Caffe2 predict net and --init
    (predict_net.pb, init_net.pb).

    INPUT is a .npy/.npz/.h5 file (one example or a batch), images (a PNG/JPEG/... file, a
    quoted glob, a folder, a Caffe list file of "path label" lines, an LMDB/LevelDB of
    Datums), or SOURCE:PART such as mnist-10k:test. Images are resized to the size the net
    was trained on and get the training config's test-time transform.

    \b
    Examples:
      netrun infer runs/quickstart/best.h5 digit.png --top-k 3
      netrun infer runs/quickstart/best.h5 'photos/*.jpg' -o predictions.csv
      netrun infer runs/quickstart/best.h5 val.txt            # list file: accuracy too
      netrun infer predict_net.pb cat.jpg --init init_net.pb
    """
    import numpy as np

    from netrun.infer import load_inputs, score  # lazy: loaded when the command runs
    from netrun.util.progress import activity  # lazy

    # Binding compiles the net's Numba kernels on a first run: many seconds without a word.
    with activity("preparing the net (a first run compiles kernels, cached for later runs)"):
        predictor = _predictor(checkpoint, weights, init_net, device, no_fuse, no_memory_plan,
                               executor)
    console.detail(f"bind-time rewrites: {predictor.rewritten.summary()}")
    inputs = load_inputs(input, predictor, data_dir, transform=not raw)
    for warning in inputs.warnings:
        console.warn(warning)
    if scale is not None:
        inputs.data *= scale
    probs = predictor.predict(inputs.data, batch_size)
    k = min(top_k, probs.shape[1])
    top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    scores = score(probs, inputs.labels) if inputs.labels is not None else None
    named_classes = predictor.class_name(0, probs.shape[1]) is not None
    records = [{"index": i, **({"input": inputs.names[i]} if inputs.names else {}),
                "top_k": [[int(c), float(probs[i, c])] for c in top[i]],
                **({"top_k_names": [predictor.class_name(int(c), probs.shape[1]) for c in top[i]]}
                   if named_classes else {}),
                **({"label": int(inputs.labels[i])} if inputs.labels is not None else {})}
               for i in range(len(probs))]
    if output:
        _write(Path(output), probs, top, records)
        console.info(f"wrote {len(probs)} predictions to {output}")
    if as_json:
        console.json({"checkpoint": checkpoint, "input": input, "count": len(probs),
                      **(scores or {}), "predictions": records})
        return
    if not output:
        named = inputs.names is not None
        rows = [(r["index"], *([r["input"]] if named else []),
                 " ".join(f"{_class_text(r, j)}:{p:.3f}" for j, (_, p) in enumerate(r["top_k"])),
                 r.get("label", "")) for r in records[:SHOWN]]
        console.table(["#", *(["input"] if named else []), f"top-{k} class:probability",
                       "label"], rows, right=["#"])
        if len(records) > SHOWN:
            console.line(f"... {len(records) - SHOWN} more (use --output or --json for all)")
    if scores is not None:
        console.line(f"accuracy {scores['accuracy']:.2%}  loss {scores['loss']:.4f}  "
                     f"on {scores['examples']} examples of {input}")


def _predictor(checkpoint: str, weights: str | None, init_net: str | None, device: str,
               no_fuse: bool, no_memory_plan: bool, executor: str):
    """The bound predict net of a checkpoint, or of a model file and its weights."""
    from netrun.infer import Predictor  # lazy: loaded when the command runs

    options = {"fuse": not no_fuse, "memory_plan": not no_memory_plan, "executor": executor}
    from netrun.train.config import is_train_config  # lazy

    if is_train_config(checkpoint):
        raise NetrunError(f"{checkpoint} is a train config: predict with the checkpoint its "
                          f"run wrote (best.h5 or last.h5 in its output folder)")
    if checkpoint.lower().endswith(MODEL_SUFFIXES):
        return Predictor.from_model(checkpoint, _weights_of(checkpoint, weights, init_net),
                                    device, **options)
    if init_net or weights:
        given = "--init goes with a Caffe2 predict net (predict_net.pb or .pbtxt)" if init_net \
            else "--weights goes with a MODEL file (.prototxt, .yaml, .pbtxt, .pb)"
        raise NetrunError(f"{given}; {checkpoint} is a checkpoint, which holds its own weights")
    return Predictor.from_checkpoint(checkpoint, device, **options)


def _weights_of(model: str, weights: str | None, init_net: str | None) -> str | None:
    """The one weights file a MODEL runs with: --weights, or --init for a Caffe2 net (None:
    an ONNX model, whose initializers are its weights)."""
    from netrun.proto.io import is_caffe2_netdef  # lazy: loaded when the command runs

    if weights and init_net:
        raise NetrunError("give the weights once: --init INIT_NET or --weights FILE, not both")
    if model.lower().endswith(".onnx") and not (weights or init_net):
        return None
    caffe2 = is_caffe2_netdef(model)
    if init_net and not is_caffe2_netdef(init_net):
        raise NetrunError(f"--init {init_net}: an init net is a Caffe2 NetDef (.pb, .pbtxt); "
                          f"give a caffemodel or a checkpoint with --weights")
    if not (weights or init_net):
        raise NetrunError(f"{model} is a model file: give its init net with --init "
                          f"(e.g. init_net.pb) or its weights with --weights" if caffe2 else
                          f"{model} is a model file: give its weights with --weights")
    return weights or init_net


def _class_text(record: dict, j: int) -> str:
    """The j-th predicted class of a record: its name with its index, or the index."""
    index = record["top_k"][j][0]
    names = record.get("top_k_names")
    return f"{names[j]} ({index})" if names else str(index)


def _csv_field(text: str) -> str:
    """A CSV field, quoted when the text holds a comma, a quote or a line break."""
    if any(ch in text for ch in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _write(path: Path, probs, top, records) -> None:
    import numpy as np

    if path.suffix == ".npy":
        np.save(path, probs)
    elif path.suffix == ".npz":
        np.savez(path, probabilities=probs, top_k=top)
    elif path.suffix == ".json":
        path.write_text(json_text(records, indent=None))
    elif path.suffix == ".csv":
        named, labelled = "input" in records[0], "label" in records[0]
        classes, k = "top_k_names" in records[0], len(records[0]["top_k"])
        # One prediction keeps the plain column names; --top-k K numbers them 1..K.
        suffixes = [""] if k == 1 else [str(j + 1) for j in range(k)]
        head = [f"prediction{s}" + (f",class{s}" if classes else "") + f",probability{s}"
                for s in suffixes]
        lines = [",".join(["index", *(["input"] if named else []), *head,
                           *(["label"] if labelled else [])])]
        for r in records:
            cells = [str(r["index"]), *([_csv_field(r["input"])] if named else [])]
            for j, (c, p) in enumerate(r["top_k"]):
                cells += [str(c), *([_csv_field(r["top_k_names"][j])] if classes else []),
                          f"{p:.6f}"]
            lines.append(",".join(cells + ([str(r["label"])] if labelled else [])))
        path.write_text("\n".join(lines) + "\n")
    else:
        raise NetrunError(f"--output '{path}': use .npy, .npz, .json or .csv")
