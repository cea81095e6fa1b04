"""NCCL for data-parallel GPU jobs (netrun.backends.cuda.nccl, netrun.train.dist.gpu).

What runs everywhere: the GPU each rank picks from its launcher's environment, the clear
error without CuPy, imports that never load CuPy, and — on the host emulator of
tests/gpu/emulator.py with a stand-in for cupy.cuda.nccl — the communicator's plumbing (the
id sent over MPI, NCCL calls on the backend's stream with the right address, count and type,
host values through MPI) and the device-buffer path of AllreduceStart/AllreduceWait (no
gradient copied to the host). What needs real GPUs is marked `gpu` and skipped elsewhere: a
one-rank NCCL smoke on one GPU, and two ranks under mpiexec on two GPUs.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import netrun
from netrun.backends.cuda import nccl as nccl_module
from netrun.core.comm import SingleProcess
from netrun.core.workspace import Workspace
from netrun.errors import BackendError, NetrunError
from netrun.train.dist import DistError
from netrun.train.dist.gpu import choose_gpu, gpu_world, local_rank
from tests.checks import checks_ops
from tests.dist.helpers import REPO, job_env, run_mpi


# The GPU each rank takes ---------------------------------------------------------------------
def test_local_rank_comes_from_the_launcher_else_the_rank():
    assert local_rank(5, 4, {"MPI_LOCALRANKID": "1"}) == 1                  # MPICH's hydra
    assert local_rank(5, 4, {"OMPI_COMM_WORLD_LOCAL_RANK": "2"}) == 2       # Open MPI
    assert local_rank(5, 4, {"SLURM_LOCALID": "3"}) == 3                    # srun
    assert local_rank(5, 4, {"MPI_LOCALRANKID": "0", "SLURM_LOCALID": "3"}) == 0
    assert local_rank(5, 4, {}) == 1                                        # 5 % 4
    assert local_rank(5, 4, {"MPI_LOCALRANKID": " "}) == 1                  # blank: unset
    with pytest.raises(DistError, match="MPI_LOCALRANKID='x'"):
        local_rank(0, 4, {"MPI_LOCALRANKID": "x"})


def test_the_device_string_is_gpu_and_the_local_rank_modulo_the_gpus():
    assert choose_gpu(0, 2, {"MPI_LOCALRANKID": "1"}) == "gpu:1"
    assert choose_gpu(7, 8, {}) == "gpu:7"
    assert choose_gpu(9, 8, {}) == "gpu:1"
    # One visible GPU per rank (the launcher set CUDA_VISIBLE_DEVICES): always its gpu:0.
    assert choose_gpu(3, 1, {"SLURM_LOCALID": "3"}) == "gpu:0"
    with pytest.raises(DistError, match="sees none"):
        choose_gpu(0, 0, {})


class _Job:
    """A stand-in for the job's MPI communicator: records calls; rank 0 of `size` unless
    told; `others_failed` is what the other ranks add to the start-up failure count."""

    def __init__(self, rank: int = 0, size: int = 2, root_value=None, others_failed=0.0,
                 watchdog=None):
        self.rank, self.size = rank, size
        self.root_value, self.others_failed = root_value, others_failed
        self.watchdog = watchdog
        self.calls: list[tuple] = []

    def broadcast_object(self, value, root=0):
        self.calls.append(("broadcast_object", value))
        return value if self.rank == root else self.root_value

    def allreduce_sum(self, buf):
        self.calls.append(("allreduce_sum", type(buf).__name__, buf.dtype.name))
        if buf.dtype == np.float64 and buf.shape == (1,):
            buf += self.others_failed
        else:
            buf += 1                    # the other rank's contribution: ones

    def start_allreduce_sum(self, buf):
        self.allreduce_sum(buf)
        return SingleProcess().start_allreduce_sum(buf)

    def broadcast(self, buf, root=0):
        self.calls.append(("broadcast", type(buf).__name__))

    def barrier(self):
        self.calls.append(("barrier",))

    def abort(self, code=1):
        self.calls.append(("abort", code))


def test_a_cpu_device_or_a_job_of_one_is_left_as_it_is():
    job = _Job()
    assert gpu_world("cpu", job) == ("cpu", job)
    one = SingleProcess()
    assert gpu_world("gpu", one) == ("gpu", one)
    assert not job.calls


class _Neighbour(_Job):
    """Rank 0 of two, whose other rank reports the same GPU key as this one, or another."""

    def __init__(self, same_gpu: bool):
        super().__init__()
        self.same_gpu = same_gpu

    def allreduce_sum(self, buf):
        if buf.shape != (2,):       # not the GPU keys (NCCL's start-up failure count)
            return super().allreduce_sum(buf)
        self.calls.append(("allreduce_sum", type(buf).__name__, buf.dtype.name))
        buf[1] = buf[0] if self.same_gpu else buf[0] + 1


@pytest.mark.parametrize("same_gpu", [False, True])
def test_ranks_on_one_gpu_sum_through_mpi_and_others_through_nccl(emulated_nccl, same_gpu,
                                                                  caplog):
    """NCCL refuses two ranks on one GPU: such a job keeps MPI for gradients, and says so."""
    backend, fake = emulated_nccl
    job = _Neighbour(same_gpu)
    with caplog.at_level("WARNING", logger="netrun.dist"):
        device, comm = gpu_world("gpu:0", job)
    assert device == "gpu:0"
    assert job.calls[0] == ("allreduce_sum", "ndarray", "float64")   # the GPUs compared
    if same_gpu:
        assert comm is job and not fake.calls
        assert "ranks share a GPU" in caplog.text and "through MPI" in caplog.text
    else:
        assert isinstance(comm, nccl_module.NcclCommunicator) and fake.calls[0][0] == "init"
        assert "share" not in caplog.text
        comm.close()


# Without CuPy --------------------------------------------------------------------------------
def test_asking_for_nccl_without_cupy_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)          # as if CuPy were not installed
    job = _Job()
    with pytest.raises(BackendError, match=r"rank 0: NCCL .* needs CuPy.*pip install") as e:
        nccl_module.NcclCommunicator(job, 0)
    assert isinstance(e.value, NetrunError)
    # Every rank learned of it before any could wait in NCCL's start.
    assert [c[0] for c in job.calls] == ["broadcast_object", "allreduce_sum"]
    with pytest.raises(BackendError, match="needs CuPy"):
        gpu_world("gpu", _Job())


def test_nccl_modules_import_without_loading_cupy():
    code = textwrap.dedent("""\
        import sys
        import netrun, netrun.ops.collective
        import netrun.backends.cuda.nccl, netrun.train.dist.gpu
        print("cupy" in sys.modules, "mpi4py" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env=job_env(), cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


# On the host emulator, with a stand-in for NCCL -----------------------------------------------
_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int32": ctypes.c_int32}


class _FakeNccl:
    """cupy.cuda.nccl as NcclCommunicator uses it. Its allReduce adds the other ranks'
    contributions (`other` each) to the device memory at the address it is given."""

    available = True
    NCCL_SUM = 0

    def __init__(self, other: float = 1.0):
        for i, name in enumerate(sorted(set(nccl_module._NCCL_TYPES.values()))):
            setattr(self, name, 100 + i)
        self._types = {getattr(self, v): k for k, v in nccl_module._NCCL_TYPES.items()}
        self.other = other
        self.ids_made = 0
        self.calls: list[tuple] = []

    def get_unique_id(self):
        self.ids_made += 1
        return b"\x07" * 128

    def get_version(self):
        return 22105

    def NcclCommunicator(self, ndev, uid, rank):     # CuPy's name
        fake = self

        class Comm:
            def allReduce(self, send, recv, count, dtype, op, stream):
                fake.calls.append(("allReduce", send, recv, count, fake._types[dtype], op,
                                   stream))
                memory = (_CTYPES[fake._types[dtype]] * count).from_address(recv)
                np.ctypeslib.as_array(memory)[...] += fake.other * (ndev - 1)

            def bcast(self, buf, count, dtype, root, stream):
                fake.calls.append(("bcast", buf, count, fake._types[dtype], root, stream))

            def destroy(self):
                fake.calls.append(("destroy",))

        self.calls.append(("init", ndev, uid, rank))
        return Comm()


@pytest.fixture
def emulated_nccl(monkeypatch):
    """(the emulated GPU backend, the fake NCCL module): cupy is the host emulator."""
    if shutil.which("g++") is None:
        pytest.skip("the GPU emulator compiles CUDA sources with g++, which is not installed")
    from tests.gpu.emulator import CUPY, emulated_gpu

    fake = _FakeNccl()
    monkeypatch.setattr(CUPY.cuda, "nccl", fake, raising=False)
    # Emulated device arrays are host memory: their address is NumPy's.
    monkeypatch.setattr(nccl_module, "_ptr", lambda buf: buf.__array_interface__["data"][0])
    with emulated_gpu() as backend:
        yield backend, fake


def _address(a) -> int:
    return a.__array_interface__["data"][0]


def test_the_id_travels_over_mpi_and_device_arrays_go_to_nccl_on_the_stream(emulated_nccl):
    backend, fake = emulated_nccl
    job = _Job(rank=0, size=2)
    comm = nccl_module.NcclCommunicator(job, backend.index, stream=backend.stream)
    assert comm.device_buffers and (comm.rank, comm.size) == (0, 2)
    assert fake.ids_made == 1 and job.calls[0] == ("broadcast_object", b"\x07" * 128)
    assert fake.calls == [("init", 2, b"\x07" * 128, 0)]
    assert "NCCL 2.21.5" in repr(comm)

    x = backend.to_device(np.arange(6, dtype=np.float32))
    comm.allreduce_sum(x)
    assert fake.calls[-1] == ("allReduce", _address(x), _address(x), 6, "float32",
                              fake.NCCL_SUM, backend.stream.ptr)
    np.testing.assert_array_equal(backend.to_host(x), np.arange(6) + 1)
    request = comm.start_allreduce_sum(x)
    request.wait()
    assert request.test()
    np.testing.assert_array_equal(backend.to_host(x), np.arange(6) + 2)
    d = backend.to_device(np.zeros(3, np.float64))
    comm.broadcast(d, root=1)
    assert fake.calls[-1] == ("bcast", _address(d), 3, "float64", 1, backend.stream.ptr)

    # Host values, objects, the barrier and abort are MPI's.
    job.calls.clear()
    loss = np.array([2.0])
    comm.allreduce_sum(loss)
    comm.start_allreduce_sum(np.ones(2, np.float32)).wait()
    comm.broadcast(np.ones(2, np.float32))
    assert comm.broadcast_object("x") == "x"
    comm.barrier()
    comm.abort(3)
    assert [c[0] for c in job.calls] == ["allreduce_sum", "allreduce_sum", "broadcast",
                                         "broadcast_object", "barrier", "abort"]
    assert job.calls[-1] == ("abort", 3)
    with pytest.raises(BackendError, match="C-contiguous"):
        comm.allreduce_sum(backend.to_device(np.ones((4, 4), np.float32))[:, ::2])
    comm.close()
    assert fake.calls[-1] == ("destroy",)


def test_other_ranks_take_rank_0s_id_and_a_failure_anywhere_stops_all(emulated_nccl):
    _, fake = emulated_nccl
    comm = nccl_module.NcclCommunicator(_Job(rank=1, root_value=b"\x05" * 128), 0)
    assert fake.ids_made == 0 and fake.calls == [("init", 2, b"\x05" * 128, 1)]
    assert comm.rank == 1
    with pytest.raises(BackendError, match="rank 1: NCCL cannot start on 1 other rank"):
        nccl_module.NcclCommunicator(_Job(rank=1, root_value=None, others_failed=1.0), 0)


def test_the_wait_blocks_under_the_watchdog(emulated_nccl):
    backend, _ = emulated_nccl

    class Dog:
        def __init__(self):
            self.log: list[str] = []

        def arm(self, what):
            self.log.append(what)

        def disarm(self):
            self.log.append("disarm")

    dog = Dog()
    comm = nccl_module.NcclCommunicator(_Job(watchdog=dog), 0, stream=backend.stream)
    comm.start_allreduce_sum(backend.to_device(np.ones(2, np.float32))).wait()
    assert dog.log == ["allreduce (NCCL)", "disarm"]


def _exchange(ws: Workspace) -> None:
    ws.run_operator_once(netrun.op("AllreduceStart", ["g", "h"], ["t"], bucket="b"))
    ws.run_operator_once(netrun.op("AllreduceWait", ["t", "g", "h"], ["g", "h"], bucket="b"))


@checks_ops("AllreduceStart", "AllreduceWait", kind="reference")
def test_gradients_are_packed_summed_and_averaged_on_the_device(emulated_nccl):
    backend, fake = emulated_nccl
    comm = nccl_module.NcclCommunicator(_Job(), 0, stream=backend.stream)
    ws = Workspace("gpu", comm=comm)
    g = np.arange(6, dtype=np.float32).reshape(2, 3)
    h = np.full(4, 3.0, np.float32)
    ws.feed_blob("g", g)
    ws.feed_blob("h", h)
    before = backend.transfers.snapshot()
    _exchange(ws)
    moved = backend.transfers.since(before)
    assert (moved.to_host, moved.to_device) == (0, 0)        # nothing left the device
    reduce = [c for c in fake.calls if c[0] == "allReduce"]
    assert len(reduce) == 1 and reduce[0][3:5] == (10, "float32")     # one fused buffer
    assert reduce[0][6] == backend.stream.ptr
    # The other rank's gradients are ones: each is now the mean of the two.
    np.testing.assert_array_equal(ws.fetch_blob("g"), (g + 1) * np.float32(0.5))
    np.testing.assert_array_equal(ws.fetch_blob("h"), (h + 1) * np.float32(0.5))
    assert not ws.collectives


def test_a_cpu_workspace_keeps_the_host_buffer_with_a_device_communicator():
    class DeviceComm(_Job):
        device_buffers = True

    comm = DeviceComm()
    ws = Workspace("cpu", comm=comm)
    g = np.arange(6, dtype=np.float32).reshape(2, 3)
    ws.feed_blob("g", g)
    ws.feed_blob("h", np.ones(4, np.float32))
    _exchange(ws)
    assert comm.calls == [("allreduce_sum", "ndarray", "float32")]
    np.testing.assert_array_equal(ws.fetch_blob("g"), (g + 1) * np.float32(0.5))


# On real GPUs ---------------------------------------------------------------------------------
def _gpus() -> int:
    try:
        nccl_module.import_nccl()
        return nccl_module.device_count()
    except NetrunError:
        return 0


@pytest.mark.gpu
def test_one_rank_nccl_smoke_on_a_real_gpu():
    if _gpus() < 1:
        pytest.skip("no CuPy with NCCL, or no CUDA device")
    from netrun.backends import get_backend

    backend = get_backend("gpu:0")
    comm = nccl_module.NcclCommunicator(SingleProcess(), 0, stream=backend.stream)
    x = backend.to_device(np.arange(1000, dtype=np.float32))
    comm.allreduce_sum(x)
    comm.start_allreduce_sum(x).wait()
    comm.broadcast(x)
    np.testing.assert_array_equal(backend.to_host(x), np.arange(1000, dtype=np.float32))
    ws = Workspace("gpu:0", comm=comm)
    g = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    ws.feed_blob("g", g)
    ws.feed_blob("h", np.ones(4, np.float32))
    before = backend.transfers.snapshot()
    _exchange(ws)
    assert backend.transfers.since(before).to_host == 0
    np.testing.assert_array_equal(ws.fetch_blob("g"), g)
    comm.close()


_TWO_RANKS = textwrap.dedent("""\
    import hashlib, json
    import numpy as np
    import netrun
    from netrun.core.workspace import Workspace
    from netrun.train.dist import world
    from netrun.train.dist.gpu import gpu_world
    from netrun.backends import get_backend

    def grads(rank):
        rng = np.random.default_rng(rank)
        return (rng.standard_normal((257, 129)).astype(np.float32),
                rng.standard_normal(1000).astype(np.float32))

    device, comm = gpu_world("gpu", world())
    backend = get_backend(device)
    g, h = grads(comm.rank)
    ws = Workspace(device, comm=comm)
    ws.feed_blob("g", g)
    ws.feed_blob("h", h)
    ws.run_operator_once(netrun.op("AllreduceStart", ["g", "h"], ["t"], bucket="b"))
    ws.run_operator_once(netrun.op("AllreduceWait", ["t", "g", "h"], ["g", "h"], bucket="b"))
    out = np.concatenate([ws.fetch_blob("g").ravel(), ws.fetch_blob("h").ravel()])
    (g0, h0), (g1, h1) = grads(0), grads(1)
    ref = np.concatenate([(g0 + g1).ravel(), h0 + h1]) * np.float32(0.5)
    x = backend.to_device(np.full(8, comm.rank, np.float32))
    comm.broadcast(x, root=1)
    print(json.dumps({"rank": comm.rank, "device": device,
                      "digest": hashlib.sha256(out.tobytes()).hexdigest(),
                      "exact": bool(np.array_equal(out, ref)),
                      "bcast": backend.to_host(x).tolist()}), flush=True)
""")


@pytest.mark.gpu
def test_two_ranks_on_two_gpus_average_gradients_with_nccl():
    if _gpus() < 2:
        pytest.skip("needs CuPy with NCCL and two CUDA devices")
    import json

    done = run_mpi(2, ["-c", _TWO_RANKS], timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    rows = sorted((json.loads(line) for line in done.stdout.splitlines()
                   if line.startswith("{")), key=lambda r: r["rank"])
    assert [r["device"] for r in rows] == ["gpu:0", "gpu:1"]
    assert rows[0]["digest"] == rows[1]["digest"]       # the same bits on both ranks
    assert all(r["exact"] for r in rows)                # two summands: a + b exactly
    assert all(r["bcast"] == [1.0] * 8 for r in rows)


@pytest.mark.gpu
def test_two_ranks_on_one_gpu_average_gradients_through_mpi():
    """What a one-GPU machine runs for `--nproc 2 --device gpu`: both ranks on gpu:0, the
    gradients summed on the host by MPI (NCCL would refuse the shared GPU)."""
    if _gpus() != 1:
        pytest.skip("needs CuPy and exactly one CUDA device")
    import json

    # MPI moves host buffers only (the mpich wheel is not CUDA-aware): no device broadcast.
    script = _TWO_RANKS.replace("comm.broadcast(x, root=1)", "x[...] = 1")
    done = run_mpi(2, ["-c", script], timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    rows = sorted((json.loads(line) for line in done.stdout.splitlines()
                   if line.startswith("{")), key=lambda r: r["rank"])
    assert [r["device"] for r in rows] == ["gpu:0", "gpu:0"]
    assert rows[0]["digest"] == rows[1]["digest"] and all(r["exact"] for r in rows)
    assert "ranks share a GPU" in done.stderr
