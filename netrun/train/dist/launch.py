"""`netrun train CONFIG --nproc N`: the same command again as N ranks under `mpiexec`.

The `mpich` wheel puts its launcher (hydra's `mpiexec`) beside the Python it was installed
for, so that one comes first: the launcher must be the MPI that mpi4py loads. Each rank
gets NETRUN_THREADS = cores // N (unless the user set it), so N ranks do not fight over the
cores. The launcher's exit status is the job's.

Signals reach the ranks through this process only: mpiexec runs in a session of its own,
so a Ctrl-C on the terminal is not delivered to it as well (hydra counts two SIGINTs as
"force abort", which kills the ranks before they can say what is on disk and exits 0).
The first SIGINT goes on as SIGINT, and every later signal, and SIGHUP (of which mpiexec
dies without passing it on), as SIGTERM: each rank then stops as one process does on its
first and second signal.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from netrun.train.dist.errors import INSTALL_HINT, DistError
from netrun.train.dist.mpi import launched_size
from netrun.train.dist.watchdog import TIMEOUT_STATUS

THREADS_ENV = "NETRUN_THREADS"
FORWARDED = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP"))
                  if s is not None)


def find_mpiexec() -> str:
    """The mpiexec beside this Python (the mpich wheel's), else the first on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise DistError(f"--nproc starts its ranks with MPI's launcher, mpiexec, which is "
                    f"neither beside {sys.executable} nor on PATH: {INSTALL_HINT}")


# mpi4py's variable naming the MPI library to load; the launcher and the library must be one
# MPI, or every rank sees a world of one.
LIBMPI_ENV = "MPI4PY_LIBMPI"


def launcher_library(mpiexec: str) -> str | None:
    """The MPI library installed with `mpiexec` (prefix/lib beside prefix/bin, as the mpich
    wheel and MPI distributions lay it out), or None where there is none."""
    lib = Path(mpiexec).resolve().parent.parent / "lib"
    for name in ("libmpi.so.12", "libmpi.so.40", "libmpi.so", "libmpi.dylib"):
        if (lib / name).is_file():
            return str(lib / name)
    return None


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def rank_environment(nproc: int, environ: Mapping[str, str] | None = None,
                     mpiexec: str | None = None) -> dict[str, str]:
    """The ranks' environment: this one, with NETRUN_THREADS = cores // nproc unless set,
    and mpi4py pointed at the MPI library of `mpiexec` unless told which to load."""
    env = dict(os.environ if environ is None else environ)
    if not env.get(THREADS_ENV, "").strip():
        env[THREADS_ENV] = str(max(1, usable_cores() // nproc))
    # mpi4py looks for libmpi in Python's prefix, then the system's: where mpich came as a
    # wheel outside the prefix (pip --target) it would load a system MPI instead.
    library = launcher_library(mpiexec) if mpiexec else None
    if library is not None and not env.get(LIBMPI_ENV, "").strip():
        env[LIBMPI_ENV] = library
    return env


def command(nproc: int, args: Sequence[str], mpiexec: str) -> list[str]:
    """mpiexec -n N <this python> -m netrun ARGS."""
    return [mpiexec, "-n", str(nproc), sys.executable, "-m", "netrun", *args]


def launch(nproc: int, args: Sequence[str], note: Callable[[str], None] | None = None) -> int:
    """Run `netrun ARGS` as `nproc` ranks; the job's exit status."""
    if launched_size() > 1:
        raise DistError(f"--nproc {nproc} starts its own ranks, but this process is already "
                        f"one of {launched_size()} started by an MPI launcher: give either "
                        f"--nproc or mpiexec -n, not both")
    mpiexec = find_mpiexec()
    cmd = command(nproc, args, mpiexec)
    env = rank_environment(nproc, mpiexec=mpiexec)
    if note is not None:
        note(f"starting {nproc} ranks, {env[THREADS_ENV]} thread(s) each: "
             f"{subprocess.list2cmdline(cmd)}")
    return run_job(cmd, env)


def run_job(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run an MPI launcher and hand it this process's signals; its exit status
    (128 + N when it was killed by signal N)."""
    received: list[int] = []
    sent_sigint: list[bool] = []
    proc: list[subprocess.Popen] = []

    def forward(signum: int, frame) -> None:
        received.append(signum)
        if not proc:
            return      # not started yet: it will not be
        if signum == signal.SIGINT and not sent_sigint:
            sent_sigint.append(True)
            to_send = signal.SIGINT
        else:
            to_send = signal.SIGTERM
        try:
            proc[0].send_signal(to_send)
        except OSError:  # already gone
            pass

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        if received:
            return 128 + received[0]
        # preexec_fn runs between fork and exec; the hook only calls prctl and getppid,
        # which take no lock that another thread could hold at the fork.
        proc.append(subprocess.Popen(list(cmd), env=None if env is None else dict(env),
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_ends_with_parent()))  # noqa: PLW1509
        status = proc[0].wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status if status >= 0 else 128 - status


def failure_note(status: int, nproc: int) -> str | None:
    """A sentence for a job that ended by a failure its ranks could not report, else None."""
    stopped = {128 + s for s in FORWARDED}
    if status in (0, 2, TIMEOUT_STATUS) or status in stopped:
        return None     # done, or the ranks said why (bad input, a stop, the watchdog)
    return (f"the {nproc}-rank job ended with exit status {status}: a rank failed or was "
            f"killed (MPICH reports a rank killed by signal N as status N), and MPI ended "
            f"the others. Checkpoints are written atomically, so the newest one in the run "
            f"folder is complete: the same command with --resume auto continues from it")


def _ends_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook that has the kernel send SIGTERM to the launcher if this process
    dies (Linux): a launcher killed with SIGKILL would otherwise leave its job running."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl   # found before the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:     # the parent died before the request was in place
            os._exit(128 + signal.SIGTERM)

    return hook
