"""Caffe2 NetDef text format (netrun.proto.pbtxt) and file dispatch (netrun.proto.io)."""
from __future__ import annotations

import math

import pytest
from google.protobuf import text_format
from hypothesis import given, settings

import netrun
from netrun.errors import NetrunError, ParseError
from netrun.proto.defs import NetDef
from netrun.proto.io import load_netdef, save_netdef
from netrun.proto.netdef_binary import netdef_from_bytes, netdef_to_bytes
from netrun.proto.netdef_rules import SKIPPED
from netrun.proto.pbtxt import netdef_from_text, netdef_to_text
from netrun.proto.wire import Writer, iter_fields
from netrun.util.files import read_text
from tests.caffe2_proto import messages, to_text
from tests.netdefs import canonical, netdefs

SAMPLE = NetDef("lenet", [
    netrun.op("Conv", ["data", "conv1_w", "conv1_b"], ["conv1"], name="conv1", kernel=5,
              pads=[1, 2, 1, 2], epsilon=1.0, order="NCHW", device="gpu:1", engine="CUDNN"),
    netrun.op("Relu", "conv1", "conv1", device="cpu"),
    netrun.op("ConstantFill", [], ["z"], shape=[], value=-math.inf, scales=[0.5, 2.0],
              names=['a "quoted"\\name', "é"]),
], ["data", "conv1_w", "conv1_b"], ["z"])

SAMPLE_TEXT = r'''name: "lenet"
op {
  input: "data"
  input: "conv1_w"
  input: "conv1_b"
  output: "conv1"
  name: "conv1"
  type: "Conv"
  arg {
    name: "kernel"
    i: 5
  }
  arg {
    name: "pads"
    ints: 1
    ints: 2
    ints: 1
    ints: 2
  }
  arg {
    name: "epsilon"
    f: 1.0
  }
  arg {
    name: "order"
    s: "NCHW"
  }
  device_option {
    device_type: 1
    device_id: 1
  }
  engine: "CUDNN"
}
op {
  input: "conv1"
  output: "conv1"
  type: "Relu"
  device_option {
    device_type: 0
  }
}
op {
  output: "z"
  type: "ConstantFill"
  arg {
    name: "shape"
  }
  arg {
    name: "value"
    f: -inf
  }
  arg {
    name: "scales"
    floats: 0.5
    floats: 2.0
  }
  arg {
    name: "names"
    strings: "a \"quoted\"\\name"
    strings: "é"
  }
}
external_input: "data"
external_input: "conv1_w"
external_input: "conv1_b"
external_output: "z"
'''


def test_writer_output_is_caffe2_text_format():
    assert netdef_to_text(SAMPLE) == SAMPLE_TEXT


def test_reader_inverts_the_writer():
    net = netdef_from_text(SAMPLE_TEXT)
    assert canonical(net) == canonical(SAMPLE)
    assert type(net.ops[0].args["epsilon"]) is float  # integral, still a float
    assert net.ops[2].args["shape"] == []


def test_design_doc_example():
    net = netdef_from_text('name: "lenet_predict"\n'
                           'op { input: "data" input: "conv1_w" input: "conv1_b" output: "conv1" '
                           'type: "Conv"\n     arg { name: "kernel" i: 5 } }\n'
                           'external_input: "data"\n')
    assert net.name == "lenet_predict" and net.external_inputs == ["data"]
    assert net.ops == [netrun.op("Conv", ["data", "conv1_w", "conv1_b"], ["conv1"], kernel=5)]


@pytest.mark.parametrize("arg, text", [
    (3, "i: 3"), (-(2**40), f"i: {-(2**40)}"), (True, "i: 1"), (2.0, "f: 2.0"), (1e-5, "f: 1e-05"),
    (math.nan, "f: nan"), (math.inf, "f: inf"), ("s", 's: "s"'), ([1, 2], "ints: 1\n    ints: 2"),
    ([1.0], "floats: 1.0"), ([1, 2.5], "floats: 1.0\n    floats: 2.5"), (["a"], 'strings: "a"'),
])
def test_argument_kinds(arg, text):
    out = netdef_to_text(NetDef(ops=[netrun.op("T", x=arg)]))
    assert f'arg {{\n    name: "x"\n    {text}\n  }}' in out
    assert netdef_to_text(netdef_from_text(out)) == out


@pytest.mark.parametrize("literal, expected", [
    ("f: 1", 1.0), ("f: 1e-4", 1e-4), ("floats: [1, 2.5]", [1.0, 2.5]), ("ints: [1, 2]", [1, 2]),
    ("i: 0x10", 16), ("s: 'single'", "single"), ("strings: 'a' strings: 'b'", ["a", "b"]),
])
def test_reader_accepts_equivalent_spellings(literal, expected):
    net = netdef_from_text(f'op {{ type: "T" arg {{ name: "x" {literal} }} }}')
    got = net.ops[0].args["x"]
    assert got == expected and type(got) is type(expected)
    if isinstance(got, list):
        assert [type(v) for v in got] == [type(v) for v in expected]


@pytest.mark.parametrize("device, text", [
    (None, ""), ("cpu", "device_type: 0\n"), ("gpu", "device_type: 1\n"),
    ("gpu:0", "device_type: 1\n    device_id: 0\n"),
    ("gpu:3", "device_type: 1\n    device_id: 3\n"),
])
def test_devices(device, text):
    out = netdef_to_text(NetDef(ops=[netrun.op("T", device=device)]))
    assert ("device_option" in out) == (device is not None)
    assert text in out
    assert netdef_from_text(out).ops[0].device == device


@pytest.mark.parametrize("option, device", [
    ("device_type: 1 cuda_gpu_id: 2", "gpu:2"),
    ("device_type: 1 device_id: 2 cuda_gpu_id: 2", "gpu:2"),
    ("", "cpu"), ("device_type: CUDA", "gpu"),
])
def test_caffe2_device_spellings(option, device):
    net = netdef_from_text(f'op {{ type: "T" device_option {{ {option} }} }}')
    assert net.ops[0].device == device


def test_executor_hints_are_accepted_and_dropped():
    net = netdef_from_text('name: "n" type: "dag" num_workers: 4\n'
                           'op { type: "T" is_gradient_op: true }')
    assert net.name == "n" and net.ops[0].type == "T"


@pytest.mark.parametrize("text, line, column, fragment", [
    ('name: "n"\nops { type: "T" }', 2, 1, "unknown field 'ops' in NetDef, did you mean 'op'?"),
    ('op {\n  type: "T"\n  inputs: "x"\n}', 3, 3, "did you mean 'input'?"),
    ('op { type: "T" arg { name: "a" flaots: 2.0 } }', 1, 32, "did you mean 'floats'?"),
    ('op { type: "T" device_option { device_typ: 1 } }', 1, 32, "did you mean 'device_type'?"),
    ('op { type: "T" domian: "caffe2" }', 1, 16, "did you mean 'domain'?"),
    ('device_option { random_sed: 1 }', 1, 17, "did you mean 'random_seed'?"),
    ("name: lenet", 1, 7, "must be a quoted string"),
    ('name: "a"\nname: "b"', 2, 1, "given more than once"),
    ('op { input: "x" }', 1, 1, "op 0 has no type"),
    ('op { type: "T"\n arg { i: 1 } }', 2, 2, "op 0 (T) has an argument with no name"),
    ('op { type: "T" arg { name: "a" i: 1.5 } }', 1, 35, "must be an integer"),
    ('op { type: "T" arg { name: "a" i: 1 f: 2.0 } }', 1, 37, "has both 'i' and 'f'"),
    ('op { type: "T" arg { name: "a" i: 1 } arg { name: "a" i: 2 } }', 1, 39, "more than once"),
    ('op { type: "T" arg { name: "a" s: NCHW } }', 1, 35, "must be a quoted string"),
    ('op { type: "T" arg { name: "a" floats: "x" } }', 1, 40, "must be a number"),
    ('op { type: "T" device_option { device_type: 5 } }', 1, 45, "which netrun does not run"),
    ('op { type: "T" device_option { device_type: 1 device_id: -1 } }', 1, 58, "must be ≥ 0"),
    ('op { type: "T" device_option { device_type: true } }', 1, 45, "not supported"),
    ('op { type: "T" device_option { device_type: 1 device_id: 1 cuda_gpu_id: 2 } }', 1, 60,
     "disagree"),
    ('op: "Conv"', 1, 5, "must be a message"),
    ('op { type: "T" ', 1, 4, "never closed"),
])
def test_reader_errors_point_at_the_field(text, line, column, fragment):
    with pytest.raises(ParseError) as info:
        netdef_from_text(text, "net.pbtxt")
    err = info.value
    assert (err.file, err.line, err.column) == ("net.pbtxt", line, column), str(err)
    assert fragment in str(err)


@pytest.mark.parametrize("op, fragment", [
    (netrun.op("T", x=[1, "a"]), "mixes strings and numbers"),
    (netrun.op("T", device="tpu:0"), "'cpu', 'gpu' or 'gpu:N'"),
    (netrun.op("T", device="gpu:²"), "'cpu', 'gpu' or 'gpu:N'"),   # isdigit(), not a number
    (netrun.op("T", device="gpu:"), "'cpu', 'gpu' or 'gpu:N'"),
])
def test_writer_refuses_what_the_format_cannot_hold(op, fragment):
    with pytest.raises(NetrunError, match=fragment):
        netdef_to_text(NetDef(ops=[op]))
    with pytest.raises(NetrunError, match=fragment):   # the binary writer: the same rules
        netdef_to_bytes(NetDef(ops=[op]))


# The same net as binary (.pb) -------------------------------------------------------------
# A zoo-style net with every field netdef_to_bytes never writes: a net-level device option
# (for the ops that have none) and arguments, DeviceOption's seeding and placement fields,
# operator hints, an empty and a "caffe2" domain, executor hints and partition info.
ZOO_TEXT = """name: "zoo"
op {
  input: "data"
  output: "conv1"
  name: "conv1"
  type: "Conv"
  arg { name: "kernel" i: 3 }
  arg { name: "scale" f: 0.1 }
  arg { name: "pads" ints: 1 ints: 0 }
  arg { name: "weights" floats: 0.5 floats: -1.25 }
  arg { name: "order" s: "NCHW" }
  engine: "CUDNN"
  is_gradient_op: false
  debug_info: "made by hand"
  domain: "caffe2"
  op_version: 2
}
op {
  input: "conv1"
  output: "relu1"
  type: "Relu"
  device_option {
    device_type: 0
    random_seed: 3
    node_name: "host"
    numa_node_id: 1
    extra_info: "a"
    extra_info: "b"
  }
  domain: ""
}
device_option {
  device_type: 1
  device_id: 2
  random_seed: 1701
  node_name: "trainer:0"
  numa_node_id: 0
  extra_info: "cuda_stream: 1"
}
arg { name: "ws_nbytes_limit" i: 1048576 }
arg { name: "executor" s: "async" }
type: "async_scheduling"
num_workers: 4
partition_info { name: "p0" device_id: 0 }
external_input: "data"
external_output: "relu1"
"""
# What both readers make of it: Conv takes the net's device, Relu keeps its own.
ZOO = NetDef("zoo", [
    netrun.op("Conv", ["data"], ["conv1"], name="conv1", kernel=3, scale=0.1, pads=[1, 0],
              weights=[0.5, -1.25], order="NCHW", engine="CUDNN", device="gpu:2"),
    netrun.op("Relu", "conv1", "relu1", device="cpu"),
], ["data"], ["relu1"])


def _zoo_bytes() -> bytes:
    """ZOO_TEXT in binary: netdef_to_bytes of the net without devices, with the fields it
    never writes appended to their messages (protobuf reads a message's fields in any
    order)."""
    conv, relu = (o.with_(device=None) for o in ZOO.ops)
    device = (Writer().int(1, 0).int(3, 3).bytes(4, "host").int(5, 1).bytes(6, "a")
              .bytes(6, "b").to_bytes())
    op_extras = [Writer().int(9, 0).bytes(10, "made by hand").bytes(11, "caffe2").int(12, 2),
                 Writer().bytes(6, device).bytes(11, "")]
    out, ops = Writer(), 0
    for number, _, value in iter_fields(netdef_to_bytes(NetDef("zoo", [conv, relu],
                                                               ZOO.external_inputs,
                                                               ZOO.external_outputs))):
        # every NetDef field netdef_to_bytes writes is length-delimited
        extra = op_extras[ops].to_bytes() if number == 2 else b""
        ops += number == 2
        out.bytes(number, bytes(value) + extra)
    net_device = (Writer().int(1, 1).int(2, 2).int(3, 1701).bytes(4, "trainer:0").int(5, 0)
                  .bytes(6, "cuda_stream: 1").to_bytes())
    return (out.bytes(5, net_device)
            .bytes(6, Writer().bytes(1, "ws_nbytes_limit").int(3, 1048576).to_bytes())
            .bytes(6, Writer().bytes(1, "executor").bytes(4, "async").to_bytes())
            .bytes(3, "async_scheduling").int(4, 4)
            .bytes(9, Writer().bytes(1, "p0").int(2, 0).to_bytes()).to_bytes())


def test_a_zoo_net_reads_the_same_from_text_and_binary():
    from_text = netdef_from_text(ZOO_TEXT, "zoo.pbtxt")
    from_bytes = netdef_from_bytes(_zoo_bytes(), "zoo.pb")
    assert from_text == from_bytes
    assert canonical(from_text) == canonical(ZOO)


def test_protobufs_own_text_and_bytes_of_the_net_read_the_same():
    # the same message written both ways by google.protobuf (whose caffe2 schema in the
    # tests has no partition_info)
    msg = text_format.Parse(ZOO_TEXT.replace('partition_info { name: "p0" device_id: 0 }\n',
                                             ""), messages()["NetDef"]())
    from_text = netdef_from_text(to_text(msg))
    assert from_text == netdef_from_bytes(msg.SerializeToString())
    assert canonical(from_text) == canonical(ZOO)


# Each field the readers skip, as text.
SKIPPED_TEXT = {
    "NetDef": {"type": 'type: "dag"', "num_workers": "num_workers: 2",
               "arg": 'arg { name: "a" i: 1 }', "partition_info": 'partition_info { name: "p" }'},
    "OperatorDef": {"is_gradient_op": "is_gradient_op: true", "debug_info": 'debug_info: "d"',
                    "op_version": "op_version: 7"},
    "DeviceOption": {"random_seed": "random_seed: 1", "node_name": 'node_name: "n"',
                     "numa_node_id": "numa_node_id: 0", "extra_info": 'extra_info: "e"'},
}


def test_every_skipped_field_is_accepted_and_changes_nothing():
    assert {m: set(f) for m, f in SKIPPED_TEXT.items()} == {m: set(f) for m, f in
                                                            SKIPPED.items() if f}
    net, op, device = (" ".join(SKIPPED_TEXT[m].values())
                       for m in ("NetDef", "OperatorDef", "DeviceOption"))
    text = (f'{net} device_option {{ {device} }}\n'
            f'op {{ type: "T" {op} device_option {{ device_type: 1 {device} }} }}')
    assert netdef_from_text(text) == NetDef(ops=[netrun.op("T", device="gpu")])
    # the same through protobuf's encoder (its caffe2 schema in the tests has no partition_info)
    msg = text_format.Parse(text.replace(SKIPPED_TEXT["NetDef"]["partition_info"], ""),
                            messages()["NetDef"]())
    assert netdef_from_bytes(msg.SerializeToString()) == NetDef(ops=[netrun.op("T",
                                                                               device="gpu")])


@pytest.mark.parametrize("text, at, fragment", [
    ('op { type: "T" control_input: "x" }', '"x"', "op 0 (T) has a control input ('x')"),
    ('op { type: "T" domain: "aten" }', '"aten"', "'aten' operator library"),
    ('op { name: "c" type: "T" arg { name: "a" n { name: "x" } } }', "n {",
     "argument 'a' of op 0 ('c', T) holds a NetDef (n)"),
    ('op { type: "T" arg { name: "a" t { dims: 1 } } }', "t {", "holds a TensorProto (t)"),
    ('op { type: "T" arg { name: "a" tensors { dims: 1 } } }', "tensors", "TensorProtos"),
    ('op { type: "T" arg { name: "a" nets { } } }', "nets", "holds NetDefs (nets)"),
    ('op { type: "T" arg { name: "a" qtensors { dims: 1 } } }', "qtensors", "QTensorProtos"),
    ('op { type: "T" arg { name: "a" i: 1 floats: 2 } }', "floats", "both 'i' and 'floats'"),
    ('op { type: "T" arg { i: 1 } }', "arg", "op 0 (T) has an argument with no name"),
    ('op { type: "T" arg { name: "a" i: 1 } arg { name: "a" s: "x" } }', 'arg { name: "a" s',
     "argument 'a' is given more than once in op 0 (T)"),
    ('op { input: "x" }', "op", "op 0 has no type"),
    ('op { type: "T" } device_option { device_type: 2 }', "2 }",
     "the net has device_type 2, which netrun does not run"),
    ('op { type: "T" device_option { device_id: -3 } }', "-3", "has device_id -3"),
])
def test_text_and_binary_refuse_alike(text, at, fragment):
    data = text_format.Parse(text, messages()["NetDef"]()).SerializeToString()
    with pytest.raises(ParseError) as from_bytes:
        netdef_from_bytes(data, "net.pb")
    with pytest.raises(ParseError) as from_text:
        netdef_from_text(text, "net.pbtxt")
    assert from_text.value.message == from_bytes.value.message
    assert fragment in from_text.value.message
    assert (from_text.value.line, from_text.value.column) == (1, text.index(at) + 1)


def test_bytes_that_are_not_utf8_are_refused_in_text_as_in_binary():
    # an escape can make any byte; the binary reader refuses such a name, and so does text
    # (protobuf's own text parser refuses it too)
    with pytest.raises(ParseError, match=r"not UTF-8 text \(byte 0xe9 at offset 3") as info:
        netdef_from_text('op { type: "T" }\nname: "caf\\351"', "n.pbtxt")
    assert (info.value.line, info.value.column) == (2, 7)
    with pytest.raises(ParseError, match=r"not UTF-8 text \(byte 0xe9 at offset 3"):
        netdef_from_bytes(Writer().bytes(1, b"caf\xe9").to_bytes())
    with pytest.raises(ParseError, match=r"field 's' of arg 'a' is not UTF-8 text \(byte 0xff"):
        netdef_from_text(r'op { type: "T" arg { name: "a" s: "\377" } }')
    # escapes that make UTF-8 are text like any other
    assert netdef_from_text(r'name: "caf\303\251"').name == "café"


# Round trips ------------------------------------------------------------------------------
NETS = netdefs(['a"b', "back\\slash", "é😀", "line\nbreak", "tab\t", "\x00", "1", "true", "x: {y}",
                "#"], int_range=(-(2**63), 2**63 - 1))


@settings(max_examples=25, deadline=None)
@given(NETS)
def test_round_trip_is_lossless_and_byte_identical(net):
    text = netdef_to_text(net)
    again = netdef_from_text(text)
    assert canonical(again) == canonical(net)
    assert netdef_to_text(again) == text


# Files (netrun.proto.io) ------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".pbtxt", ".pb.txt", ".txt", ".yaml", ".yml", ".PBTXT"])
def test_save_and_load_by_extension(tmp_path, suffix):
    path = tmp_path / f"net{suffix}"
    save_netdef(SAMPLE, path)
    text = path.read_text(encoding="utf-8")
    assert (text == SAMPLE_TEXT) == (suffix.lower() in (".pbtxt", ".pb.txt", ".txt"))
    assert canonical(load_netdef(path)) == canonical(SAMPLE)
    assert canonical(load_netdef(str(path))) == canonical(SAMPLE)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_save_replaces_an_existing_file(tmp_path):
    path = tmp_path / "net.pbtxt"
    path.write_text("old")
    save_netdef(NetDef("new"), path)
    assert path.read_text() == 'name: "new"\n'


def test_parse_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.pbtxt"
    path.write_text('name: "n"\nop { type: "T"\n')
    with pytest.raises(ParseError) as info:
        load_netdef(path)
    assert info.value.file == str(path) and info.value.line == 2


@pytest.mark.parametrize("name, fragment", [
    ("net.json", "cannot tell the format"), ("net", "cannot tell the format"),
    ("lenet.prototxt", "netrun.load_model"),
])
def test_unknown_extensions(tmp_path, name, fragment):
    (tmp_path / name).write_text("")
    with pytest.raises(NetrunError, match=fragment):
        load_netdef(tmp_path / name)
    with pytest.raises(NetrunError, match=fragment):
        save_netdef(SAMPLE, tmp_path / name)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(NetrunError, match="cannot read .*no such file"):
        load_netdef(tmp_path / "missing.pbtxt")
    with pytest.raises(NetrunError, match="cannot read .*directory"):
        read_text(tmp_path)
    (tmp_path / "latin1.pbtxt").write_bytes(b'name: "caf\xe9"')
    with pytest.raises(NetrunError, match="cannot read .*not UTF-8.*0xe9"):
        load_netdef(tmp_path / "latin1.pbtxt")
    with pytest.raises(NetrunError, match="cannot write"):
        save_netdef(SAMPLE, tmp_path / "no" / "such" / "dir" / "net.pbtxt")
