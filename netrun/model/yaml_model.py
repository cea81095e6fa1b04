"""Model YAML: the layer form (`layers:`) and the raw form (`ops:`/`init_ops:`) -> Model.

In the raw form every init_ops output is a parameter, trained with lr_mult and decay_mult 1
unless `params:` says otherwise, per parameter:

    params:
      conv1_b: {layer: conv1, role: bias, lr_mult: 2, decay_mult: 0}
      bn1_mean: {layer: bn1, role: running_mean, trainable: false}   # saved, never trained

(`lr_mult: 0` also leaves a parameter untrained, as in Caffe; `layer` is the Caffe layer
whose blobs it is.) A YAML file with neither `layers:` nor `inputs:` is a NetDef in YAML and
is loaded as a bare net (see netrun.model.model_from_netdef). Every error points at
file:line:column.
"""
from __future__ import annotations

import difflib
import inspect
from pathlib import Path
from typing import Any

from netrun.core.schema import OpSchema, TensorSpec, all_schemas, get_schema
from netrun.core.shape_inference import infer_op
from netrun.errors import NetrunError, ParseError, UnknownOpError, suggest
from netrun.model.builder import LAYERS, LOSSES, METRICS, ModelBuilder, options
from netrun.model.model import Model, Param, model_from_netdef
from netrun.proto.defs import NetDef, OperatorDef
from netrun.proto.netdef_yaml import netdef_from_yaml
from netrun.proto.yaml_marks import (
    MarkedDict,
    MarkedList,
    check_keys,
    error_at,
    expect_type,
    load_yaml,
)
from netrun.util import safe_yaml

MODEL_KEYS = ("name", "description", "inputs", "layers", "loss", "metrics", "predict")
RAW_MODEL_KEYS = ("name", "description", "inputs", "ops", "init_ops", "predict_ops", "loss",
                  "metrics", "outputs", "params")
PARAM_KEYS = ("layer", "role", "lr_mult", "decay_mult", "trainable")
ROLES = ("weight", "bias", "scale", "running_mean", "running_var", "running_factor")
OP_KEYS = ("type", "name", "inputs", "outputs", "args", "device", "engine")
DTYPES = ("float32", "float64", "float16", "int32", "int64", "uint8")


def model_from_yaml_file(path: str | Path, data_inputs: list[str] | None = None) -> Model:
    """Load a model YAML file (layer or raw form), or a NetDef written as YAML."""
    return model_from_yaml(safe_yaml.read_text(path), str(path), data_inputs)


def model_from_yaml(text: str, filename: str | None = None,
                    data_inputs: list[str] | None = None) -> Model:
    """Parse model YAML text; `filename` is used in error messages and as the default name."""
    doc = load_yaml(text, filename)
    if not isinstance(doc, MarkedDict):
        raise error_at(doc, "a model file is a mapping with 'inputs' and 'layers' (or 'ops')",
                       file=filename)
    if "layers" not in doc and "inputs" not in doc:
        return model_from_netdef(netdef_from_yaml(text, filename), filename, data_inputs)
    default_name = Path(filename).stem if filename else "model"
    if "ops" in doc and "layers" not in doc:
        return _raw_model(doc, filename, default_name)
    check_keys(doc, MODEL_KEYS, "a model (layer form; use 'ops:' for raw operators)")
    if "layers" not in doc:
        raise error_at(doc, "the model has no 'layers' (or 'ops')")
    return _layer_model(doc, filename, default_name)


# Inputs -----------------------------------------------------------------------------------
def _inputs(doc: MarkedDict) -> dict[str, tuple[tuple[int, ...], str | None]]:
    """inputs: {name: [d1, d2, ...]} or {name: {shape: [...], dtype: int32}} (per example)."""
    if "inputs" not in doc:
        raise error_at(doc, "the model declares no 'inputs' (name: per-example shape)")
    node = expect_type(doc, "inputs", dict, "a mapping of input name to per-example shape")
    result = {}
    for name, value in node.items():
        dtype = None
        if isinstance(value, dict):
            check_keys(value, ("shape", "dtype"), f"input '{name}'")
            if "dtype" in value:
                dtype = expect_type(value, "dtype", str, "a dtype name")
                if dtype not in DTYPES:
                    raise error_at(value, f"unknown dtype '{dtype}'{suggest(dtype, DTYPES)}",
                                   "dtype", value=True)
            shape, where, key = value.get("shape", []), value, "shape"
        else:
            shape, where, key = value, node, name
        if not isinstance(shape, list) or not all(_is_int(d) and d > 0 for d in shape):
            raise error_at(where, f"input '{name}': the shape must be a list of positive "
                                  f"integers (per example, without the batch), got {shape!r}",
                           key, value=True)
        result[str(name)] = (tuple(shape), dtype)
    return result


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# Layer form -------------------------------------------------------------------------------
def _layer_model(doc: MarkedDict, filename: str | None, default_name: str) -> Model:
    name = expect_type(doc, "name", str, "a string") if "name" in doc else default_name
    b = ModelBuilder(name)
    for input_name, (shape, dtype) in _inputs(doc).items():
        b.add_input(input_name, shape, dtype)
    layers = expect_type(doc, "layers", list, "a list of layers")
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise error_at(layers, f"layer {i + 1} must be a mapping with a 'type'", i)
        _call(b, layer, LAYERS, "layer", f"{{type}}{i + 1}")
    if doc.get("loss") is not None:
        _call(b, expect_type(doc, "loss", dict, "a mapping with a 'type'"), LOSSES, "loss")
    metrics = doc.get("metrics") or MarkedList()
    if not isinstance(metrics, list):
        raise error_at(doc, "'metrics' must be a list of mappings", "metrics", value=True)
    for i, metric in enumerate(metrics):
        if not isinstance(metric, dict):
            raise error_at(metrics, "a metric is a mapping with a 'type'", i)
        _call(b, metric, METRICS, "metric")
    _predict(b, doc)
    return b.build(source_path=filename)


def _call(b: ModelBuilder, node: MarkedDict, table: dict, what: str,
          default_name: str | None = None) -> str:
    """Check one layer/loss/metric mapping against its builder method and call it."""
    if "type" not in node:
        raise error_at(node, f"this {what} has no 'type' (one of: {', '.join(table)})")
    kind = expect_type(node, "type", str, f"a {what} type name")
    if kind not in table:
        raise error_at(node, f"unknown {what} type '{kind}'{suggest(kind, table)} (known: "
                             f"{', '.join(table)})", "type", value=True)
    method = table[kind]
    required, optional = options(method)
    check_keys(node, ("type", "name", "input", *required, *optional), f"a {kind} {what}")
    if "name" in node:
        expect_type(node, "name", str, "a string")
    if "input" in node and not _blobs(node["input"]):
        raise error_at(node, "'input' must be a blob name or a list of blob names", "input",
                       value=True)
    name = node.get("name") or (default_name.format(type=kind) if default_name else None)
    label = f"{what} '{name}' ({kind})" if name else f"{what} {kind}"
    for key in required:
        if key not in node:
            raise error_at(node, f"{label} needs '{key}'")
    annotations = inspect.signature(method).parameters
    kwargs = {}
    for key, value in node.items():
        if key in ("type", "name", "input"):
            continue
        _check_option(node, key, value, str(annotations[key].annotation), label)
        kwargs[key] = value
    if name is not None:
        kwargs["name"] = name
    try:
        return method(b, node.get("input"), **kwargs)
    except ParseError:
        raise
    except NetrunError as e:
        message = str(e) if f"'{name}'" in str(e) else f"{label}: {e}"
        key = getattr(e, "key", None)   # builder.OptionError: point at the option's value
        if key in node:
            raise error_at(node, message, key, value=True) from e
        raise error_at(node, message) from e


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _list_of(v: Any, ok) -> bool:
    return isinstance(v, list) and all(ok(x) for x in v)


# Annotation of a builder argument (its start) -> (accepts(value), what it must be)
_CHECKS = (
    ("Filler", lambda v: True, ""),               # the builder checks fillers
    ("Mult", lambda v: _num(v) or _list_of(v, _num), "a number or a list of numbers"),
    ("int | Sequence[int]", lambda v: _is_int(v) or _list_of(v, _is_int),
     "an integer or a list of integers"),
    ("Sequence[int]", lambda v: _list_of(v, _is_int), "a list of integers"),
    ("Sequence[str]", lambda v: isinstance(v, str) or _list_of(v, lambda x: isinstance(x, str)),
     "a blob name or a list of them"),
    ("bool", lambda v: isinstance(v, bool) or v in (0, 1), "true or false"),
    ("float", _num, "a number"),
    ("int", _is_int, "an integer"),
    ("str", lambda v: isinstance(v, str), "a string"),
)


def _blobs(v: Any) -> bool:
    return isinstance(v, str) or (_list_of(v, lambda x: isinstance(x, str)) and len(v) > 0)


def _check_option(node: MarkedDict, key: str, value: Any, annotation: str, label: str) -> None:
    if value is None and "None" in annotation:
        return
    for pattern, ok, what in _CHECKS:
        if annotation.startswith(pattern):
            if not ok(value):
                raise error_at(node, f"{label}: '{key}' must be {what}, got {value!r}", key,
                               value=True)
            return


def _predict(b: ModelBuilder, doc: MarkedDict) -> None:
    """predict: softmax | {output: blob, softmax: true} (what the predict net returns)."""
    node = doc.get("predict")
    if node is None:
        return
    if node == "softmax":
        node = MarkedDict(softmax=True)
    if not isinstance(node, dict):
        raise error_at(doc, "'predict' is 'softmax' or a mapping {output: blob, softmax: bool}",
                       "predict", value=True)
    check_keys(node, ("output", "softmax"), "predict")
    try:
        b.set_predict(node.get("output"), bool(node.get("softmax", False)))
    except NetrunError as e:
        raise error_at(doc, str(e), "predict", value=True) from e


# Raw form ---------------------------------------------------------------------------------
def _raw_model(doc: MarkedDict, filename: str | None, default_name: str) -> Model:
    check_keys(doc, RAW_MODEL_KEYS, "a model (raw form)")
    name = expect_type(doc, "name", str, "a string") if "name" in doc else default_name
    inputs = _inputs(doc)
    ops = _ops(doc, "ops")
    init_ops = _ops(doc, "init_ops") if "init_ops" in doc else []
    loss = expect_type(doc, "loss", str, "a blob name") if doc.get("loss") is not None else None
    metrics = [str(m) for m in (doc.get("metrics") or [])]
    heads = ([loss] if loss else []) + metrics
    if "outputs" in doc:
        outputs = [str(o) for o in expect_type(doc, "outputs", list, "a list of blob names")]
    else:  # what the loss reads (as in the layer form), else the last op's first output
        outputs = [next((o.inputs[0] for o in ops if loss in o.outputs and o.inputs),
                        ops[-1].outputs[0])] if ops else []
    predict_ops = (_ops(doc, "predict_ops") if "predict_ops" in doc
                   else _needed_for(ops, set(outputs)))
    read = {b for o in predict_ops for b in o.inputs}
    labels = [n for n in inputs if n not in read]
    specs = {n: TensorSpec(shape, dtype or ("int32" if n in labels else "float32"))
             for n, (shape, dtype) in inputs.items()}
    param_names = [b for o in init_ops for b in o.outputs]
    data = [n for n in inputs if n not in labels]
    init_net = NetDef(f"{name}_init", init_ops, [], param_names)
    param_specs = _check_shapes(doc, "init_ops", init_ops, {})
    _check_shapes(doc, "ops", ops, {**param_specs, **{n: TensorSpec((1, *s.shape), s.dtype)
                                                      for n, s in specs.items()}})
    settings = _param_settings(doc, param_names)
    params = [Param(p, param_specs[p].shape if p in param_specs else None, **settings.get(p, {}))
              for p in param_names]
    return Model(name=name, init_net=init_net,
                 train_net=NetDef(f"{name}_train", ops, list(inputs) + param_names,
                                  heads or outputs),
                 predict_net=NetDef(f"{name}_predict", predict_ops, data + param_names, outputs),
                 inputs=specs, params=params, outputs=outputs, loss=loss, metrics=metrics,
                 source_path=filename, labels=labels)


def _param_settings(doc: MarkedDict, names: list[str]) -> dict[str, dict[str, Any]]:
    """`params:` {name: {layer, role, lr_mult, decay_mult, trainable}} -> Param keywords."""
    if doc.get("params") is None:
        return {}
    node = expect_type(doc, "params", dict, "a mapping of parameter name to its settings")
    result = {}
    for name, value in node.items():
        if name not in names:
            raise error_at(node, f"'{name}' is not a parameter (parameters are the outputs of "
                                 f"init_ops){suggest(str(name), names)}", name)
        if not isinstance(value, dict):
            raise error_at(node, f"parameter '{name}': give a mapping with any of "
                                 f"{', '.join(PARAM_KEYS)}", name, value=True)
        check_keys(value, PARAM_KEYS, f"parameter '{name}'")
        kw: dict[str, Any] = {}
        for key in ("lr_mult", "decay_mult"):
            if key in value:
                if not _num(value[key]):
                    raise error_at(value, f"parameter '{name}': '{key}' must be a number, got "
                                          f"{value[key]!r}", key, value=True)
                kw[key] = float(value[key])
        if "trainable" in value:
            kw["trainable"] = expect_type(value, "trainable", bool, "true or false")
        if "layer" in value:
            kw["layer"] = expect_type(value, "layer", str, "a layer name")
        if "role" in value:
            kw["role"] = expect_type(value, "role", str, "a parameter role")
            if kw["role"] not in ROLES:
                raise error_at(value, f"parameter '{name}': unknown role '{kw['role']}'"
                                      f"{suggest(kw['role'], ROLES)} (roles: {', '.join(ROLES)})",
                               "role", value=True)
        # As in Caffe, lr_mult 0 means the solver leaves the parameter alone.
        kw["trainable"] = kw.get("trainable", True) and kw.get("lr_mult", 1.0) != 0
        result[str(name)] = kw
    return result


def _check_shapes(doc: MarkedDict, key: str, ops: list[OperatorDef],
                  specs: dict[str, TensorSpec]) -> dict[str, TensorSpec]:
    """Infer shapes op by op (batch of one) so a mismatch points at the op's line; ops that
    read blobs of unknown shape are left for `netrun inspect --input`."""

    specs = dict(specs)
    for i, op in enumerate(ops):
        if all(b in specs for b in op.inputs):
            try:
                specs.update(zip(op.outputs, infer_op(op, [specs[b] for b in op.inputs]).outputs))
            except NetrunError as e:
                raise error_at(doc[key], str(e), i) from e
    return specs


def _needed_for(ops: list[OperatorDef], outputs: set[str]) -> list[OperatorDef]:
    """The ops that the given blobs depend on, in net order (walking backwards)."""
    needed, keep = set(outputs), []
    for o in reversed(ops):
        if any(b in needed for b in o.outputs):
            keep.append(o)
            needed.update(o.inputs)
    return keep[::-1]


def _ops(doc: MarkedDict, key: str) -> list[OperatorDef]:
    node = expect_type(doc, key, list, "a list of operators")
    result = []
    for i, item in enumerate(node):
        if not isinstance(item, dict):
            raise error_at(node, "an operator is a mapping with 'type', 'inputs', 'outputs'", i)
        result.append(op_from_node(item))
    return result


def lookup_schema(type_: str) -> OpSchema:
    """get_schema, with a looser "did you mean" for typos of short names (Convolutoin)."""
    try:
        return get_schema(type_)
    except UnknownOpError as e:
        if "did you mean" in str(e):
            raise
        known = [t for t in all_schemas() if not t.endswith("Gradient")]
        near = difflib.get_close_matches(type_, known, n=1, cutoff=0.5)
        hint = f", did you mean '{near[0]}'?" if near else " (`netrun ops` lists them all)"
        raise UnknownOpError(f"unknown op type '{type_}'{hint}") from None


def op_from_node(node: MarkedDict) -> OperatorDef:
    """One raw operator: {type, inputs, outputs, name, args: {...}}; other keys are args too."""
    if "type" not in node:
        raise error_at(node, "this operator has no 'type'")
    type_ = expect_type(node, "type", str, "an op type name")
    try:
        schema = lookup_schema(type_)
    except NetrunError as e:
        raise error_at(node, str(e), "type", value=True) from e
    args_node = node.get("args") or MarkedDict()
    if not isinstance(args_node, dict):
        raise error_at(node, "'args' must be a mapping of argument name to value", "args",
                       value=True)
    args = {}
    arg_names = [a.name for a in schema.args]
    for where, key in [(args_node, k) for k in args_node] + [(node, k) for k in node
                                                              if k not in OP_KEYS]:
        if schema.arg_spec(key) is None:
            hint = suggest(str(key), arg_names + list(OP_KEYS) * (where is node))
            raise error_at(where, f"{type_} has no argument '{key}'{hint} (arguments: "
                                  f"{', '.join(arg_names) or 'none'})", key)
        args[key] = _arg_value(where, key)
    op = OperatorDef(type_, tuple(_names(node, "inputs")), tuple(_names(node, "outputs")), args,
                     str(node.get("name", "")), node.get("device"), str(node.get("engine", "")))
    try:
        schema.verify(op)
    except NetrunError as e:
        raise error_at(node, str(e)) from e
    return op


def _arg_value(node: MarkedDict, key: str) -> Any:
    """An argument's value: an int, float, string or bool, or a flat list of them."""
    value = node[key]
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, (bool, int, float, str)) for v in items):
        raise error_at(node, f"argument '{key}' must be a number, a string or a list of them, "
                             f"got {value!r}", key, value=True)
    return value


def _names(node: MarkedDict, key: str) -> list[str]:
    value = node.get(key, [])
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise error_at(node, f"'{key}' must be a blob name or a list of blob names", key,
                       value=True)
    return list(value)
