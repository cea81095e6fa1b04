"""TensorBoard scalars of a training run (`netrun train --tensorboard [DIR]`, `tensorboard:`).

Written through tensorboardX (the `tensorboard` extra), which writes TensorBoard's event
files without TensorFlow. Tags, each at the iteration it was measured after:

    train/loss, train/lr                 where metrics.jsonl logs them (display, iteration 1)
    train/examples_per_second            the examples of those steps over their time
    test/loss, test/<metric>             after every test (test/accuracy, ...)

Only the data-parallel job's rank 0 writes (the trainer asks it to, as for metrics.jsonl).
A resumed run goes on writing the same curves: its first event purges what a stopped run
had written after the checkpoint it resumes from, so the curves never show both.
"""
from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from netrun.errors import NetrunError

INSTALL_HINT = "pip install 'netrun[tensorboard]'"
FOLDER = "tensorboard"           # in the run folder, when no other is given
FLUSH_SECONDS = 10               # how stale a live TensorBoard may be at most


class TensorBoardMissing(NetrunError):
    """TensorBoard scalars were asked for, but tensorboardX is not installed."""


def require() -> ModuleType:
    """The tensorboardX module, or TensorBoardMissing saying how to install it."""
    try:
        import tensorboardX  # optional (the `tensorboard` extra): only when asked for
    except ImportError:
        raise TensorBoardMissing(f"TensorBoard scalars need the Python package tensorboardX; "
                                 f"install it with: {INSTALL_HINT}") from None
    return tensorboardX


class ScalarLog:
    """One run's TensorBoard event file; `close` flushes it."""

    def __init__(self, folder: str | Path, first_iteration: int = 0):
        tensorboardX = require()
        Path(folder).mkdir(parents=True, exist_ok=True)
        # purge_step: events an earlier run wrote past `first_iteration` belong to a run
        # that stopped without a checkpoint there; TensorBoard hides them.
        # The file is named by the second it was opened in and the host: a run resumed
        # within that second would overwrite it without a suffix of its own.
        self.writer = tensorboardX.SummaryWriter(
            logdir=str(folder), purge_step=first_iteration + 1, flush_secs=FLUSH_SECONDS,
            filename_suffix=f".iter{first_iteration}.{os.getpid()}")
        self.folder = Path(folder)
        self._examples, self._seconds = 0, 0.0

    def step(self, iteration: int, loss: float, lr: float, examples: int, seconds: float,
             write: bool) -> None:
        """Count one training step; write its scalars when `write` (a logged iteration)."""
        self._examples += examples
        self._seconds += seconds
        if not write:
            return
        self._scalar("train/loss", loss, iteration)
        self._scalar("train/lr", lr, iteration)
        if self._seconds > 0:
            self._scalar("train/examples_per_second", self._examples / self._seconds, iteration)
        self._examples, self._seconds = 0, 0.0

    def test(self, iteration: int, loss: float, metrics: dict[str, float]) -> None:
        """Write one test's loss and metrics."""
        self._scalar("test/loss", loss, iteration)
        for name, value in metrics.items():
            self._scalar(f"test/{name}", value, iteration)

    def _scalar(self, tag: str, value: float, iteration: int) -> None:
        self.writer.add_scalar(tag, float(value), iteration)

    def close(self) -> None:
        """Write what is pending and close the file."""
        self.writer.close()


__all__ = ["FOLDER", "INSTALL_HINT", "ScalarLog", "TensorBoardMissing", "require"]
