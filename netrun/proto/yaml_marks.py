"""YAML that remembers where everything came from, so errors can point at file:line:column.

`load_yaml` builds `MarkedDict`/`MarkedList` containers: plain dict/list subclasses that also
carry the position of the container, of each key and of each value or item. Scalars stay
plain Python values; their positions live in the container that holds them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from netrun.errors import ParseError, suggest
from netrun.util import safe_yaml


@dataclass(frozen=True)
class Mark:
    """A 1-based position in a source file, with the text of its line for the caret."""

    file: str | None
    line: int
    column: int
    source_line: str | None = None

    def error(self, message: str) -> ParseError:
        """A ParseError at this position."""
        return ParseError(message, self.file, self.line, self.column, self.source_line)


class MarkedDict(dict):
    """A mapping from YAML; `mark` is where it starts, `key_marks`/`value_marks` per key."""

    mark: Mark | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key_marks: dict[Any, Mark] = {}
        self.value_marks: dict[Any, Mark] = {}


class MarkedList(list):
    """A sequence from YAML; `mark` is where it starts, `item_marks[i]` where item i is."""

    mark: Mark | None = None

    def __init__(self, *args):
        super().__init__(*args)
        self.item_marks: list[Mark] = []


class _MarkingLoader(safe_yaml.LimitedLoader):
    """The size-limited SafeLoader, building MarkedDict/MarkedList and refuses duplicate keys."""

    filename: str | None = None
    lines: list[str] = []

    def mark(self, m: yaml.Mark) -> Mark:
        line = self.lines[m.line] if m.line < len(self.lines) else None
        return Mark(self.filename, m.line + 1, m.column + 1, line)


def _construct_mapping(loader: _MarkingLoader, node: yaml.MappingNode) -> MarkedDict:
    loader.flatten_mapping(node)  # resolves YAML merge keys (<<)
    result = MarkedDict()
    result.mark = loader.mark(node.start_mark)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        key_mark = loader.mark(key_node.start_mark)
        try:
            duplicate = key in result
        except TypeError:
            raise key_mark.error("a mapping key must be a plain value, not a list or mapping")
        if duplicate:
            first = result.key_marks[key]
            raise key_mark.error(f"duplicate key '{key}' (first given at line {first.line})")
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_marks[key] = key_mark
        result.value_marks[key] = loader.mark(value_node.start_mark)
    return result


def _construct_sequence(loader: _MarkingLoader, node: yaml.SequenceNode) -> MarkedList:
    result = MarkedList()
    result.mark = loader.mark(node.start_mark)
    for child in node.value:
        result.append(loader.construct_object(child, deep=True))
        result.item_marks.append(loader.mark(child.start_mark))
    return result


# YAML 1.1 reads `1e-4` (no dot) as a string; model files write learning rates and epsilons
# that way, so resolve it as a float, as netrun.proto.netdef_yaml does.
_EXP_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_MarkingLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXP_FLOAT,
                                     list("-+0123456789"))
_MarkingLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_MarkingLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG,
                               _construct_sequence)


def load_yaml(text: str, filename: str | None = None) -> Any:
    """Parse one YAML document into marked containers, within netrun.util.safe_yaml's limits;
    every error is a ParseError with file:line:col."""
    loader, root = safe_yaml.compose(text, filename, _MarkingLoader)
    loader.filename = filename
    loader.lines = safe_yaml.source_lines(text)
    return safe_yaml.construct(loader, root, filename, text)


def load_yaml_file(path: str | Path) -> Any:
    """Read (UTF-8, size-checked) and parse a YAML file; errors are ParseErrors naming it."""
    return load_yaml(safe_yaml.read_text(path), str(path))


def mark_of(node: Any, key: Any = None, value: bool = False) -> Mark | None:
    """Position of a container, of one of its keys (or its value, with value=True) or items."""
    if key is not None:
        if isinstance(node, MarkedDict):
            marks = node.value_marks if value else node.key_marks
            if key in marks:
                return marks[key]
        elif isinstance(node, MarkedList) and isinstance(key, int) and key < len(node.item_marks):
            return node.item_marks[key]
    return getattr(node, "mark", None)


def error_at(node: Any, message: str, key: Any = None, value: bool = False,
             file: str | None = None) -> ParseError:
    """A ParseError at a node's position (or at one of its keys/values/items)."""
    m = mark_of(node, key, value)
    if m is None:
        return ParseError(message, file)
    return m.error(message)


def check_keys(mapping: Any, known: Iterable[str], what: str) -> None:
    """Raise a ParseError at the first key of `mapping` that is not in `known`, with a hint."""
    known = list(known)
    for key in mapping:
        if key not in known:
            raise error_at(mapping, f"unknown key '{key}' in {what}{suggest(str(key), known)} "
                                    f"(known keys: {', '.join(known)})", key)


def expect_type(node: Any, key: Any, types: type | tuple[type, ...], what: str) -> Any:
    """node[key] if it has one of `types`, else a ParseError at the value saying what is needed."""
    value = node[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        ok = False  # YAML `yes`/`true` is a bool, which Python would accept as an int
    else:
        ok = isinstance(value, types)
    if not ok:
        raise error_at(node, f"'{key}' must be {what}, got {value!r}", key, value=True)
    return value
