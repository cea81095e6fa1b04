"""A translated Caffe model as netrun model YAML (`netrun convert model.prototxt model.yaml`).

The layer form cannot say everything a Caffe net does (in-place renames, BatchNorm's three
statistics blobs, Scale broadcasts), so this writes the raw form: `inputs`, `init_ops`
(fillers), `ops` (the TRAIN phase, plus the TEST phase's metric ops), `predict_ops`, `loss`,
`metrics`, `outputs`. The raw form has no place for per-parameter lr_mult/decay_mult, for
statistics that are saved but not trained, or for the data layers; the header comment lists
what was left out, so the YAML model is exact for inference and close for training.
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


def _left_out(model) -> list[str]:
    notes = []
    mults = [f"{p.name} (lr_mult {p.lr_mult:g}, decay_mult {p.decay_mult:g})"
             for p in model.params if (p.lr_mult, p.decay_mult) != (1.0, 1.0) and p.trainable]
    if mults:
        notes.append("per-parameter multipliers: " + ", ".join(mults))
    frozen = [p.name for p in model.params if not p.trainable]
    if frozen:
        notes.append("parameters that are saved but not trained (the raw form trains every "
                     "init_ops output): " + ", ".join(frozen))
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
        header.append("# Not expressible in this raw form, and left out:")
        header += [f"#   - {n}" for n in notes]
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100,
                          allow_unicode=True)
    return "\n".join(header) + "\n" + body
