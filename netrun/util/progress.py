"""Words for long waits: lower layers say what they are doing, the CLI decides how to show it.

Code that may keep a user waiting in silence (rendering a dataset, compiling kernels, a
download) wraps the wait in `with activity("rendering 60,000 train digits"):`. Nothing is
shown unless a caller above installed a reporter with `reporting(reporter)`: the CLI installs
a spinner when stderr is a terminal; tests and library users see nothing and pay nothing.

The reporter is held in a ContextVar rather than passed down as a parameter because the
waits sit many layers below the command (a Numba compile happens inside an operator that a
net builds): a ContextVar belongs to the code that set it, is reset on the way out, and is
not seen by other threads, so two commands in one process never share a reporter.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Protocol


class Reporter(Protocol):
    """What shows activities: `begin` when one starts (activities nest), `end` when the
    innermost one ends."""

    def begin(self, words: str) -> None:
        """An activity described by `words` has started."""

    def end(self) -> None:
        """The innermost activity has ended."""


_REPORTER: ContextVar[Reporter | None] = ContextVar("netrun_progress_reporter", default=None)


@contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Show the activities started inside the block through `reporter` (None: show none)."""
    token = _REPORTER.set(reporter)
    try:
        yield
    finally:
        _REPORTER.reset(token)


@contextmanager
def activity(words: str) -> Iterator[None]:
    """Tell the installed reporter, if any, that the block is a wait described by `words`."""
    reporter = _REPORTER.get()
    if reporter is None:
        yield
        return
    reporter.begin(words)
    try:
        yield
    finally:
        reporter.end()


__all__ = ["Reporter", "activity", "reporting"]
