"""The one safe way netrun reads YAML: limits checked before anything big is built.

Every YAML reader (train configs, model files, NetDef YAML, --set values) goes through
`compose`, which turns every PyYAML failure into a ParseError with file:line:column and
refuses, before constructing any Python value:

- a file over MAX_FILE_BYTES, a line over MAX_SCALAR_CHARS, or bytes that are not UTF-8 (the error names offset and line);
- a scalar (string) longer than MAX_SCALAR_CHARS;
- nesting deeper than MAX_DEPTH (PyYAML's composer recurses: deep input would end in a
  RecursionError);
- a document that, with its aliases expanded, holds more than MAX_NODES nodes (a "billion
  laughs" alias bomb is a few hundred bytes that expand to gigabytes once something walks
  or serializes it).

The limits are far above what a config or model needs (the largest zoo file has a few
hundred nodes) and are module constants, not settings: a file that needs more is not a
config.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from netrun.errors import ParseError

MAX_FILE_BYTES = 4 * 1024 * 1024   # PyYAML parses about 0.5 MB/s: a bound on time too
MAX_SCALAR_CHARS = 1024 * 1024
MAX_DEPTH = 100
MAX_NODES = 1_000_000
MAX_INT_DIGITS = 4000
# The line breaks PyYAML counts (not str.splitlines's longer list), so marks index lines.
_BREAKS = re.compile("\r\n|[\n\r\x85\u2028\u2029]")


def source_lines(text: str) -> list[str]:
    """The text's lines as PyYAML numbers them (a trailing break gives a last empty line)."""
    return _BREAKS.split(text)


class LimitedLoader(yaml.SafeLoader):
    """SafeLoader whose composer counts nesting depth and scalar length as it goes."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Limit(f"nesting deeper than {MAX_DEPTH} levels", mark)
            if self.check_event(yaml.ScalarEvent):
                event = self.peek_event()
                if len(event.value) > MAX_SCALAR_CHARS:
                    raise _Limit(f"a value of {len(event.value):,} characters (the limit is "
                                 f"{MAX_SCALAR_CHARS:,})", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_int(loader: LimitedLoader, node: yaml.ScalarNode) -> int:
    # Python refuses to parse integers of over 4300 digits (a ValueError with no position).
    if len(node.value) > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {len(node.value):,} digits (the limit is "
            f"{MAX_INT_DIGITS})", node.start_mark)
    return yaml.SafeLoader.construct_yaml_int(loader, node)


LimitedLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
# YAML 1.1 (PyYAML) reads `1e-3` and `5e2` as strings: numbers without a dot, as YAML 1.2
# and every config writer mean them. Earlier resolvers still take what they matched before.
LimitedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


class _Limit(Exception):
    def __init__(self, message: str, mark: yaml.Mark | None):
        super().__init__(message)
        self.message, self.mark = message, mark


def expanded_size(root: yaml.Node, sizes: dict[int, int] | None = None) -> int:
    """Nodes in the document with every alias expanded (memoized: linear in the graph);
    `sizes` receives each node's count, by id."""
    sizes = {} if sizes is None else sizes
    # Iterative post-order walk: the graph may be deep (up to MAX_DEPTH) and shared.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if done or not children:
            total = 1 + sum(sizes.get(id(c), 0) for c in children)
            sizes[id(node)] = min(total, MAX_NODES + 1)   # cap: the counts stay small ints
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _culprit(node: yaml.Node, sizes: dict[int, int]) -> yaml.Node:
    """The smallest node that is over the limit on its own: where the bomb is."""
    while True:
        big = [c for c in _children(node) if sizes.get(id(c), 0) > MAX_NODES]
        if not big:
            return node
        node = big[0]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def compose(text: str, filename: str | None = None,
            loader_class: type[LimitedLoader] = LimitedLoader) -> tuple[LimitedLoader, Any]:
    """(loader, root node) of one YAML document, within the limits; the caller constructs
    values with the loader and must call `loader.dispose()`. Errors are ParseErrors."""
    lines = source_lines(text)
    if len(text) > MAX_FILE_BYTES:
        raise ParseError(f"the YAML text is {_human(len(text))}; the limit is "
                         f"{_human(MAX_FILE_BYTES)}", filename)
    # PyYAML scans in pure Python (about a second per megabyte): refuse an overlong line
    # before scanning it rather than after.
    longest = max(range(len(lines)), key=lambda i: len(lines[i]), default=None)
    if longest is not None and len(lines[longest]) > MAX_SCALAR_CHARS:
        raise _error(f"YAML too large: line {longest + 1} has {len(lines[longest]):,} "
                     f"characters (the limit is {MAX_SCALAR_CHARS:,})", filename, longest, 0,
                     lines)
    try:
        # Inside the try: the reader checks for control characters as it is built.
        loader = loader_class(text)
        root = loader.get_single_node()
    except _Limit as e:
        raise _at(f"YAML too large: {e.message}", e.mark, filename, lines) from None
    except yaml.reader.ReaderError as e:  # a control character YAML does not allow
        pos = e.position
        line, col = text.count("\n", 0, pos), pos - (text.rfind("\n", 0, pos) + 1)
        char = e.character if isinstance(e.character, int) else ord(str(e.character)[:1] or " ")
        raise _error(f"invalid YAML: unacceptable character U+{char:04X} ({e.reason})",
                     filename, line, col, lines) from None
    except yaml.MarkedYAMLError as e:
        raise _marked(e, filename, lines) from None
    except yaml.YAMLError as e:
        raise ParseError(f"invalid YAML: {e}", filename) from None
    except RecursionError:  # belt and braces: MAX_DEPTH should stop it first
        raise ParseError(f"invalid YAML: nesting too deep (limit {MAX_DEPTH})",
                         filename) from None
    sizes: dict[int, int] = {}
    if root is not None and expanded_size(root, sizes) > MAX_NODES:
        loader.dispose()
        raise _at(f"YAML too large: more than {MAX_NODES:,} values once its aliases (*name) "
                  f"are expanded", _culprit(root, sizes).start_mark, filename, lines)
    return loader, root


def construct(loader: LimitedLoader, root: Any, filename: str | None, text: str) -> Any:
    """Python values of a composed document; constructor errors become ParseErrors."""
    try:
        return None if root is None else loader.construct_document(root)
    except yaml.MarkedYAMLError as e:   # e.g. a !!python/object tag, which SafeLoader refuses
        raise _marked(e, filename, source_lines(text)) from None
    except yaml.YAMLError as e:
        raise ParseError(f"invalid YAML: {e}", filename) from None
    finally:
        loader.dispose()


def safe_load(text: str, filename: str | None = None,
              loader_class: type[LimitedLoader] = LimitedLoader) -> Any:
    """yaml.safe_load within the limits; every failure is a ParseError."""
    loader, root = compose(text, filename, loader_class)
    return construct(loader, root, filename, text)


def decode(data: bytes, filename: str | None = None) -> str:
    """UTF-8 bytes -> text (a BOM is dropped); other bytes are a ParseError naming the byte,
    its offset and its line."""
    bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        start = e.start + bom
        line = data.count(b"\n", 0, start)
        col = start - (data.rfind(b"\n", 0, start) + 1)
        raise ParseError(f"not UTF-8 text: byte 0x{data[start]:02x} at offset {start} "
                         f"({e.reason}); save the file as UTF-8", filename, line + 1,
                         col + 1) from None


def read_text(path: str | os.PathLike) -> str:
    """A YAML file's text: size-checked before reading, decoded as UTF-8; ParseError for
    a missing, unreadable, oversized or non-UTF-8 file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise ParseError(f"the file is {_human(size)}; a YAML file may be at most "
                                 f"{_human(MAX_FILE_BYTES)}", str(path))
            data = f.read(MAX_FILE_BYTES + 1)
    except IsADirectoryError:
        raise ParseError("cannot read file: it is a directory", str(path)) from None
    except FileNotFoundError:
        raise ParseError("cannot read file: no such file", str(path)) from None
    except OSError as e:
        raise ParseError(f"cannot read file: {e.strerror or e}", str(path)) from None
    if len(data) > MAX_FILE_BYTES:   # a pipe or a file that grew
        raise ParseError(f"the file is larger than {_human(MAX_FILE_BYTES)}", str(path))
    return decode(data, str(path))


def _marked(e: yaml.MarkedYAMLError, filename: str | None, lines: list[str]) -> ParseError:
    mark = e.problem_mark or e.context_mark
    problem = e.problem or e.context or "invalid YAML"
    if e.context and e.problem:
        problem = f"{e.problem} ({e.context})"
    return _at(f"invalid YAML: {problem}", mark, filename, lines)


def _at(message: str, mark: yaml.Mark | None, filename: str | None,
        lines: list[str]) -> ParseError:
    if mark is None:
        return ParseError(message, filename)
    return _error(message, filename, mark.line, mark.column, lines)


def _error(message: str, filename: str | None, line: int, col: int,
           lines: list[str]) -> ParseError:
    source = lines[line] if 0 <= line < len(lines) else None
    if source is not None and len(source) > 200:   # a huge line is no help under a caret
        source = None
    return ParseError(message, filename, line + 1, col + 1, source)


def _human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
