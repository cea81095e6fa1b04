"""Data-parallel jobs on MPI: the communicator of a launched job, `--nproc`, and faults.

`world()` is the communicator of this process: `SingleProcess()` unless an MPI launcher
started it as one of several ranks, and then an `MpiCommunicator` over mpi4py (the `dist`
extra: mpi4py and MPICH from wheels). Nothing here imports mpi4py until a launched job asks
for it, so a run of one process never loads MPI.

`launch` is what `netrun train --nproc N` does: the same command again, under the `mpiexec`
that came with the wheel, N times. Across machines users call `mpiexec -n N -hosts a,b netrun
train ...` themselves; the ranks then find each other through the same `world()`.

Faults. MPICH's launcher (hydra) kills every rank within milliseconds when one dies (a
signal, or an exit without finishing MPI). Two cases it cannot see are handled here:
a rank that leaves by an error (its exit would finish MPI, which waits for ranks that wait
for it: use `abort_on_error`), and a rank that hangs or whose machine is gone (the
`Watchdog` inside `MpiCommunicator` ends a collective that waited longer than
NETRUN_DIST_TIMEOUT seconds).
"""
from __future__ import annotations

from netrun.train.dist.errors import DistError
from netrun.train.dist.mpi import (
    MpiCommunicator,
    abort_on_error,
    exit_status,
    launched_rank,
    launched_size,
    world,
)
from netrun.train.dist.watchdog import TIMEOUT_ENV, TIMEOUT_STATUS, Watchdog

__all__ = ["TIMEOUT_ENV", "TIMEOUT_STATUS", "DistError", "MpiCommunicator", "Watchdog",
           "abort_on_error", "exit_status", "launched_rank", "launched_size", "world"]
