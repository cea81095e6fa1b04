"""OpSchema: what an operator accepts, how its shapes and costs follow from its inputs."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from netrun.errors import SchemaError, UnknownOpError, suggest
from netrun.proto.defs import OperatorDef

# Argument types a schema can declare; "ints"/"floats"/"strs" are repeated fields.
ARG_TYPES = ("int", "float", "str", "ints", "floats", "strs", "any")
_REQUIRED = object()


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a blob, as shape inference sees it."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def size(self) -> int:
        # Python ints: a product past int64 must not wrap (np.prod would, silently).
        return math.prod(int(d) for d in self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return "×".join(str(d) for d in self.shape) if self.shape else "scalar"


@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes moved by one run of an operator."""

    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0


@dataclass(frozen=True)
class Arg:
    """One argument: name, type, default (REQUIRED if none), allowed values, doc."""

    name: str
    type: str = "any"
    default: Any = None
    allowed: tuple | None = None
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


REQUIRED = _REQUIRED


class Args(dict):
    """Resolved arguments (defaults applied); attribute access for kernels: args.kernel."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


ShapeFn = Callable[[Args, list[TensorSpec]], list[TensorSpec]]
CostFn = Callable[[Args, list[TensorSpec], list[TensorSpec]], Cost]


def default_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    """One FLOP per output element; every input read and every output written once."""
    return Cost(sum(o.size for o in outs), sum(i.nbytes for i in ins), sum(o.nbytes for o in outs))


@dataclass(frozen=True)
class OpSchema:
    """The contract of one operator type; validates OperatorDefs and infers shapes and costs."""

    type: str
    inputs: tuple[int, int] = (1, 1)            # (min, max) counts
    outputs: tuple[int, int] = (1, 1)
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    args: tuple[Arg, ...] = ()
    inplace: tuple[tuple[int, int], ...] = ()     # (input index, output index) that may alias
    enforce_inplace: tuple[tuple[int, int], ...] = ()  # pairs that must alias (running stats)
    shape_fn: ShapeFn | None = None
    cost_fn: CostFn = default_cost
    doc: str = ""
    # True for ops through which no gradient flows (fillers, metrics, StopGradient, updates).
    no_gradient: bool = False
    # Inputs that never get a gradient (labels, indices), whatever the maker says.
    non_differentiable: tuple[int, ...] = ()
    family: str = ""
    # Cross-argument rules that types alone cannot express; raise SchemaError naming the arg.
    check_fn: Callable[[OperatorDef, Args], None] | None = None

    def arg_spec(self, name: str) -> Arg | None:
        for a in self.args:
            if a.name == name:
                return a
        return None

    def resolve_args(self, op: OperatorDef) -> Args:
        """Validate op.args against the schema and return them with defaults applied."""
        known = {a.name: a for a in self.args}
        out = Args()
        for name, value in op.args.items():
            spec = known.get(name)
            if spec is None:
                raise SchemaError(f"op {op.label}: unknown argument '{name}'"
                                  f"{suggest(name, known)} (known: {', '.join(sorted(known)) or 'none'})")
            out[name] = _check_arg_type(op, spec, value)
            if spec.allowed is not None and out[name] not in spec.allowed:
                raise SchemaError(f"op {op.label}: argument '{name}' is {value!r}; "
                                  f"allowed values are {', '.join(map(repr, spec.allowed))}")
        for spec in self.args:
            if spec.name not in out:
                if spec.required:
                    raise SchemaError(f"op {op.label}: missing required argument '{spec.name}'")
                out[spec.name] = list(spec.default) if isinstance(spec.default, (list, tuple)) else spec.default
        return out

    def verify(self, op: OperatorDef) -> Args:
        """Check input/output counts, in-place rules and arguments; return resolved args."""
        lo, hi = self.inputs
        if not lo <= len(op.inputs) <= hi:
            raise SchemaError(f"op {op.label}: takes {_count(lo, hi)} input(s), got {len(op.inputs)}")
        lo, hi = self.outputs
        if not lo <= len(op.outputs) <= hi:
            raise SchemaError(f"op {op.label}: makes {_count(lo, hi)} output(s), got {len(op.outputs)}")
        allowed = set(self.inplace) | set(self.enforce_inplace)
        for i, name in enumerate(op.inputs):
            for j, out_name in enumerate(op.outputs):
                if name == out_name and (i, j) not in allowed:
                    raise SchemaError(f"op {op.label}: output {j} '{out_name}' may not be written "
                                      f"in place over input {i}")
        for i, j in self.enforce_inplace:
            if i < len(op.inputs) and j < len(op.outputs) and op.inputs[i] != op.outputs[j]:
                raise SchemaError(f"op {op.label}: output {j} must be the same blob as input {i} "
                                  f"('{op.inputs[i]}'), got '{op.outputs[j]}'")
        args = self.resolve_args(op)
        if self.check_fn is not None:
            self.check_fn(op, args)
        return args

    def infer_shapes(self, op: OperatorDef, args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
        """Output specs for the given input specs (raises ShapeError on mismatch)."""
        if self.shape_fn is None:
            raise SchemaError(f"op {op.label}: no shape inference for {self.type}")
        return list(self.shape_fn(args, list(ins)))

    def cost(self, args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
        return self.cost_fn(args, list(ins), list(outs))


def _count(lo: int, hi: int) -> str:
    if lo == hi:
        return str(lo)
    return f"at least {lo}" if hi >= 1 << 30 else f"{lo} to {hi}"


def _check_arg_type(op: OperatorDef, spec: Arg, value: Any) -> Any:
    t = spec.type
    if t == "any":
        return value
    if t in _LISTS:
        if not isinstance(value, list):
            value = [value]  # a single value where a list is expected is a list of one
        # One pass without building a message per element: init nets hold millions of values.
        scalar = _LISTS[t]
        if scalar == "float" and all(type(v) is float for v in value):
            return list(value)      # already floats (GivenTensorFill's values): no per-item call
        out = [_scalar(scalar, v) for v in value]
        if any(v is _BAD for v in out):
            bad = next(v for v, o in zip(value, out) if o is _BAD)
            raise SchemaError(f"op {op.label}: argument '{spec.name}' must be {_describe(t)}, "
                              f"got {bad!r} among its values")
        return out
    out = _scalar(t, value)
    if out is _BAD:
        raise SchemaError(f"op {op.label}: argument '{spec.name}' must be {_describe(t)}, "
                          f"got {value!r}")
    return out


_LISTS = {"ints": "int", "floats": "float", "strs": "str"}
_BAD = object()


def _scalar(t: str, value: Any) -> Any:
    """`value` as type `t` ("int", "float", "str"), or _BAD."""
    if t == "float":
        return float(value) if isinstance(value, (int, float)) else _BAD
    if t == "int":
        if isinstance(value, int):
            return value
        return int(value) if isinstance(value, float) and value.is_integer() else _BAD
    return value if isinstance(value, str) else _BAD


def _describe(t: str) -> str:
    return {"int": "an integer", "float": "a number", "str": "a string", "ints": "a list of integers",
            "floats": "a list of numbers", "strs": "a list of strings"}.get(t, t)


_SCHEMAS: dict[str, OpSchema] = {}
MANY = 1 << 30


def register_schema(type: str, *, inputs: int | tuple[int, int] = 1,
                    outputs: int | tuple[int, int] = 1, args: Sequence[Arg] = (),
                    **fields) -> OpSchema:
    """Register the schema of an operator type; counts are an int or a (min, max) pair."""
    if type in _SCHEMAS:
        raise ValueError(f"schema for {type} registered twice")
    pair = lambda c: (c, c) if isinstance(c, int) else tuple(c)  # noqa: E731
    schema = OpSchema(type=type, inputs=pair(inputs), outputs=pair(outputs), args=tuple(args),
                      **fields)
    _SCHEMAS[type] = schema
    return schema


def get_schema(type: str) -> OpSchema:
    """The schema of an op type, or UnknownOpError with the closest known name."""
    schema = _SCHEMAS.get(type)
    if schema is None:
        raise UnknownOpError(f"unknown op type '{type}'{suggest(type, _SCHEMAS)}")
    return schema


def all_schemas() -> dict[str, OpSchema]:
    """Every registered schema, by type name."""
    return dict(sorted(_SCHEMAS.items()))
