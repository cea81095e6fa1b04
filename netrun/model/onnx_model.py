"""ONNX models as netrun Models: `netrun.load_model("model.onnx")`, so every command that
takes a MODEL runs them, and `netrun train` fine-tunes them.

The init net fills the parameters with the file's initializers (GivenTensorFill, as a Caffe2
init net does); the predict net is the graph in netrun operators, in inference mode; the
train net runs the same operators in training mode (BatchNorm on batch statistics, Dropout
dropping) and, when the first output is a batch of class scores (N×K), adds softmax
cross-entropy against an int32 input `label` and its accuracy, so the model trains as it is.
Initializers are trainable parameters, except BatchNorm's running statistics; values from
Constant nodes stay fixed. Every node netrun cannot run is listed in one error.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from netrun.core.schema import TensorSpec
from netrun.errors import suggest
from netrun.model.loading import register_format
from netrun.model.model import Model
from netrun.model.onnx_fold import FOLDERS, foldable
from netrun.model.onnx_graph import Const, Graph, Namer, Node, Poisoned, Unsupported
from netrun.model.onnx_nodes import CONVERTERS
from netrun.model.onnx_read import (
    DEFAULT_DOMAINS,
    OnnxGraph,
    OnnxImportError,
    ValueInfo,
    read_onnx,
)
from netrun.proto.defs import NetDef, OperatorDef, op

FLOAT = 1     # TensorProto.FLOAT
ELEMENT_TYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64",
                 8: "string", 9: "bool", 10: "float16", 11: "float64", 16: "bfloat16"}


@register_format(".onnx")
def load_onnx_model(path: str | Path, data_inputs: list[str] | None = None) -> Model:
    """Translate an ONNX model into a Model whose init net holds its initializers.

    `data_inputs` (ONNX names) picks and orders the graph inputs fed as data; by default,
    every graph input that is not an initializer, in the file's order.
    """
    return model_from_onnx(read_onnx(path), str(path), data_inputs)


def model_from_onnx(g: OnnxGraph, where: str, data_inputs: list[str] | None = None) -> Model:
    """The Model of a read ONNX graph; every problem is raised at once."""
    problems = [(None, "", why) for why in g.problems]
    nodes = _live(g)
    read = {n for node, _ in nodes for n in node.inputs if n} | {v.name for v in g.outputs}
    inputs = _chosen_inputs(g, read, data_inputs, where)
    batch, static = _batch(inputs)
    cx = Graph(g.opset, batch, static, Namer())
    for v in inputs:
        shape = _example_shape(v, problems)
        if shape is not None:
            blob = cx.names.name(v.name)
            cx.blobs[v.name] = blob
            cx.specs[blob] = TensorSpec((batch, *shape))
        else:
            cx.poisoned.add(v.name)
    for name, value in g.initializers.items():
        cx.consts[name] = Const(value, trainable=value.dtype.kind == "f")
    for node, _ in nodes:
        for n in node.inputs:
            cx.consumers.setdefault(n, []).append(node)
    cx.graph_outputs = {v.name for v in g.outputs}
    for node, domain in nodes:
        try:
            _convert(cx, node, domain)
        except Unsupported as e:
            problems.append((node.op_type, node.label, str(e)))
            cx.poisoned.update(node.outputs)
        except Poisoned:
            cx.poisoned.update(node.outputs)
    data = [cx.blobs[v.name] for v in inputs if v.name in cx.blobs]
    outputs = _outputs(cx, g.outputs, data, len(g.nodes), problems)
    if problems:
        raise OnnxImportError(_message(where, g.opset, problems))
    return _assemble(cx, Path(where).stem, data, outputs, where)


def _live(g: OnnxGraph) -> list[tuple[Node, str]]:
    """The nodes the graph outputs depend on (with their domains), in graph order."""
    needed = {v.name for v in g.outputs}
    live = []
    for node, domain in reversed(list(zip(g.nodes, g.domains))):
        if any(o in needed for o in node.outputs if o):
            live.append((node, domain))
            needed.update(n for n in node.inputs if n)
    return live[::-1]


def _chosen_inputs(g: OnnxGraph, read: set[str], data_inputs: list[str] | None,
                   where: str) -> list[ValueInfo]:
    by_name = {v.name: v for v in g.inputs}
    if data_inputs is None:
        return [v for v in g.inputs if v.name in read]
    unknown = [d for d in data_inputs if d not in by_name]
    if unknown:
        raise OnnxImportError(f"{where}: the graph has no input '{unknown[0]}'"
                              f"{suggest(unknown[0], by_name)}")
    missing = [v.name for v in g.inputs if v.name in read and v.name not in data_inputs]
    if missing:
        raise OnnxImportError(f"{where}: the graph reads input '{missing[0]}' too; name every "
                              f"input it reads")
    return [by_name[d] for d in data_inputs]


def _batch(inputs: list[ValueInfo]) -> tuple[int, bool]:
    """The batch size the file fixes (its first input's first dim), else 1 and symbolic."""
    for v in inputs:
        if v.dims and isinstance(v.dims[0], int) and v.dims[0] > 0:
            return v.dims[0], True
    return 1, False


def _example_shape(v: ValueInfo, problems: list) -> tuple[int, ...] | None:
    """One example's shape (the dims after the batch), or None with the reason recorded."""
    why = None
    if v.elem_type != FLOAT:
        why = (f"has element type {ELEMENT_TYPES.get(v.elem_type, v.elem_type)}; netrun feeds "
               f"float32 inputs")
    elif not v.dims:
        why = "has no shape (netrun needs one example's shape)"
    elif not all(isinstance(d, int) and d > 0 for d in v.dims[1:]):
        why = (f"has dims {['?' if not isinstance(d, int) or d <= 0 else d for d in v.dims]}; "
               f"netrun needs every dim after the batch fixed")
    if why is not None:
        problems.append((None, "", f"input '{v.name}' {why}"))
        return None
    return tuple(int(d) for d in v.dims[1:])


def _convert(cx: Graph, node: Node, domain: str) -> None:
    if domain not in DEFAULT_DOMAINS:
        raise Unsupported(f"operator domain '{domain}' is not supported (netrun runs the "
                          f"default ONNX operator set)")
    known = node.op_type in CONVERTERS or node.op_type in FOLDERS
    if any(n in cx.poisoned for n in node.inputs if n):
        if known:
            raise Poisoned(node.label)
        raise Unsupported("operator not supported")
    if foldable(cx, node):
        FOLDERS[node.op_type](cx, node)
    elif node.op_type in CONVERTERS:
        CONVERTERS[node.op_type](cx, node)
    elif known:
        raise Unsupported("supported only on values known at load time (initializers, "
                          "Constants, shapes), not on tensors computed at run time")
    else:
        raise Unsupported("operator not supported")
    unread = node.unread()
    if unread:
        raise Unsupported(f"attribute{'s' * (len(unread) > 1)} {', '.join(unread)} not "
                          f"supported")


def _outputs(cx: Graph, outputs: list[ValueInfo], data: list[str], count: int,
             problems: list) -> list[str]:
    """The blobs of the graph outputs; one that is an input, a parameter or another output
    gets a copy of its own."""
    blobs: list[str] = []
    for k, v in enumerate(outputs):
        if v.name in cx.poisoned:
            continue
        blob = cx.blobs.get(v.name)
        if blob is None:
            why = "is a constant" if v.name in cx.consts else "is made by no node"
            problems.append((None, "", f"output '{v.name}' {why}; netrun's outputs are "
                                       f"computed from the inputs"))
            continue
        if blob in cx.params or blob in blobs or blob in data:
            node = Node("Identity", f"{v.name}_copy", [v.name], [v.name], {}, count + k)
            copy = cx.names.fresh(v.name)
            cx.emit(node, "Copy", [blob], [copy])
            blob = copy
        blobs.append(blob)
    return blobs


def _message(where: str, opset: int, problems: list) -> str:
    grouped: dict[tuple, list[str]] = {}
    for op_type, label, why in problems:
        grouped.setdefault((op_type, why), []).append(label)
    lines = []
    for (op_type, why), labels in grouped.items():
        if op_type is None:
            lines.append(f"  - {why}")
        else:
            lines.append(f"  - {op_type} {', '.join(labels)}: {why}")
    supported = sorted(set(CONVERTERS) | set(FOLDERS))
    return (f"{where}: netrun cannot run this ONNX model (opset {opset}); nothing was "
            f"loaded:\n" + "\n".join(lines) +
            f"\nnetrun converts these ONNX operators: {', '.join(supported)}")


def _assemble(cx: Graph, name: str, data: list[str], outputs: list[str], where: str) -> Model:
    inputs = {b: TensorSpec(cx.shape(b)[1:]) for b in data}
    heads, labels, loss, metrics = [], [], None, []
    if outputs and len(cx.shape(outputs[0])) == 2:
        # class scores: softmax cross-entropy on the logits (before a final Softmax)
        logits = cx.logits_of.get(outputs[0], outputs[0])
        label, loss, accuracy = (cx.names.fresh(n) for n in ("label", "loss", "accuracy"))
        heads = [op("SoftmaxWithLoss", [logits, label], [cx.names.fresh(f"{loss}_prob"), loss],
                    name=loss),
                 op("Accuracy", [logits, label], [accuracy], name=accuracy)]
        inputs[label] = TensorSpec((), "int32")
        labels, metrics = [label], [accuracy]
    params = list(cx.params.values())
    names = [p.name for p in params]
    init = NetDef(f"{name}_init", [_fill(p, cx.values[p]) for p in names], [], names)
    read = {b for o in cx.test_ops for b in o.inputs}
    predict = NetDef(f"{name}_predict", list(cx.test_ops),
                     data + [p for p in names if p in read], list(outputs))
    ends = ([loss] if loss else []) + metrics or list(outputs)
    external = data + labels + names
    return Model(name=name, init_net=init,
                 train_net=NetDef(f"{name}_train", cx.train_ops + heads, external, ends),
                 test_net=NetDef(f"{name}_test", cx.test_ops + heads, external, ends),
                 predict_net=predict, inputs=inputs, params=params, outputs=list(outputs),
                 loss=loss, metrics=metrics, source_path=where, labels=labels)


def _fill(name: str, value: np.ndarray) -> OperatorDef:
    return op("GivenTensorFill", [], [name], shape=list(value.shape), values=value.reshape(-1))
