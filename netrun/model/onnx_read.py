"""Reading an ONNX file into plain Python: nodes, initializers, inputs and outputs.

The file is data: its tensors may name external data files, which are read only when they
lie inside the model's own folder (a location that is absolute, climbs out with '..' or
leaves through a symbolic link is refused before anything is read).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from netrun.errors import NetrunError, ParseError
from netrun.model.onnx_graph import Node

DEFAULT_DOMAINS = ("", "ai.onnx")


class OnnxImportError(NetrunError):
    """An ONNX model netrun cannot load or run (the message lists every reason)."""


@dataclass
class ValueInfo:
    """A graph input or output: its name, element type and dims (int, str or None)."""

    name: str
    elem_type: int
    dims: list[Any] | None


@dataclass
class OnnxGraph:
    """The parts of an ONNX model netrun converts."""

    opset: int
    nodes: list[Node]
    domains: list[str]
    initializers: dict[str, np.ndarray]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    problems: list[str] = field(default_factory=list)


def onnx_module():
    """The onnx package, imported lazily: it is an optional extra."""
    try:
        import onnx  # lazy: an optional extra, needed only for .onnx files
    except ImportError:
        raise OnnxImportError("reading ONNX models needs the onnx package; install it with: "
                              "pip install 'netrun[onnx]'") from None
    return onnx


def read_onnx(path: str | os.PathLike) -> OnnxGraph:
    """The graph of an ONNX file, with its initializers (external data checked and read)."""
    onnx = onnx_module()
    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:     # protobuf's DecodeError and friends: the file is not ONNX
        raise ParseError(f"not a readable ONNX model ({type(e).__name__}: {e})",
                         str(path)) from None
    if not model.HasField("graph"):   # protobuf reads an empty file as an empty message
        raise ParseError("not an ONNX model: it holds no graph", str(path))
    _load_external_data(onnx, model, path)
    return _graph(onnx, model, str(path))


def _tensors(graph) -> list:
    """Every tensor a graph holds: initializers, Constant values, nested graphs' ones."""
    found = list(graph.initializer)
    found += [t for s in graph.sparse_initializer for t in (s.values, s.indices)]
    for node in graph.node:
        for a in node.attribute:
            found += ([a.t] if a.HasField("t") else []) + list(a.tensors)
            found += [t for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)
                      for t in _tensors(g)]
    return found


def _load_external_data(onnx, model, path: Path) -> None:
    external = [t for t in _tensors(model.graph)
                if t.data_location == onnx.TensorProto.EXTERNAL]
    if not external:
        return
    folder = path.parent.resolve()
    for tensor in external:
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location", "")
        target = (folder / location).resolve()
        if not location or Path(location).is_absolute() or not target.is_relative_to(folder):
            raise OnnxImportError(f"{path}: tensor '{tensor.name}' keeps its data in "
                                  f"'{location}', outside the model's folder {folder}; netrun "
                                  f"reads external data only from beside the model")
        if not target.is_file():
            raise OnnxImportError(f"{path}: tensor '{tensor.name}' keeps its data in "
                                  f"'{location}', which does not exist")
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(folder))
    except (OSError, ValueError) as e:
        raise OnnxImportError(f"{path}: cannot read the external data: {e}") from None


def _value_info(v) -> ValueInfo:
    t = v.type.tensor_type if v.type.HasField("tensor_type") else None
    if t is None:
        return ValueInfo(v.name, 0, None)
    dims = None
    if t.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else
                (d.dim_param or None) for d in t.shape.dim]
    return ValueInfo(v.name, t.elem_type, dims)


def _attribute(onnx, a) -> Any:
    kind = onnx.AttributeProto
    if a.type == kind.TENSOR:
        return onnx.numpy_helper.to_array(a.t)
    if a.type == kind.TENSORS:
        return [onnx.numpy_helper.to_array(t) for t in a.tensors]
    if a.type in (kind.GRAPH, kind.GRAPHS, kind.SPARSE_TENSOR, kind.SPARSE_TENSORS,
                  kind.TYPE_PROTO, kind.TYPE_PROTOS):
        return None            # subgraphs and types: no converter reads them
    value = onnx.helper.get_attribute_value(a)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", "replace") for v in value]
    return value


def _graph(onnx, model, where: str) -> OnnxGraph:
    graph = model.graph
    opsets = {o.domain: o.version for o in model.opset_import}
    opset = next((opsets[d] for d in DEFAULT_DOMAINS if d in opsets), None)
    if opset is None:
        raise OnnxImportError(f"{where}: the model imports no version of the default ONNX "
                              f"operator set")
    problems = []
    if graph.sparse_initializer:
        names = ", ".join(s.values.name for s in graph.sparse_initializer)
        problems.append(f"sparse initializers ({names}) are not supported")
    initializers = {}
    for t in graph.initializer:
        try:
            initializers[t.name] = onnx.numpy_helper.to_array(t)
        except Exception as e:     # a damaged tensor: the file is data
            problems.append(f"initializer '{t.name}' cannot be read ({e})")
    nodes = [Node(n.op_type, n.name, list(n.input), list(n.output),
                  {a.name: _attribute(onnx, a) for a in n.attribute}, i)
             for i, n in enumerate(graph.node)]
    return OnnxGraph(opset, nodes, [n.domain for n in graph.node], initializers,
                     [_value_info(v) for v in graph.input if v.name not in initializers],
                     [_value_info(v) for v in graph.output], problems)
