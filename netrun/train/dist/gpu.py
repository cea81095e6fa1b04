"""Data-parallel jobs on GPUs: one process per GPU, chosen by the rank's place on its node,
and the NCCL communicator built over the job's MPI one (netrun.backends.cuda.nccl).

`gpu_world(device, comm)` is what the trainer calls for a GPU job of several ranks: a plain
'gpu' becomes 'gpu:<local rank>' (an explicit 'gpu:N' is kept: a job of one rank per node,
or a launcher that gives each rank its own CUDA_VISIBLE_DEVICES), and the MPI communicator
is wrapped so that gradients are summed by NCCL on the GPU backend's stream while host values
and small objects still go through MPI. Nothing here imports CuPy (the backend does).
"""
from __future__ import annotations

import logging
import os
import socket
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from netrun.core.comm import Communicator
from netrun.train.dist.errors import DistError

log = logging.getLogger("netrun.dist")

# This process's index among the ranks of its own machine, as launchers say: MPICH's hydra
# (and Intel MPI's), Open MPI's, Slurm's srun.
LOCAL_RANK_ENV = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")


def local_rank(rank: int, device_count: int, environ: Mapping[str, str] | None = None) -> int:
    """This rank's index on its node (the launcher's variable), else rank % device_count."""
    env = os.environ if environ is None else environ
    for name in LOCAL_RANK_ENV:
        value = env.get(name, "").strip()
        if value:
            if not value.isdigit():
                raise DistError(f"{name}={value!r}: expected this process's index among the "
                                f"ranks of its machine (a number)")
            return int(value)
    return rank % max(device_count, 1)


def choose_gpu(rank: int, device_count: int, environ: Mapping[str, str] | None = None) -> str:
    """'gpu:<n>': the GPU of this rank, n = its local rank modulo the GPUs it sees.

    Two ranks of a node on one GPU is not a configuration NCCL runs (it refuses a duplicate
    GPU in one communicator): gpu_world then sums gradients through MPI on the host.
    """
    if device_count < 1:
        raise DistError("a data-parallel GPU job needs a CUDA device on every node, and this "
                        "one sees none (check CUDA_VISIBLE_DEVICES)")
    return f"gpu:{local_rank(rank, device_count, environ) % device_count}"


def gpu_world(device: str, comm: Communicator,
              environ: Mapping[str, str] | None = None) -> tuple[str, Communicator]:
    """(the device this rank trains on, the communicator to train with) for a GPU job.

    A job of one rank, or a CPU device, is returned as it is. Otherwise the device is picked
    by local rank (for a plain 'gpu') and `comm` is wrapped in an NcclCommunicator on that
    GPU's backend stream. Collective: every rank calls it.
    """
    from netrun.backends import get_backend, parse_device
    from netrun.backends.cuda.nccl import NcclCommunicator, device_count

    kind, _ = parse_device(device)
    if kind != "gpu" or comm.size <= 1:
        return device, comm
    if ":" not in device:
        device = choose_gpu(comm.rank, device_count(), environ)
    backend = get_backend(device)
    if shares_its_gpu(comm, backend):
        # NCCL refuses two ranks on one GPU; the host exchange still trains the same.
        if comm.rank == 0:
            log.warning("ranks share a GPU (%d ranks, %d GPU(s) on this node): NCCL needs "
                        "one GPU per rank, so gradients are summed through MPI on the host, "
                        "which is slower", comm.size, device_count())
        return backend.device, comm
    return backend.device, NcclCommunicator(comm, backend.index, stream=backend.stream)


def shares_its_gpu(comm: Communicator, backend: Any) -> bool:
    """Whether another rank of the job trains on this rank's GPU (same machine, same PCI
    address). Collective: every rank calls it."""
    where = f"{socket.gethostname()}/{backend.pci_address}"
    # Each rank's key in its own slot (a CRC is exact in float64); the sum is every key.
    keys = np.zeros(comm.size, np.float64)
    keys[comm.rank] = zlib.crc32(where.encode()) + 1
    comm.allreduce_sum(keys)
    return int(np.count_nonzero(keys == keys[comm.rank])) > 1
