"""NetDef as YAML (netrun.proto.netdef_yaml): lossless, deterministic, errors with positions."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings

import netrun
from netrun.errors import ParseError
from netrun.proto.defs import NetDef
from netrun.proto.netdef_yaml import netdef_from_yaml, netdef_to_yaml
from netrun.proto.pbtxt import netdef_from_text, netdef_to_text
from tests.netdefs import canonical, netdefs



SAMPLE = NetDef("lenet", [
    netrun.op("Conv", ["data", "conv1_w", "conv1_b"], ["conv1"], name="conv1", kernel=5,
              pads=[1, 2, 1, 2], epsilon=1e-5, order="NCHW", device="gpu:1", engine="CUDNN"),
    netrun.op("Relu", "conv1", "conv1"),
    netrun.op("ConstantFill", [], ["z"], shape=[], value=1.0, low=-math.inf),
], ["data"], ["z"])

SAMPLE_YAML = """name: lenet
external_inputs: [data]
external_outputs: [z]
ops:
- type: Conv
  inputs: [data, conv1_w, conv1_b]
  outputs: [conv1]
  args:
    kernel: 5
    pads: [1, 2, 1, 2]
    epsilon: 1.0e-05
    order: NCHW
  name: conv1
  device: gpu:1
  engine: CUDNN
- type: Relu
  inputs: [conv1]
  outputs: [conv1]
- type: ConstantFill
  outputs: [z]
  args:
    shape: []
    value: 1.0
    low: -.inf
"""


def test_writer_output():
    assert netdef_to_yaml(SAMPLE) == SAMPLE_YAML


def test_reader_inverts_the_writer():
    assert canonical(netdef_from_yaml(SAMPLE_YAML)) == canonical(SAMPLE)


def test_empty_optional_fields_are_left_out():
    assert netdef_to_yaml(NetDef(ops=[netrun.op("Iter")])) == "ops:\n- {type: Iter}\n"
    assert netdef_from_yaml("ops:\n- {type: Iter}\n") == NetDef(ops=[netrun.op("Iter")])


@pytest.mark.parametrize("arg", [
    1, -7, 2**70, 1.0, 1e-5, 1e16, -0.0, 2.5, math.inf, -math.inf, math.nan, "1", "1.0", "true",
    "yes", "no", "on", "null", "~", "1e5", "1e-5", "0x1f", "017", "1_000", "1:20", ".inf", "",
    " padded ", "a: b", "- x", "#", "é", "line\nbreak", "\x85", "\u2028", [1, 2], [1.0, 2.0],
    ["1", "true"], [],
])
def test_argument_types_survive(arg):
    net = NetDef(ops=[netrun.op("T", x=arg)])
    text = netdef_to_yaml(net)
    again = netdef_from_yaml(text)
    assert canonical(again) == canonical(net), text
    assert netdef_to_yaml(again) == text


@pytest.mark.parametrize("literal, expected", [
    ("1e-5", 1e-5), ("1E3", 1000.0), ("-2e+2", -200.0), ("1.0e-5", 1e-5), (".inf", math.inf),
    ("5", 5), ("0x10", 16), ("true", 1), ("'1e-5'", "1e-5"), ("NCHW", "NCHW"),
    ("[1, 2.5]", [1, 2.5]),
])
def test_hand_written_values(literal, expected):
    got = netdef_from_yaml(f"ops: [{{type: T, args: {{x: {literal}}}}}]").ops[0].args["x"]
    assert got == expected and type(got) is type(expected)


def test_hand_written_conveniences():
    net = netdef_from_yaml("ops:\n- {type: Relu, inputs: x, outputs: y, device: null}\n")
    assert net.ops[0].inputs == ("x",) and net.ops[0].outputs == ("y",)
    assert net.ops[0].device is None


def test_shared_lists_are_not_written_as_aliases():
    conv = netrun.op("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    text = netdef_to_yaml(NetDef(ops=[conv, conv]))  # one op twice: its args list is shared
    assert "&" not in text and "*" not in text
    assert text.count("pads: [1, 1, 1, 1]") == 2


def test_yaml_and_text_format_agree():
    assert canonical(netdef_from_yaml(netdef_to_yaml(SAMPLE))) == \
        canonical(netdef_from_text(netdef_to_text(SAMPLE)))


@pytest.mark.parametrize("text, line, column, fragment", [
    ("name: n\nops: [{type: T\n", 3, 1, "expected ',' or '}'"),
    ("name: n\n  bad: indent\n", 2, 6, "mapping values are not allowed"),
    ("name: n\nopss: []\n", 2, 1, "unknown key 'opss' in NetDef, did you mean 'ops'?"),
    ("ops:\n- type: T\n  input: [x]\n", 3, 3, "did you mean 'inputs'?"),
    ("name: a\nname: b\n", 2, 1, "duplicate key 'name'"),
    ("ops:\n- {type: T, args: {a: 1, a: 2}}\n", 2, 26, "duplicate key 'a'"),
    ("ops:\n- {inputs: [x]}\n", 2, 3, "op has no 'type'"),
    ("ops:\n- {type: T, args: {a: null}}\n", 2, 23, "argument 'a' must be"),
    ("ops:\n- {type: T, args: {a: [1, {b: 2}]}}\n", 2, 27, "argument 'a' must be"),
    ("ops:\n- {type: T, args: [1]}\n", 2, 19, "args must be a mapping"),
    ("name: 5\n", 1, 7, "name must be a string"),
    ("ops:\n- {type: T, inputs: [x, 1]}\n", 2, 25, "must be a string"),
    ("ops: {type: T}\n", 1, 6, "'ops' must be a list"),
    ("- a\n", 1, 1, "NetDef must be a mapping"),
    ("ops:\n- {type: T, args: {1: 2}}\n", 2, 20, "keys of args must be strings"),
    ("ops: [{type: !!python/name:os.system T}]\n", 1, 14, "could not determine a constructor"),
    ('name: "a\x01"\n', 1, 9, "unacceptable character U+0001"),
])
def test_errors_have_line_and_column(text, line, column, fragment):
    with pytest.raises(ParseError) as info:
        netdef_from_yaml(text, "net.yaml")
    err = info.value
    assert (err.file, err.line, err.column) == ("net.yaml", line, column), str(err)
    assert fragment in str(err)
    assert err.source_line == text.split("\n")[line - 1]


def test_empty_file_is_an_error():
    with pytest.raises(ParseError, match="empty file"):
        netdef_from_yaml("# nothing here\n", "net.yaml")


# Round trips ------------------------------------------------------------------------------
NETS = netdefs(["yes", "null", "~", "1e5", "0x1f", "1:20", "'q'", '"q"', "a: b", "- x", "\x85",
                "\u2028", "\ufeff", " ", "*x", "&x", "!x", "%x", "@x", "`x", "{x}", "[x]", "|",
                ">", "?", "é😀"])


@settings(max_examples=25, deadline=None)
@given(NETS)
def test_round_trip_is_lossless_and_byte_identical(net):
    text = netdef_to_yaml(net)
    again = netdef_from_yaml(text)
    assert canonical(again) == canonical(net)
    assert netdef_to_yaml(again) == text
