"""Batch-parallel NumPy work on a fixed partition: the same bits on any number of threads.

NumPy's ufuncs, copies and BLAS calls release the GIL, so Python threads working on chunks of
a batch run on as many cores. Two rules make the results independent of how many threads
there are (netrun's reproducibility promise: same inputs and seed, same bits):

* The BLAS runs on one thread, pinned once for the process (threadpoolctl) when netrun starts
  its workers. A multithreaded OpenBLAS splits a GEMM's sums differently with 1 and 2
  threads, and its thread count is process-wide: setting it per call from concurrent workers
  raced, so some GEMMs ran with one thread and some with two, differently on every run. All
  the parallelism is ours instead.
* `chunks` cuts range(n) into chunk boundaries that depend only on n and the work (never on
  the thread count); each thread takes every T-th chunk, and what a chunk adds into a shared
  result (a partial filter gradient) is added by its commit, which `chunks` runs in chunk
  order. Big single GEMMs go through `matmul`, which splits them the same way into fixed
  blocks of rows or columns (no sum is split, so no reduction order changes).

On other array modules (CuPy) everything runs on the calling thread as one chunk.

A traced run (`netrun profile --trace`) installs a recorder with `recording`: every chunk
split over the workers is then reported with its thread and its start and end. The recorder
is a context variable, unset by default, so runs outside the `with` (other workspaces, other
threads) record nothing and work that is not split never looks it up.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

ENV = "NETRUN_THREADS"     # worker threads (default: the usable cores, at most MAX_THREADS)
MAX_THREADS = 16
# Chunks of a batch: a power of two (so that 2 or 4 threads share them evenly), at most
# MAX_CHUNKS. Work below 2·MIN_ELEMENTS is one chunk (the hand-off would cost more than it
# saves); above it, two chunks, and more only while each gets CHUNK_ELEMENTS: smaller
# chunks mean smaller GEMMs (dft_gemm's per-frequency products have the block as one side)
# and more Python per op, which cost LeNet's training step 15-35% with 8 chunks on 2 cores;
# for the same reason a chunk is not cut below its caller's block of images except to make
# two (winograd_jit streams its filter spectrum once per block: 16 images of 256 channels
# in 8 chunks ran 1.4× slower than in 2) (measurements: benchmarks/README.md). Changing
# any of these moves where partial sums are cut, and so the last bits of results.
MAX_CHUNKS = 8
MIN_ELEMENTS = 1 << 18
CHUNK_ELEMENTS = 1 << 22
# `matmul` cuts a product into blocks of at least this many flops and rows (or columns):
# blocks re-read the other operand and repack it, so LeNet's FC products (51 MFLOP) go in 2.
GEMM_MIN_FLOPS = 16 << 20
GEMM_MIN_SIDE = 128

Commit = Callable[[], None]
_POOL: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()
_BLAS_PIN: list = []           # the threadpoolctl limiter, held for the life of the process
_LOCAL = threading.local()     # .busy: this thread is running a chunk (nested work runs inline)


class ChunkRecorder(Protocol):
    """What `recording` reports each chunk to (netrun.profile.trace.ChunkLog)."""

    def chunk(self, kind: str, index: int, count: int, worker: int, start: float,
              end: float) -> None:
        """Chunk `index` of `count` ran on `worker` (this thread) from start to end
        (time.perf_counter seconds); kind: 'chunk' (a batch) or 'gemm block'."""


# Set only inside `recording`: a context variable, so that one traced run never reports
# another workspace's work and nothing outlives the `with`.
_RECORDER: ContextVar[ChunkRecorder | None] = ContextVar("netrun_chunk_recorder", default=None)


@contextmanager
def recording(recorder: ChunkRecorder) -> Iterator[ChunkRecorder]:
    """`with recording(r):` every chunk split over the workers by this thread's work (the
    calling thread's own chunks included) is reported to r.chunk while the block runs."""
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)


# Set while a net runs (`steady_thread_count`): the count its ops see, read once per run.
_STEADY: ContextVar[int | None] = ContextVar("netrun_steady_threads", default=None)


def thread_count() -> int:
    """Worker threads: NETRUN_THREADS, else the BLAS thread variables (a user limiting
    OPENBLAS_NUM_THREADS or OMP_NUM_THREADS limits netrun too), else the usable cores."""
    steady = _STEADY.get()
    return steady if steady is not None else _environment_thread_count()


@contextmanager
def steady_thread_count() -> Iterator[int]:
    """Inside the block, this thread's `thread_count()` is what it was on entry: a net's run
    reads the environment once instead of once per op (four variables and the affinity mask
    cost ~9 µs, a tenth of a small convolution at batch 1)."""
    count = _environment_thread_count()
    token = _STEADY.set(count)
    try:
        yield count
    finally:
        _STEADY.reset(token)


def _environment_thread_count() -> int:
    for var in (ENV, "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return min(int(value), MAX_THREADS)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_THREADS))


def in_chunk() -> bool:
    """Whether this thread is running a chunk (work it starts now runs inline, on it alone)."""
    return getattr(_LOCAL, "busy", False)


def chunk_count(n: int, work: int = 0, block: int = 1) -> int:
    """How many chunks `chunks` cuts range(n) into, given `work` (elements touched; 0: no
    limit) and the caller's `block` (items it prefers to process at once; chunks are cut
    smaller only to make two): a power of two that depends on these only, never on the
    thread count."""
    limit = min(n, MAX_CHUNKS, max(2, n // max(block, 1)))
    if work:
        per_chunk = max(min(2, work // max(MIN_ELEMENTS, 1)), work // max(CHUNK_ELEMENTS, 1))
        limit = min(limit, per_chunk)
    return _power_of_two(limit)


def chunks(xp: Any, n: int, fn: Callable[[int, int, int], Commit | None], work: int = 0,
           block: int = 1) -> None:
    """fn(index, n0, n1) over the `chunk_count(n, work, block)` contiguous chunks of range(n),
    on the worker threads (chunk i on worker i % T).

    A chunk that must add into a result shared with other chunks returns a commit (a callable
    doing the add; any other return value is ignored): commits run one at a time in chunk
    order, each as soon as the chunks before it have finished, so the sums are the same
    whatever the thread count. Chunks on one worker run one after another: `chunk_scratch`
    gives a worker's buffers, reused by its next chunk only after this one's commit. A
    non-NumPy array module runs fn(0, 0, n) on this thread.
    """
    if xp is not np:
        _commit(fn(0, 0, n))
        return
    _run([partial(fn, i, n0, n1) for i, (n0, n1) in enumerate(chunk_bounds(n, work, block))])


def chunk_bounds(n: int, work: int = 0, block: int = 1) -> list[tuple[int, int]]:
    """The (n0, n1) ranges `chunks` hands to fn for these arguments (what a caller may build
    ahead of time per chunk size)."""
    return _bounds(n, chunk_count(n, work, block))


def matmul(xp: Any, a, b, out) -> None:
    """out = a @ b (np.matmul's rules), a big product cut into fixed blocks on the workers.

    A stack of products is cut along its leading axis; a single 2-D product along out's
    longer side (rows of a, or columns of b: each block reads all of the other operand).
    Every output element is still one BLAS dot product, so no sum depends on the threads.
    """
    matmuls(xp, [(a, b, out)])


def matmuls(xp: Any, products: Sequence[tuple[Any, Any, Any]]) -> None:
    """Independent products (a, b, out), as `matmul` does each, all blocks in one hand-off:
    an FC gradient's dW and dX run side by side."""
    if xp is not np:
        for a, b, out in products:
            xp.matmul(a, b, out=out)
        return
    flops = sum(2 * out.size * a.shape[-1] for a, _, out in products)
    if flops < 2 * GEMM_MIN_FLOPS:   # too little for a hand-off (`one_call`)
        pin_blas()
        for a, b, out in products:
            np.matmul(a, b, out=out)
        return
    _run([job for a, b, out in products for job in _product_blocks(a, b, out)], "gemm block")


def one_call(xp: Any, a, out) -> bool:
    """Whether `matmul` computes out = a @ b as one BLAS call on the calling thread (too
    little work for a hand-off), on any thread count."""
    return xp is np and 2 * out.size * a.shape[-1] < 2 * GEMM_MIN_FLOPS


def _product_blocks(a, b, out) -> list[Callable[[], None]]:
    """The fixed blocks of out = a @ b, each a call computing its part of out."""
    if min(a.ndim, b.ndim, out.ndim) < 2:    # a vector: one block
        return [partial(np.matmul, a, b, out=out)]
    flops = 2 * out.size * a.shape[-1]
    if out.ndim > 2:                          # a stack: blocks of its leading axis
        lead = out.shape[0]
        count = _power_of_two(min(MAX_CHUNKS, lead, flops // GEMM_MIN_FLOPS))
        return [partial(np.matmul, _lead(a, out, i0, i1), _lead(b, out, i0, i1),
                        out=out[i0:i1]) for i0, i1 in _bounds(lead, count)]
    m, n = out.shape
    count = _power_of_two(min(MAX_CHUNKS, max(m, n) // GEMM_MIN_SIDE, flops // GEMM_MIN_FLOPS))
    if m >= n:
        return [partial(np.matmul, a[i0:i1], b, out=out[i0:i1]) for i0, i1 in _bounds(m, count)]
    return [partial(np.matmul, a, b[:, i0:i1], out=out[:, i0:i1])
            for i0, i1 in _bounds(n, count)]


def _lead(operand, out, i0: int, i1: int):
    """Rows i0:i1 of an operand's leading (stack) axis, unless it is broadcast along it."""
    if operand.ndim == out.ndim and operand.shape[0] == out.shape[0]:
        return operand[i0:i1]
    return operand


def per_thread(n: int, block: int, work: int = 0) -> tuple[int, int]:
    """(scratch copies, images per block) when `chunks` splits n images (`work` as given to
    it) in blocks of at most `block`: what an algorithm's scratch estimate multiplies out.
    There is one set of buffers per thread that runs at the same time as others."""
    count = chunk_count(n, work, block)
    return max(1, min(thread_count(), count)), max(1, min(block, -(-n // count)))


def chunk_scratch(scratch: Callable, index: int) -> Callable:
    """A scratch function for chunk `index` whose buffers no chunk running at the same time
    shares (the chunks of one worker, which run one after another, share them). Work nested
    in a chunk runs inline on its thread, so it must not use chunk_scratch itself."""
    slot = index % thread_count()     # the worker: chunk i runs on worker i % T (see `chunks`)
    if slot == 0:
        return scratch
    return lambda key, shape, dtype="float32": scratch(f"{key}#{slot}", shape, dtype)


def start() -> None:
    """Pin the BLAS to one thread and start the worker threads now (a one-time cost that would
    show in a short first iteration)."""
    pin_blas()
    t = thread_count()
    if t > 1:
        pool = _pool(t)
        for f in [pool.submit(lambda: None) for _ in range(t - 1)]:
            f.result()


def pin_blas() -> None:
    """Limit every BLAS loaded in this process to one thread, once, for the rest of the
    process: a multithreaded BLAS would make results depend on its thread count."""
    if _BLAS_PIN:
        return
    with _LOCK:
        if not _BLAS_PIN:
            _BLAS_PIN.append(threadpool_limits(limits=1, user_api="blas"))


# Running chunks ---------------------------------------------------------------------------
def _power_of_two(limit: int) -> int:
    """The largest power of two <= limit (1 for limit < 2)."""
    return 1 << (max(int(limit), 1).bit_length() - 1)


def _bounds(n: int, count: int) -> list[tuple[int, int]]:
    return [(n * i // count, n * (i + 1) // count) for i in range(count)]


def _commit(commit: Any) -> None:
    if callable(commit):
        commit()


def _run(jobs: Sequence[Callable[[], Any]], kind: str = "chunk") -> None:
    """The jobs (chunks) on the worker threads, job i on worker i % T; the commits they
    return run in job order. A recorder (`recording`) hears of each job's run."""
    pin_blas()
    count = len(jobs)
    t = 1 if count == 1 else min(thread_count(), count)
    if t <= 1 or getattr(_LOCAL, "busy", False):   # one thread, or nested in a chunk
        for job in jobs:
            _commit(job())
        return
    recorder = _RECORDER.get()
    if recorder is not None:
        jobs = [partial(_recorded, recorder, kind, job, i, count, i % t)
                for i, job in enumerate(jobs)]
    order = _Order(count)

    def worker(w: int) -> None:
        _LOCAL.busy = True
        try:
            for i in range(w, count, t):
                if order.failed:
                    return
                order.finish(i, jobs[i]())
        except BaseException:
            order.fail()
            raise
        finally:
            _LOCAL.busy = False

    pool = _pool(t)
    futures = [pool.submit(worker, w) for w in range(1, t)]
    try:
        worker(0)
    finally:
        for f in futures:
            f.result()


def _recorded(recorder: ChunkRecorder, kind: str, job: Callable[[], Any], index: int,
              count: int, worker: int) -> Any:
    """job(), reported to the recorder with its start and end (its commit is not timed:
    it may wait for the chunks before it)."""
    start = time.perf_counter()
    result = job()
    recorder.chunk(kind, index, count, worker, start, time.perf_counter())
    return result


class _Order:
    """Runs the chunks' commits one at a time in chunk order, as chunks finish."""

    def __init__(self, count: int):
        self.cond = threading.Condition()
        self.done = [False] * count
        self.next = 0          # the first chunk not finished
        self.failed = False

    def finish(self, index: int, commit: Any) -> None:
        with self.cond:
            if callable(commit):
                while self.next != index and not self.failed:
                    self.cond.wait()
                if self.failed:
                    return
                commit()
            self.done[index] = True
            while self.next < len(self.done) and self.done[self.next]:
                self.next += 1
            self.cond.notify_all()

    def fail(self) -> None:
        """A chunk raised: wake every waiting commit so that its worker gives up."""
        with self.cond:
            self.failed = True
            self.cond.notify_all()


def _pool(t: int) -> ThreadPoolExecutor:
    global _POOL
    with _LOCK:
        if _POOL is None or _POOL._max_workers < t - 1:
            _POOL = ThreadPoolExecutor(max_workers=max(1, t - 1), thread_name_prefix="netrun")
        return _POOL
