"""The Communicator over MPI (mpi4py), and `world()`: the communicator of this process.

Reproducibility: MPICH picks a collective's algorithm from the number of ranks, the message
size, the datatype and its own settings (MPIR_CVAR_* variables, its tuning file), never from
timing, and every algorithm it has for a sum ends with one result sent to all (recursive
doubling adds the same pairs in commuted order, which IEEE addition makes equal; the
reduce-scatter ones sum each block once and gather it). So a sum is the same bits on every
rank, and again in the next run with the same ranks on the same machines. What can change
it: another number of ranks, another placement of ranks on machines (MPICH's hierarchical
algorithms follow the node layout), other MPIR_CVAR_ settings or another MPICH version.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from netrun.core.comm import Communicator, SingleProcess
from netrun.errors import InternalError, NetrunError
from netrun.train.dist.errors import INSTALL_HINT, DistError
from netrun.train.dist.watchdog import Watchdog, timeout_from_env

# (size, rank) variables that MPI launchers give their processes: MPICH's hydra (and Intel
# MPI's, and Slurm's PMI2), then Open MPI's.
LAUNCHER_ENV = (("PMI_SIZE", "PMI_RANK"), ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"))

_WORLD: list[MpiCommunicator] = []   # the one communicator over MPI_COMM_WORLD, once made


def launched_size(environ: Mapping[str, str] | None = None) -> int:
    """How many ranks the MPI launcher that started this process started (1: none)."""
    env = os.environ if environ is None else environ
    for size_var, _ in LAUNCHER_ENV:
        value = env.get(size_var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def launched_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank as its launcher says (0 when none started it)."""
    env = os.environ if environ is None else environ
    for size_var, rank_var in LAUNCHER_ENV:
        if env.get(size_var, "").strip():
            value = env.get(rank_var, "").strip()
            return int(value) if value.isdigit() else 0
    return 0


def world(timeout: float | None = None) -> Communicator:
    """This process's job: MPI's when a launcher started several ranks, else SingleProcess().

    timeout: seconds a collective may wait for the other ranks before the whole job is
    ended (0: forever; None: NETRUN_DIST_TIMEOUT, else 600). The first call decides.
    """
    size = launched_size()
    if size == 1:
        return SingleProcess()
    if _WORLD:
        return _WORLD[0]
    rank = launched_rank()
    if timeout is None:
        timeout = timeout_from_env()
    try:
        from mpi4py import MPI  # lazy: loads and starts MPI, only in a launched job
    except ImportError as e:
        raise DistError(f"this process is rank {rank} of {size} started by an MPI launcher, "
                        f"but mpi4py cannot be imported ({e}): {INSTALL_HINT}") from None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != size:
        raise DistError(
            f"the launcher started {size} ranks, but MPI sees {comm.Get_size()}: the mpiexec "
            f"that started this job is not the MPI that mpi4py uses ({_library(MPI)}). Start "
            f"it with that MPI's mpiexec, or point mpi4py at the launcher's library "
            f"(MPI4PY_LIBMPI=/path/to/libmpi.so.12), or use `netrun train ... --nproc "
            f"{size}`, which does so")
    _WORLD.append(MpiCommunicator(comm, timeout))
    return _WORLD[0]


class MpiCommunicator:
    """The Communicator of the ranks of an mpi4py communicator (world(): all of the job's)."""

    def __init__(self, comm: Any, timeout: float | None = None):
        from mpi4py import MPI  # lazy: the caller holds an mpi4py communicator, so loaded

        self._mpi = MPI
        self._comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.library = _library(MPI)
        self.watchdog = Watchdog(timeout, self.rank) if timeout else None

    def allreduce_sum(self, buf: np.ndarray) -> None:
        """Sum `buf` over all ranks in place; the same bits on every rank (see the module)."""
        _check_buffer(buf, "allreduce_sum")
        dog = self.watchdog
        if dog is not None:
            dog.arm("allreduce")
        try:
            self._comm.Allreduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM)
        finally:
            if dog is not None:
                dog.disarm()

    def start_allreduce_sum(self, buf: np.ndarray) -> MpiRequest:
        """Begin summing `buf` in place; leave it alone until the request's wait().

        MPICH advances a started collective only inside MPI calls (it runs no thread of its
        own): a request makes progress when it is tested or waited for. Between processes of
        one machine the sum is memory traffic on the ranks' own cores anyway.
        """
        _check_buffer(buf, "start_allreduce_sum")
        request = self._comm.Iallreduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM)
        return MpiRequest(request, buf, self.watchdog)

    def broadcast(self, buf: np.ndarray, root: int = 0) -> None:
        """Overwrite `buf` on every rank with root's."""
        _check_buffer(buf, "broadcast")
        self._waiting("broadcast", self._comm.Bcast, buf, root=root)

    def broadcast_object(self, value: Any, root: int = 0) -> Any:
        """Root's value (pickled) on every rank."""
        return self._waiting("broadcast_object", self._comm.bcast, value, root=root)

    def barrier(self) -> None:
        """Wait until every rank got here."""
        self._waiting("barrier", self._comm.Barrier)

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now, with exit status `code` (MPI_Abort)."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        self._comm.Abort(code)

    def abort_at_exit(self, code: int) -> None:
        """End every rank when this process exits, instead of finishing MPI with them."""
        from mpi4py import run  # lazy: mpi4py is loaded already

        run.set_abort_status(code)

    def _waiting(self, what: str, call, *args, **kwargs):
        dog = self.watchdog
        if dog is None:
            return call(*args, **kwargs)
        dog.arm(what)
        try:
            return call(*args, **kwargs)
        finally:
            dog.disarm()

    def __repr__(self) -> str:
        return f"MpiCommunicator(rank {self.rank} of {self.size}, {self.library})"


class MpiRequest:
    """A started allreduce; holds its buffer until the collective is complete."""

    __slots__ = ("_buf", "_request", "_watchdog")

    def __init__(self, request: Any, buf: np.ndarray, watchdog: Watchdog | None):
        self._request, self._buf, self._watchdog = request, buf, watchdog

    def test(self) -> bool:
        """Advance the collective; whether it is complete (then wait() returns at once)."""
        if self._request is None:
            return True
        if self._request.Test():
            self._request = self._buf = None
            return True
        return False

    def wait(self) -> None:
        """Block until the collective is complete (its buffer is then final)."""
        if self._request is None:
            return
        dog = self._watchdog
        if dog is not None:
            dog.arm("allreduce")
        try:
            self._request.Wait()
        finally:
            if dog is not None:
                dog.disarm()
        self._request = self._buf = None


def exit_status(error: BaseException) -> int:
    """The exit status that `error` leaving the command gives (as netrun's CLI does)."""
    if isinstance(error, SystemExit):
        code = error.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    if isinstance(error, KeyboardInterrupt):
        return 130
    if isinstance(error, NetrunError):
        return 2
    code = getattr(error, "exit_code", None)     # click's Exit and usage errors
    return code if isinstance(code, int) else 1


@contextmanager
def abort_on_error(comm: Communicator) -> Iterator[None]:
    """Make an error that leaves the block end every rank when this process exits.

    Without it a rank that fails alone hangs the job: at exit mpi4py finishes MPI, which
    waits for the other ranks, while they wait in a collective for this one (measured with
    MPICH 5: still hanging after 30 s, with nothing printed by the others). With it, the
    error goes on as before (the CLI prints its message), and the process then calls
    MPI_Abort, which the launcher turns into the end of all.
    A stop that all ranks agreed on ends the same way, which only costs MPICH's one-line
    note of the abort.
    """
    try:
        yield
    except BaseException as e:
        code = exit_status(e)
        if code and comm.size > 1 and hasattr(comm, "abort_at_exit"):
            comm.abort_at_exit(code)
        raise


def _check_buffer(buf: Any, what: str) -> None:
    # MPI reads and writes the buffer as one block of memory: a view with strides would
    # be rejected by mpi4py with a message about buffers, not about the caller.
    if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
        raise InternalError(f"{what} takes a C-contiguous NumPy array, got "
                            f"{type(buf).__name__}"
                            + ("" if not isinstance(buf, np.ndarray) else " with strides "
                               f"{buf.strides}"))


def _library(mpi: Any) -> str:
    """'MPICH 5.0.2', from the MPI library's own version string."""
    try:
        first = mpi.Get_library_version().strip().splitlines()[0]
    except Exception:   # noqa: BLE001 -- only a description
        return "unknown MPI"
    return " ".join(first.replace("Version:", "").split())
