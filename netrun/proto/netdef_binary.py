"""Caffe2 NetDef as binary protobuf (`.pb`: the model zoo's predict_net.pb and init_net.pb).

Field numbers, from caffe2/proto/caffe2.proto:

    NetDef        name=1 op=2 type=3 num_workers=4 device_option=5 arg=6 external_input=7
                  external_output=8 partition_info=9
    OperatorDef   input=1 output=2 name=3 type=4 arg=5 device_option=6 engine=7
                  control_input=8 is_gradient_op=9 debug_info=10 domain=11 op_version=12
    Argument      name=1 f=2 (float) i=3 (int64) s=4 (bytes) floats=5 ints=6 strings=7 n=8
                  nets=9 t=10 tensors=11 qtensors=12
    DeviceOption  device_type=1 device_id=2 (once cuda_gpu_id) random_seed=3 node_name=4
                  numa_node_id=5 extra_info=6

The schema is proto2 without [packed=true], so Caffe2 writes repeated numbers one field each;
the writer does the same, in field-number order, so its bytes are what protobuf's own
serializer makes of the same message. The reader takes packed and unpacked lists alike and
skips fields it does not know, as protobuf readers do. What netrun cannot represent (tensor
or net arguments, control inputs, other operator libraries) is refused, not dropped; those
rules are netdef_rules', which the text reader (pbtxt) applies too.
"""
from __future__ import annotations

import numpy as np

from netrun.errors import NetrunError, ParseError
from netrun.proto.defs import ArgValue, NetDef, OperatorDef
from netrun.proto.netdef_rules import (
    FIELDS,
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
from netrun.proto.wire import (
    FIXED32,
    LENGTH,
    VARINT,
    WireError,
    Writer,
    as_real,
    as_reals,
    iter_fields,
    key,
    read_varint,
    signed,
)

_OP_NAMES = {number: name for name, number in FIELDS["OperatorDef"].items()}
_ARG_NAMES = {number: name for name, number in FIELDS["Argument"].items()}
# One unpacked float of Argument.floats: key byte 0x2D (field 5, fixed32), then 4 bytes.
_FLOAT_RECORD = np.dtype([("key", "u1"), ("value", "<f4")])
_FLOAT_KEY = key(5, FIXED32)[0]
_INT64 = (-(1 << 63), (1 << 63) - 1)


# Writing ----------------------------------------------------------------------------------
def netdef_to_bytes(net: NetDef) -> bytes:
    """The NetDef as Caffe2's binary protobuf (deterministic: field-number order)."""
    w = Writer()
    if net.name:
        w.bytes(1, net.name)
    for op in net.ops:
        w.bytes(2, _op_bytes(op))
    for blob in net.external_inputs:
        w.bytes(7, blob)
    for blob in net.external_outputs:
        w.bytes(8, blob)
    return w.to_bytes()


def _op_bytes(op: OperatorDef) -> bytes:
    w = Writer()
    for blob in op.inputs:
        w.bytes(1, blob)
    for blob in op.outputs:
        w.bytes(2, blob)
    if op.name:
        w.bytes(3, op.name)
    w.bytes(4, op.type)
    for name, value in op.args.items():
        w.bytes(5, _arg_bytes(name, value, op))
    if op.device is not None:
        w.bytes(6, _device_bytes(op))
    if op.engine:
        w.bytes(7, op.engine)
    return w.to_bytes()


def _arg_bytes(name: str, value: ArgValue, op: OperatorDef) -> bytes:
    w = Writer().bytes(1, name)
    # bool before int: True is an int in Python, and Caffe2 stores flags as i
    if isinstance(value, (bool, int)):
        return w.int(3, _int64(int(value), name, op)).to_bytes()
    if isinstance(value, float):
        return w.float(2, _float32(value, name, op)).to_bytes()
    if isinstance(value, str):
        return w.bytes(4, value).to_bytes()
    if all(isinstance(v, (bool, int)) for v in value):   # an empty list writes just the name
        for v in value:
            w.int(6, _int64(int(v), name, op))
        return w.to_bytes()
    if all(isinstance(v, (bool, int, float)) for v in value):
        return w.to_bytes() + _unpacked_floats(_floats32(value, name, op))
    if all(isinstance(v, str) for v in value):
        for v in value:
            w.bytes(7, v)
        return w.to_bytes()
    raise NetrunError(f"argument '{name}' of op {op.label} mixes strings and numbers: {value!r}")


def _unpacked_floats(values: np.ndarray) -> bytes:
    """Argument.floats one field per value, as Caffe2 writes them (built as one array: an
    init net holds millions)."""
    records = np.empty(len(values), _FLOAT_RECORD)
    records["key"] = _FLOAT_KEY
    records["value"] = values
    return records.tobytes()


def _int64(value: int, name: str, op: OperatorDef) -> int:
    if not _INT64[0] <= value <= _INT64[1]:
        raise NetrunError(f"argument '{name}' of op {op.label} is {value}, outside int64, "
                          f"which is all a Caffe2 argument can hold")
    return value


def _float32(value: float, name: str, op: OperatorDef) -> float:
    return float(_floats32([value], name, op)[0])


def _floats32(values: list, name: str, op: OperatorDef) -> np.ndarray:
    """The values as float32 (Caffe2's float), refusing finite ones beyond its range."""
    wide = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore"):
        single = wide.astype(np.float32)
    lost = np.flatnonzero(np.isfinite(wide) & ~np.isfinite(single))
    if lost.size:
        at = f" (at index {lost[0]})" if len(wide) > 1 else ""
        raise NetrunError(f"argument '{name}' of op {op.label} is {wide[lost[0]]:g}{at}, beyond "
                          f"float32's range (Caffe2 stores float arguments as float32)")
    return single


def _device_bytes(op: OperatorDef) -> bytes:
    kind, index = device_option(op)
    w = Writer().int(1, kind)
    if index is not None:
        w.int(2, index)
    return w.to_bytes()


# Reading ----------------------------------------------------------------------------------
def netdef_from_bytes(data: bytes | memoryview, where: str = "<bytes>") -> NetDef:
    """Parse a binary Caffe2 NetDef. Damaged bytes raise WireError naming `where`; content
    netrun cannot represent raises ParseError."""
    try:
        return _read_net(memoryview(data))
    except WireError as e:
        raise WireError(f"{where}: not a readable Caffe2 NetDef ({e})") from None
    except Refusal as e:                  # the rules say what is wrong; this says where
        raise ParseError(e.message, where) from None


def _read_net(buf: memoryview) -> NetDef:
    name, ops, inputs, outputs, devices = "", [], [], [], []
    for number, wire, value in iter_fields(buf):
        if number == 1:
            name = _text(wire, value, "NetDef.name")
        elif number == 2:
            ops.append(_read_op(_message(wire, value, "NetDef.op"), len(ops)))
        elif number == 5:
            devices.append(bytes(_message(wire, value, "NetDef.device_option")))
        elif number == 7:
            inputs.append(_text(wire, value, "NetDef.external_input"))
        elif number == 8:
            outputs.append(_text(wire, value, "NetDef.external_output"))
        # the rest is skipped (netdef_rules.SKIPPED), and so is anything newer
    # A message field given twice is merged, as protobuf does: the bytes read as one message.
    device = _read_device(memoryview(b"".join(devices)), "the net") if devices else None
    return NetDef(name, with_net_device(ops, device), inputs, outputs)


def _read_op(buf: memoryview, index: int) -> OperatorDef:
    fields: dict[str, list] = {"input": [], "output": [], "arg": []}
    scalars: dict[str, str] = {}
    devices: list[bytes] = []
    for number, wire, value in iter_fields(buf):
        if number in (1, 2):
            fields["input" if number == 1 else "output"].append(
                _text(wire, value, "OperatorDef.input/output"))
        elif number in (3, 4, 7, 8, 11):
            # control_input is repeated; one is enough to refuse the op
            field = _OP_NAMES[number]
            scalars[field] = _text(wire, value, f"OperatorDef.{field}")
        elif number == 5:
            fields["arg"].append(_message(wire, value, "OperatorDef.arg"))
        elif number == 6:
            devices.append(bytes(_message(wire, value, "OperatorDef.device_option")))
        # 9 is_gradient_op, 10 debug_info, 12 op_version: skipped (netdef_rules.SKIPPED)
    label = op_label(index, scalars.get("name"), scalars.get("type"))
    check_op(label, scalars.get("type"), scalars.get("control_input"), scalars.get("domain"))
    args: dict[str, ArgValue] = {}
    for arg in fields["arg"]:
        add_arg(args, *_read_arg(arg, label), label)
    return OperatorDef(scalars["type"], tuple(fields["input"]), tuple(fields["output"]), args,
                       scalars.get("name", ""),
                       _read_device(memoryview(b"".join(devices)), label) if devices else None,
                       scalars.get("engine", ""))


def _read_arg(buf: memoryview, label: str) -> tuple[str, ArgValue]:
    name, kinds, values, unsupported = None, [], {}, []
    for number, wire, value in _argument_fields(buf):
        if number == 1:
            name = _text(wire, value, "Argument.name")
            continue
        kind = _ARG_NAMES.get(number)
        if kind in UNSUPPORTED_KINDS:
            unsupported.append(kind)
            continue
        if kind is None:
            continue                                 # a field from a newer schema
        if kind not in kinds:
            kinds.append(kind)
        if kind in SCALAR_KINDS:                     # optional scalar: the last one wins
            values[kind] = _scalar(number, wire, value)
        else:
            values.setdefault(kind, []).extend(_items(number, wire, value))
    kind = arg_kind(name, label, kinds, unsupported)
    if kind is None:
        return name, []      # an empty repeated field leaves nothing but the name
    if kind == "s":
        return name, utf8(values["s"], f"argument '{name}' of {label}")
    if kind == "strings":
        return name, [utf8(v, f"argument '{name}' of {label}") for v in values["strings"]]
    return name, values[kind]


def _argument_fields(buf: memoryview):
    """iter_fields for an Argument, except that a run of unpacked floats (the values of a
    GivenTensorFill: millions in a zoo init net) comes back as one packed-like array."""
    pos, end = 0, len(buf)
    while pos < end:
        if buf[pos] == _FLOAT_KEY:
            run = _float_run(buf, pos)
            if run:
                floats = np.frombuffer(buf, _FLOAT_RECORD, count=run, offset=pos)["value"]
                yield 5, LENGTH, np.ascontiguousarray(floats).view(np.uint8).data
                pos += run * _FLOAT_RECORD.itemsize
                continue
        start = pos
        number_wire, pos = read_varint(buf, pos)
        # Hand one field to iter_fields: it checks the wire type and the lengths.
        pos = _field_end(buf, pos, number_wire & 7)
        yield from iter_fields(buf[start:pos])


def _float_run(buf: memoryview, pos: int) -> int:
    """How many whole unpacked-float records start at `pos` (windows that double in size, so
    the scan costs what the run is long, whatever follows it)."""
    total = (len(buf) - pos) // _FLOAT_RECORD.itemsize
    run, window = 0, 64
    while run < total:
        count = min(window, total - run)
        keys = np.frombuffer(buf, _FLOAT_RECORD, count=count,
                             offset=pos + run * _FLOAT_RECORD.itemsize)["key"]
        other = np.flatnonzero(keys != _FLOAT_KEY)
        if other.size:
            return run + int(other[0])
        run, window = run + count, window * 2
    return run


def _field_end(buf: memoryview, pos: int, wire: int) -> int:
    """The end of a field's payload starting at `pos` (bounds are checked by iter_fields)."""
    if wire == VARINT:
        return read_varint(buf, pos)[1]
    if wire == LENGTH:
        size, pos = read_varint(buf, pos)
        return min(pos + size, len(buf) + 1)         # past the end: iter_fields says so
    if wire in (1, 5):
        return min(pos + (8 if wire == 1 else 4), len(buf) + 1)
    return len(buf)                                  # a group: iter_fields refuses it


def _scalar(number: int, wire: int, value):
    if number == 2:
        if wire != FIXED32:
            _wrong("Argument.f", "a float")
        # The shortest decimal that is this float32, as Caffe2's text output shows it: so
        # `f: 0.0001` reads the same from .pb and .pbtxt, and netrun -> .pb -> netrun keeps
        # the value it started with whenever that was a float32's shortest decimal.
        return float(np.format_float_scientific(np.float32(as_real(wire, value)), unique=True))
    if number == 3:
        return signed(value) if wire == VARINT else _wrong("Argument.i", "a varint")
    return bytes(value) if wire == LENGTH else _wrong("Argument.s", "length-delimited")


def _items(number: int, wire: int, value) -> list:
    if number == 5:
        if wire not in (FIXED32, LENGTH):
            _wrong("Argument.floats", "fixed32 or packed")
        return as_reals(wire, value, "<f4").tolist()
    if number == 6:
        if wire == VARINT:
            return [signed(value)]
        if wire != LENGTH:
            _wrong("Argument.ints", "a varint or packed")
        out, pos = [], 0
        while pos < len(value):
            v, pos = read_varint(value, pos)
            out.append(signed(v))
        return out
    if wire != LENGTH:
        _wrong("Argument.strings", "length-delimited")
    return [bytes(value)]


def _wrong(field: str, kind: str):
    raise WireError(f"{field} is not {kind}")


def _message(wire: int, value, field: str) -> memoryview:
    if wire != LENGTH:
        _wrong(field, "a message (length-delimited)")
    return value


def _text(wire: int, value, field: str) -> str:
    if wire != LENGTH:
        _wrong(field, "a string (length-delimited)")
    return utf8(bytes(value), field)


def _read_device(buf: memoryview, label: str) -> str:
    kind, index = 0, None                       # Caffe2's default device_type is CPU
    for number, wire, value in iter_fields(buf):
        if number in (1, 2) and wire != VARINT:
            _wrong("DeviceOption.device_type/device_id", "a varint")
        if number == 1:
            kind = signed(value, 32)
        elif number == 2:
            index = signed(value, 32)
        # 3 random_seed, 4 node_name, 5 numa_node_id, 6 extra_info: skipped
    return device_name(kind, index, label)
