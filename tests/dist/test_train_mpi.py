"""Data-parallel training under `mpiexec -n 2`: the same global batch gives what one process
gives (to float32 rounding), two runs give the same bits, a run resumes exactly, its
checkpoint serves one process, and a killed rank ends the job with the checkpoint intact."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from netrun.train import checkpoint as ckpt
from tests.checks import checks_ops
from tests.dist.helpers import run_mpi
from tests.train.conftest import TINY_MODEL

# The tiny model of tests/train without its dropout: ranks draw masks from the same seed,
# which a single process would draw for the whole batch at once.
MODEL = "".join(line for line in TINY_MODEL.splitlines(keepends=True) if "dropout" not in line)


def write_config(tmp_path, name: str, max_iter: int = 12, snapshot: int = 0,
                 transform: str = "{scale: 0.00390625, crop_size: 24, mirror: true}") -> str:
    (tmp_path / "tiny.yaml").write_text(MODEL.replace("[1, 28, 28]", "[1, 24, 24]"))
    (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(f"""\
        model: tiny.yaml
        data: {{source: generated, dir: {tmp_path / 'data'}, train_count: 480, test_count: 96,
                batch_size: 16, transform: {transform}}}
        solver: {{type: sgd, base_lr: 0.05, momentum: 0.9, max_iter: {max_iter}, display: 0,
                  seed: 3, snapshot: {snapshot}, test_interval: 0}}
        output: {tmp_path / name}
        """))
    return str(tmp_path / f"{name}.yaml")


def params(path) -> dict[str, np.ndarray]:
    info = ckpt.read_info(path)
    import h5py
    with h5py.File(path, "r") as f:
        return {name: f["params"][name][()] for name in info.params}


def train_one_process(config: str, *extra: str) -> None:
    done = subprocess.run([sys.executable, "-m", "netrun", "train", config, *extra],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def train_ranks(config: str, *extra: str, n: int = 2) -> subprocess.CompletedProcess:
    done = run_mpi(n, ["-m", "netrun", "train", config, *extra], timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process, and two 2-rank runs, of the same config (global batch 16)."""
    tmp = tmp_path_factory.mktemp("dp")
    one = write_config(tmp, "one")
    train_one_process(one)
    first, second = write_config(tmp, "two_a"), write_config(tmp, "two_b")
    train_ranks(first)
    train_ranks(second)
    return tmp


@checks_ops("AllreduceStart", "AllreduceWait", kind="reference")
def test_two_ranks_match_one_process_to_float32_rounding(runs):
    one, two = params(runs / "one" / "last.h5"), params(runs / "two_a" / "last.h5")
    assert one.keys() == two.keys()
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_two_rank_runs_are_the_same_bits(runs):
    a, b = params(runs / "two_a" / "last.h5"), params(runs / "two_b" / "last.h5")
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_rank_zero_alone_writes(runs):
    lines = (runs / "two_a" / "metrics.jsonl").read_text().splitlines()
    assert sum('"event": "start"' in line for line in lines) == 1


def test_resume_with_two_ranks_continues_exactly(runs, tmp_path):
    config = write_config(tmp_path, "resumed", snapshot=6)
    train_ranks(config, "--max-iter", "6")
    train_ranks(config, "--resume", "auto")
    whole, resumed = params(runs / "two_a" / "last.h5"), params(tmp_path / "resumed" / "last.h5")
    for name in whole:
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)


def test_a_two_rank_checkpoint_serves_one_process(runs):
    done = subprocess.run([sys.executable, "-m", "netrun", "infer",
                           str(runs / "two_a" / "last.h5"), "generated:test", "--json",
                           "--data-dir", str(runs / "data")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["count"] == 96


def test_a_killed_rank_ends_the_job_and_resume_continues(tmp_path):
    config = write_config(tmp_path, "killed", max_iter=100000, snapshot=5)
    from tests.dist.helpers import mpi_command
    proc = subprocess.Popen(mpi_command(2, ["-m", "netrun", "train", config]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    last = tmp_path / "killed" / "last.h5"
    deadline = time.monotonic() + 120
    while not last.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert last.exists(), proc.communicate(timeout=30)
    ranks = _rank_pids(proc.pid)
    assert len(ranks) == 2, ranks
    os.kill(ranks[-1], signal.SIGKILL)
    start = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < 60 and proc.returncode != 0
    ckpt.read_info(last)                          # intact: its CRCs and metadata check out
    done = run_mpi(2, ["-m", "netrun", "train", config, "--resume", "auto",
                       "--max-iter", str(ckpt.read_info(last).iteration + 5)], timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def _rank_pids(launcher: int) -> list[int]:
    """The python processes under the launcher (hydra's proxy starts them), oldest first."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    children: dict[int, list[tuple[int, str]]] = {}
    for line in out.splitlines()[1:]:
        pid, ppid, args = line.split(None, 2)
        children.setdefault(int(ppid), []).append((int(pid), args))
    found, todo = [], [launcher]
    while todo:
        for pid, args in children.get(todo.pop(), []):
            todo.append(pid)
            if "-m netrun train" in args and "mpiexec" not in args:
                found.append(pid)
    return sorted(found)
