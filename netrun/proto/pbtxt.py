"""Caffe2 NetDef text format (`.pbtxt`): NetDef <-> text, lossless and deterministic.

The writer prints fields in Caffe2's field-number order (OperatorDef: input, output, name, type,
arg, device_option, engine), so write -> read -> write is byte-identical.
"""
from __future__ import annotations

import re

from netrun.errors import NetrunError, suggest
from netrun.proto.defs import ArgValue, NetDef, OperatorDef
from netrun.proto.textformat import Enum, Field, Message, format_message, parse

_NET_FIELDS = ("name", "op", "external_input", "external_output")
_OP_FIELDS = ("input", "output", "name", "type", "arg", "device_option", "engine")
_ARG_FIELDS = ("name", "f", "i", "s", "floats", "ints", "strings")
_ARG_VALUE_FIELDS = _ARG_FIELDS[1:]
_DEVICE_FIELDS = ("device_type", "device_id", "cuda_gpu_id")
# Caffe2 fields netrun accepts and drops: executor hints and debugging aids, which do not change
# what a net computes (netrun picks its own executor).
_IGNORED = {"NetDef": ("type", "num_workers"), "op": ("is_gradient_op", "debug_info"),
            "arg": (), "device_option": ()}
# Caffe2's DeviceType enum: CPU = 0, CUDA = 1.
_DEVICE_TYPES = {"cpu": 0, "gpu": 1}
_DEVICE_NAMES = {0: "cpu", 1: "gpu", "CPU": "cpu", "CUDA": "gpu", "GPU": "gpu"}
_DEVICE = re.compile(r"(cpu|gpu)(?::([0-9]+))?")


# Writing ----------------------------------------------------------------------------------
def netdef_to_text(net: NetDef) -> str:
    """The NetDef in Caffe2 text format (deterministic: the same net gives the same bytes)."""
    root = Message()
    if net.name:
        root.add("name", net.name)
    for op in net.ops:
        root.add("op", _op_message(op))
    for blob in net.external_inputs:
        root.add("external_input", blob)
    for blob in net.external_outputs:
        root.add("external_output", blob)
    return format_message(root)


def _op_message(op: OperatorDef) -> Message:
    m = Message()
    for blob in op.inputs:
        m.add("input", blob)
    for blob in op.outputs:
        m.add("output", blob)
    if op.name:
        m.add("name", op.name)
    m.add("type", op.type)
    for name, value in op.args.items():
        m.add("arg", _arg_message(name, value, op))
    if op.device is not None:
        m.add("device_option", _device_message(op.device, op))
    if op.engine:
        m.add("engine", op.engine)
    return m


def _arg_message(name: str, value: ArgValue, op: OperatorDef) -> Message:
    m = Message().add("name", name)
    # bool before int: True is an int in Python, and Caffe2 stores flags as i
    if isinstance(value, (bool, int)):
        return m.add("i", int(value))
    if isinstance(value, float):
        return m.add("f", value)  # stays a float even when integral: written as 1.0
    if isinstance(value, str):
        return m.add("s", value)
    if all(isinstance(v, (bool, int)) for v in value):  # an empty list writes just the name
        kind, items = "ints", [int(v) for v in value]
    elif all(isinstance(v, (bool, int, float)) for v in value):
        kind, items = "floats", [float(v) for v in value]
    elif all(isinstance(v, str) for v in value):
        kind, items = "strings", list(value)
    else:
        raise NetrunError(f"argument '{name}' of op {op.label} mixes strings and numbers: "
                          f"{value!r}")
    for item in items:
        m.add(kind, item)
    return m


def _device_message(device: str, op: OperatorDef) -> Message:
    match = _DEVICE.fullmatch(device)
    if match is None:
        raise NetrunError(f"op {op.label} has device {device!r}; the text format can hold "
                          "'cpu', 'gpu' or 'gpu:N'")
    m = Message().add("device_type", _DEVICE_TYPES[match.group(1)])
    if match.group(2) is not None:
        m.add("device_id", int(match.group(2)))
    return m


# Reading ----------------------------------------------------------------------------------
def netdef_from_text(text: str, filename: str | None = None) -> NetDef:
    """Parse a Caffe2 NetDef in text format; errors are ParseErrors with file:line:col."""
    root = parse(text, filename)
    _check_fields(root, _NET_FIELDS, "NetDef")
    return NetDef(name=_single_string(root, "name", "NetDef") or "",
                  ops=[_op_from(f, root) for f in _fields(root, "op")],
                  external_inputs=_strings(root, "external_input", "NetDef"),
                  external_outputs=_strings(root, "external_output", "NetDef"))


def _fields(msg: Message, name: str) -> list[Field]:
    return [f for f in msg.fields if f.name == name]


def _check_fields(msg: Message, known: tuple[str, ...], what: str) -> None:
    for f in msg.fields:
        if f.name not in known and f.name not in _IGNORED[what]:
            raise msg.error(f"unknown field '{f.name}' in {what}{suggest(f.name, known)}", f)


def _single(msg: Message, name: str, what: str) -> Field | None:
    found = _fields(msg, name)
    if len(found) > 1:
        raise msg.error(f"field '{name}' is given more than once in {what}", found[1])
    return found[0] if found else None


def _expect(msg: Message, f: Field, ok: bool, kind: str, what: str) -> None:
    if not ok:
        found = "a message" if isinstance(f.value, Message) else repr(f.value)
        raise msg.error(f"field '{f.name}' of {what} must be {kind}, got {found}",
                        f.value_position or f.position)


def _string(msg: Message, f: Field, what: str) -> str:
    # an Enum (bare identifier) is not a string: Caffe2 quotes every string field
    _expect(msg, f, type(f.value) is str, "a quoted string", what)
    return f.value


def _single_string(msg: Message, name: str, what: str) -> str | None:
    f = _single(msg, name, what)
    return None if f is None else _string(msg, f, what)


def _strings(msg: Message, name: str, what: str) -> list[str]:
    return [_string(msg, f, what) for f in _fields(msg, name)]


def _message(msg: Message, f: Field, what: str) -> Message:
    _expect(msg, f, isinstance(f.value, Message), "a message { ... }", what)
    return f.value


def _op_from(field: Field, root: Message) -> OperatorDef:
    m = _message(root, field, "NetDef")
    _check_fields(m, _OP_FIELDS, "op")
    op_type = _single_string(m, "type", "op")
    if op_type is None:
        raise root.error("op has no 'type'", field)
    args: dict[str, ArgValue] = {}
    for f in _fields(m, "arg"):
        name, value = _arg_from(_message(m, f, "op"), f, m)
        if name in args:
            raise m.error(f"argument '{name}' is given more than once in op '{op_type}'", f)
        args[name] = value
    device = _single(m, "device_option", "op")
    return OperatorDef(op_type, tuple(_strings(m, "input", "op")),
                       tuple(_strings(m, "output", "op")), args,
                       _single_string(m, "name", "op") or "",
                       None if device is None else _device_from(_message(m, device, "op")),
                       _single_string(m, "engine", "op") or "")


def _arg_from(m: Message, field: Field, op: Message) -> tuple[str, ArgValue]:
    _check_fields(m, _ARG_FIELDS, "arg")
    name = _single_string(m, "name", "arg")
    if name is None:
        raise op.error("arg has no 'name'", field)
    kinds = list(dict.fromkeys(f.name for f in m.fields if f.name in _ARG_VALUE_FIELDS))
    if len(kinds) > 1:
        raise m.error(f"argument '{name}' has both '{kinds[0]}' and '{kinds[1]}'", kinds[1])
    if not kinds:
        return name, []  # Caffe2 writes an empty repeated field as nothing at all
    kind, what = kinds[0], f"arg '{name}'"
    if kind in ("i", "f", "s"):
        return name, _arg_value(m, _single(m, kind, what), what)
    return name, [_arg_value(m, f, what) for f in _fields(m, kind)]


def _arg_value(m: Message, f: Field, what: str) -> ArgValue:
    v = f.value
    if f.name in ("i", "ints"):
        _expect(m, f, type(v) is int, "an integer", what)
        return v
    if f.name in ("f", "floats"):
        # an integral literal (f: 1) is still a float argument
        _expect(m, f, type(v) in (int, float), "a number", what)
        return float(v)
    return _string(m, f, what)


def _device_from(m: Message) -> str:
    _check_fields(m, _DEVICE_FIELDS, "device_option")
    kind = "cpu"  # Caffe2's default device_type
    dtype = _single(m, "device_type", "device_option")
    if dtype is not None:
        # bool is excluded by the exact type test: `device_type: true` is not CUDA
        kind = _DEVICE_NAMES.get(dtype.value) if type(dtype.value) in (int, Enum) else None
        if kind is None:
            raise m.error(f"device_type {dtype.value!r} is not supported (0 = CPU, 1 = CUDA)",
                          dtype.value_position)
    # cuda_gpu_id is the pre-2018 name of device_id
    ids = [f for f in (_single(m, n, "device_option") for n in ("device_id", "cuda_gpu_id"))
           if f is not None]
    for f in ids:
        _expect(m, f, type(f.value) is int and f.value >= 0, "a non-negative integer",
                "device_option")
    if len(ids) == 2 and ids[0].value != ids[1].value:
        raise m.error("device_id and cuda_gpu_id disagree", ids[1])
    return f"{kind}:{ids[0].value}" if ids else kind
