"""Typed errors for bad input; the CLI turns every NetrunError into exit status 2."""
from __future__ import annotations

import difflib
from typing import Iterable


class NetrunError(Exception):
    """Base of every error caused by user input (a file, a net, an argument)."""


class ParseError(NetrunError):
    """A syntax error in a model or net file, with file, line, column and a caret."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None,
                 column: int | None = None, source_line: str | None = None):
        self.message, self.file, self.line, self.column = message, file, line, column
        self.source_line = source_line
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.file is not None or self.line is not None:
            where = f"{self.file or '<string>'}"
            if self.line is not None:
                where += f":{self.line}"
                if self.column is not None:
                    where += f":{self.column}"
            where += ": "
        text = f"{where}{self.message}"
        if self.source_line is not None and self.column is not None:
            # Keep the source line's tabs under the caret so it lines up in tab-indented files.
            lead = "".join(c if c == "\t" else " " for c in self.source_line[: self.column - 1])
            text += f"\n    {self.source_line.rstrip()}\n    {lead}^"
        return text


class SchemaError(NetrunError):
    """An OperatorDef that its schema rejects (argument, input count, value)."""


class ShapeError(NetrunError):
    """Shapes that do not fit together; the message names the blobs and both shapes."""


class UnknownOpError(NetrunError):
    """An operator type no schema is registered for."""


class GradientError(NetrunError):
    """The backward pass cannot be built (missing gradient maker, overwritten input)."""


class CheckpointError(NetrunError):
    """A checkpoint file that is missing, truncated, corrupt or does not fit the net."""


class BackendError(NetrunError):
    """A device that cannot be used here (no CuPy, no GPU, bad device string)."""


class ConfigError(NetrunError):
    """A training or model config with a missing, unknown or ill-typed key."""


class DataError(NetrunError):
    """A dataset that cannot be read: a missing or damaged image, database or list file."""


class MemoryLimitError(NetrunError):
    """Tensors a net would allocate that do not fit the memory budget (netrun.core.budget)."""


class InternalError(RuntimeError):
    """A failure inside netrun's own code that no input explains: a bug to report, never the
    user's mistake (the CLI exits 1 with a request to report it, not 2)."""


def suggest(name: str, known: Iterable[str]) -> str:
    """Return ", did you mean 'x'?" for the closest known name, or an empty string."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if not match:
        lowered = {k.lower(): k for k in known}
        if name.lower() in lowered:
            match = [lowered[name.lower()]]
    return f", did you mean '{match[0]}'?" if match else ""
