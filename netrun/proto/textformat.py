"""Schema-less protobuf text format: a parser to a position-keeping Message tree, and a writer.

Used for Caffe2 NetDef `.pbtxt` and Caffe `.prototxt`/solver files. Without a schema the parser
cannot know a field's type, so a value keeps the type its literal spells: int, float, bool,
str (quoted), Enum (a bare identifier such as MAX) or a nested Message.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterator, NamedTuple

from netrun.errors import ParseError
from netrun.util.files import read_text

MAX_DEPTH = 200  # nested messages; deeper input is an error rather than a RecursionError
_MAX_SHOWN = 300  # longest source line an error message quotes (with a caret under it)


class Enum(str):
    """A bare identifier value (an enum constant such as MAX or CAFFE), unlike a quoted string."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Enum({str.__repr__(self)})"


class Position(NamedTuple):
    """A 1-based line and column in the source text."""

    line: int
    column: int


class Field(NamedTuple):
    """One field occurrence: its name, value, and where the name and the value start."""

    name: str
    value: Any
    position: Position | None = None
    value_position: Position | None = None


class Source:
    """The text a tree was parsed from (file name and lines), for error messages."""

    __slots__ = ("file", "lines")

    def __init__(self, text: str, file: str | None = None):
        self.file = file
        self.lines = text.split("\n")  # not splitlines(): only \n ends a line for us

    def error(self, message: str, position: Position | None = None) -> ParseError:
        """A ParseError at `position` with the source line for the caret."""
        if position is None:
            return ParseError(message, self.file)
        line = self.lines[position.line - 1] if 0 < position.line <= len(self.lines) else None
        if line is not None and len(line) > _MAX_SHOWN:
            line = None      # a huge line (a hostile or minified file) is not worth printing
        return ParseError(message, self.file, position.line, position.column, line)


def _same(a: Any, b: Any) -> bool:
    """Value equality that tells Enum from str and bool from int, and lets NaN equal NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


class Message:
    """Ordered fields (a name may repeat) with their source positions."""

    __slots__ = ("fields", "start", "source")

    def __init__(self, fields: list[Field] | None = None, start: Position | None = None,
                 source: Source | None = None):
        self.fields: list[Field] = list(fields or [])
        self.start = start  # where the opening brace is (None for the top level or built)
        self.source = source

    def add(self, name: str, value: Any) -> Message:
        """Append a field (for building messages to write); returns self for chaining."""
        self.fields.append(Field(name, value))
        return self

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return ((f.name, f.value) for f in self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return len(self.fields) == len(other.fields) and all(
            a.name == b.name and _same(a.value, b.value) for a, b in zip(self.fields, other.fields))

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"Message({list(self)!r})"

    def names(self) -> list[str]:
        """The distinct field names, in first-seen order."""
        return list(dict.fromkeys(f.name for f in self.fields))

    def has(self, name: str) -> bool:
        """Whether at least one field is called `name`."""
        return any(f.name == name for f in self.fields)

    def field(self, name: str) -> Field | None:
        """The last field called `name` (protobuf: the last value of a singular field wins)."""
        for f in reversed(self.fields):
            if f.name == name:
                return f
        return None

    def get(self, name: str, default: Any = None) -> Any:
        """The value of the last field called `name`, or `default`."""
        f = self.field(name)
        return default if f is None else f.value

    def get_all(self, name: str) -> list[Any]:
        """The values of every field called `name`, in order (a repeated field)."""
        return [f.value for f in self.fields if f.name == name]

    def position(self, name: str | None = None) -> Position | None:
        """Where the field get(name) returns starts; without a name, where this message does."""
        if name is None:
            return self.start
        f = self.field(name)
        if f is None:
            raise KeyError(name)
        return f.position

    def value_position(self, name: str) -> Position | None:
        """Where the value of the field that get(name) returns starts."""
        f = self.field(name)
        if f is None:
            raise KeyError(name)
        return f.value_position

    def error(self, message: str, at: Field | Position | str | None = None) -> ParseError:
        """A ParseError at a field (its name), a position, a field name, or this message."""
        if isinstance(at, str):
            at = self.field(at)
        if isinstance(at, Field):
            at = at.position
        source = self.source or Source("")
        return source.error(message, at if at is not None else self.start)


# Tokenizer --------------------------------------------------------------------------------
# One master regex; strings and numbers match in runs with possessive quantifiers, so a
# megabyte literal costs time and memory in proportion to its length (a per-character
# alternation keeps a backtracking frame per character). `number` is deliberately greedy (1.2.3, 12abc) so a malformed literal is one
# token that gets a clear "invalid number" rather than two tokens and a confusing error later.
_TOKEN = re.compile(r"""
  (?P<ws>[ \t\r\n\f\v]+)
| (?P<comment>\#[^\n]*)
| (?P<string>"[^"\\\n]*+(?:\\[^\n][^"\\\n]*+)*+"|'[^'\\\n]*+(?:\\[^\n][^'\\\n]*+)*+')
| (?P<number>\.?[0-9](?:[0-9A-Za-z_.]++|(?<=[eE])[+-])*+)
| (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
| (?P<symbol>[{}<>\[\]:;,\-])
| (?P<quote>["'])
| (?P<other>.)
""", re.VERBOSE | re.DOTALL)
_INT = re.compile(r"0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*")
_FLOAT = re.compile(r"(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?")
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{4})"
                     r"|U([0-9a-fA-F]{8})|([ntr\\\"'abfv?]))")
_SIMPLE_ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", '"': b'"', "'": b"'",
                   "a": b"\a", "b": b"\b", "f": b"\f", "v": b"\v", "?": b"?"}
_SPECIAL_IDENTS = {"true": True, "True": True, "false": False, "False": False}
_FLOAT_IDENTS = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}  # case-insensitive


class _Token(NamedTuple):
    kind: str  # ws/comment are dropped; quote/other become errors when the parser reaches them
    text: str
    pos: Position


def _tokenize(text: str) -> Iterator[_Token]:
    line, line_start = 1, 0
    for m in _TOKEN.finditer(text):
        kind, start = m.lastgroup, m.start()
        if kind == "ws":
            newlines = text.count("\n", start, m.end())
            if newlines:
                line += newlines
                line_start = text.rfind("\n", start, m.end()) + 1
        elif kind != "comment":
            yield _Token(kind, m.group(), Position(line, start - line_start + 1))
    yield _Token("eof", "", Position(line, len(text) - line_start + 1))


class _Tokens:
    """The tokens of a text, made as the parser reaches them and dropped once it has passed
    them: an error near the start of a huge file is found at once, and memory holds only a
    short window of tokens (the parser looks at most one token back and one ahead)."""

    _KEEP = 8

    def __init__(self, text: str):
        self._source = _tokenize(text)
        self._window: list[_Token] = []
        self._first = 0          # index of _window[0]

    def __getitem__(self, i: int) -> _Token:
        if i - self._first > 4 * self._KEEP:
            drop = i - self._first - self._KEEP
            del self._window[:drop]
            self._first += drop
        while i - self._first >= len(self._window):
            token = next(self._source, None)
            if token is None:        # past the end: the eof token again
                return self._window[-1]
            self._window.append(token)
        return self._window[i - self._first]


# Python refuses to turn longer decimal strings into ints (a guard against quadratic time);
# no protobuf integer field comes anywhere near it (int64 has 19 digits).
_MAX_DIGITS = 4300


def _number(text: str) -> int | float | None:
    """The value of a number literal, or None if it is malformed (or absurdly long)."""
    if len(text) > _MAX_DIGITS:
        return None
    if _INT.fullmatch(text):
        if text[:2] in ("0x", "0X"):
            return int(text, 16)
        return int(text, 8) if len(text) > 1 and text[0] == "0" else int(text)
    # all digits but not an int: a leading zero with 8 or 9, which protobuf rejects too
    if not text.isdigit() and _FLOAT.fullmatch(text):
        return float(text.rstrip("fF"))
    return None


def _describe(tok: _Token) -> str:
    if tok.kind == "eof":
        return "end of file"
    if tok.kind == "string":
        return f"string {tok.text}"
    return f"'{tok.text}'"


# Parser -----------------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str, file: str | None):
        self.source = Source(text, file)
        self.tokens = _Tokens(text)
        self.i = 0

    def error(self, message: str, pos: Position) -> ParseError:
        return self.source.error(message, pos)

    def lexical_error(self, tok: _Token) -> ParseError:
        if tok.kind == "quote":
            return self.error("unterminated string (missing closing quote on this line)", tok.pos)
        if tok.kind == "number":
            if len(tok.text) > _MAX_DIGITS:
                return self.error(f"invalid number '{tok.text[:20]}...': longer than "
                                  f"{_MAX_DIGITS} characters", tok.pos)
            return self.error(f"invalid number '{tok.text}'", tok.pos)
        return self.error(f"unexpected character {tok.text!r}", tok.pos)

    def fields(self, msg: Message, opener: _Token | None, name: str, depth: int) -> Message:
        """Parse fields into msg until EOF (top level) or the bracket that closes `opener`."""
        tokens = self.tokens
        close = None if opener is None else ("}" if opener.text == "{" else ">")
        while True:
            tok = tokens[self.i]
            if tok.kind == "ident":
                self.i += 1
                self.field(msg, tok, depth)
                sep = tokens[self.i]
                if sep.kind == "symbol" and sep.text in ";,":
                    self.i += 1
            elif tok.kind == "eof":
                if opener is not None:
                    raise self.error(f"'{opener.text}' of field '{name}' is never closed "
                                     f"(missing '{close}')", opener.pos)
                return msg
            elif tok.kind == "symbol" and tok.text in "}>":
                if close is None:
                    raise self.error(f"unexpected '{tok.text}': no open message to close", tok.pos)
                if tok.text != close:
                    raise self.error(f"expected '{close}' to close '{name} {opener.text}' opened "
                                     f"at line {opener.pos.line}, found '{tok.text}'", tok.pos)
                self.i += 1
                return msg
            elif tok.kind in ("quote", "other") or (tok.kind == "number"
                                                    and _number(tok.text) is None):
                raise self.lexical_error(tok)
            else:
                raise self.error(f"expected a field name, found {_describe(tok)}", tok.pos)

    def field(self, msg: Message, name_tok: _Token, depth: int) -> None:
        name = name_tok.text
        tok = self.tokens[self.i]
        colon = tok if tok.kind == "symbol" and tok.text == ":" else None
        if colon:
            self.i += 1
            tok = self.tokens[self.i]
        if tok.kind == "symbol" and tok.text in "{<":
            value = self.message(tok, name, depth)
            msg.fields.append(Field(name, value, name_tok.pos, tok.pos))
        elif tok.kind == "symbol" and tok.text == "[":
            self.list(msg, name_tok, tok, colon is not None, depth)
        elif colon is None:
            if tok.kind in ("number", "string", "ident") or tok.text == "-":
                raise self.error(f"missing ':' between field '{name}' and its value", tok.pos)
            raise self.error(f"expected ':' or '{{' after field name '{name}', found "
                             f"{_describe(tok)}", tok.pos)
        else:
            value = self.scalar(name, colon)
            msg.fields.append(Field(name, value, name_tok.pos, tok.pos))

    def message(self, opener: _Token, name: str, depth: int) -> Message:
        if depth >= MAX_DEPTH:
            raise self.error(f"messages nested more than {MAX_DEPTH} deep", opener.pos)
        self.i += 1
        return self.fields(Message([], opener.pos, self.source), opener, name, depth + 1)

    def list(self, msg: Message, name_tok: _Token, opener: _Token, colon: bool,
             depth: int) -> None:
        """`name: [v, v]` or `name [{..}, {..}]`: each element becomes one repeated field."""
        name = name_tok.text
        self.i += 1
        if self.tokens[self.i].text == "]" and self.tokens[self.i].kind == "symbol":
            self.i += 1
            return
        while True:
            tok = self.tokens[self.i]
            if tok.kind == "eof":
                raise self.unclosed_list(name, opener)
            if tok.kind == "symbol" and tok.text in "{<":
                value = self.message(tok, name, depth)
            elif not colon:
                raise self.error(f"missing ':' before the list of values of field '{name}'",
                                 opener.pos)
            else:
                value = self.scalar(name, None)
            msg.fields.append(Field(name, value, name_tok.pos, tok.pos))
            tok = self.tokens[self.i]
            self.i += 1
            if tok.kind == "symbol" and tok.text == "]":
                return
            if tok.kind == "eof":
                raise self.unclosed_list(name, opener)
            if not (tok.kind == "symbol" and tok.text == ","):
                raise self.error(f"unclosed list of field '{name}': expected ',' or ']', found "
                                 f"{_describe(tok)}", tok.pos)

    def unclosed_list(self, name: str, opener: _Token) -> ParseError:
        return self.error(f"unclosed list: '[' of field '{name}' is never closed", opener.pos)

    def scalar(self, name: str, colon: _Token | None) -> Any:
        """A scalar value; `colon` is set for a field value (None for a list element)."""
        tok = self.tokens[self.i]
        self.i += 1
        if tok.kind == "string":
            parts = [self.decode(tok)]
            while self.tokens[self.i].kind == "string":  # "a" "b" concatenates, as in C
                parts.append(self.decode(self.tokens[self.i]))
                self.i += 1
            return "".join(parts)
        if tok.kind == "number":
            value = _number(tok.text)
            if value is None:
                raise self.lexical_error(tok)
            return value
        if tok.kind == "ident":
            nxt = self.tokens[self.i]
            if colon is not None and nxt.kind == "symbol" and nxt.text in ":{<":
                # `a:` then `b: 1`: the identifier is the next field's name, not a's value
                raise self.missing_value(name, colon, tok)
            if tok.text in _SPECIAL_IDENTS:
                return _SPECIAL_IDENTS[tok.text]
            return _FLOAT_IDENTS.get(tok.text.lower(), Enum(tok.text))
        if tok.kind == "symbol" and tok.text == "-":
            num = self.tokens[self.i]
            self.i += 1
            if num.kind == "number" and _number(num.text) is not None:
                return -_number(num.text)
            if num.kind == "ident" and num.text.lower() in _FLOAT_IDENTS:
                return -_FLOAT_IDENTS[num.text.lower()]
            if num.kind == "number":
                raise self.lexical_error(num)
            raise self.error(f"expected a number after '-', found {_describe(num)}", num.pos)
        if tok.kind in ("quote", "other"):
            raise self.lexical_error(tok)
        if colon is None:
            raise self.error(f"expected a value in the list of field '{name}', found "
                             f"{_describe(tok)}", tok.pos)
        raise self.missing_value(name, colon, tok)

    def missing_value(self, name: str, colon: _Token, tok: _Token) -> ParseError:
        # point at the offending token when it is on the colon's line, else just past the colon
        pos = tok.pos if tok.pos.line == colon.pos.line and tok.kind != "eof" else \
            Position(colon.pos.line, colon.pos.column + 1)
        return self.error(f"missing value after ':' for field '{name}'", pos)

    def decode(self, tok: _Token) -> str:
        """The text of a string literal: C escapes give bytes, and the bytes are UTF-8."""
        body = tok.text[1:-1]
        if "\\" not in body:
            return body
        out, last = bytearray(), 0
        while (k := body.find("\\", last)) >= 0:
            out += body[last:k].encode("utf-8", "surrogateescape")
            m = _ESCAPE.match(body, k)
            where = Position(tok.pos.line, tok.pos.column + 1 + k)
            if m is None:
                raise self.error(f"invalid escape '{body[k:k + 2]}' in string", where)
            octal, hexa, u4, u8, simple = m.groups()
            if simple:
                out += _SIMPLE_ESCAPES[simple]
            elif octal or hexa:  # one byte
                code = int(octal, 8) if octal else int(hexa, 16)
                if code > 255:
                    raise self.error(f"invalid escape '{m.group()}': octal above \\377", where)
                out.append(code)
            else:  # a code point, written as its UTF-8 bytes
                code = int(u4 or u8, 16)
                if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                    raise self.error(f"invalid escape '{m.group()}': not a Unicode character",
                                     where)
                out += chr(code).encode("utf-8")
            last = m.end()
        out += body[last:].encode("utf-8", "surrogateescape")
        # bytes that are not UTF-8 survive as lone surrogates, so writing restores them
        return out.decode("utf-8", "surrogateescape")


def parse(text: str, file: str | None = None) -> Message:
    """Parse protobuf text format into a Message; syntax errors raise ParseError."""
    parser = _Parser(text, file)
    return parser.fields(Message([], None, parser.source), None, "", 0)


def parse_file(path) -> Message:
    """Read and parse a text-format file (NetrunError if it cannot be read)."""
    return parse(read_text(path), str(path))


# Writer -----------------------------------------------------------------------------------
_WRITE_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", '"': '\\"'}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def format_string(text: str) -> str:
    """A double-quoted literal that parses back to `text` (non-printables as octal UTF-8 bytes)."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = []
    for ch in text:
        if ch in _WRITE_ESCAPES:
            out.append(_WRITE_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            # three octal digits always, so a following digit is never read into the escape
            raw = ch.encode("utf-8", "surrogateescape")  # lone surrogates: undecodable bytes
            out.append("".join(f"\\{b:03o}" for b in raw))
    return '"' + "".join(out) + '"'


def format_float(value: float) -> str:
    """The shortest literal that reads back to exactly this float (repr; inf, -inf, nan)."""
    return repr(float(value))


def format_scalar(value: Any) -> str:
    """A scalar in canonical text form: bool, int, float, Enum (bare) or str (quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, Enum):
        if not _IDENT.fullmatch(value) or value in _SPECIAL_IDENTS \
                or value.lower() in _FLOAT_IDENTS:
            raise ValueError(f"{value!r} cannot be written as an enum identifier")
        return str(value)
    if isinstance(value, str):
        return format_string(value)
    raise TypeError(f"cannot write {value!r} as a text-format scalar")


def format_message(msg: Message, indent: int = 0, step: int = 2) -> str:
    """The canonical text of a Message: one field per line, nested messages indented."""
    out: list[str] = []
    _format_into(msg, out, " " * indent, " " * step)
    return "".join(out)


def _format_into(msg: Message, out: list[str], pad: str, step: str) -> None:
    for name, value in msg:
        if isinstance(value, Message):
            out.append(f"{pad}{name} {{\n")
            _format_into(value, out, pad + step, step)
            out.append(f"{pad}}}\n")
        else:
            out.append(f"{pad}{name}: {format_scalar(value)}\n")
