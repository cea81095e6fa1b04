"""The one console of the CLI: data on stdout, diagnostics on stderr, colour only when wanted.

Colour follows `--color/--no-color`, else NO_COLOR, else whether the stream is a terminal
(rich decides). Progress displays are for terminals only (`console.interactive`): the
spinner that names a silent wait (`console.waits()`, fed by netrun.util.progress) too.

Output is never a reason to stop: a closed pipe (`netrun train cfg | head -1`) or a vanished
terminal (SIGHUP) silences that stream for the rest of the process, and the command goes on
(training keeps writing its checkpoints, which are the record that matters).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
from typing import Any, Callable, Iterable, Iterator, NoReturn, Sequence

import click
from rich.console import Console as RichConsole
from rich.table import Table
from rich.text import Text

# Width for tables written to a pipe or file, where there is no terminal to measure.
PIPE_WIDTH = 200


class QuietOnClose:
    """sys.stdout or sys.stderr, looked up at each write; the first OSError (EPIPE from a
    closed pipe, EIO from a closed terminal, ...) silences it instead of raising."""

    def __init__(self, name: str):
        self.name, self.silenced = name, False

    def _stream(self):
        stream = getattr(sys, self.name)
        # rich's progress display stands in for sys.stdout/err with a proxy: write past it.
        return getattr(stream, "rich_proxied_file", stream)

    def write(self, text: str) -> int:
        if not self.silenced:
            try:
                return self._stream().write(text)
            except (OSError, ValueError):    # ValueError: the stream object was closed
                self.silence()
        return len(text)

    def flush(self) -> None:
        if not self.silenced:
            try:
                self._stream().flush()
            except (OSError, ValueError):
                self.silence()

    def silence(self) -> None:
        """Drop all further output to this stream, by anyone."""
        self.silenced = True
        stream = self._stream()
        # Point the descriptor at /dev/null, so that what is still buffered, later writes
        # by other code and the interpreter's flush at exit all succeed quietly (a failed
        # flush at exit would turn the exit status into 120).
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
        with contextlib.suppress(OSError, ValueError):
            stream.flush()

    def __getattr__(self, attr):             # isatty, fileno, encoding, ...
        return getattr(self._stream(), attr)


class Console:
    """Owns all CLI output. `configure` is called once per invocation by the group."""

    def __init__(self) -> None:
        self.configure()

    def configure(self, color: bool | None = None, verbosity: int = 0,
                  debug: bool = False) -> None:
        """Set colour (None: automatic), verbosity (-q < 0 < -v) and --debug."""
        self.verbosity, self.debug = verbosity, debug
        # The streams look up sys.stdout/sys.stderr at each write, so redirected streams
        # (CliRunner, pytest capture) are honoured.
        self.stdout, self.stderr = QuietOnClose("stdout"), QuietOnClose("stderr")
        common = {"highlight": False, "force_terminal": color,
                  "no_color": (not color) if color is not None else None}
        self.out = RichConsole(file=self.stdout, width=None if sys.stdout.isatty() else PIPE_WIDTH,
                               **common)
        self.err = RichConsole(file=self.stderr, stderr=True, **common)

    @property
    def interactive(self) -> bool:
        """Whether stderr is a terminal (spinners and progress bars are shown only then)."""
        return self.err.is_terminal

    # Data (stdout) ---------------------------------------------------------------------
    def text(self, text: str) -> None:
        """Plain text as is (no markup, no wrapping): net files, listings."""
        click.echo(text, nl=not text.endswith("\n"), file=self.stdout)

    def json(self, data: Any) -> None:
        """Machine-readable output for --json (strict JSON: NaN and infinities become null)."""
        click.echo(json_text(data), file=self.stdout)

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None,
              right: Sequence[str] = ()) -> None:
        """A table on stdout; `right` names the columns to right-align (numbers)."""
        table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        for c in columns:
            table.add_column(c, justify="right" if c in right else "left", overflow="fold")
        for row in rows:
            table.add_row(*(Text(str(v)) for v in row))
        self.out.print(table)

    def line(self, text: str = "", style: str | None = None) -> None:
        """One line of data on stdout (never markup: blob names may contain brackets)."""
        self.out.print(Text(text, style=style or ""))

    # Diagnostics (stderr) --------------------------------------------------------------
    def info(self, message: str) -> None:
        if self.verbosity >= 0:
            self.err.print(Text(message), soft_wrap=True)

    def detail(self, message: str) -> None:
        """Shown only with -v."""
        if self.verbosity > 0:
            self.err.print(Text(message, style="dim"), soft_wrap=True)

    def warn(self, message: str) -> None:
        self.err.print(Text.assemble(("warning: ", "bold yellow"), message), soft_wrap=True)

    def error(self, message: str) -> None:
        self.err.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)

    # Waits (stderr) --------------------------------------------------------------------
    @contextlib.contextmanager
    def waits(self, show: Callable[[str | None], None] | None = None) -> Iterator[None]:
        """Show the activities that lower layers announce (netrun.util.progress) inside the
        block: through `show(words)` / `show(None)` when given (a live progress bar's own
        line), else as a spinner on stderr; nothing when stderr is not a terminal or -q."""
        from netrun.util.progress import reporting

        if not self.interactive or self.verbosity < 0:
            with reporting(None):
                yield
            return
        waits = Waits(show or _Spinner(self.err).show)
        try:
            with reporting(waits):
                yield
        finally:
            waits.close()


class Waits:
    """A progress reporter (netrun.util.progress.Reporter) that shows the innermost
    activity's words once the outermost has lasted DELAY seconds, and clears them when the
    last one ends: a wait that ends sooner shows nothing (no flicker of cache loads)."""

    DELAY = 0.4

    def __init__(self, show: Callable[[str | None], None]):
        self._show_words, self._words = show, []
        self._shown, self._timer = False, None
        # begin/end come from the command's thread, the first show from the timer's.
        self._lock = threading.Lock()

    def begin(self, words: str) -> None:
        """An activity started (see netrun.util.progress.Reporter)."""
        with self._lock:
            self._words.append(words)
            if self._shown:
                self._show_words(words)
            elif self._timer is None:
                self._timer = threading.Timer(self.DELAY, self._show_now)
                self._timer.daemon = True
                self._timer.start()

    def end(self) -> None:
        """The innermost activity ended."""
        with self._lock:
            if self._words:
                self._words.pop()
            if self._words:
                if self._shown:
                    self._show_words(self._words[-1])
                return
            self._stop()

    def close(self) -> None:
        """Clear whatever is shown (the block that installed this reporter is over)."""
        with self._lock:
            self._words.clear()
            self._stop()

    def _show_now(self) -> None:
        with self._lock:
            self._timer = None
            if self._words and not self._shown:
                self._shown = True
                self._show_words(self._words[-1])

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._shown:
            self._shown = False
            self._show_words(None)


class _Spinner:
    """A rich spinner on stderr with the given words; show(None) removes it."""

    def __init__(self, err: RichConsole):
        self.err, self.status = err, None

    def show(self, words: str | None) -> None:
        if words is None:
            if self.status is not None:
                self.status.stop()
                self.status = None
        elif self.status is None:
            from rich.errors import LiveError

            status = self.err.status(_one_line(words))
            try:
                status.start()
            except LiveError:    # a progress bar owns the terminal: it says what happens
                return
            self.status = status
        else:
            self.status.update(_one_line(words))


def _one_line(words: str) -> Text:
    # A spinner line that wraps leaves its second line behind on some terminals.
    return Text(words, no_wrap=True, overflow="ellipsis")


def json_text(data: Any, indent: int | None = 2) -> str:
    """Strict JSON text: NaN and ±Infinity (which JSON lacks) are written as null."""
    return json.dumps(_finite(data), indent=indent, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


console = Console()


def abort(message: str, code: int = 2) -> NoReturn:
    """Report an expected failure on stderr and exit with `code` (2: bad input)."""
    console.error(message)
    raise click.exceptions.Exit(code)
