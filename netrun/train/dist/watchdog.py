"""A deadline on collectives: the bound on how long a rank waits for a peer that is gone.

MPICH's launcher ends a job when one of its processes exits, but a rank that hangs (a stuck
file system, a stopped process) or whose machine lost power exits nothing: its peers would
wait in their next collective forever (a vanished host keeps its TCP connections open, so
no error ever arrives). A daemon thread looks at the collective in progress; when one has
waited longer than the timeout it says so and ends this process without finishing MPI,
which the launcher takes as a failed rank and ends the others. Blocking MPI calls release
the GIL (mpi4py), so the thread runs while the main thread waits inside one.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping

from netrun.train.dist.errors import DistError

TIMEOUT_ENV = "NETRUN_DIST_TIMEOUT"
# Long enough for work that one rank does while the others wait in a collective (rank 0's
# tests and checkpoints); PyTorch's NCCL watchdog waits as long by default.
DEFAULT_TIMEOUT = 600.0
# As GNU timeout's: the job ended because something took longer than it may.
TIMEOUT_STATUS = 124


def timeout_from_env(environ: Mapping[str, str] | None = None) -> float | None:
    """NETRUN_DIST_TIMEOUT in seconds (default 600); None when it is 0 (wait forever)."""
    text = (os.environ if environ is None else environ).get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise DistError(f"{TIMEOUT_ENV}={text!r}: expected the seconds a collective may wait "
                        f"for the other ranks (a number; 0 waits forever)")
    return seconds or None


class Watchdog:
    """Ends this process when the armed wait has lasted longer than `timeout` seconds."""

    def __init__(self, timeout: float, rank: int, status: int = TIMEOUT_STATUS):
        self.timeout, self.rank, self.status = timeout, rank, status
        # Written by arm() in this order and read by the thread in the reverse one, so a
        # `what` it sees is never paired with an older `since`.
        self._since = 0.0
        self._what: str | None = None
        self._thread: threading.Thread | None = None
        self._poll = min(1.0, max(timeout / 10, 0.05))

    def arm(self, what: str) -> None:
        """A wait for the other ranks begins (`what`: 'allreduce', 'barrier', ...)."""
        self._since = time.monotonic()
        self._what = what
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="netrun-dist-watchdog",
                                            daemon=True)
            self._thread.start()

    def disarm(self) -> None:
        """The wait is over."""
        self._what = None

    def _watch(self) -> None:
        while True:
            time.sleep(self._poll)
            what = self._what
            waited = time.monotonic() - self._since
            if what is not None and waited > self.timeout:
                self._expire(what, waited)

    def _expire(self, what: str, waited: float) -> None:
        message = (f"\nerror: rank {self.rank}: {what} has waited {waited:.0f} s for the other "
                   f"ranks (limit {TIMEOUT_ENV}={self.timeout:g} s): a rank has hung or its "
                   f"machine is gone, so the whole job ends (exit status {self.status}). "
                   f"Checkpoints are written atomically: the newest one is complete, and "
                   f"--resume auto continues from it.\n")
        # Straight to the descriptor: the main thread may be inside a buffered write.
        try:
            os.write(2, message.encode("utf-8", "replace"))
        except OSError:
            pass
        # Not sys.exit: the main thread is blocked in MPI, and finishing MPI would wait for
        # the very peers that are gone. An exit without it is what the launcher acts on.
        os._exit(self.status)
