"""Reading Caffe text-format messages with bookkeeping: typed reads, and every problem (an
unsupported layer, field or value) collected with its file:line:column, reported all at once.

`Fields` wraps a parsed Message and records which fields were read; whatever the translator
never read is a field netrun does not support, and is reported rather than silently ignored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from netrun.errors import ParseError
from netrun.proto.textformat import Enum, Field, Message, Position, Source

_KINDS = {bool: "bool", int: "int", float: "float", str: "str"}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a Caffe file, and where."""

    message: str
    position: Position | None = None


class Skip(Exception):
    """Raised inside a layer translation to give up on that layer after a problem."""

    def __init__(self, problem: Problem):
        super().__init__(problem.message)
        self.problem = problem


class Problems:
    """Problems of one file, in the order found, each listed once."""

    def __init__(self, source: Source | None):
        self.source = source
        self.items: list[Problem] = []

    def add(self, message: str, position: Position | None = None) -> None:
        """Record a problem (a duplicate of one already recorded is dropped)."""
        problem = Problem(message, position)
        if problem not in self.items:
            self.items.append(problem)

    def where(self, position: Position | None) -> str:
        """"file:line:column" of a position in this file."""
        file = (self.source.file if self.source else None) or "<string>"
        return f"{file}:{position.line}:{position.column}" if position else file

    def raise_if_any(self, what: str) -> None:
        """One ParseError listing every problem with file:line:column (the first one's
        position is kept on the error's file/line/column attributes)."""
        if not self.items:
            return
        if len(self.items) == 1:
            p = self.items[0]
            if self.source is not None:
                raise self.source.error(p.message, p.position)
            raise ParseError(p.message)
        lines = [f"  {self.where(p.position)}: {p.message}" for p in self.items]
        error = ParseError(f"{len(self.items)} problems in {what}:\n" + "\n".join(lines))
        first = self.items[0].position
        error.file = self.source.file if self.source else None
        error.line, error.column = (first.line, first.column) if first else (None, None)
        raise error


class Fields:
    """A message whose reads are recorded; `label` names it in messages ("layer 'conv1'")."""

    def __init__(self, msg: Message | None, label: str, position: Position | None = None):
        self.msg = msg if msg is not None else Message()
        self.label = label
        self.start = position or self.msg.start
        self.read: set[str] = set()
        self.children: list[Fields] = []
        self._subs: dict[str, list[Fields]] = {}   # the same children on every read

    # Reads ------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        """Whether the field is present (does not count as reading it)."""
        return self.msg.has(name)

    def field(self, name: str) -> Field | None:
        """The last field called `name` (None if absent), marked as read."""
        self.read.add(name)
        return self.msg.field(name)

    def position(self, name: str | None = None) -> Position | None:
        """Where field `name` starts (the message itself without a name, or when absent)."""
        f = self.msg.field(name) if name else None
        return f.position if f is not None else self.start

    def get(self, name: str, default: Any = None, kind: str | None = None) -> Any:
        """The last value of a singular field, checked against `kind` (default: the type of
        `default`): bool, int, float, str (quoted) or enum (a bare identifier)."""
        f = self.field(name)
        if f is None:
            return default
        return self._check(f, kind or _KINDS.get(type(default), "any"))

    def get_all(self, name: str, kind: str = "any") -> list[Any]:
        """Every value of a repeated field, each checked against `kind`."""
        self.read.add(name)
        return [self._check(f, kind) for f in self.msg.fields if f.name == name]

    def enum(self, name: str, default: str, allowed: Iterable[str]) -> str:
        """An enum field's value, which must be one of `allowed`."""
        f = self.field(name)
        if f is None:
            return default
        value = self._check(f, "enum")
        allowed = tuple(allowed)
        if value not in allowed:
            raise self.skip(f"{name}: {value} is not supported (supported: "
                            f"{', '.join(allowed)})", f.position)
        return str(value)

    def sub(self, name: str) -> Fields:
        """A nested message field (an empty one when absent), tracked as part of this one."""
        found = self.subs(name)
        if len(found) > 1:
            raise self.skip(f"'{name}' is given {len(found)} times", found[-1].start)
        return found[0] if found else Fields(None, self.label, self.start)

    def subs(self, name: str) -> list[Fields]:
        """Every occurrence of a repeated message field."""
        self.read.add(name)
        if name not in self._subs:
            out = []
            for f in self.msg.fields:
                if f.name != name:
                    continue
                if not isinstance(f.value, Message):
                    raise self.skip(f"'{name}' must be a message {{ ... }}", f.position)
                out.append(Fields(f.value, self.label, f.position))
            self.children += out
            self._subs[name] = out
        return self._subs[name]

    def ignore(self, *names: str) -> None:
        """Fields that are accepted and have no effect in netrun (engine, backend hints)."""
        self.read.update(names)

    def ignore_all(self) -> None:
        """Every field of this message, nested ones included, counts as read."""
        self.read.update(f.name for f in self.msg.fields)
        for child in self.children:
            child.ignore_all()

    # Problems ---------------------------------------------------------------------------
    def skip(self, message: str, position: Position | None = None) -> Skip:
        """A Skip for a problem with this message (raise it)."""
        return Skip(Problem(f"{self.label}: {message}", position or self.start))

    def unread(self, prefix: str = "") -> list[tuple[str, Field]]:
        """(dotted name, field) of every field nobody read, nested messages included."""
        out = [(prefix + f.name, f) for f in self.msg.fields if f.name not in self.read]
        for child in self.children:
            if child.msg.fields:
                out += child.unread(prefix)
        return out

    def _check(self, f: Field, kind: str) -> Any:
        value = f.value
        ok = {
            "any": True,
            "bool": isinstance(value, bool) or value in (0, 1) and isinstance(value, int),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "str": isinstance(value, str) and not isinstance(value, Enum),
            "enum": isinstance(value, Enum),
            "message": isinstance(value, Message),
        }[kind]
        if not ok:
            what = {"bool": "true or false", "int": "an integer", "float": "a number",
                    "str": "a quoted string", "enum": "an enum name (e.g. MAX)",
                    "message": "a message { ... }"}[kind]
            raise self.skip(f"'{f.name}' must be {what}, got {value!r}", f.value_position
                            or f.position)
        if kind == "bool":
            return bool(value)
        if kind == "float":
            return float(value)
        return value
