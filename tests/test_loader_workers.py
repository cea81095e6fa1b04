"""The batch loader with worker processes: the same bits as in-process, resumable, and
failures that reach the training process with their message (or a clear one, when a worker
dies)."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from netrun.errors import DataError, NetrunError
from netrun.train.data import BatchLoader, Transform, iterate_once


class FailingArray:
    """Picklable lazy data whose example `bad` cannot be read (as a damaged image)."""

    def __init__(self, data: np.ndarray, bad: int):
        self.data, self.bad = data, bad
        self.shape, self.dtype, self.ndim = data.shape, data.dtype, data.ndim

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index):
        idx = np.atleast_1d(np.arange(len(self))[index])
        if self.bad in idx:
            raise DataError(f"example {self.bad}: not a readable image")
        return self.data[index]


def images(n=300):
    rng = np.random.default_rng(1)
    return (rng.integers(0, 256, (n, 3, 10, 10)).astype(np.uint8),
            rng.integers(0, 10, n).astype(np.int32))


TRANSFORM = Transform(scale=1 / 256, crop_size=8, mirror=True, mean=[100.0, 110.0, 120.0])


def take(loader, n):
    with loader:
        return [next(loader) for _ in range(n)]


def test_workers_give_the_same_bits_as_the_training_process():
    data, label = images()
    want = take(BatchLoader((data, label), 32, seed=4, transform=TRANSFORM, prefetch=False), 14)
    for workers in (1, 3):
        got = take(BatchLoader((data, label), 32, seed=4, transform=TRANSFORM, workers=workers), 14)
        for (x0, y0), (x1, y1) in zip(want, got):
            assert x1.dtype == np.float32 and x1.shape == (32, 3, 8, 8)
            np.testing.assert_array_equal(x1, x0)
            np.testing.assert_array_equal(y1, y0)


def test_workers_resume_where_the_state_says():
    data, label = images()
    whole = take(BatchLoader((data, label), 48, seed=9, transform=TRANSFORM, workers=2), 10)
    first = BatchLoader((data, label), 48, seed=9, transform=TRANSFORM, workers=2)
    with first:
        for _ in range(7):                     # 7 x 48 > 300: the state is in epoch 1
            next(first)
        state = first.state()
    assert state["epoch"] == 1
    second = BatchLoader((data, label), 48, seed=9, transform=TRANSFORM, workers=1)
    second.load_state(state)
    for want, got in zip(whole[7:], take(second, 3)):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_a_worker_error_reaches_the_consumer_with_its_message():
    data, label = images(64)
    loader = BatchLoader((FailingArray(data, bad=40), label), 16, shuffle=False, workers=2)
    with loader:
        next(loader), next(loader)                       # examples 0..31 read fine
        with pytest.raises(DataError, match="example 40: not a readable image"):
            next(loader)
        assert loader.state()["index"] == 32            # the failed batch was not consumed


def test_a_killed_worker_ends_the_wait_with_a_clear_error():
    data, label = images(64)
    loader = BatchLoader((data, label), 16, workers=1, depth=1)
    next(loader)
    pool = loader._holder.prefetcher
    os.kill(pool.procs[0].pid, signal.SIGKILL)
    pool.procs[0].join(10)
    start = time.monotonic()
    with pytest.raises(NetrunError, match="data worker netrun-data-0 stopped"):
        for _ in range(4):      # batches made before the kill may still be handed over
            next(loader)
    assert time.monotonic() - start < 10
    loader.close()
    assert loader._holder.prefetcher is None


def test_workers_count_is_checked():
    data, label = images(10)
    with pytest.raises(NetrunError, match="workers must be 0..64"):
        BatchLoader((data, label), 2, workers=-1)


def test_evaluation_with_workers_is_the_in_process_pass():
    data, label = images(100)                      # 3 full batches of 32 and one of 4
    want = list(iterate_once((data, label), 32, TRANSFORM))
    got = list(iterate_once((data, label), 32, TRANSFORM, workers=2))
    assert [len(y) for _, y in got] == [32, 32, 32, 4]
    for (x0, y0), (x1, y1) in zip(want, got):
        np.testing.assert_array_equal(x1, x0)
        np.testing.assert_array_equal(y1, y0)
    assert len(list(iterate_once((data, label), 32, TRANSFORM, workers=1, limit=2))) == 2


def test_workers_leave_when_the_training_process_is_killed(tmp_path):
    """No orphans: a training process killed with SIGKILL takes its workers with it."""
    import subprocess
    import sys
    script = tmp_path / "victim.py"
    script.write_text(
        "import numpy as np, sys\n"
        "from netrun.train.data import BatchLoader\n"
        "if __name__ == '__main__':\n"
        "    x = np.zeros((64, 1, 4, 4), np.float32); y = np.zeros(64, np.int32)\n"
        "    loader = BatchLoader((x, y), 8, workers=2)\n"
        "    next(loader)\n"
        "    print(' '.join(str(p.pid) for p in loader._holder.prefetcher.procs), flush=True)\n"
        "    sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_script_without_a_main_guard_fails_fast_with_the_reason(tmp_path):
    """Spawned workers import the user's script; unguarded, it would start workers again.
    That must end in a message, not a hang (multiprocessing blocks forever writing a large
    start-up payload to a child that died before reading it)."""
    import subprocess
    import sys
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import numpy as np\n"
        "from netrun.train.data import BatchLoader\n"
        "x = np.zeros((4000, 3, 16, 16), np.uint8); y = np.zeros(4000, np.int32)\n"
        "print(next(BatchLoader((x, y), 8, workers=1))[0].shape)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert 'if __name__ == "__main__":' in done.stderr


@pytest.mark.parametrize("workers", [0, 2])
def test_the_shards_of_the_ranks_make_the_whole_batch(workers):
    """Each rank makes its slice of the global batch, crops and flips included."""
    data, label = images(90)
    whole = take(BatchLoader((data, label), 24, seed=5, transform=TRANSFORM), 6)
    shards = [take(BatchLoader((data, label), 24, seed=5, transform=TRANSFORM,
                               shard=(rank, 3), workers=workers), 6) for rank in range(3)]
    for k, (x, y) in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([s[k][0] for s in shards]), x)
        np.testing.assert_array_equal(np.concatenate([s[k][1] for s in shards]), y)
    with pytest.raises(NetrunError, match="cannot be split evenly over 5 ranks"):
        BatchLoader((data, label), 24, shard=(0, 5))
