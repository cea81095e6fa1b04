"""What netrun takes from a Caffe2 NetDef, shared by the binary reader (netdef_binary, `.pb`)
and the text reader (pbtxt, `.pbtxt`): one net reads as the same NetDef, or is refused for
the same reason, whichever way it was written.

Each reader finds the fields in its own format (wire types, literals, positions) and hands
their values here. A broken rule raises Refusal, a ParseError without a place; the reader
re-raises it saying where: the file for `.pb`, file:line:column for `.pbtxt`.

Some differences are the formats' own. As in protobuf, the binary reader skips fields it
does not know (forward compatibility) and keeps the last of a repeated singular field, while
the text reader refuses both (a misspelt name, a pasted duplicate). And a float is what the
file holds: a float32 in `.pb` (an `f` read as its shortest decimal, so `f: 0.1` is 0.1 both
ways; `floats` exactly, 0.1 becoming 0.10000000149011612), the decimal written in `.pbtxt`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from netrun.errors import NetrunError, ParseError
from netrun.proto.defs import ArgValue, OperatorDef

# Every field of the caffe2/proto/caffe2.proto messages netrun reads: name -> field number.
FIELDS: dict[str, dict[str, int]] = {
    "NetDef": {"name": 1, "op": 2, "type": 3, "num_workers": 4, "device_option": 5, "arg": 6,
               "external_input": 7, "external_output": 8, "partition_info": 9},
    "OperatorDef": {"input": 1, "output": 2, "name": 3, "type": 4, "arg": 5,
                    "device_option": 6, "engine": 7, "control_input": 8,
                    "is_gradient_op": 9, "debug_info": 10, "domain": 11, "op_version": 12},
    "Argument": {"name": 1, "f": 2, "i": 3, "s": 4, "floats": 5, "ints": 6, "strings": 7,
                 "n": 8, "nets": 9, "t": 10, "tensors": 11, "qtensors": 12},
    "DeviceOption": {"device_type": 1, "device_id": 2, "random_seed": 3, "node_name": 4,
                     "numa_node_id": 5, "extra_info": 6},
}
# Fields read past without a look: they change nothing netrun computes. NetDef: executor
# hints (netrun picks its own executor), its arguments (they configure Caffe2's executors,
# not operators) and partition placement; OperatorDef: gradient and debugging marks and the
# schema version; DeviceOption: seeding and placement beyond the device itself. Neither reader
# looks at them (tests/test_pbtxt.py checks that both accept each).
SKIPPED: dict[str, frozenset[str]] = {
    "NetDef": frozenset({"type", "num_workers", "arg", "partition_info"}),
    "OperatorDef": frozenset({"is_gradient_op", "debug_info", "op_version"}),
    "Argument": frozenset(),
    "DeviceOption": frozenset({"random_seed", "node_name", "numa_node_id", "extra_info"}),
}
SCALAR_KINDS = ("f", "i", "s")
LIST_KINDS = ("floats", "ints", "strings")
# Argument values no netrun operator takes: refused by name rather than dropped.
UNSUPPORTED_KINDS = {"n": "a NetDef (n)", "nets": "NetDefs (nets)", "t": "a TensorProto (t)",
                     "tensors": "TensorProtos (tensors)", "qtensors": "QTensorProtos (qtensors)"}

DEVICE_TYPES = {"cpu": 0, "gpu": 1}           # Caffe2's DeviceTypeProto: CPU = 0, CUDA = 1
_DEVICE_NAMES = {v: k for k, v in DEVICE_TYPES.items()}
_DEVICE = re.compile(r"(cpu|gpu)(?::([0-9]+))?")


class Refusal(ParseError):
    """A rule a net's content breaks; `field` names the Caffe2 field at fault (None: the
    message as a whole) so that the text reader can point at it."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def op_label(index: int, name: str | None, op_type: str | None) -> str:
    """How errors name an op while it is read: "op 3 ('conv1', Conv)"."""
    named = [repr(name)] if name else []
    named += [op_type] if op_type else []
    return f"op {index}" + (f" ({', '.join(named)})" if named else "")


def check_op(label: str, op_type: str | None, control_input: str | None,
             domain: str | None) -> None:
    """Refuse an op without a type, with a control input, or from another operator library."""
    if op_type is None:
        raise Refusal(f"{label} has no type")
    if control_input is not None:
        raise Refusal(f"{label} has a control input ('{control_input}'): netrun orders ops "
                      f"by the blobs they read and write only", "control_input")
    if domain not in (None, "", "caffe2"):
        raise Refusal(f"{label} is from the '{domain}' operator library; netrun runs Caffe2 "
                      f"operators only", "domain")


def arg_kind(name: str | None, label: str, kinds: list[str],
             unsupported: list[str]) -> str | None:
    """The argument's one kind of value (None: an empty list), or a Refusal saying why not."""
    # kinds and unsupported: the value fields present, in the order first seen
    if name is None:
        raise Refusal(f"{label} has an argument with no name")
    if unsupported:
        raise Refusal(f"argument '{name}' of {label} holds {UNSUPPORTED_KINDS[unsupported[0]]}; "
                      f"no netrun operator takes such an argument", unsupported[0])
    if len(kinds) > 1:
        raise Refusal(f"argument '{name}' of {label} has both '{kinds[0]}' and '{kinds[1]}'",
                      kinds[1])
    return kinds[0] if kinds else None


def add_arg(args: dict[str, ArgValue], name: str, value: ArgValue, label: str) -> None:
    """Add one argument to an op's, refusing a name given twice."""
    if name in args:
        raise Refusal(f"argument '{name}' is given more than once in {label}", "arg")
    args[name] = value


def device_name(kind: int, index: int | None, label: str) -> str:
    """A DeviceOption's device_type and device_id as netrun's device: 'cpu', 'gpu', 'gpu:N'."""
    if kind not in _DEVICE_NAMES:
        raise Refusal(f"{label} has device_type {kind}, which netrun does not run "
                      f"(0 = CPU, 1 = CUDA)", "device_type")
    if index is not None and index < 0:
        raise Refusal(f"{label} has device_id {index}; it must be ≥ 0", "device_id")
    return f"{_DEVICE_NAMES[kind]}:{index}" if index is not None else _DEVICE_NAMES[kind]


def with_net_device(ops: Iterable[OperatorDef], net_device: str | None) -> list[OperatorDef]:
    """The ops with the net's device option given to those that have none (as Caffe2 does)."""
    if net_device is None:
        return list(ops)
    return [o if o.device is not None else o.with_(device=net_device) for o in ops]


def utf8(data: bytes, what: str) -> str:
    """`data` as text; bytes that are not UTF-8 are refused (netrun's names are text)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Refusal(f"{what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                      f"{e.start} of {data[:40]!r}); netrun keeps names and string "
                      f"arguments as text") from None


def device_option(op: OperatorDef) -> tuple[int, int | None]:
    """(device_type, device_id or None) of an op's device, for the writers."""
    match = _DEVICE.fullmatch(op.device or "")
    if match is None:
        raise NetrunError(f"op {op.label} has device {op.device!r}; a Caffe2 NetDef can hold "
                          f"'cpu', 'gpu' or 'gpu:N'")
    return DEVICE_TYPES[match.group(1)], (None if match.group(2) is None
                                          else int(match.group(2)))
