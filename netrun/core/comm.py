"""Communicators: how the processes of one data-parallel job exchange arrays.

A workspace holds one (`Workspace.comm`); collective operators (netrun.ops.collective) reach
it through their context, so two jobs in one process would simply hold two. `SingleProcess`
is the job of one; `netrun.train.dist` makes the MPI one when a launcher started several.
Every call is collective: all ranks make the same calls in the same order.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Request(Protocol):
    """A started, non-blocking collective."""

    def wait(self) -> None:
        """Block until the collective is complete (its buffer is then final)."""

    def test(self) -> bool:
        """Let the collective progress (MPI moves it only inside MPI calls); True if done."""


class Communicator(Protocol):
    """What netrun needs from a distributed engine."""

    rank: int
    size: int

    def allreduce_sum(self, buf: np.ndarray) -> None:
        """Sum `buf` (contiguous) over all ranks, in place; the same bits on every rank."""

    def start_allreduce_sum(self, buf: np.ndarray) -> Request:
        """Begin summing `buf` in place; it must not be touched until the request's wait()."""

    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        """Overwrite `buf` on every rank with root's."""

    def broadcast_object(self, value: Any, root: int = 0) -> Any:
        """Root's small JSON-like value (a decision, a path) on every rank."""

    def barrier(self) -> None:
        """Wait until every rank got here."""

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (after an error on this one)."""


class _Done:
    """The request of a collective that was complete when it started."""

    def wait(self) -> None:
        """Nothing to wait for."""

    def test(self) -> bool:
        """Done."""
        return True


class SingleProcess:
    """The communicator of a job of one process: every collective is the identity."""

    rank, size = 0, 1

    def allreduce_sum(self, buf: np.ndarray) -> None:
        """Nothing to add."""

    def start_allreduce_sum(self, buf: np.ndarray) -> Request:
        """Complete at once."""
        return _Done()

    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        """Already root's."""

    def broadcast_object(self, value: Any, root: int = 0) -> Any:
        """Already root's."""
        return value

    def barrier(self) -> None:
        """No one to wait for."""

    def abort(self, code: int = 1) -> None:
        """Nothing else to end; the caller raises its error."""

    def __repr__(self) -> str:
        return "SingleProcess()"
