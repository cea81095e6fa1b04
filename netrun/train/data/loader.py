"""Batches for training and testing: deterministic order, background prefetch, resumable.

The loader is an endless stream of examples, as Caffe's data layers are: epoch `e` visits
the examples in the order `permutation(seed, e)` (or in file order without shuffling), and
a batch that runs past the end of an epoch continues into the next one. Everything about a
batch, including its random crops and flips, is a function of (seed, epoch, index), so the
position `(epoch, index)` is the whole state: a run resumed from `state()` sees exactly the
batches an uninterrupted run would have seen.
"""
from __future__ import annotations

import queue
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from netrun.errors import NetrunError
from netrun.train.data.transforms import Transform
from netrun.train.data.workers import SlotLayout, WorkerPool

Position = tuple[int, int]                 # (epoch, index of the next example in that epoch)
Batch = tuple[np.ndarray, ...]


class _Sampler:
    """Builds the batch at a position; holds no reference to the loader (see BatchLoader)."""

    def __init__(self, arrays: Sequence[Any], batch_size: int, shuffle: bool, seed: int,
                 transform: Transform | None, drop_last: bool, train: bool, ring: int,
                 shard: tuple[int, int] = (0, 1)):
        # batch_size is the whole (global) batch; this process makes its `shard` of it.
        self.arrays, self.global_batch, self.shuffle, self.seed = arrays, batch_size, shuffle, seed
        self.rank, self.ranks = shard
        self.batch_size = batch_size // self.ranks
        self.transform, self.drop_last, self.train = transform, drop_last, train
        self.size = len(arrays[0])
        self._orders: dict[int, np.ndarray] = {}
        self._ring, self._slot, self._buffers = ring, 0, {}

    def order(self, epoch: int) -> np.ndarray:
        """The example order of `epoch` (a permutation seeded by (seed, epoch))."""
        if epoch not in self._orders:
            if len(self._orders) > 2:                # keep the current and the next epoch
                self._orders.pop(min(self._orders))
            self._orders[epoch] = (np.random.default_rng([self.seed, epoch]).permutation(self.size)
                                   if self.shuffle else np.arange(self.size))
        return self._orders[epoch]

    def indices(self, pos: Position) -> tuple[np.ndarray, Position]:
        """Example indices of the batch at `pos` and the position after it."""
        epoch, index = pos
        if self.drop_last and index + self.global_batch > self.size:
            epoch, index = epoch + 1, 0               # skip the epoch's incomplete tail
        parts, need = [], self.global_batch
        while need:
            take = min(need, self.size - index)
            parts.append(self.order(epoch)[index:index + take])
            need -= take
            index += take
            if index == self.size:                    # Caffe: wrap into the next epoch
                epoch, index = epoch + 1, 0
        return np.concatenate(parts) if len(parts) > 1 else parts[0], (epoch, index)

    def __getstate__(self) -> dict:
        # Worker processes get the recipe, not this process's caches and buffers.
        state = dict(self.__dict__)
        state.update(_orders={}, _buffers={}, _ring=0, _slot=0)
        return state

    def after(self, pos: Position) -> Position:
        """The position of the batch that follows the one at `pos`."""
        return self.indices(pos)[1]

    def layout(self) -> list[tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of each array of a batch (data first, float32)."""
        shape = (self.batch_size, *self.arrays[0].shape[1:])
        if self.transform is not None:
            shape = (self.batch_size, *self.transform.output_shape(shape[1:]))
        return [(shape, np.dtype(np.float32))] + [
            ((self.batch_size, *np.shape(a)[1:]), np.asarray(a[:1]).dtype)
            for a in self.arrays[1:]]

    def fill(self, pos: Position, out: list[np.ndarray]) -> None:
        """Write the batch at `pos` into `out` (a worker's shared-memory slot)."""
        self.batch(pos, out)

    def batch(self, pos: Position, out: list[np.ndarray] | None = None
              ) -> tuple[Batch, Position]:
        """The ready batch at `pos` (float32 data first) and the position after it."""
        idx, after = self.indices(pos)
        start = self.rank * self.batch_size
        if self.ranks > 1:
            idx = idx[start:start + self.batch_size]
        out = out if out is not None else self._outputs()
        data = self.arrays[0][idx]
        if self.transform is not None and not self.transform.identity:
            # Crops and flips come from a generator keyed by the batch's own position.
            rng = np.random.default_rng([self.seed, pos[0], pos[1], 0x7F4A])
            shard = {"part": (start, self.global_batch)} if self.ranks > 1 else {}
            first = self.transform(data, rng, self.train, out=out[0] if out else None, **shard)
        else:
            first = data.astype(np.float32, copy=False)
            if out:
                np.copyto(out[0], first)
                first = out[0]
        rest = []
        for k, array in enumerate(self.arrays[1:], start=1):
            value = np.asarray(array[idx])
            if out:
                np.copyto(out[k], value)
                value = out[k]
            rest.append(value)
        return (first, *rest), after

    def _outputs(self) -> list[np.ndarray] | None:
        """The next slot of the buffer ring (reuse_buffers), else None: allocate fresh."""
        if not self._ring:
            return None
        slot, self._slot = self._slot, (self._slot + 1) % self._ring
        if slot not in self._buffers:
            self._buffers[slot] = [np.empty(shape, dtype) for shape, dtype in self.layout()]
        return self._buffers[slot]


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class _Prefetcher:
    """A daemon thread that keeps up to `depth` batches ready in a queue."""

    def __init__(self, make: Callable[[Position], tuple[Batch, Position]], start: Position,
                 depth: int):
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(make, start), daemon=True,
                                       name="netrun-prefetch")
        self.thread.start()

    def _run(self, make: Callable, pos: Position) -> None:
        try:
            while not self.stop.is_set():
                item = make(pos)
                pos = item[1]
                self._put(item)
        except BaseException as e:                   # handed to the consumer, never lost
            self._put(_Failure(e))

    def _put(self, item: Any) -> None:
        # Poll so that close() is noticed while the queue is full.
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def get(self) -> tuple[Batch, Position]:
        """The next batch and the position after it; re-raises the producer's error."""
        while True:
            try:
                item = self.queue.get(timeout=0.5)
            except queue.Empty:
                if not self.thread.is_alive() and self.queue.empty():
                    raise NetrunError("the data prefetch thread stopped unexpectedly") from None
                continue
            if isinstance(item, _Failure):
                raise item.error
            return item

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and drop the batches it made ahead."""
        self.stop.set()
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self.thread.join(timeout)


class _Holder:
    """The loader's current prefetcher (a thread or worker processes), closed by a finalizer
    if the loader is dropped."""

    def __init__(self) -> None:
        self.prefetcher: _Prefetcher | WorkerPool | None = None

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
            self.prefetcher = None


class BatchLoader:
    """An endless, deterministic, resumable stream of (data, label, ...) batches.

    `arrays`: a sequence of arrays with the same first dimension (e.g. a source part); the
    first is the data (transformed, float32), the others are passed through (labels).
    With `reuse_buffers`, batches are written into a ring of preallocated buffers: a batch
    stays valid until the next call of `next()`. With `workers` > 0, batches are made by that
    many spawned processes (netrun.train.data.workers) instead of a thread: the same batches,
    for data whose decoding would hold the GIL (images); the arrays and the transform must
    then be picklable, and lazy arrays must reopen their files in each process.
    """

    def __init__(self, arrays: Sequence[Any], batch_size: int, shuffle: bool = True,
                 seed: int = 0, transform: Transform | None = None, drop_last: bool = False,
                 prefetch: bool = True, train: bool = True, depth: int = 3,
                 reuse_buffers: bool = False, workers: int = 0,
                 shard: tuple[int, int] = (0, 1)):
        arrays = tuple(arrays)
        if not arrays or len(arrays[0]) == 0:
            raise NetrunError("BatchLoader: the dataset is empty")
        for k, a in enumerate(arrays[1:], start=1):
            if len(a) != len(arrays[0]):
                raise NetrunError(f"BatchLoader: array {k} has {len(a)} rows, the data "
                                  f"has {len(arrays[0])}")
        if int(batch_size) < 1:
            raise NetrunError(f"BatchLoader: batch_size must be >= 1, got {batch_size}")
        if drop_last and batch_size > len(arrays[0]):
            raise NetrunError(f"BatchLoader: drop_last with batch_size {batch_size} > "
                              f"{len(arrays[0])} examples leaves no batch")
        if not 1 <= depth <= 16:
            raise NetrunError(f"BatchLoader: prefetch depth must be 1..16, got {depth}")
        rank, ranks = shard
        if not 0 <= rank < ranks or int(batch_size) % ranks:
            raise NetrunError(f"BatchLoader: a batch of {batch_size} cannot be split evenly "
                              f"over {ranks} ranks (rank {rank}); make batch_size a multiple "
                              f"of the number of ranks")
        if not 0 <= int(workers) <= 64:
            raise NetrunError(f"BatchLoader: workers must be 0..64, got {workers}")
        self.batch_size, self.shuffle, self.seed = int(batch_size), bool(shuffle), int(seed)
        self.prefetch, self.depth = bool(prefetch), int(depth)
        self.workers = int(workers) if prefetch else 0
        # Ring size: the consumer's batch + `depth` queued + one being filled.
        ring = (depth + 2 if prefetch else 1) if reuse_buffers else 0
        self._sampler = _Sampler(arrays, self.batch_size, self.shuffle, self.seed, transform,
                                 bool(drop_last), bool(train), ring, shard)
        self._pos: Position = (0, 0)
        self._holder = _Holder()
        self._finalizer = weakref.finalize(self, self._holder.close)

    @property
    def size(self) -> int:
        """Number of examples in the dataset."""
        return self._sampler.size

    @property
    def batches_per_epoch(self) -> float:
        """Batches per pass over the data (fractional when batches wrap across epochs)."""
        if self._sampler.drop_last:
            return self.size // self.batch_size
        return self.size / self.batch_size

    @property
    def epoch(self) -> int:
        """The epoch the next batch starts in."""
        return self._pos[0]

    def state(self) -> dict:
        """The position of the next batch, as a small JSON-able dict."""
        return {"epoch": self._pos[0], "index": self._pos[1], "seed": self.seed,
                "size": self.size, "shuffle": self.shuffle}

    def load_state(self, state: dict) -> None:
        """Continue from a `state()`: the next batch is the one that followed it."""
        for key, mine in (("size", self.size), ("seed", self.seed), ("shuffle", self.shuffle)):
            if key in state and state[key] != mine:
                raise NetrunError(f"data loader state was saved with {key}={state[key]!r} but "
                                  f"this loader has {key}={mine!r}; resuming would not see the "
                                  f"same batches")
        epoch, index = int(state["epoch"]), int(state["index"])
        if epoch < 0 or not 0 <= index < self.size:
            raise NetrunError(f"data loader state: position ({epoch}, {index}) is outside a "
                              f"dataset of {self.size} examples")
        self._holder.close()                 # batches made ahead belong to the old position
        self._pos = (epoch, index)

    def __iter__(self) -> BatchLoader:
        return self

    def __next__(self) -> Batch:
        batch, self._pos = self._next()
        return batch

    def next(self) -> Batch:
        """The next batch: (data float32, label, ...)."""
        return self.__next__()

    def _next(self) -> tuple[Batch, Position]:
        if not self.prefetch:
            return self._sampler.batch(self._pos)
        if self._holder.prefetcher is None:
            self._holder.prefetcher = self._start_prefetch()
        try:
            return self._holder.prefetcher.get()
        except BaseException:
            # The thread has stopped (or the wait was interrupted): start afresh next time,
            # from the position of the batch that failed.
            self._holder.close()
            raise

    def _start_prefetch(self) -> _Prefetcher | WorkerPool:
        if not self.workers:
            return _Prefetcher(self._sampler.batch, self._pos, self.depth)
        sampler = self._sampler
        return WorkerPool(sampler.fill, SlotLayout(sampler.layout()), sampler.after, self._pos,
                          self.workers, self.depth + self.workers)

    def close(self) -> None:
        """Stop the prefetch thread or workers; the loader may be used again (it restarts)."""
        self._holder.close()

    def __enter__(self) -> BatchLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def iterate_once(arrays: Sequence[Any], batch_size: int,
                 transform: Transform | None = None, workers: int = 0,
                 limit: int = 0) -> Iterator[Batch]:
    """One in-order pass for evaluation: test-mode transform, the last batch may be short.

    With `workers`, the full batches are made by worker processes (as in training) and only
    a short last batch in this one; `limit` stops after that many batches (0: all), so the
    workers decode no more than is asked for.
    """
    arrays = tuple(arrays)
    full = len(arrays[0]) // batch_size
    if limit:
        full = min(full, limit)
    start = 0
    if workers and full > 1:
        loader = BatchLoader(arrays, batch_size, shuffle=False, transform=transform,
                             train=False, workers=workers, depth=min(3, full))
        with loader:
            for _ in range(full):
                yield next(loader)
        start = full * batch_size
        if limit and full >= limit:
            return
    for start in range(start, len(arrays[0]), batch_size):
        sl = slice(start, start + batch_size)
        data = arrays[0][sl]
        data = (transform(data, None, train=False) if transform is not None
                else np.asarray(data, np.float32))
        yield (data, *(np.asarray(a[sl]) for a in arrays[1:]))
