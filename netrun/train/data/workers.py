"""Batches made by worker processes and handed over in shared memory.

Decoding JPEGs and augmenting them is Python-and-C work that holds the GIL for long stretches,
so a thread cannot hide it behind a training step; processes can. The parent knows every
batch's position in advance (positions depend only on batch size and dataset size), so it
hands batch k, at its position, to worker k mod W, and reads the batches back in order. A
batch is a function of (seed, position) alone, which is why the stream is the same bits for
any number of workers, and why the loader's position is still its whole state.

Each batch in flight owns one slot of a shared-memory ring: the worker writes the transformed
float32 data and the labels straight into it and sends only (batch number, slot) back; the
parent copies the slot out (a memcpy, a few MB at most) and the slot is free for the batch
`depth` later. Workers are spawned, not forked: the parent runs BLAS/OpenMP and oneDNN
threads, which a fork would copy in an unknown state.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import traceback
from collections import deque
from multiprocessing import shared_memory
from typing import Any, Callable

import numpy as np

from netrun import errors
from netrun.errors import DataError, NetrunError

Position = tuple[int, int]
# What a worker needs to make the batch at a position into given output arrays.
MakeBatch = Callable[[Position, list], Any]

# The batch number of a worker's failure to take the recipe (before any batch).
RECIPE = -1
# How long the parent waits for a result before it looks whether the workers still live.
_POLL_S = 0.5
_JOIN_S = 5.0


class SlotLayout:
    """Where each array of a batch lies in a slot: shapes, dtypes and byte offsets."""

    def __init__(self, specs: list[tuple[tuple[int, ...], np.dtype]]):
        self.specs, self.offsets = [(tuple(s), np.dtype(d)) for s, d in specs], []
        size = 0
        for shape, dtype in self.specs:
            size = -(-size // 64) * 64                     # cache-line aligned arrays
            self.offsets.append(size)
            size += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.slot_bytes = max(64, -(-size // 64) * 64)

    def views(self, buffer, slot: int) -> list[np.ndarray]:
        """The arrays of `slot` as views into `buffer`."""
        base = slot * self.slot_bytes
        return [np.ndarray(shape, dtype, buffer=buffer, offset=base + off)
                for (shape, dtype), off in zip(self.specs, self.offsets)]


def _receive(tasks, parent: int) -> Any:
    """The next message for this worker; None once the training process is gone."""
    while True:
        try:
            return tasks.get(timeout=_POLL_S)
        except queue.Empty:
            if os.getppid() != parent:      # the training process died (kill -9): go too
                return None


def _worker_main(shm_name: str, layout: SlotLayout, tasks, results, threads: int,
                 parent: int) -> None:
    """A worker: take the batch recipe, then make each (batch number, position, slot) task's
    batch in its slot."""
    # Spawned workers share the parent's resource tracker, which records the block once (a
    # set): the parent's unlink is the one that counts, so a worker that dies leaks nothing.
    shm = shared_memory.SharedMemory(name=shm_name)
    try:
        from threadpoolctl import threadpool_limits

        limits = threadpool_limits(threads)   # the training step owns the cores' BLAS threads
    except Exception:   # noqa: BLE001
        limits = None
    # Ctrl-C reaches the whole process group: the training process handles it (it finishes
    # the step and writes a checkpoint) and then stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # `parent` comes from the parent itself: one that died while this worker was still
    # starting would otherwise look like the parent (init) from the first look on.
    try:
        try:
            make_batch: MakeBatch | None = _receive(tasks, parent)
        except Exception as e:   # noqa: BLE001  (a recipe that does not unpickle here)
            results.put((RECIPE, _describe(e)))
            return
        while make_batch is not None:
            task = _receive(tasks, parent)
            if task is None:
                return
            number, pos, slot = task
            try:
                make_batch(pos, layout.views(shm.buf, slot))
                results.put((number, None))
            except BaseException as e:   # noqa: BLE001  (handed to the parent, never lost)
                results.put((number, _describe(e)))
                if not isinstance(e, Exception):
                    return
    finally:
        del limits
        shm.close()


def _describe(e: BaseException) -> tuple[str, str, str]:
    """An exception as (class name, message, traceback): picklable whatever its class."""
    return type(e).__name__, str(e), traceback.format_exc()


def _rebuild(kind: str, message: str, trace: str) -> BaseException:
    """The worker's error in the parent: a NetrunError keeps its kind (bad data is the user's
    to fix); anything else is a bug and carries the worker's traceback."""
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, NetrunError):
        try:
            return cls(message)
        except TypeError:
            return DataError(message)
    return RuntimeError(f"a data worker failed: {kind}: {message}\n--- worker traceback ---\n"
                        f"{trace}")


class WorkerPool:
    """W spawned processes making batches ahead of the consumer, `depth` in flight."""

    def __init__(self, make_batch: MakeBatch, layout: SlotLayout,
                 positions: Callable[[Position], Position], start: Position, workers: int,
                 depth: int, threads: int = 1):
        self.layout, self.depth, self.positions = layout, max(depth, workers), positions
        self._next_pos, self._submitted, self._consumed = start, 0, 0
        self._after: deque[Position] = deque()
        self._done: dict[int, Any] = {}
        ctx = mp.get_context("spawn")
        self.shm = shared_memory.SharedMemory(create=True,
                                              size=layout.slot_bytes * self.depth)
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(workers)]
        self.procs = []
        try:
            for k, tasks in enumerate(self.tasks):
                proc = ctx.Process(target=_worker_main, name=f"netrun-data-{k}", daemon=True,
                                   args=(self.shm.name, layout, tasks, self.results, threads,
                                         os.getpid()))
                proc.start()
                self.procs.append(proc)
                # The recipe (arrays included) goes through the queue, not the start-up pipe:
                # multiprocessing blocks forever writing a large start-up payload to a child
                # that died before reading it; a queue's writer is a thread that never blocks us.
                tasks.put(make_batch)
            for _ in range(self.depth):
                self._submit()
        except BaseException:
            self.close()
            raise

    def _submit(self) -> None:
        number = self._submitted
        self.tasks[number % len(self.tasks)].put((number, self._next_pos, number % self.depth))
        self._next_pos = self.positions(self._next_pos)
        self._after.append(self._next_pos)
        self._submitted += 1

    def get(self) -> tuple[tuple[np.ndarray, ...], Position]:
        """The next batch in order (copied out of its slot) and the position after it."""
        number = self._consumed
        while number not in self._done:
            try:
                got, error = self.results.get(timeout=_POLL_S)
            except queue.Empty:
                self._check_alive(number)
                continue
            if got == RECIPE:
                raise _rebuild(*error)
            self._done[got] = error
        error = self._done.pop(number)
        if error is not None:
            raise _rebuild(*error)
        batch = tuple(np.array(v) for v in self.layout.views(self.shm.buf, number % self.depth))
        self._consumed += 1
        after = self._after.popleft()
        self._submit()                      # its slot is free again: reuse it at once
        return batch, after

    def _check_alive(self, number: int) -> None:
        proc = self.procs[number % len(self.procs)]
        if not proc.is_alive():
            raise NetrunError(f"data worker {proc.name} stopped (exit code {proc.exitcode}) "
                              f"before handing over batch {number}; the training data could "
                              f"not be read (killed for memory?). Try data.workers: 0 to read "
                              f"in the training process and see the error. From a script of "
                              f"your own: workers are spawned and import your script, so its "
                              f"training code must be under `if __name__ == \"__main__\":`")

    def close(self) -> None:
        """Stop the workers and free the shared memory; safe to call twice."""
        for tasks, proc in zip(self.tasks, self.procs):
            if proc.is_alive():
                try:
                    tasks.put(None)
                except (OSError, ValueError):
                    pass
        for proc in self.procs:
            proc.join(_JOIN_S)
            if proc.is_alive():
                proc.terminate()
                proc.join(_JOIN_S)
        for q in (*self.tasks, self.results):
            q.close()
            q.cancel_join_thread()
        self.procs, self.tasks = [], []
        if self.shm is not None:
            self.shm.close()
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass
            self.shm = None
