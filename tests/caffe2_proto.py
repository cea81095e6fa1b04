"""Caffe2's NetDef message types built at run time with google.protobuf (tests only): an
encoder and decoder independent of netrun's hand-written wire code.

The messages follow caffe2/proto/caffe2.proto (proto2; repeated numbers unpacked, as Caffe2
writes them). `messages(packed=True)` gives the same types with packed floats and ints, which
protobuf readers must accept too. TensorProto and QTensorProto are cut to a few fields: only
their presence in an Argument matters here.
"""
from __future__ import annotations

import functools
import math

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from netrun.proto.defs import NetDef, OperatorDef

F = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REPEATED = F.LABEL_OPTIONAL, F.LABEL_REPEATED
STRING, BYTES, FLOAT, INT64, INT32, UINT32, BOOL, MESSAGE = (
    F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_FLOAT, F.TYPE_INT64, F.TYPE_INT32, F.TYPE_UINT32,
    F.TYPE_BOOL, F.TYPE_MESSAGE)

# message -> [(name, number, label, type, message type or None)]
SCHEMA = {
    "TensorProto": [("dims", 1, REPEATED, INT64, None), ("data_type", 2, OPTIONAL, INT32, None),
                    ("float_data", 3, REPEATED, FLOAT, None), ("name", 7, OPTIONAL, STRING, None)],
    "QTensorProto": [("dims", 1, REPEATED, INT64, None)],
    "Argument": [("name", 1, OPTIONAL, STRING, None), ("f", 2, OPTIONAL, FLOAT, None),
                 ("i", 3, OPTIONAL, INT64, None), ("s", 4, OPTIONAL, BYTES, None),
                 ("floats", 5, REPEATED, FLOAT, None), ("ints", 6, REPEATED, INT64, None),
                 ("strings", 7, REPEATED, BYTES, None), ("n", 8, OPTIONAL, MESSAGE, "NetDef"),
                 ("nets", 9, REPEATED, MESSAGE, "NetDef"),
                 ("t", 10, OPTIONAL, MESSAGE, "TensorProto"),
                 ("tensors", 11, REPEATED, MESSAGE, "TensorProto"),
                 ("qtensors", 12, REPEATED, MESSAGE, "QTensorProto")],
    "DeviceOption": [("device_type", 1, OPTIONAL, INT32, None),
                     ("device_id", 2, OPTIONAL, INT32, None),
                     ("random_seed", 3, OPTIONAL, UINT32, None),
                     ("node_name", 4, OPTIONAL, STRING, None),
                     ("numa_node_id", 5, OPTIONAL, INT32, None),
                     ("extra_info", 6, REPEATED, STRING, None)],
    "OperatorDef": [("input", 1, REPEATED, STRING, None), ("output", 2, REPEATED, STRING, None),
                    ("name", 3, OPTIONAL, STRING, None), ("type", 4, OPTIONAL, STRING, None),
                    ("arg", 5, REPEATED, MESSAGE, "Argument"),
                    ("device_option", 6, OPTIONAL, MESSAGE, "DeviceOption"),
                    ("engine", 7, OPTIONAL, STRING, None),
                    ("control_input", 8, REPEATED, STRING, None),
                    ("is_gradient_op", 9, OPTIONAL, BOOL, None),
                    ("debug_info", 10, OPTIONAL, STRING, None),
                    ("domain", 11, OPTIONAL, STRING, None),
                    ("op_version", 12, OPTIONAL, INT64, None)],
    "NetDef": [("name", 1, OPTIONAL, STRING, None), ("op", 2, REPEATED, MESSAGE, "OperatorDef"),
               ("type", 3, OPTIONAL, STRING, None), ("num_workers", 4, OPTIONAL, INT32, None),
               ("device_option", 5, OPTIONAL, MESSAGE, "DeviceOption"),
               ("arg", 6, REPEATED, MESSAGE, "Argument"),
               ("external_input", 7, REPEATED, STRING, None),
               ("external_output", 8, REPEATED, STRING, None)],
}


def messages(packed: bool = False) -> dict:
    """{message name: class} of the caffe2 schema (a separate package when packed)."""
    return _messages(bool(packed))


@functools.cache
def _messages(packed: bool) -> dict:
    package = "caffe2packed" if packed else "caffe2"
    proto = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package,
                                               syntax="proto2")
    for message, fields in SCHEMA.items():
        m = proto.message_type.add(name=message)
        for name, number, label, kind, type_name in fields:
            f = m.field.add(name=name, number=number, label=label, type=kind)
            if type_name:
                f.type_name = f".{package}.{type_name}"
            if packed and label == REPEATED and kind in (FLOAT, INT64):
                f.options.packed = True
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
            for name in SCHEMA}


def to_proto(net: NetDef, packed: bool = False):
    """A netrun NetDef as a caffe2.NetDef message (argument kinds chosen as Caffe2 would)."""
    msg = messages(packed)["NetDef"]()
    if net.name:
        msg.name = net.name
    for op in net.ops:
        _op_to_proto(op, msg.op.add())
    msg.external_input.extend(net.external_inputs)
    msg.external_output.extend(net.external_outputs)
    return msg


def _op_to_proto(op: OperatorDef, m) -> None:
    m.input.extend(op.inputs)
    m.output.extend(op.outputs)
    if op.name:
        m.name = op.name
    m.type = op.type
    for name, value in op.args.items():
        a = m.arg.add(name=name)
        if isinstance(value, int):
            a.i = value
        elif isinstance(value, float):
            a.f = value
        elif isinstance(value, str):
            a.s = value.encode()
        elif all(isinstance(v, int) for v in value):
            a.ints.extend(value)
        elif all(isinstance(v, str) for v in value):
            a.strings.extend(v.encode() for v in value)
        else:
            a.floats.extend(value)
    if op.device is not None:
        kind, _, index = op.device.partition(":")
        m.device_option.device_type = {"cpu": 0, "gpu": 1}[kind]
        if index:
            m.device_option.device_id = int(index)
    if op.engine:
        m.engine = op.engine


def from_proto(msg) -> NetDef:
    """A caffe2.NetDef message as a netrun NetDef (the test's own decoder)."""
    ops = []
    for m in msg.op:
        args = {}
        for a in m.arg:
            kind = next((k for k in ("f", "i", "s") if a.HasField(k)), None)
            if kind == "s":
                args[a.name] = a.s.decode()
            elif kind:
                args[a.name] = getattr(a, kind)
            else:
                args[a.name] = (list(a.floats) or list(a.ints)
                                or [s.decode() for s in a.strings])
        device = None
        if m.HasField("device_option"):
            d = m.device_option
            device = {0: "cpu", 1: "gpu"}[d.device_type]
            if d.HasField("device_id"):
                device += f":{d.device_id}"
        ops.append(OperatorDef(m.type, tuple(m.input), tuple(m.output), args, m.name, device,
                               m.engine))
    return NetDef(msg.name, ops, list(msg.external_input), list(msg.external_output))


def to_text(msg) -> str:
    """The message in protobuf text format, as protobuf's own printer writes it."""
    return text_format.MessageToString(msg)


def same_floats(a: list[float], b: list[float]) -> bool:
    """Equal float lists, NaN equal to NaN."""
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y))
                                    for x, y in zip(a, b))
