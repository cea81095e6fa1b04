"""Caffe2 NetDef text format (netrun.proto.pbtxt) and file dispatch (netrun.proto.io)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings

import netrun
from netrun.errors import NetrunError, ParseError
from netrun.proto.defs import NetDef
from netrun.proto.io import load_netdef, save_netdef
from netrun.util.files import read_text
from netrun.proto.pbtxt import netdef_from_text, netdef_to_text
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
    ("name: lenet", 1, 7, "must be a quoted string"),
    ('name: "a"\nname: "b"', 2, 1, "given more than once"),
    ('op { input: "x" }', 1, 1, "op has no 'type'"),
    ('op { type: "T"\n arg { i: 1 } }', 2, 2, "arg has no 'name'"),
    ('op { type: "T" arg { name: "a" i: 1.5 } }', 1, 35, "must be an integer"),
    ('op { type: "T" arg { name: "a" i: 1 f: 2.0 } }', 1, 37, "has both 'i' and 'f'"),
    ('op { type: "T" arg { name: "a" i: 1 } arg { name: "a" i: 2 } }', 1, 39, "more than once"),
    ('op { type: "T" arg { name: "a" s: NCHW } }', 1, 35, "must be a quoted string"),
    ('op { type: "T" arg { name: "a" floats: "x" } }', 1, 40, "must be a number"),
    ('op { type: "T" device_option { device_type: 5 } }', 1, 45, "not supported"),
    ('op { type: "T" device_option { device_type: 1 device_id: -1 } }', 1, 58, "non-negative"),
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
])
def test_writer_refuses_what_the_format_cannot_hold(op, fragment):
    with pytest.raises(NetrunError, match=fragment):
        netdef_to_text(NetDef(ops=[op]))


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
