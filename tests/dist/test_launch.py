"""`netrun train --nproc N` and the faults of a job: the launcher it hands over to, the signals
it passes on, and a rank that is killed, fails alone or hangs, each ending the whole job."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from netrun.cli import cli
from netrun.train import dist
from netrun.train.dist import launch
from tests.dist.helpers import finish, job_env, require_mpi, start_mpi

# Every fault must end the job well within the bound.
BOUND = 60


def _executable(path) -> None:
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def test_the_mpiexec_beside_python_comes_first(tmp_path, monkeypatch):
    (tmp_path / "venv").mkdir()
    (tmp_path / "path").mkdir()
    _executable(tmp_path / "venv" / "mpiexec")
    _executable(tmp_path / "path" / "mpiexec")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    assert launch.find_mpiexec() == str(tmp_path / "venv" / "mpiexec")
    (tmp_path / "venv" / "mpiexec").unlink()
    assert launch.find_mpiexec() == str(tmp_path / "path" / "mpiexec")


def test_no_mpiexec_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(dist.DistError, match=r"mpiexec.*pip install 'netrun\[dist\]'"):
        launch.find_mpiexec()


def test_ranks_share_the_cores_unless_threads_are_set(monkeypatch):
    monkeypatch.setattr(launch, "usable_cores", lambda: 8)
    assert launch.rank_environment(2, {})["NETRUN_THREADS"] == "4"
    assert launch.rank_environment(3, {})["NETRUN_THREADS"] == "2"
    assert launch.rank_environment(16, {})["NETRUN_THREADS"] == "1"
    assert launch.rank_environment(2, {"NETRUN_THREADS": "3"})["NETRUN_THREADS"] == "3"
    assert launch.command(2, ["train", "c.yaml"], "/x/mpiexec") == [
        "/x/mpiexec", "-n", "2", sys.executable, "-m", "netrun", "train", "c.yaml"]


def test_ranks_load_the_mpi_library_installed_with_the_launcher(tmp_path):
    """mpich unpacked outside Python's prefix (pip --target): mpi4py would otherwise load
    whatever MPI the system has, and each rank would see a world of one."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    mpiexec = tmp_path / "bin" / "mpiexec"
    mpiexec.write_text("")
    assert launch.launcher_library(str(mpiexec)) is None         # no library beside it
    (tmp_path / "lib" / "libmpi.so.12").write_text("")
    library = str(tmp_path / "lib" / "libmpi.so.12")
    assert launch.launcher_library(str(mpiexec)) == library
    env = launch.rank_environment(2, {}, mpiexec=str(mpiexec))
    assert env["MPI4PY_LIBMPI"] == library
    mine = launch.rank_environment(2, {"MPI4PY_LIBMPI": "/opt/mpi/libmpi.so"}, str(mpiexec))
    assert mine["MPI4PY_LIBMPI"] == "/opt/mpi/libmpi.so"          # the user's choice stands
    assert "MPI4PY_LIBMPI" not in launch.rank_environment(2, {})


def test_nproc_hands_the_same_command_over(tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("{}")
    seen = []
    monkeypatch.setattr(launch, "launch", lambda n, args, note=None: seen.append((n, args)) or 0)
    args = ["-v", "--no-color", "train", str(config), "--nproc", "2", "--max-iter", "3",
            "--set", "a=1", "--set", "b=-2", "--force", "--executor", "dag"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert seen == [(2, ["--verbose", "--no-color", "train", "--force", "--set", "a=1",
                         "--set", "b=-2", "--max-iter", "3", "--executor", "dag", str(config)])]


def test_nproc_returns_the_job_status_with_a_note(tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("{}")
    monkeypatch.setattr(launch, "launch", lambda n, args, note=None: 9)
    result = CliRunner().invoke(cli, ["train", str(config), "--nproc", "2"])
    assert result.exit_code == 9
    assert "--resume auto" in result.output
    assert CliRunner().invoke(cli, ["train", str(config), "--nproc", "0"]).exit_code == 2


def test_nproc_inside_a_launched_job_is_refused(monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(dist.DistError, match="either --nproc or mpiexec"):
        launch.launch(2, ["--version"])


def test_nproc_runs_the_ranks_and_returns_their_status(tmp_path):
    require_mpi()
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    done = subprocess.run([sys.executable, "-m", "netrun", "train", str(bad), "--nproc", "2"],
                          capture_output=True, text=True, env=job_env(), timeout=BOUND)
    # Both ranks read the config and report it; the job's status is theirs.
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count(str(bad)) >= 2


RANK_SIGNALS = textwrap.dedent("""\
    import os, signal, sys, time
    rank = os.environ["PMI_RANK"]
    got = []
    def handle(signum, frame):
        got.append(signum)
        # A file, not stdout: mpiexec passes the ranks' output on without keeping lines whole.
        with open(os.path.join(sys.argv[1], "got" + rank), "a") as f:
            f.write(signal.Signals(signum).name + " ")
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handle)
    open(os.path.join(sys.argv[1], "ready" + rank), "w").close()
    while len(got) < int(sys.argv[2]):
        time.sleep(0.01)
    sys.exit(128 + got[-1])
""")

LAUNCHER = ("import sys; from netrun.train.dist import launch; "
            "sys.exit(launch.run_job(sys.argv[1:]))")


@pytest.mark.parametrize("signals, status, names", [
    ((signal.SIGINT,), 130, ["SIGINT"]),
    ((signal.SIGINT, signal.SIGINT), 143, ["SIGINT", "SIGTERM"]),
    ((signal.SIGHUP,), 143, ["SIGTERM"]),
])
def test_signals_to_the_launcher_reach_every_rank_once_each(tmp_path, signals, status, names):
    exe = require_mpi()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SIGNALS)
    cmd = [sys.executable, "-c", LAUNCHER, exe, "-n", "2", sys.executable, str(script),
           str(tmp_path), str(len(signals))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=job_env(), start_new_session=True)
    _wait_for(lambda: all((tmp_path / f"ready{r}").exists() for r in range(2)), proc)
    for sig in signals:
        os.kill(proc.pid, sig)
        time.sleep(0.3)     # one at a time, as a user's
    done = finish(proc, BOUND)
    assert done.returncode == status, done.stdout + done.stderr
    for rank in range(2):
        assert (tmp_path / f"got{rank}").read_text().split() == names
    assert "force abort" not in done.stderr


LOOP = textwrap.dedent("""\
    import os, signal, sys
    import numpy as np
    from netrun.errors import DataError
    from netrun.train import dist

    comm = dist.world()
    fault = sys.argv[2]
    buf = np.ones(1000, np.float32)
    step = 0
    try:
        with dist.abort_on_error(comm):
            while True:
                comm.allreduce_sum(buf)
                buf[:] = 1
                step += 1
                if step == 20:
                    open(os.path.join(sys.argv[1], f"pid{comm.rank}"), "w").write(
                        str(os.getpid()))
                if comm.rank == 1 and step == 50:
                    if fault == "error":
                        raise DataError("shard 1 is damaged")
                    if fault == "hang":
                        os.kill(os.getpid(), signal.SIGSTOP)
    except DataError as e:      # as netrun's CLI: the message, then exit status 2
        print(f"error: rank {comm.rank}: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
""")


def _job(tmp_path, fault: str, env=None):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    return start_mpi(2, [script, tmp_path, fault], env=env)


def _wait_for(ready, proc) -> None:
    deadline = time.monotonic() + BOUND
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate(timeout=BOUND) if proc.poll() is None else \
                proc.communicate()
            pytest.fail(f"the job did not get ready (status {proc.returncode})\n{out}\n{err}")
        time.sleep(0.02)


def test_a_killed_rank_ends_the_job(tmp_path):
    proc = _job(tmp_path, "kill")
    pid = tmp_path / "pid1"
    _wait_for(lambda: pid.exists() and pid.read_text(), proc)
    os.kill(int(pid.read_text()), signal.SIGKILL)   # as the out-of-memory killer does
    done = finish(proc, BOUND)
    assert done.returncode != 0
    assert "signal 9" in done.stdout + done.stderr   # MPICH: "Killed (signal 9)"


def test_a_rank_failing_alone_ends_the_job(tmp_path):
    done = finish(_job(tmp_path, "error"), BOUND)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: rank 1: shard 1 is damaged" in done.stderr


def test_a_hung_rank_ends_the_job_after_the_timeout(tmp_path):
    done = finish(_job(tmp_path, "hang", env={"NETRUN_DIST_TIMEOUT": "1"}), BOUND)
    assert done.returncode == dist.TIMEOUT_STATUS, done.stdout + done.stderr
    assert "rank 0: allreduce has waited" in done.stderr
    assert "NETRUN_DIST_TIMEOUT=1 s" in done.stderr
