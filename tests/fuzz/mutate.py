"""Seeded mutations of a valid file: byte-level for every reader, token-level for text ones,
field-level for protobuf ones.

`mutate(seed, rng, text=..., proto=..., others=...)` applies one to four mutations drawn from
`rng`, so a case is reproduced exactly by its (target, case seed) pair. Results are capped
at MAX_SIZE: a reader must cope with hostile content, not with an unbounded test generator.
"""
from __future__ import annotations

import random
import re
import struct
from typing import Callable

MAX_SIZE = 4 << 20

# Values that sit on the edges of integer and float types, as raw bytes of every width.
_EDGE_INTS = (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000,
              0xFFFFFFFF, 0x7FFFFFFFFFFFFFFF, 0x8000000000000000, 0xFFFFFFFFFFFFFFFF)
_EDGE_FLOATS = (float("nan"), float("inf"), float("-inf"), 1e38, -1e308, 5e-324, -0.0)
# Replacements for a number in a text file.
_NUMBERS = ("0", "-1", "-0", "1.5", "-2.5", "1e29", "1e308", "-1e308", "1e-400", "1e400",
            "nan", "NaN", "inf", "-inf", ".inf", "-.inf", "2147483648", "4294967296",
            "9223372036854775808", "18446744073709551617", "0x7fffffff", "0xffffffffffffffff",
            "99999999999999999999999999999999", "1" * 5000, "0" * 300 + "1", "1e", "--1",
            "1.2.3", "true", "null", "~", "[]", "{}", '""')
# Snippets that stress a text parser: nesting, aliases, tags, control and non-UTF-8 bytes.
_TEXT_SNIPPETS = (b"\x00", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\x1b[31m", b"\x7f",
                  b"\r", b"\t", b"\\", b'"', b"'", b"#", b":", b": ", b"- ", b"{", b"}", b"[",
                  b"]", b"<", b">", b",", b";", b"&a ", b"*a", b"<<: *a\n", b"!!python/object ",
                  b"!!binary ", b"? ", b"---\n", b"...\n", b"%YAML 1.1\n", b"|\n", b">-\n",
                  b"\\x", b"\\u12", b"\\777", b"\xe2\x80\xa8", b"\xef\xbb\xbf")
_TOKEN = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(rb"(?<![A-Za-z_0-9.])-?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")


def mutate(seed: bytes, rng: random.Random, *, text: bool = False, proto: bool = False,
           others: list[bytes] = ()) -> bytes:
    """One to four random mutations of `seed` (text mutations too when `text`, protobuf
    field mutations when `proto`)."""
    ops = BYTE_OPS + (TEXT_OPS if text else ()) + (PROTO_OPS if proto else ())
    data = bytearray(seed)
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        op = rng.choice(ops)
        data = bytearray(op(bytes(data), rng, list(others) or [seed]))[:MAX_SIZE]
    return bytes(data)


def _pos(data: bytes, rng: random.Random) -> int:
    return rng.randrange(len(data) + 1)


def _span(data: bytes, rng: random.Random, most: int = 256) -> tuple[int, int]:
    start = _pos(data, rng)
    return start, min(len(data), start + rng.randint(1, most))


# Byte-level ---------------------------------------------------------------------------------
def flip_bits(data: bytes, rng: random.Random, others) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def replace_byte(data: bytes, rng: random.Random, others) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    i = rng.randrange(len(out))
    out[i] = rng.choice((0x00, 0xFF, 0x7F, 0x80, 0x01, rng.randrange(256)))
    return bytes(out)


def edge_value(data: bytes, rng: random.Random, others) -> bytes:
    """Overwrite (or insert) an edge integer or float of a random width and byte order."""
    order = rng.choice("<>")
    if rng.random() < 0.3:
        value = rng.choice(_EDGE_FLOATS)
        wide = abs(value) > 3e38 and value != float("inf") and value != float("-inf")
        raw = struct.pack(order + ("d" if wide else rng.choice("fd")), value)
    else:
        width = rng.choice((1, 2, 4, 8))
        raw = (rng.choice(_EDGE_INTS) & ((1 << 8 * width) - 1)).to_bytes(
            width, "little" if order == "<" else "big")
    i = _pos(data, rng)
    end = i if rng.random() < 0.3 else i + len(raw)
    return data[:i] + raw + data[end:]


def huge_varint(data: bytes, rng: random.Random, others) -> bytes:
    """A protobuf varint that never ends, or that encodes 2**64 - 1 or more."""
    raw = rng.choice((b"\xff" * 10 + b"\x01", b"\xff" * 9 + b"\x01", b"\x80" * 20,
                      b"\xff\xff\xff\xff\x0f", b"\xff" * 64))
    i = _pos(data, rng)
    return data[:i] + raw + data[i + (rng.randint(0, len(raw)) if rng.random() < 0.5 else 0):]


def insert_random(data: bytes, rng: random.Random, others) -> bytes:
    i = _pos(data, rng)
    return data[:i] + rng.randbytes(rng.randint(1, 64)) + data[i:]


def delete_span(data: bytes, rng: random.Random, others) -> bytes:
    start, end = _span(data, rng)
    return data[:start] + data[end:]


def truncate(data: bytes, rng: random.Random, others) -> bytes:
    return data[:_pos(data, rng)]


def splice(data: bytes, rng: random.Random, others) -> bytes:
    """A chunk of another seed of the same reader, inserted or overwriting."""
    donor = rng.choice(others)
    start, end = _span(donor, rng, 4096)
    i = _pos(data, rng)
    cut = i if rng.random() < 0.5 else i + (end - start)
    return data[:i] + donor[start:end] + data[cut:]


def repeat_chunk(data: bytes, rng: random.Random, others) -> bytes:
    start, end = _span(data, rng, 64)
    return data[:end] + data[start:end] * rng.choice((2, 3, 16, 1000)) + data[end:]


BYTE_OPS: tuple[Callable, ...] = (flip_bits, replace_byte, edge_value, huge_varint,
                                  insert_random, delete_span, truncate, splice, repeat_chunk)


# Text-level ---------------------------------------------------------------------------------
def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def replace_number(data: bytes, rng: random.Random, others) -> bytes:
    found = list(_NUMBER.finditer(data))
    if not found:
        return insert_snippet(data, rng, others)
    m = rng.choice(found)
    return data[:m.start()] + rng.choice(_NUMBERS).encode() + data[m.end():]


def duplicate_line(data: bytes, rng: random.Random, others) -> bytes:
    lines = _lines(data)
    i = rng.randrange(len(lines))
    lines[i:i] = [lines[i]] * rng.choice((1, 1, 2, 50))
    return b"\n".join(lines)


def delete_line(data: bytes, rng: random.Random, others) -> bytes:
    lines = _lines(data)
    del lines[rng.randrange(len(lines))]
    return b"\n".join(lines)


def swap_lines(data: bytes, rng: random.Random, others) -> bytes:
    lines = _lines(data)
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return b"\n".join(lines)


def reindent(data: bytes, rng: random.Random, others) -> bytes:
    lines = _lines(data)
    i = rng.randrange(len(lines))
    lines[i] = rng.choice((b"", b" ", b"    ", b"\t")) + lines[i].lstrip()
    return b"\n".join(lines)


def swap_token(data: bytes, rng: random.Random, others) -> bytes:
    """An identifier replaced by another one of this or another seed (a key, a type, a name)."""
    here = list(_TOKEN.finditer(data))
    pool = [m.group() for m in _TOKEN.finditer(rng.choice(others))] or [b"x"]
    if not here:
        return data
    m = rng.choice(here)
    return data[:m.start()] + rng.choice(pool) + data[m.end():]


def deep_nesting(data: bytes, rng: random.Random, others) -> bytes:
    depth = rng.choice((100, 1000, 20000))
    opener, closer = rng.choice(((b"[", b"]"), (b"{", b"}"), (b"a {", b"}"), (b"- ", b""),
                                 (b"{a: ", b"}"), (b"a <", b">")))
    nest = opener * depth + (closer * depth if rng.random() < 0.7 else b"")
    if opener == b"- ":   # a block sequence nests by indentation
        nest = b"".join(b"  " * k + b"-\n" for k in range(min(depth, 2000)))
    i = _pos(data, rng)
    return data[:i] + nest + data[i:]


def alias_bomb(data: bytes, rng: random.Random, others) -> bytes:
    """A billion-laughs YAML block: each level refers to the one above ten times."""
    levels = rng.choice((3, 9))
    bomb = [b"a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for k in range(1, levels):
        refs = b", ".join([b"*a%d" % (k - 1)] * 10)
        bomb.append(b"a%d: &a%d [%s]" % (k, k, refs))
    return b"\n".join(bomb) + b"\n" + data


def long_string(data: bytes, rng: random.Random, others) -> bytes:
    size = rng.choice((1000, 1000, 100_000, 100_000, 100_000, 3_000_000))
    i = _pos(data, rng)
    quote = rng.choice((b'"', b"'", b""))
    return data[:i] + quote + b"A" * size + quote + data[i:]


def insert_snippet(data: bytes, rng: random.Random, others) -> bytes:
    i = _pos(data, rng)
    return data[:i] + rng.choice(_TEXT_SNIPPETS) + data[i:]


TEXT_OPS: tuple[Callable, ...] = (replace_number, replace_number, replace_number,
                                  duplicate_line, delete_line, swap_lines, reindent, swap_token,
                                  swap_token, deep_nesting, alias_bomb, long_string,
                                  insert_snippet, insert_snippet)


# Protobuf-level -----------------------------------------------------------------------------
# Byte mutations mostly break a protobuf's framing (a length, a key), so the reader stops at
# the wire layer. These keep the framing valid and change what the fields say: a field of a
# random number, wire type and value put into a random (sub)message of the seed, a field
# dropped, doubled, renumbered or given another wire type, with every enclosing length fixed
# up; or a whole message of random fields. Written here, not with netrun's wire code, so the
# inputs do not share the reader's assumptions.
_PROTO_LIMIT = 1 << 16          # bytes: larger inputs get a top-level field only (parse cost)
_PROTO_DEPTH = 4                # NetDef > op > arg/device_option > a message inside
_TEXTS = (b"", b"x", b"conv1", b"caffe2", b"aten", b"NCHW", "é😀".encode(), b"\xff\xfe",
          b"\xc3", b"\xed\xa0\x80", b"\x00", b"a" * 300)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1               # negatives as 64-bit two's complement, as protobuf
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("not a varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def _parse(data: bytes, depth: int = 0) -> list[list] | None:
    """[number, wire, value] per field (value: an int, bytes, or the fields of a payload that
    parses as a message), or None if `data` is not a message."""
    fields, pos = [], 0
    try:
        while pos < len(data):
            key, pos = _read_varint(data, pos)
            number, wire = key >> 3, key & 7
            if number == 0 or wire not in (0, 1, 2, 5):
                return None
            if wire == 0:
                value, pos = _read_varint(data, pos)
            else:
                size = {1: 8, 5: 4}.get(wire)
                if size is None:
                    size, pos = _read_varint(data, pos)
                if pos + size > len(data):
                    return None
                value, pos = data[pos:pos + size], pos + size
                if wire == 2 and value and depth < _PROTO_DEPTH:
                    # a payload is taken as a message only if it writes back the same (a
                    # string or packed numbers can look like one)
                    inner = _parse(value, depth + 1)
                    if inner and _serialize(inner) == value:
                        value = inner
            fields.append([number, wire, value])
    except ValueError:
        return None
    return fields


def _serialize(fields: list[list]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        if wire == 0:
            out += _varint(value)
            continue
        payload = _serialize(value) if isinstance(value, list) else value
        out += (_varint(len(payload)) if wire == 2 else b"") + payload
    return bytes(out)


def _messages(fields: list[list]) -> list[list[list]]:
    """This message and every message inside it."""
    found = [fields]
    for _, _, value in fields:
        if isinstance(value, list):
            found += _messages(value)
    return found


def _random_field(rng: random.Random, depth: int = 0) -> list:
    number = rng.choice((*range(1, 13), *range(1, 13), 13, 99, (1 << 29) - 1))
    wire = rng.choice((0, 0, 1, 2, 2, 2, 5))
    if wire == 0:
        return [number, 0, rng.choice((*_EDGE_INTS, 2, 3, -1, -(1 << 63), rng.getrandbits(64)))]
    if wire in (1, 5):
        fmt = "<d" if wire == 1 else "<f"
        raw = struct.pack(fmt, rng.choice((0.5, -2.0, *_EDGE_FLOATS[:3], *_EDGE_FLOATS[-2:])))
        return [number, wire, raw if rng.random() < 0.7 else rng.randbytes(len(raw))]
    kind = rng.randrange(5)
    if kind == 0 and depth < _PROTO_DEPTH:                    # a nested message
        return [number, 2, [_random_field(rng, depth + 1) for _ in range(rng.randint(0, 4))]]
    if kind == 1:                                            # packed floats, maybe ragged
        return [number, 2, rng.randbytes(4 * rng.randint(0, 8) + rng.choice((0, 0, 0, 1, 3)))]
    if kind == 2:                                            # packed varints
        return [number, 2, b"".join(_varint(rng.choice(_EDGE_INTS))
                                    for _ in range(rng.randint(0, 6)))]
    return [number, 2, rng.choice(_TEXTS) if kind == 3 else rng.randbytes(rng.randint(0, 32))]


def proto_edit(data: bytes, rng: random.Random, others) -> bytes:
    """One field of a random message in `data` added, dropped, doubled, renumbered, re-typed
    or given another value; lengths around it stay right."""
    fields = _parse(data) if len(data) <= _PROTO_LIMIT else None
    if fields is None:   # not a message (an earlier mutation broke it): add a field at the end
        return data + _serialize([_random_field(rng)])
    target = rng.choice(_messages(fields))
    how = rng.randrange(6) if target else 0
    if how == 0:
        target.insert(rng.randint(0, len(target)), _random_field(rng))
    elif how == 1:
        del target[rng.randrange(len(target))]
    elif how == 2:
        i = rng.randrange(len(target))
        target.insert(i, list(target[i]))
    elif how == 3:
        field = target[rng.randrange(len(target))]
        field[0] = rng.choice((*range(1, 13), 13, 99))
    elif how == 4:
        field = target[rng.randrange(len(target))]
        field[1:] = _random_field(rng)[1:]
    else:
        field = target[rng.randrange(len(target))]
        if field[1] == 0:
            field[2] = rng.choice((*_EDGE_INTS, -1, rng.getrandbits(64)))
        else:
            raw = field[2] if isinstance(field[2], bytes) else _serialize(field[2])
            field[2] = rng.choice(BYTE_OPS)(raw, rng, [raw])[:_PROTO_LIMIT]
            if field[1] != 2:                   # a fixed-size value keeps its size
                field[2] = (field[2] + bytes(8))[:8 if field[1] == 1 else 4]
    return _serialize(fields)


def random_message(data: bytes, rng: random.Random, others) -> bytes:
    """A message of random fields in place of the seed."""
    return _serialize([_random_field(rng) for _ in range(rng.randint(0, 8))])


def random_bytes(data: bytes, rng: random.Random, others) -> bytes:
    """Random bytes in place of the seed."""
    return rng.randbytes(rng.choice((0, 1, 2, 5, 16, 64, 512)))


# Weighted so that about half the cases keep a readable framing (byte mutations rarely do).
PROTO_OPS: tuple[Callable, ...] = (proto_edit,) * 10 + (random_message, random_bytes)
