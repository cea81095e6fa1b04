"""The schema-less protobuf text-format parser and writer (netrun.proto.textformat)."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netrun.errors import NetrunError, ParseError
from netrun.proto.textformat import (Enum, Message, Position, format_message, format_scalar,
                                     format_string, parse, parse_file)

CAFFE_DIR = Path(os.environ.get("NETRUN_SHARED", Path(__file__).resolve().parents[1].parent
                                / "shared")) / "models" / "caffe"
CAFFE_FILES = sorted(CAFFE_DIR.rglob("*.prototxt")) if CAFFE_DIR.is_dir() else []


def value(literal: str):
    """The value of `x: <literal>`."""
    return parse(f"x: {literal}").get("x")


# Scalars ----------------------------------------------------------------------------------
@pytest.mark.parametrize("literal, expected", [
    ("0", 0), ("42", 42), ("-7", -7), ("- 7", -7), ("0x1F", 31), ("0X10", 16), ("-0x10", -16),
    ("017", 15), ("123456789012345678901234567890", 123456789012345678901234567890),
    ("true", True), ("false", False), ("True", True), ("False", False),
])
def test_int_and_bool_literals(literal, expected):
    got = value(literal)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("literal, expected", [
    ("1.5", 1.5), ("1e-4", 1e-4), ("1E+3", 1000.0), (".5", 0.5), ("5.", 5.0), ("-2.5", -2.5),
    ("1.0f", 1.0), ("2F", 2.0), ("1e5f", 1e5), ("0.1", 0.1), ("inf", math.inf),
    ("-inf", -math.inf), ("Infinity", math.inf), ("-Infinity", -math.inf), ("0.0", 0.0),
])
def test_float_literals(literal, expected):
    got = value(literal)
    assert type(got) is float and got == expected


def test_nan_and_negative_zero():
    assert math.isnan(value("nan")) and math.isnan(value("-nan")) and math.isnan(value("NaN"))
    assert math.copysign(1.0, value("-0.0")) == -1.0


def test_identifiers_are_enums_and_quoted_text_is_str():
    msg = parse('pool: MAX backend: "LMDB" phase: TEST')
    assert type(msg.get("pool")) is Enum and msg.get("pool") == "MAX"
    assert type(msg.get("backend")) is str and msg.get("backend") == "LMDB"
    assert repr(msg.get("phase")) == "Enum('TEST')"


@pytest.mark.parametrize("literal, expected", [
    (r'"a\nb\tc"', "a\nb\tc"), (r"'it\'s'", "it's"), (r'"q\"q"', 'q"q'),
    (r'"back\\slash"', "back\\slash"), (r'"\x41\x4a"', "AJ"), (r'"\101\60"', "A0"), (r'"\0"', "\0"),
    (r'"\a\b\f\v\r\?"', "\a\b\f\v\r?"), (r'"\303\251"', "é"), (r'"\xc3\xa9"', "é"),
    (r'"\u00e9\U0001F600"', "é😀"), ('"é 😀"', "é 😀"), ('"a" "b" \'c\'', "abc"),
    ('"a"\n  "b"', "ab"), ('""', ""), ('"#not a comment"', "#not a comment"),
])
def test_strings(literal, expected):
    got = value(literal)
    assert type(got) is str and got == expected


def test_bytes_that_are_not_utf8_survive_a_round_trip():
    text = value(r'"\377\001x"')
    assert parse("x: " + format_string(text)).get("x") == text
    assert format_string(text) == r'"\377\001x"'


# Structure --------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "m { a: 1 b: 2 }", "m: { a: 1 b: 2 }", "m < a: 1 b: 2 >", "m: <a:1;b:2>", "m{a:1,b:2}",
    "m {\n  a: 1;\n  b: 2;\n}", "# leading comment\nm { a: 1  # one\n b: 2 } # trailing",
])
def test_nested_message_syntaxes(text):
    msg = parse(text)
    assert msg == Message().add("m", Message().add("a", 1).add("b", 2))


def test_repeated_fields_and_lists():
    msg = parse("top: 'a' top: 'b' dim: [1, 2, 3] empty: [] layer [{n: 1}, <n: 2>] layer: [{n: 3}]")
    assert msg.get_all("top") == ["a", "b"]
    assert msg.get_all("dim") == [1, 2, 3]
    assert not msg.has("empty") and msg.get_all("empty") == []
    assert [m.get("n") for m in msg.get_all("layer")] == [1, 2, 3]
    assert msg.names() == ["top", "dim", "layer"]


def test_message_helpers():
    msg = parse("a: 1\nb { c: 'x' }\na: 2\n")
    assert list(msg) == [("a", 1), ("b", msg.get("b")), ("a", 2)]
    assert len(msg) == 3
    assert msg.get("a") == 2  # the last value of a singular field wins, as in protobuf
    assert msg.get("missing", "dflt") == "dflt" and msg.get("missing") is None
    assert msg.has("b") and not msg.has("c")
    assert msg.get("b").get("c") == "x"
    with pytest.raises(KeyError):
        msg.position("missing")


def test_positions_of_fields_and_values():
    msg = parse("name: 'n'\nlayer {\n\ttop: \"t\"  pool: MAX\n  p: [1,\n 2]\n}\n")
    assert msg.position("name") == Position(1, 1) and msg.value_position("name") == (1, 7)
    layer = msg.get("layer")
    assert msg.position("layer") == (2, 1) and layer.position() == (2, 7)
    assert layer.position("top") == (3, 2)  # a tab is one column
    assert layer.value_position("top") == (3, 7)
    assert layer.position("pool") == (3, 12) and layer.value_position("pool") == (3, 18)
    assert [f.value_position for f in layer.fields if f.name == "p"] == [(4, 7), (5, 2)]


def test_message_error_points_at_a_field():
    msg = parse("a: 1\n  bad_field: 2\n", "f.prototxt")
    err = msg.error("unknown field 'bad_field'", "bad_field")
    assert (err.file, err.line, err.column) == ("f.prototxt", 2, 3)
    assert "  bad_field: 2" in str(err)


# Errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, line, column, fragment", [
    ('a: 1\nb: "abc\nc: 2', 2, 4, "unterminated string"),
    ("a: 1\nb: 'it\\'s\n", 2, 4, "unterminated string"),
    ('a: 1\nb: "x\\qy"', 2, 6, "invalid escape '\\q'"),
    ('b: "\\xZZ"', 1, 5, "invalid escape"),
    ('b: "\\400"', 1, 5, "octal above"),
    ("a {\n  b: 1\n  c { d: 2 }\n", 1, 3, "never closed"),
    ("a <\n  b: 1\n}", 3, 1, "expected '>'"),
    ("a { b: 1 }\n}\n", 2, 1, "unexpected '}'"),
    ("a: 1\nb: }", 2, 4, "missing value after ':' for field 'b'"),
    ("a:\nb: 2", 1, 3, "missing value after ':' for field 'a'"),
    ("a: 1\nb:", 2, 3, "missing value after ':' for field 'b'"),
    ("a: 1\n  kernel_size 3\n", 2, 15, "missing ':' between field 'kernel_size'"),
    ('a "s"', 1, 3, "missing ':'"),
    ("a: 1\nb: 1.2.3", 2, 4, "invalid number '1.2.3'"),
    ("a: 12abc", 1, 4, "invalid number '12abc'"),
    ("a: 09", 1, 4, "invalid number '09'"),
    ("a: 1\n  b: 2 $", 2, 8, "unexpected character '$'"),
    ("a: 1 @b: 2", 1, 6, "unexpected character '@'"),
    ("a: [1, 2\nb: 3", 2, 1, "unclosed list"),
    ("x: 0\na: [1, 2", 2, 4, "unclosed list"),
    ("a: [1 2]", 1, 7, "expected ',' or ']'"),
    ("a: [1,]", 1, 7, "expected a value in the list"),
    ("a: -x", 1, 5, "expected a number after '-'"),
    ("a: 1\n: 2", 2, 1, "expected a field name"),
])
def test_syntax_errors_have_line_and_column(text, line, column, fragment):
    with pytest.raises(ParseError) as info:
        parse(text, "net.pbtxt")
    err = info.value
    assert (err.file, err.line, err.column) == ("net.pbtxt", line, column), str(err)
    assert fragment in err.message
    assert err.source_line == text.split("\n")[line - 1]


def test_error_text_shows_file_line_column_source_and_caret():
    with pytest.raises(ParseError) as info:
        parse("name: 'x'\nlayer { top: 1.2.3 }\n", "model.prototxt")
    lines = str(info.value).split("\n")
    assert lines[0] == "model.prototxt:2:14: invalid number '1.2.3'"
    assert lines[1].strip() == "layer { top: 1.2.3 }"
    assert lines[2].index("^") == lines[1].index("1.2.3")


def test_parse_file(tmp_path):
    path = tmp_path / "solver.prototxt"
    path.write_text("base_lr: 0.01\nlr_policy: 'inv'\nmax_iter: [\n")
    with pytest.raises(ParseError) as info:
        parse_file(path)
    assert (info.value.file, info.value.line, info.value.column) == (str(path), 3, 11)
    path.write_text("base_lr: 0.01\n")
    assert parse_file(path).get("base_lr") == 0.01
    with pytest.raises(NetrunError, match="cannot read"):
        parse_file(tmp_path / "missing.prototxt")


def test_deep_nesting_is_a_parse_error_not_a_crash():
    with pytest.raises(ParseError, match="nested more than"):
        parse("a { " * 1000 + "}" * 1000)


# Real Caffe files -------------------------------------------------------------------------
@pytest.mark.skipif(not CAFFE_FILES, reason=f"no Caffe prototxt files under {CAFFE_DIR}")
@pytest.mark.parametrize("path", CAFFE_FILES, ids=lambda p: p.name)
def test_every_caffe_prototxt_parses(path):
    msg = parse(path.read_text(), str(path))
    assert len(msg) > 0
    if "solver" in path.name:
        assert type(msg.get("base_lr")) is float and type(msg.get("max_iter")) is int
        assert type(msg.get("net", "")) is str
    else:
        layers = msg.get_all("layer")
        assert layers and all(type(layer.get("type")) is str for layer in layers)
        # and it writes back to an equal tree
        assert parse(format_message(msg)) == msg


@pytest.mark.skipif(not (CAFFE_DIR / "resnet50").is_dir(), reason=f"no ResNet-50 in {CAFFE_DIR}")
def test_resnet50_structure():
    msg = parse((CAFFE_DIR / "resnet50" / "ResNet-50-deploy.prototxt").read_text())
    assert msg.get_all("input_dim") == [1, 3, 224, 224]
    layers = msg.get_all("layer")
    pools = [layer.get("pooling_param") for layer in layers if layer.get("type") == "Pooling"]
    assert pools[0].get("pool") == Enum("MAX") and type(pools[0].get("pool")) is Enum
    assert sum(layer.get("type") == "Convolution" for layer in layers) == 53
    bn = next(layer for layer in layers if layer.get("type") == "BatchNorm")
    assert bn.get("batch_norm_param").get("use_global_stats") is True


# Writer -----------------------------------------------------------------------------------
@pytest.mark.parametrize("scalar, text", [
    (True, "true"), (False, "false"), (3, "3"), (-3, "-3"), (1.0, "1.0"), (1e-5, "1e-05"),
    (math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan"), (-0.0, "-0.0"),
    (Enum("MAX"), "MAX"), ("MAX", '"MAX"'), ('a"b\\c\n', r'"a\"b\\c\n"'), ("é\t", r'"é\t"'),
    ("\x00\u200b", r'"\000\342\200\213"'),
])
def test_format_scalar(scalar, text):
    assert format_scalar(scalar) == text


@pytest.mark.parametrize("bad", [Enum("nan"), Enum("true"), Enum("Inf"), Enum("a b"), Enum(""),
                                 None])
def test_format_scalar_refuses_what_would_read_back_differently(bad):
    with pytest.raises((ValueError, TypeError)):
        format_scalar(bad)


def test_format_message_layout():
    msg = Message().add("name", "n").add("layer", Message().add("top", "t").add(
        "p", Message().add("k", 3))).add("e", Enum("MAX"))
    assert format_message(msg) == ('name: "n"\nlayer {\n  top: "t"\n  p {\n    k: 3\n  }\n}\n'
                                   'e: MAX\n')


@settings(max_examples=25, deadline=None)
@given(st.text(st.characters(codec="utf-8")))
def test_any_string_round_trips(text):
    literal = format_string(text)
    assert "\n" not in literal
    assert value(literal) == text


_idents = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
_enums = _idents.filter(lambda s: s not in ("true", "True", "false", "False")
                        and s.lower() not in ("inf", "infinity", "nan")).map(Enum)
_scalars = st.one_of(st.integers(), st.floats(), st.booleans(),
                     st.text(st.characters(codec="utf-8")), _enums)
_messages = st.recursive(
    st.lists(st.tuples(_idents, _scalars), max_size=4),
    lambda children: st.lists(st.tuples(_idents, st.one_of(_scalars, children.map(
        lambda fields: _build(fields)))), max_size=4),
    max_leaves=12).map(lambda fields: _build(fields))


def _build(fields) -> Message:
    msg = Message()
    for name, val in fields:
        msg.add(name, val)
    return msg


@settings(max_examples=25, deadline=None)
@given(_messages)
def test_message_trees_round_trip(msg):
    text = format_message(msg)
    again = parse(text)
    assert again == msg
    assert format_message(again) == text
