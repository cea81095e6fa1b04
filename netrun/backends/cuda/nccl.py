"""NCCL for data-parallel GPU jobs: a Communicator whose allreduce runs on the compute stream.

One process per GPU. The ranks already share an MPI communicator (netrun.train.dist.world);
rank 0 makes NCCL's unique id, MPI carries it to the others (`broadcast_object`), and every
rank joins the NCCL communicator on its own device. From then on device arrays (CuPy's) are
summed and broadcast by NCCL, queued on the stream given here (the GPU backend's, so in order
with the backward kernels that wrote the gradients and the unpack kernels that read them),
and everything that is not a device array or not an array at all goes to MPI: host buffers
(the loss, the stop flag, parameters broadcast at start), small objects, the barrier, abort.
`device_buffers = True` tells netrun.ops.collective to pack gradients into a device buffer.

Waiting. A started allreduce records a CUDA event after the NCCL kernel; `wait()` blocks the
host on that event, under the MPI communicator's watchdog (NETRUN_DIST_TIMEOUT). The device
would not need it: the unpack that follows is queued on the same stream after the NCCL
kernel. The host wait is there because NCCL has no timeout of its own: a peer that hangs
(not dies: the launcher ends a job whose process dies) would leave this rank blocked in its
next device sync forever; under the watchdog it ends the job as an MPI collective would.
It costs next to nothing: the waits are the last ops of the step net, and the trainer reads
the loss (a full sync) right after them anyway.

Reproducibility. NCCL picks an algorithm (ring, tree, ...), a protocol (LL, LL128, Simple)
and a number of channels from its tuning model — the message size, the rank count, the
topology it detects, its version — never from timing; each element is summed once along a
fixed path and the result sent to all, so every rank gets the same bits, and the next run
on the same machines gets them again. Two ranks are exact whatever NCCL picks (a + b ==
b + a). To keep the order fixed across NCCL versions or machines with more ranks, pin it:
NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=NCCL_MAX_NCHANNELS=<n>.

CuPy is imported lazily, in the functions that need it (this package never imports it when
loaded).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from netrun.errors import BackendError

NCCL_HINT = ("NCCL comes with CuPy's CUDA wheels through the nvidia-nccl wheel: pip install "
             "'netrun[gpu-cuda12]' nvidia-nccl-cu12 (or the cuda13 ones)")

# NumPy dtype name -> the name of cupy.cuda.nccl's constant.
_NCCL_TYPES = {"float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64", "float16": "NCCL_FLOAT16",
               "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
               "uint32": "NCCL_UINT32", "int64": "NCCL_INT64", "uint64": "NCCL_UINT64"}


def import_nccl() -> tuple[Any, Any]:
    """(cupy, cupy.cuda.nccl), or a BackendError that says what is missing."""
    try:
        import cupy  # optional: only a GPU job needs it
    except ImportError as e:
        raise BackendError(f"NCCL (data-parallel training on GPUs) needs CuPy, which is not "
                           f"installed ({e}): {NCCL_HINT}") from None
    nccl = getattr(cupy.cuda, "nccl", None)
    if nccl is None:
        try:
            from cupy.cuda import nccl
        except ImportError as e:
            raise BackendError(f"CuPy is installed but cannot load NCCL ({e}): "
                               f"{NCCL_HINT}") from None
    if not getattr(nccl, "available", True):
        raise BackendError(f"CuPy is installed but its NCCL module is not available: "
                           f"{NCCL_HINT}")
    return cupy, nccl


def device_count() -> int:
    """The CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies)."""
    try:
        import cupy  # optional
    except ImportError as e:
        raise BackendError(f"device 'gpu' needs CuPy, which is not installed ({e}): "
                           f"{NCCL_HINT}") from None
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:   # noqa: BLE001 -- CUDA driver missing or broken
        raise BackendError(f"CuPy is installed but no CUDA device is usable ({e})") from None


def _ptr(buf: Any) -> int:
    """The device address of a CuPy array."""
    return buf.data.ptr


class NcclCommunicator:
    """The Communicator of one GPU per rank: NCCL for device arrays, `mpi_comm` for the rest.

    mpi_comm: the job's communicator over MPI (an MpiCommunicator, or any Communicator: a
    SingleProcess makes a job of one, a smoke test of NCCL itself). device_id: this rank's
    GPU. stream: the CuPy stream NCCL's kernels are queued on (the GPU backend's compute
    stream); None: the stream current at each call. Collective: every rank calls this.
    """

    device_buffers = True   # netrun.ops.collective packs gradients on the device

    def __init__(self, mpi_comm: Any, device_id: int, stream: Any = None):
        self._mpi = mpi_comm
        self.rank, self.size = int(mpi_comm.rank), int(mpi_comm.size)
        self.device_id = int(device_id)
        self.watchdog = getattr(mpi_comm, "watchdog", None)
        # Every rank learns whether every rank can go on before any waits in NCCL's init:
        # a rank that cannot load NCCL must not leave the others waiting for it.
        problem, cupy, nccl, uid = None, None, None, None
        try:
            cupy, nccl = import_nccl()
            if self.rank == 0:
                uid = nccl.get_unique_id()
        except BackendError as e:
            problem = str(e)
        except Exception as e:   # noqa: BLE001 -- NCCL's own (its bootstrap, the driver)
            problem = f"NCCL could not start: {type(e).__name__}: {e}"
        uid = mpi_comm.broadcast_object(uid)
        failed = np.array([1.0 if problem else 0.0])
        mpi_comm.allreduce_sum(failed)
        if problem:
            raise BackendError(f"rank {self.rank}: {problem}")
        if failed[0] or uid is None:
            raise BackendError(f"rank {self.rank}: NCCL cannot start on "
                               f"{int(failed[0])} other rank(s) of the job (their messages "
                               f"say why)")
        self._cupy, self._nccl = cupy, nccl
        self._stream = stream
        self._device = cupy.cuda.Device(self.device_id)
        with self._device:
            self._comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        self.version = _version(nccl)

    # Device arrays: NCCL on the stream ---------------------------------------------------------
    def _device_array(self, buf: Any, what: str) -> bool:
        if not isinstance(buf, self._cupy.ndarray):
            return False
        if not buf.flags.c_contiguous:
            raise BackendError(f"{what} takes a C-contiguous device array, got strides "
                               f"{buf.strides}")
        if buf.dtype.name not in _NCCL_TYPES:
            raise BackendError(f"{what}: NCCL cannot sum {buf.dtype} arrays")
        return True

    def _stream_now(self) -> Any:
        return self._stream if self._stream is not None else self._cupy.cuda.get_current_stream()

    def _type(self, buf: Any) -> int:
        return getattr(self._nccl, _NCCL_TYPES[buf.dtype.name])

    def _allreduce(self, buf: Any, stream: Any) -> None:
        if buf.size:
            with self._device:
                self._comm.allReduce(_ptr(buf), _ptr(buf), buf.size, self._type(buf),
                                     self._nccl.NCCL_SUM, stream.ptr)

    def allreduce_sum(self, buf: Any) -> None:
        """Sum `buf` over all ranks in place: on the stream for a device array (the host sees
        it after its next sync), through MPI for a host one."""
        if not self._device_array(buf, "allreduce_sum"):
            self._mpi.allreduce_sum(buf)
            return
        self._allreduce(buf, self._stream_now())

    def start_allreduce_sum(self, buf: Any) -> Any:
        """Queue the sum of `buf` on the stream; the request's wait() blocks the host until it
        is done (see the module). A host buffer goes to MPI's non-blocking allreduce."""
        if not self._device_array(buf, "start_allreduce_sum"):
            return self._mpi.start_allreduce_sum(buf)
        stream = self._stream_now()
        self._allreduce(buf, stream)
        with self._device:
            event = self._cupy.cuda.Event(disable_timing=True)
            event.record(stream)
        return NcclRequest(event, buf, self.watchdog)

    def broadcast(self, buf: Any, root: int = 0) -> None:
        """Overwrite `buf` with root's: NCCL on the stream for a device array, else MPI."""
        if not self._device_array(buf, "broadcast"):
            self._mpi.broadcast(buf, root)
            return
        if buf.size:
            with self._device:
                self._comm.bcast(_ptr(buf), buf.size, self._type(buf), root,
                                 self._stream_now().ptr)

    # Everything else: MPI ----------------------------------------------------------------------
    def broadcast_object(self, value: Any, root: int = 0) -> Any:
        """Root's small value on every rank (MPI)."""
        return self._mpi.broadcast_object(value, root)

    def barrier(self) -> None:
        """Wait until every rank got here (MPI; device work already queued is not waited for)."""
        self._mpi.barrier()

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (MPI_Abort; the driver frees NCCL's resources)."""
        self._mpi.abort(code)

    def abort_at_exit(self, code: int) -> None:
        """End every rank when this process exits (as MpiCommunicator does)."""
        hook = getattr(self._mpi, "abort_at_exit", None)
        if hook is not None:
            hook(code)

    def close(self) -> None:
        """Free NCCL's resources (collective; the object is unusable afterwards)."""
        comm, self._comm = getattr(self, "_comm", None), None
        if comm is not None:
            with self._device:
                comm.destroy()

    def __repr__(self) -> str:
        return (f"NcclCommunicator(rank {self.rank} of {self.size}, gpu:{self.device_id}, "
                f"NCCL {self.version}, over {self._mpi!r})")


class NcclRequest:
    """A queued device allreduce; holds its buffer until the host saw it complete."""

    __slots__ = ("_buf", "_event", "_watchdog")

    def __init__(self, event: Any, buf: Any, watchdog: Any):
        self._event, self._buf, self._watchdog = event, buf, watchdog

    def test(self) -> bool:
        """Whether the NCCL kernel has finished (a query: never blocks)."""
        if self._event is None:
            return True
        if self._event.done:
            self._event = self._buf = None
            return True
        return False

    def wait(self) -> None:
        """Block the host until the sum is complete, under the watchdog when there is one."""
        if self._event is None:
            return
        dog = self._watchdog
        if dog is not None:
            dog.arm("allreduce (NCCL)")
        try:
            self._event.synchronize()   # CuPy releases the GIL: the watchdog thread runs
        finally:
            if dog is not None:
                dog.disarm()
        self._event = self._buf = None


def _version(nccl: Any) -> str:
    """'2.21.5' from NCCL's version code (2.9+: major*10000 + minor*100 + patch)."""
    try:
        code = int(nccl.get_version())
    except Exception:   # noqa: BLE001 -- only a description
        return "?"
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"
