"""Starting MPI jobs from tests: `run_mpi`, `start_mpi`, and a clean skip where MPI cannot start.

Jobs run `mpiexec -n N <this python> ...` with the mpiexec beside this Python (the mpich
wheel's, as `netrun train --nproc` does) else the first on PATH. Whether MPI starts at all is
probed once, with mpi4py alone, so that a skip never hides a failure of netrun's own code.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What a launcher gives its ranks: a test started under mpiexec must not pass it on.
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL")


def mpiexec() -> str | None:
    """The launcher the tests use, or None."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


@functools.cache
def mpi_problem() -> str | None:
    """Why MPI cannot start a 2-rank job here, or None when it can (probed once)."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'netrun[dist]')"
    exe = mpiexec()
    if exe is None:
        return "no mpiexec beside sys.executable or on PATH (pip install 'netrun[dist]')"
    probe = "from mpi4py import MPI; assert MPI.COMM_WORLD.Get_size() == 2"
    try:
        done = subprocess.run([exe, "-n", "2", sys.executable, "-c", probe], env=job_env(),
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"mpiexec -n 2 cannot start here: {e}"
    if done.returncode != 0:
        return f"mpiexec -n 2 cannot start here: {(done.stderr or done.stdout).strip()[-500:]}"
    return None


def require_mpi() -> str:
    """The mpiexec to use; skips the test (with the reason) where MPI cannot start."""
    reason = mpi_problem()
    if reason:
        pytest.skip(reason)
    return mpiexec()


def job_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment for a job's ranks: netrun from this checkout, one thread per rank
    (the machine's cores are shared), no launcher variables; `env` on top."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), out.get("PYTHONPATH")]))
    out["NETRUN_THREADS"] = "1"
    out.update(env or {})
    return out


def mpi_command(n: int, args: Sequence[str]) -> list[str]:
    """`mpiexec -n n <python> args`; skips the test where MPI cannot start."""
    return [require_mpi(), "-n", str(n), sys.executable, *map(str, args)]


def start_mpi(n: int, args: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: str | Path | None = None) -> subprocess.Popen:
    """`mpiexec -n n <python> args` started, output piped (text); skips where MPI can't."""
    return subprocess.Popen(mpi_command(n, args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=job_env(env), cwd=cwd,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """Wait for a started job; fails the test (after killing it) past `timeout` seconds."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGKILL to mpiexec: its proxy sees the launcher gone and kills the ranks.
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(proc.args)} did not end within {timeout} s\n"
                    f"--- stdout\n{out}\n--- stderr\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_mpi(n: int, args: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run `mpiexec -n n <python> args` to its end (stdout, stderr captured as text)."""
    return finish(start_mpi(n, args, env, cwd), timeout)
