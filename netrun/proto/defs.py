"""OperatorDef and NetDef: nets as plain data (Caffe2's protobufs as dataclasses)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Union

ArgValue = Union[int, float, str, list]


def normalize_arg(value: Any) -> ArgValue:
    """Bring an argument value to int/float/str or a list of them (bools become ints, as in Caffe2)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)):
        return value
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy scalars
        return normalize_arg(value.item())
    # Numeric arrays convert in one call (init nets of model-zoo and ONNX files hold millions
    # of values): tolist() gives Python ints and floats, nested as the array is.
    if getattr(getattr(value, "dtype", None), "kind", "") in ("f", "i", "u"):
        return value.tolist()
    if isinstance(value, list) and all(type(v) is float or type(v) is int for v in value):
        return list(value)
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        items = value.tolist() if hasattr(value, "tolist") else value
        return [normalize_arg(v) for v in items]
    raise TypeError(f"argument value {value!r} is not an int, float, str or list of them")


@dataclass(frozen=True)
class OperatorDef:
    """One operator: type, input and output blob names, arguments, optional device/engine."""

    type: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    args: dict[str, ArgValue] = field(default_factory=dict)
    name: str = ""
    device: str | None = None
    engine: str = ""

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "args", {k: normalize_arg(v) for k, v in self.args.items()})

    def with_(self, **changes) -> "OperatorDef":
        """Return a copy with some fields replaced."""
        return replace(self, **changes)

    @property
    def label(self) -> str:
        """How error messages name this op: "conv1 (Conv)" or just "Conv"."""
        return f"'{self.name}' ({self.type})" if self.name else f"{self.type} {list(self.inputs)} -> {list(self.outputs)}"


@dataclass
class NetDef:
    """A named list of operators plus the blobs it reads from and writes for outside."""

    name: str = ""
    ops: list[OperatorDef] = field(default_factory=list)
    external_inputs: list[str] = field(default_factory=list)
    external_outputs: list[str] = field(default_factory=list)

    def copy(self) -> "NetDef":
        """A copy whose op list can be extended without touching this one."""
        return NetDef(self.name, list(self.ops), list(self.external_inputs),
                      list(self.external_outputs))


def op(type: str, inputs=(), outputs=(), name: str = "", device: str | None = None,
       engine: str = "", **args) -> OperatorDef:
    """Build an OperatorDef: op("Conv", ["X", "W", "b"], ["Y"], kernel=3, pad=1)."""
    if isinstance(inputs, str):
        inputs = [inputs]
    if isinstance(outputs, str):
        outputs = [outputs]
    return OperatorDef(type, tuple(inputs), tuple(outputs), dict(args), name, device, engine)
