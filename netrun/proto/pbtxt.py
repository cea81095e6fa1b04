"""Caffe2 NetDef text format (`.pbtxt`): NetDef <-> text, lossless and deterministic.

The writer prints fields in Caffe2's field-number order (OperatorDef: input, output, name, type,
arg, device_option, engine), so write -> read -> write is byte-identical. The reader applies
the binary reader's rules (netrun.proto.netdef_rules), so a net reads the same from `.pbtxt`
as from `.pb`, or is refused for the same reason, with the place in the file.
"""
from __future__ import annotations

from netrun.errors import NetrunError, suggest
from netrun.proto.defs import ArgValue, NetDef, OperatorDef
from netrun.proto.netdef_rules import (
    FIELDS,
    LIST_KINDS,
    SCALAR_KINDS,
    UNSUPPORTED_KINDS,
    Refusal,
    add_arg,
    arg_kind,
    check_op,
    device_name,
    device_option,
    op_label,
    utf8,
    with_net_device,
)
from netrun.proto.textformat import Enum, Field, Message, format_message, parse

# The words errors use for a message (as the file spells it) -> its name in caffe2.proto.
_MESSAGES = {"NetDef": "NetDef", "op": "OperatorDef", "arg": "Argument",
             "device_option": "DeviceOption"}
# cuda_gpu_id is the pre-2018 name of DeviceOption.device_id (field 2), still in old files.
_ALIASES = {"device_option": ("cuda_gpu_id",)}
# device_type is an int32 in caffe2.proto; these names of 0 and 1 the text reader has always
# taken as well.
_DEVICE_ENUMS = {"CPU": 0, "CUDA": 1, "GPU": 1}


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
        m.add("device_option", _device_message(op))
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


def _device_message(op: OperatorDef) -> Message:
    kind, index = device_option(op)
    m = Message().add("device_type", kind)
    if index is not None:
        m.add("device_id", index)
    return m


# Reading ----------------------------------------------------------------------------------
def netdef_from_text(text: str, filename: str | None = None) -> NetDef:
    """Parse a Caffe2 NetDef in text format; errors are ParseErrors with file:line:col."""
    root = parse(text, filename)
    _check_fields(root, "NetDef")
    name = _single_string(root, "name", "NetDef") or ""
    ops = [_op_from(f, root, i) for i, f in enumerate(_fields(root, "op"))]
    option = _single(root, "device_option", "NetDef")
    device = None if option is None else _device_from(_message(root, option, "NetDef"),
                                                      "the net")
    return NetDef(name, with_net_device(ops, device), _strings(root, "external_input", "NetDef"),
                  _strings(root, "external_output", "NetDef"))


def _fields(msg: Message, name: str) -> list[Field]:
    return [f for f in msg.fields if f.name == name]


def _check_fields(msg: Message, what: str) -> None:
    # Unlike the binary reader, which must skip fields of newer schemas, text names every
    # field: one caffe2.proto does not have is a typo worth pointing at.
    known = (*FIELDS[_MESSAGES[what]], *_ALIASES.get(what, ()))
    for f in msg.fields:
        if f.name not in known:
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
    if not f.value.isascii():
        _utf8(msg, f, f"field '{f.name}' of {what}")
    return f.value


def _utf8(msg: Message, f: Field, what: str) -> None:
    """Refuse a string whose escapes make bytes that are not UTF-8, as the binary reader
    refuses such bytes (the parser keeps them as lone surrogates)."""
    try:
        f.value.encode("utf-8")
    except UnicodeEncodeError:
        try:
            data = f.value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:   # a surrogate put in a str by its caller, not an escape
            data = f.value.encode("utf-8", "surrogatepass")
        try:
            utf8(data, what)
        except Refusal as e:
            raise msg.error(e.message, f.value_position or f.position) from None


def _single_string(msg: Message, name: str, what: str) -> str | None:
    f = _single(msg, name, what)
    return None if f is None else _string(msg, f, what)


def _strings(msg: Message, name: str, what: str) -> list[str]:
    return [_string(msg, f, what) for f in _fields(msg, name)]


def _message(msg: Message, f: Field, what: str) -> Message:
    _expect(msg, f, isinstance(f.value, Message), "a message { ... }", what)
    return f.value


def _op_from(field: Field, root: Message, index: int) -> OperatorDef:
    m = _message(root, field, "NetDef")
    _check_fields(m, "op")
    op_type, name = _single_string(m, "type", "op"), _single_string(m, "name", "op")
    controls = _strings(m, "control_input", "op")
    label = op_label(index, name, op_type)
    try:
        check_op(label, op_type, controls[-1] if controls else None,
                 _single_string(m, "domain", "op"))
    except Refusal as e:
        # at the value refused (the binary reader names the last control input), or at
        # the op that has no type
        at = m.field(e.field).value_position if e.field else field
        raise root.error(e.message, at) from None
    args: dict[str, ArgValue] = {}
    for f in _fields(m, "arg"):
        arg_name, value = _arg_from(_message(m, f, "op"), f, m, label)
        try:
            add_arg(args, arg_name, value, label)
        except Refusal as e:
            raise m.error(e.message, f) from None
    device = _single(m, "device_option", "op")
    return OperatorDef(op_type, tuple(_strings(m, "input", "op")),
                       tuple(_strings(m, "output", "op")), args, name or "",
                       None if device is None else _device_from(_message(m, device, "op"),
                                                                label),
                       _single_string(m, "engine", "op") or "")


def _arg_from(m: Message, field: Field, op: Message, label: str) -> tuple[str, ArgValue]:
    _check_fields(m, "arg")
    name = _single_string(m, "name", "arg")
    present = list(dict.fromkeys(f.name for f in m.fields))
    try:
        kind = arg_kind(name, label, [k for k in present if k in SCALAR_KINDS + LIST_KINDS],
                        [k for k in present if k in UNSUPPORTED_KINDS])
    except Refusal as e:
        # the first field of the kind that is too many (or the arg itself, if it has no name)
        at = next((f for f in m.fields if f.name == e.field), None)
        raise (m.error(e.message, at) if at else op.error(e.message, field)) from None
    if kind is None:
        return name, []  # Caffe2 writes an empty repeated field as nothing at all
    what = f"arg '{name}'"
    if kind in SCALAR_KINDS:
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


def _device_from(m: Message, label: str) -> str:
    _check_fields(m, "device_option")
    kind = 0  # Caffe2's default device_type: CPU
    dtype = _single(m, "device_type", "device_option")
    if dtype is not None:
        # bool is excluded by the exact type test: `device_type: true` is not CUDA
        kind = (dtype.value if type(dtype.value) is int
                else _DEVICE_ENUMS.get(dtype.value) if type(dtype.value) is Enum else None)
        if kind is None:
            raise m.error(f"device_type {dtype.value!r} is not supported (0 = CPU, 1 = CUDA)",
                          dtype.value_position)
    # device_id and its old name cuda_gpu_id are one field: both given must agree
    ids = [f for f in (_single(m, n, "device_option") for n in ("device_id", "cuda_gpu_id"))
           if f is not None]
    for f in ids:
        _expect(m, f, type(f.value) is int, "an integer", "device_option")
    if len(ids) == 2 and ids[0].value != ids[1].value:
        raise m.error("device_id and cuda_gpu_id disagree", ids[1])
    try:
        return device_name(kind, ids[0].value if ids else None, label)
    except Refusal as e:
        at = dtype if e.field == "device_type" else ids[0]
        raise m.error(e.message, at.value_position) from None
