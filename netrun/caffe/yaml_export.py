"""A translated Caffe model as netrun model YAML (`netrun convert model.prototxt model.yaml`).

The layer form cannot say everything a Caffe net does (in-place renames, BatchNorm's three
statistics blobs, Scale broadcasts), so this writes the raw form: `inputs`, `init_ops`
(fillers), `params` (per parameter: its Caffe layer and role, lr_mult and decay_mult where
they are not 1, and `trainable: false` for BatchNorm's statistics, which are saved but never
trained), `ops` (the TRAIN phase, plus the TEST phase's metric ops), `predict_ops`, `loss`,
`metrics`, `outputs`. Training from the YAML takes the same steps as training from the
prototxt. What stays out is the data layers (the training config names the data instead) and
the TEST phase's own ops: the YAML's test net is its train net in test mode, which is the
TEST phase unless the prototxt gives that phase other layers. The header comment lists the
data layers left out.
"""
from __future__ import annotations

from typing import Any

import yaml

from netrun.proto.defs import OperatorDef


def _op(o: OperatorDef) -> dict[str, Any]:
    d: dict[str, Any] = {"type": o.type, "inputs": list(o.inputs), "outputs": list(o.outputs)}
    if o.args:
        d["args"] = dict(o.args)
    if o.name:
        d["name"] = o.name
    return d


def _train_ops(model) -> tuple[list[OperatorDef], list[str]]:
    """TRAIN ops plus the TEST ops that compute metrics the TRAIN phase lacks."""
    ops = list(model.train_net.ops)
    have = {b for o in ops for b in o.outputs} | set(model.inputs) | set(model.param_names)
    metrics = [m for m in model.metrics if m in have]
    for o in (model.test_net.ops if model.test_net else []):
        missing = [m for m in o.outputs if m in model.metrics and m not in have]
        if missing and all(b in have for b in o.inputs):
            ops.append(o)
            have.update(o.outputs)
            metrics += missing
    return ops, metrics


def _params(model) -> dict[str, dict[str, Any]]:
    """Per parameter: Caffe layer and role, and the solver settings that are not defaults."""
    out = {}
    for p in model.params:
        d: dict[str, Any] = {}
        if p.layer:
            d["layer"] = p.layer
        d["role"] = p.role
        for key in ("lr_mult", "decay_mult"):
            if getattr(p, key) != 1.0:
                d[key] = _number(getattr(p, key))
        if not p.trainable and p.lr_mult != 0:
            d["trainable"] = False
        out[p.name] = d
    return out


def _number(v: float) -> int | float:
    return int(v) if float(v).is_integer() else float(v)


def _left_out(model) -> list[str]:
    notes = []
    for d in getattr(model, "data_layers", []):
        notes.append(f"{d.type} layer '{d.name}' ({d.phase}): source {d.source}, batch_size "
                     f"{d.batch_size}, transform {d.transform or 'none'}")
    return notes


def caffe_to_yaml(model) -> str:
    """Raw-form model YAML for a model from load_caffe_model (or any Model)."""
    ops, metrics = _train_ops(model)
    doc: dict[str, Any] = {"name": model.name}
    doc["inputs"] = {n: {"shape": list(s.shape), "dtype": s.dtype}
                     for n, s in model.inputs.items() if s is not None}
    doc["init_ops"] = [_op(o) for o in model.init_net.ops]
    doc["params"] = _params(model)
    doc["ops"] = [_op(o) for o in ops]
    doc["predict_ops"] = [_op(o) for o in model.predict_net.ops]
    if model.loss:
        doc["loss"] = model.loss
    if metrics:
        doc["metrics"] = metrics
    doc["outputs"] = list(model.outputs)
    header = [f"# {model.name}: converted from {model.source_path or 'a Caffe net'} by netrun."]
    notes = _left_out(model)
    if notes:
        header.append("# Left out (give the data in the training config):")
        header += [f"#   - {n}" for n in notes]
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100,
                          allow_unicode=True)
    return "\n".join(header) + "\n" + body
