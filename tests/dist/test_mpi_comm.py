"""The MPI communicator: `world()` from the launcher's environment, each collective under
`mpiexec`, and sums that are the same bits on every rank and in every run."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from netrun.core.comm import SingleProcess
from netrun.train import dist
from netrun.train.dist.watchdog import DEFAULT_TIMEOUT, timeout_from_env
from tests.dist.helpers import job_env, require_mpi, run_mpi

SIZES = (1000, 300_000)     # MPICH sums these with different algorithms


def test_the_launcher_environment_gives_size_and_rank():
    assert dist.launched_size({}) == 1 and dist.launched_rank({}) == 0
    assert dist.launched_size({"PMI_SIZE": "4", "PMI_RANK": "3"}) == 4
    assert dist.launched_rank({"PMI_SIZE": "4", "PMI_RANK": "3"}) == 3
    ompi = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}
    assert dist.launched_size(ompi) == 2 and dist.launched_rank(ompi) == 1
    assert dist.launched_size({"PMI_SIZE": ""}) == 1


def test_one_process_gets_single_process_and_never_loads_mpi():
    code = textwrap.dedent("""\
        import sys
        import netrun.cli.train_cmd
        from netrun.train import dist
        comm = dist.world()
        print(type(comm).__name__, "mpi4py" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=job_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["SingleProcess", "False"]


def test_a_launched_rank_without_mpi4py_says_how_to_install(monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setitem(sys.modules, "mpi4py", None)    # as if not installed
    with pytest.raises(dist.DistError, match=r"rank 1 of 2.*pip install 'netrun\[dist\]'"):
        dist.world()


def test_a_launcher_of_another_mpi_is_a_clear_error():
    require_mpi()
    # PMI_SIZE without a launcher: what a foreign mpiexec looks like to this MPI (a world
    # of one), which would otherwise train N copies that each think they are rank 0.
    code = "from netrun.train import dist; dist.world()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=job_env({"PMI_SIZE": "2", "PMI_RANK": "0"}), timeout=60)
    assert done.returncode != 0
    assert "the launcher started 2 ranks, but MPI sees 1" in done.stderr


def test_the_timeout_comes_from_the_environment():
    assert timeout_from_env({}) == DEFAULT_TIMEOUT
    assert timeout_from_env({"NETRUN_DIST_TIMEOUT": "2.5"}) == 2.5
    assert timeout_from_env({"NETRUN_DIST_TIMEOUT": "0"}) is None
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(dist.DistError, match="NETRUN_DIST_TIMEOUT"):
            timeout_from_env({"NETRUN_DIST_TIMEOUT": bad})


def test_exit_statuses_follow_the_cli():
    from netrun.errors import DataError

    assert dist.exit_status(SystemExit(0)) == 0 and dist.exit_status(SystemExit(None)) == 0
    assert dist.exit_status(SystemExit(3)) == 3 and dist.exit_status(SystemExit("x")) == 1
    assert dist.exit_status(KeyboardInterrupt()) == 130
    assert dist.exit_status(DataError("bad shard")) == 2
    assert dist.exit_status(RuntimeError("bug")) == 1


SUMS = textwrap.dedent("""\
    import sys
    import numpy as np
    from netrun.train import dist

    comm = dist.world()
    out = {}
    for dtype in ("float32", "float64"):
        for n in SIZES:
            # Magnitudes over eight decades: which pairs are added first changes the rounding.
            rng = np.random.default_rng([comm.rank, n])
            x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 4, n)).astype(dtype)
            out[f"in_{dtype}_{n}"] = x.copy()
            blocking = x.copy()
            comm.allreduce_sum(blocking)
            started = x.copy()
            request = comm.start_allreduce_sum(started)
            request.wait()
            out[f"sum_{dtype}_{n}"], out[f"isum_{dtype}_{n}"] = blocking, started
    np.savez(f"{sys.argv[1]}/rank{comm.rank}.npz", **out)
""").replace("SIZES", repr(SIZES))


def test_sums_are_the_same_bits_on_every_rank_and_in_every_run(tmp_path):
    script = tmp_path / "sums.py"
    script.write_text(SUMS)
    runs = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        done = run_mpi(3, [script, tmp_path / run], timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        runs.append([dict(np.load(tmp_path / run / f"rank{r}.npz")) for r in range(3)])
    first = runs[0]
    for dtype in ("float32", "float64"):
        for n in SIZES:
            inputs = [first[r][f"in_{dtype}_{n}"] for r in range(3)]
            a, b, c = inputs
            # The data is order-sensitive: two association orders round differently.
            assert not np.array_equal((a + b) + c, a + (b + c))
            exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
            for key in (f"sum_{dtype}_{n}", f"isum_{dtype}_{n}"):
                result = first[0][key]
                assert result.dtype == np.dtype(dtype)
                np.testing.assert_allclose(result, exact, rtol=1e-5 if dtype == "float32"
                                           else 1e-12, atol=1e-3 if dtype == "float32"
                                           else 1e-9)
                for run in runs:
                    for rank in range(3):
                        assert run[rank][key].tobytes() == result.tobytes(), (key, rank)


COLLECTIVES = textwrap.dedent("""\
    import json
    import sys
    import numpy as np
    from netrun.errors import InternalError
    from netrun.train import dist

    comm = dist.world()
    assert dist.world() is comm
    got = {"rank": comm.rank, "size": comm.size, "repr": repr(comm)}
    buf = np.full(5, float(comm.rank), np.float32)
    comm.broadcast(buf, root=1)
    got["broadcast"] = buf.tolist()
    got["object"] = comm.broadcast_object({"step": 7, "who": comm.rank} if comm.rank == 0
                                          else None)
    counts = np.array([comm.rank + 1], np.int64)
    request = comm.start_allreduce_sum(counts)
    while not request.test():
        pass
    request.wait()
    got["count"] = int(counts[0])
    try:
        comm.allreduce_sum(np.zeros((4, 4), np.float32)[:, 0])
    except InternalError as e:
        got["strided"] = str(e)
    comm.barrier()
    with open(f"{sys.argv[1]}/rank{comm.rank}.json", "w") as f:
        json.dump(got, f)
""")


def test_collectives_under_two_ranks(tmp_path):
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES)
    # Files, not stdout: mpiexec passes the ranks' output on without keeping lines whole.
    done = run_mpi(2, [script, tmp_path], timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [g["rank"] for g in ranks] == [0, 1] and {g["size"] for g in ranks} == {2}
    for got in ranks:
        assert got["repr"].startswith(f"MpiCommunicator(rank {got['rank']} of 2, MPI")
        assert got["broadcast"] == [1.0] * 5
        assert got["object"] == {"step": 7, "who": 0}
        assert got["count"] == 3
        assert "C-contiguous" in got["strided"]


def test_one_rank_under_mpiexec_is_a_single_process(tmp_path):
    code = ("import sys; from netrun.train import dist; "
            "print(type(dist.world()).__name__, 'mpi4py' in sys.modules)")
    done = run_mpi(1, ["-c", code], timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["SingleProcess", "False"]


def test_single_process_is_the_identity():
    comm = SingleProcess()
    buf = np.arange(3, dtype=np.float32)
    comm.allreduce_sum(buf)
    comm.start_allreduce_sum(buf).wait()
    assert buf.tolist() == [0, 1, 2] and comm.broadcast_object("x") == "x"
    with pytest.raises(ValueError), dist.abort_on_error(comm):
        raise ValueError("nothing to abort in a job of one")
