"""Stop requests for long commands: SIGINT, SIGTERM and SIGHUP, once politely, twice at once.

The first signal only sets a flag, which the training loop polls between steps: it finishes
the step, writes a checkpoint and exits with 128 + the signal's number. The handler never
raises, so no exception can land in the middle of a step or of a checkpoint write. A second
signal means "now": the handler writes one line saying exactly what is on disk (asked of
`describe`) straight to fd 2 and ends the process with os._exit. Files are safe at any such
moment because every checkpoint write is atomic (temp file, fsync, rename); a temp file left
behind is removed by the next run in that folder.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Callable

# SIGHUP: a closed terminal or SSH session. Not every platform has it.
SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP"))
                if s is not None)


def signal_name(signum: int) -> str:
    """'SIGINT' for 2, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopRequest:
    """Signal handlers from `install()` to `restore()`; `requested()` is polled between steps."""

    def __init__(self, describe: Callable[[str], str] = lambda name: ""):
        # describe(signal name) -> the sentence to print when a second signal stops at once.
        self.describe = describe
        self.received: list[int] = []
        self._previous: dict[int, object] = {}

    def install(self) -> StopRequest:
        """Handle the signals from now on (also SIGINT that a background job inherits ignored)."""
        self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def restore(self) -> None:
        """Put back the handlers that were there before `install`, unless a stop is under way."""
        # After a first signal the command is on its way out: a second one must still mean
        # "now, with 128 + N and a true sentence", not the default action (killed by the
        # signal, status -N), however late in the exit it lands.
        if self.received:
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if len(self.received) == 1:
            return
        try:
            message = self.describe(signal_name(signum))
        except Exception as e:  # noqa: BLE001 -- a failed report must not keep the process alive
            message = f"second signal ({signal_name(signum)}): stopped at once ({e})"
        # Straight to the descriptor: the handler may run while a buffered stream is in the
        # middle of a write, and stderr may be gone (closed terminal): then say nothing.
        try:
            # A progress bar may have hidden the terminal's cursor: show it again.
            show_cursor = "\x1b[?25h" if os.isatty(2) else ""
            os.write(2, (f"{show_cursor}\nwarning: {message}\n").encode("utf-8", "replace"))
        except OSError:
            pass
        os._exit(128 + signum)

    def requested(self) -> bool:
        """Whether a signal asked the run to stop."""
        return bool(self.received)

    @property
    def first(self) -> int | None:
        """The number of the first signal received, or None."""
        return self.received[0] if self.received else None
