"""The state of one ONNX -> netrun conversion: names, constants, parameters, ops and shapes.

ONNX values become netrun blobs (activations and parameters) or stay constants known at load
time (initializers, Constant nodes, and what shape arithmetic computes from them). Shapes are
tracked through netrun's own shape inference of every op emitted, at the batch size the file
gives (1 when it leaves the batch symbolic), so a converter sees exactly what netrun will run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from netrun.core.schema import TensorSpec, get_schema
from netrun.core.shape_inference import infer_op
from netrun.errors import NetrunError
from netrun.model.model import Param
from netrun.proto.defs import OperatorDef
from netrun.util.names import unique_name

_UNSAFE = re.compile(r"[^A-Za-z0-9_.]+")
_MAX_NAME = 200


class Unsupported(Exception):
    """One node netrun cannot run (or one attribute value it cannot honour): the reason."""


class Poisoned(Exception):
    """A node reads a value that an unsupported node makes: reported there, not here."""


class Namer:
    """Deterministic, unique, netrun-safe blob names for ONNX names (in order of first use)."""

    def __init__(self):
        self.taken: set[str] = set()
        self.of: dict[str, str] = {}

    def name(self, onnx_name: str) -> str:
        """The netrun name of an ONNX value (the same every time it is asked for)."""
        if onnx_name not in self.of:
            self.of[onnx_name] = self.fresh(onnx_name)
        return self.of[onnx_name]

    def fresh(self, base: str) -> str:
        """A new name from `base`: characters HDF5 groups and NetDef text would trip over
        become '_', and a counter keeps it unique."""
        clean = _UNSAFE.sub("_", base).strip("_.")[:_MAX_NAME] or "blob"
        return unique_name(clean, self.taken, "__")


@dataclass
class Const:
    """A value known at load time. `batch_at`: the elements of a 1-D shape value that stand
    for the batch size (a Shape of an activation); `trainable`: an initializer, which
    fine-tuning may change (Constant nodes and folded values stay fixed)."""

    value: np.ndarray
    batch_at: frozenset[int] = frozenset()
    trainable: bool = False


@dataclass
class Node:
    """One ONNX node with its attributes decoded; converters mark the attributes they read."""

    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    index: int
    read: set[str] = field(default_factory=set)

    @property
    def label(self) -> str:
        """How messages name the node: its name, or its position in the graph."""
        return f"'{self.name}'" if self.name else f"#{self.index}"

    def attr(self, key: str, default: Any = None) -> Any:
        """An attribute's value, or `default` when the node does not set it."""
        self.read.add(key)
        return self.attrs.get(key, default)

    def input(self, i: int) -> str | None:
        """The i-th input's name, None when absent or left empty (an omitted optional)."""
        return self.inputs[i] if i < len(self.inputs) and self.inputs[i] else None

    def unread(self) -> list[str]:
        """Attributes no converter looked at: their meaning would be silently lost."""
        return [k for k in self.attrs if k not in self.read]


class Graph:
    """Everything a conversion builds; converters call its methods."""

    def __init__(self, opset: int, batch: int, static_batch: bool, namer: Namer):
        self.opset = opset
        self.batch = batch                        # the batch size shapes are tracked at
        self.static_batch = static_batch          # the file fixes it (else: symbolic)
        self.names = namer
        self.op_names = Namer()                   # ops and blobs have names of their own
        self.blobs: dict[str, str] = {}           # ONNX value -> netrun blob
        self.consts: dict[str, Const] = {}        # ONNX value -> value known at load time
        self.specs: dict[str, TensorSpec] = {}    # netrun blob -> spec at `batch`
        self.params: dict[str, Param] = {}        # netrun blob -> parameter
        self.values: dict[str, np.ndarray] = {}   # parameter -> initial value
        self.of_const: dict[tuple[str, str], str] = {}   # (ONNX value, form) -> parameter
        self.train_ops: list[OperatorDef] = []
        self.test_ops: list[OperatorDef] = []
        self.poisoned: set[str] = set()
        self.consumers: dict[str, list[Node]] = {}
        self.graph_outputs: set[str] = set()
        self.folded_pads: dict[str, tuple[str, tuple[int, int, int, int]]] = {}
        self.logits_of: dict[str, str] = {}       # softmax output -> its input (rank 2)

    # Values ------------------------------------------------------------------------------
    def const(self, name: str | None) -> Const | None:
        """The load-time value of an ONNX value, or None when it is computed at run time."""
        return None if name is None else self.consts.get(name)

    def const_array(self, name: str | None, what: str) -> np.ndarray:
        """A value that must be known at load time (a shape, a pad, a bound)."""
        c = self.const(name)
        if c is None:
            self.check(name)
            raise Unsupported(f"{what} is computed at run time; netrun needs it as an "
                              f"initializer or a Constant")
        if c.batch_at:
            raise Unsupported(f"{what} depends on the batch size")
        return c.value

    def check(self, name: str | None) -> None:
        """Raise Poisoned when an unsupported node makes this value."""
        if name in self.poisoned:
            raise Poisoned(name)

    def data(self, name: str) -> str:
        """The blob of a value that must be an activation (graph input or node output)."""
        self.check(name)
        if name in self.folded_pads:
            raise Unsupported("reads a zero Pad that netrun folds into convolutions and pooling "
                              "only")
        if name in self.blobs:
            return self.blobs[name]
        if name in self.consts:
            return self.param(name)
        raise Unsupported(f"reads '{name}', which no earlier node makes")

    def operand(self, name: str) -> str:
        """The blob of an input that may be an activation or a load-time value (a parameter)."""
        return self.param(name) if name in self.consts else self.data(name)

    def param(self, name: str, role: str = "weight", layer: str = "",
              form: str = "", value: np.ndarray | None = None,
              trainable: bool | None = None) -> str:
        """The parameter blob holding a load-time value; `form` and `value` give a derived
        value (transposed, scaled...) its own blob, named after the ONNX one."""
        c = self.consts[name]
        if c.batch_at:
            raise Unsupported(f"uses '{name}', which depends on the batch size, as a tensor")
        key = (name, form)
        if key in self.of_const:
            return self.of_const[key]
        array = np.asarray(c.value if value is None else value)
        if array.dtype.kind not in "fiub":
            raise Unsupported(f"'{name}' has dtype {array.dtype}; netrun computes in float32")
        blob = self.names.fresh(f"{name}_{form}") if form else self.names.name(name)
        self._add_param(blob, array, role, layer, c.trainable if trainable is None else trainable)
        self.of_const[key] = blob
        return blob

    def new_param(self, base: str, value: np.ndarray, role: str, layer: str,
                  trainable: bool) -> str:
        """A parameter netrun adds (a zero bias for an FC that has none in the file)."""
        blob = self.names.fresh(base)
        self._add_param(blob, value, role, layer, trainable)
        return blob

    def _add_param(self, blob: str, value: np.ndarray, role: str, layer: str,
                   trainable: bool) -> None:
        array = np.ascontiguousarray(value, dtype=np.float32)
        if array.ndim == 0:       # netrun's fills make 1-D tensors: broadcasting is the same
            array = array.reshape(1)
        mult = 1.0 if trainable else 0.0
        self.params[blob] = Param(blob, tuple(array.shape), layer, role, mult, mult, trainable)
        self.values[blob] = array
        self.specs[blob] = TensorSpec(tuple(array.shape))

    def shape(self, blob: str) -> tuple[int, ...]:
        """The tracked shape of a netrun blob (batch first, at the tracked batch size)."""
        return tuple(self.specs[blob].shape)

    def value_shape(self, name: str) -> tuple[int, ...]:
        """The shape of an ONNX value, constant or not."""
        c = self.const(name)
        if c is not None:
            return tuple(c.value.shape)
        return self.shape(self.data(name))

    # Outputs -----------------------------------------------------------------------------
    def out(self, node: Node, i: int = 0) -> str:
        """The blob for a node's i-th output."""
        return self.names.name(node.outputs[i])

    def tmp(self, node: Node, suffix: str) -> str:
        """A blob for an intermediate value that no ONNX value names."""
        return self.names.fresh(f"{node.outputs[0]}_{suffix}")

    def alias(self, node: Node, blob: str, i: int = 0) -> None:
        """The node's output is an existing blob (Identity, Dropout at inference)."""
        self.blobs[node.outputs[i]] = blob

    def set_const(self, node: Node, value: np.ndarray, i: int = 0,
                  batch_at: frozenset[int] = frozenset()) -> None:
        """The node's output is known at load time."""
        self.consts[node.outputs[i]] = Const(np.asarray(value), batch_at)

    def used(self, node: Node, i: int) -> bool:
        """Whether anything reads the node's i-th output."""
        if i >= len(node.outputs) or not node.outputs[i]:
            return False
        name = node.outputs[i]
        return bool(self.consumers.get(name)) or name in self.graph_outputs

    def emit(self, node: Node, type_: str, inputs: list[str], outputs: list[str],
             train_outputs: list[str] | None = None, train_args: dict | None = None,
             **args) -> OperatorDef:
        """Add an op to the nets; the train net's twin may write more outputs (what its
        gradient needs) and take other arguments (training mode). Output specs come from
        netrun's shape inference, whose complaints make the node unsupported."""
        op = OperatorDef(type_, tuple(inputs), tuple(outputs), args,
                         self.op_names.fresh(node.name or f"{node.op_type}_{node.index}"))
        train = op.with_(outputs=tuple(train_outputs or outputs),
                         args={**args, **(train_args or {})})
        try:
            record = infer_op(op, [self.specs[b] for b in inputs])
            get_schema(type_).verify(train)
        except NetrunError as e:
            raise Unsupported(str(e)) from None
        self.specs.update(zip(outputs, record.outputs))
        for onnx_name in node.outputs:
            blob = self.names.of.get(onnx_name)
            if blob in outputs and onnx_name not in self.blobs:
                self.blobs[onnx_name] = blob
        self.test_ops.append(op)
        self.train_ops.append(train)
        return op
