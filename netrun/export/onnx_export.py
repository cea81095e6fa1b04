"""Export a predict net and its parameters to an ONNX model (netrun export)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import infer_shapes
from netrun.core.workspace import Workspace
from netrun.errors import NetrunError
from netrun.export.onnx_ops import CONVERTERS
from netrun.model import load_model
from netrun.proto.defs import NetDef
from netrun.train import checkpoint as ckpt
from netrun.util.atomic import atomic_path
from netrun.util.names import unique_name
from netrun.version import __version__
from netrun.weights import load_weights

DEFAULT_OPSET = 17
MIN_OPSET = 13


@dataclass
class ExportSource:
    """What an export needs: the predict net, its parameters, its input and outputs."""

    net: NetDef
    params: dict[str, np.ndarray]
    input_name: str
    input_shape: tuple[int, ...]          # one example, without the batch dimension
    outputs: list[str]


def _onnx():
    try:
        import onnx
    except ImportError:
        raise NetrunError("ONNX export needs the onnx package; install it with: "
                          "pip install 'netrun[onnx]'") from None
    return onnx


def _params(net: NetDef, ws: Workspace, skip: str) -> dict[str, np.ndarray]:
    names = {n for op in net.ops for n in op.inputs}
    return {n: np.asarray(ws.fetch_blob(n)) for n in sorted(names)
            if n != skip and ws.has_blob(n)}


def _source(net: NetDef, ws: Workspace, inputs: dict, labels: list, outputs: list) -> ExportSource:
    # The same choice of input and output blob as infer's Predictor (a sibling layer).
    name = next((n for n in inputs if n not in labels), None) or next(
        iter(net.external_inputs), None)
    if name is None or not net.ops:
        raise NetrunError(f"the predict net '{net.name}' has no input or no ops to export")
    spec = inputs.get(name)
    if not spec:
        raise NetrunError(f"the model gives no shape for its input '{name}', which the "
                          f"export needs")
    out = (list(outputs) or [net.ops[-1].outputs[0]])[:1]
    return ExportSource(net, _params(net, ws, name), name, tuple(spec[0]), out)


def source_from_checkpoint(path: str | os.PathLike) -> ExportSource:
    """The predict net and parameters of a netrun checkpoint."""
    info = ckpt.read_info(path)
    model = info.meta.get("model", {})
    ws = Workspace("cpu", memory_plan=False)
    ckpt.load_blobs(ws, path, info.params, "params")
    return _source(info.net("predict"), ws, model.get("inputs", {}), model.get("labels", []),
                   model.get("outputs", []))


def source_from_model(path: str | os.PathLike,
                      weights: str | os.PathLike | None = None) -> ExportSource:
    """A model file with weights from `weights`, or from its init net's fillers when None."""
    model = load_model(path)
    ws = Workspace("cpu", seed=0, memory_plan=False)
    ws.run_net_once(model.init_net)
    if weights is not None:
        load_weights(ws, weights, model)
    inputs = {n: (None if s is None else [list(s.shape), s.dtype])
              for n, s in model.inputs.items()}
    return _source(model.predict_net.copy(), ws, inputs, list(model.labels),
                   list(model.outputs))


class _Builder:
    """ONNX nodes and initializers for one net, with blobs renamed to single assignments."""

    def __init__(self, onnx, source: ExportSource):
        self.onnx = onnx
        self.source = source
        self.nodes: list = []
        self.initializers: dict[str, np.ndarray] = {}
        self.current: dict[str, str] = {source.input_name: source.input_name}
        self.taken: set[str] = {source.input_name} | set(source.params)
        # How often each blob is written: its last write keeps the plain name (so outputs
        # keep theirs), earlier writes of an in-place chain get a version suffix.
        self.writes: dict[str, int] = {}
        for op in source.net.ops:
            for o in op.outputs:
                self.writes[o] = self.writes.get(o, 0) + 1
        self.seen: dict[str, int] = {}

    def param(self, name: str) -> np.ndarray | None:
        """A parameter's value, or None if `name` is an activation."""
        return self.source.params.get(name)

    def inp(self, op, i: int) -> str:
        """The ONNX name of op's i-th input (parameters become initializers on first use)."""
        blob = op.inputs[i]
        if blob in self.current:
            return self.current[blob]
        if blob in self.source.params:
            self.initializers[blob] = self.source.params[blob]
            self.current[blob] = blob
            return blob
        raise NetrunError(f"op {op.label} reads '{blob}', which is neither the input, a "
                          f"parameter nor written by an earlier op")

    def _fresh(self, base: str) -> str:
        return unique_name(base, self.taken, "__")

    def out(self, op, i: int) -> str:
        """A new ONNX name for op's i-th output (ONNX is single-assignment)."""
        blob = op.outputs[i]
        self.seen[blob] = self.seen.get(blob, 0) + 1
        last = self.seen[blob] == self.writes[blob]
        name = self._fresh(blob if last else f"{blob}__v{self.seen[blob]}")
        self.current[blob] = name
        return name

    def alias(self, op, out: int, inp: int) -> None:
        """op's output is its input (an identity op dropped from the graph)."""
        self.seen[op.outputs[out]] = self.seen.get(op.outputs[out], 0) + 1
        self.current[op.outputs[out]] = self.inp(op, inp)

    def tmp(self, base: str) -> str:
        """A name for an intermediate value no netrun blob holds."""
        return self._fresh(base)

    def const(self, base: str, value: np.ndarray) -> str:
        """A new initializer holding `value`."""
        name = self._fresh(base)
        self.initializers[name] = np.asarray(value)
        return name

    def node(self, op_type: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        """Append one ONNX node."""
        self.nodes.append(self.onnx.helper.make_node(
            op_type, inputs, outputs, name=self._fresh(f"{outputs[0]}_{op_type}"), **attrs))


def to_onnx(source: ExportSource, opset: int = DEFAULT_OPSET, batch: int | None = None):
    """The ONNX ModelProto of `source` (batch None: a symbolic batch dimension)."""
    onnx = _onnx()
    if opset < MIN_OPSET:
        raise NetrunError(f"opset {opset} is too old: netrun exports opset {MIN_OPSET} or newer")
    if batch is not None and batch < 1:
        raise NetrunError(f"batch must be at least 1, got {batch}")
    net = source.net
    missing = sorted({op.type for op in net.ops if op.type not in CONVERTERS})
    if missing:
        raise NetrunError(f"the net '{net.name}' has ops with no ONNX converter: "
                          f"{', '.join(missing)}; supported: {', '.join(sorted(CONVERTERS))}")
    specs = {n: TensorSpec(tuple(v.shape), str(v.dtype)) for n, v in source.params.items()}
    specs[source.input_name] = TensorSpec((batch or 1, *source.input_shape))
    shapes = infer_shapes(net, specs)
    b = _Builder(onnx, source)
    for record in shapes.ops:
        CONVERTERS[record.op.type](b, record.op, record.inputs, record.outputs)
    outputs = []
    for name in source.outputs:
        if name not in b.current:
            raise NetrunError(f"the net '{net.name}' does not write its output '{name}'")
        if b.current[name] != name:        # an output that a dropped op left aliased
            b.node("Identity", [b.current[name]], [name])
        outputs.append(name)
    tp, h = onnx.TensorProto, onnx.helper
    dim0 = batch if batch is not None else "batch"
    graph = h.make_graph(
        b.nodes, net.name or "predict",
        [h.make_tensor_value_info(source.input_name, tp.FLOAT, [dim0, *source.input_shape])],
        [h.make_tensor_value_info(o, tp.FLOAT,
                                  [dim0, *shapes.blobs[o].shape[1:]]) for o in outputs],
        [onnx.numpy_helper.from_array(np.ascontiguousarray(v), n)
         for n, v in b.initializers.items()])
    model = h.make_model(graph, producer_name="netrun", producer_version=__version__,
                         opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, _max_ir(onnx, opset))
    onnx.checker.check_model(model, full_check=True)
    return model


def _max_ir(onnx, opset: int) -> int:
    """The oldest IR version that carries the opset (so older runtimes load the file)."""
    try:
        return onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)])
    except Exception:
        return onnx.IR_VERSION


def export_onnx(source: ExportSource, path: str | os.PathLike, opset: int = DEFAULT_OPSET,
                batch: int | None = None):
    """Convert, check and write `source` to `path` atomically; returns the ModelProto."""
    model = to_onnx(source, opset, batch)
    path = Path(path)
    if not path.parent.is_dir():
        raise NetrunError(f"cannot write '{path}': folder '{path.parent}' does not exist")
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(model.SerializeToString())
    return model
