"""Data-parallel training on one machine, and the cost of the gradient exchange (issue 17).

    python benchmarks/bench_dist.py [--steps 20] [--only throughput,allreduce,overlap] [--json]

- throughput: ResNet-20 (batch 128) and cifar10_quick (batch 100) trained by one process
  with 2 threads and by 2 ranks with 1 thread each (`netrun train --nproc 2`), same global
  batch, on random 3x32x32 data (an npz source); median step time from metrics.jsonl.
- allreduce: time of a sum over 2 ranks (MPICH from the wheel, shared memory) for messages
  from 8 B to ResNet-50's 25.6 M parameters; latency and bandwidth fitted to them; a ring
  allreduce model for 8 and 64 nodes from those numbers and from a network's.
- overlap: ResNet-50 at batch 8 (4 per rank) on 2 ranks: the time each step spends waiting
  for its gradient buckets, against the exchange alone, i.e. the share hidden behind backward.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
NETS = {"resnet20": ("zoo/resnet20.yaml", 128), "cifar10_quick": ("zoo/cifar10_quick.yaml", 100)}
SIZES = [2, 256, 16_384, 262_144, 2_097_152, 25_557_032]      # float32 values per message


def write_data(folder: Path, count: int = 2048) -> Path:
    """Random CIFAR-sized images and labels (the speed of a step does not depend on them)."""
    rng = np.random.default_rng(0)
    path = folder / "random32.npz"
    np.savez(path, x_train=rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8),
             y_train=rng.integers(0, 10, count), x_test=rng.integers(0, 256, (256, 3, 32, 32),
                                                                        dtype=np.uint8),
             y_test=rng.integers(0, 10, 256))
    return path


def write_config(folder: Path, net: str, data: Path, steps: int, name: str) -> Path:
    model, batch = NETS[net]
    path = folder / f"{name}.yaml"
    path.write_text(f"""\
model: {REPO / model}
data: {{source: npz, path: {data}, batch_size: {batch}, transform: {{scale: 0.0039}}}}
solver: {{type: sgd, base_lr: 0.01, momentum: 0.9, max_iter: {steps}, display: 1, seed: 1,
          test_interval: 0, snapshot: 0}}
output: {folder / name}
""")
    return path


def step_ms(run: Path, skip: int = 3) -> float:
    """Median step time of a run (the first `skip` steps bind and warm up)."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    times = [x["seconds"] for x in lines if "seconds" in x and "loss" in x][skip:]
    return 1000 * statistics.median(times)


def throughput(steps: int) -> list[dict]:
    """One process x 2 threads against 2 ranks x 1 thread, per net."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = write_data(folder)
        for net, (_, batch) in NETS.items():
            row = {"net": net, "batch": batch}
            for label, extra, threads in (("1x2", [], "2"), ("2x1", ["--nproc", "2"], "1")):
                cfg = write_config(folder, net, data, steps, f"{net}_{label}")
                env = {**os.environ, "NETRUN_THREADS": threads}
                done = subprocess.run([sys.executable, "-m", "netrun", "-q", "train", str(cfg),
                                       *extra], env=env, capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"{net} {label}: {done.stderr}")
                ms = step_ms(folder / f"{net}_{label}")
                row[f"{label}_step_ms"] = round(ms, 1)
                row[f"{label}_images_per_s"] = round(batch / ms * 1000, 1)
            row["ratio"] = round(row["2x1_images_per_s"] / row["1x2_images_per_s"], 3)
            rows.append(row)
            print(f"throughput {net}: {row}", file=sys.stderr)
    return rows


def _rank_main(mode: str, steps: int, out: str) -> None:
    """What each rank does under mpiexec (allreduce or overlap), rank 0 writing `out`."""
    from netrun.train.dist import world
    comm = world()
    result: dict = {}
    if mode == "allreduce":
        for n in SIZES:
            buf = np.ones(n, np.float32)
            comm.allreduce_sum(buf)                           # warm-up
            times = []
            for _ in range(5 if n > 1_000_000 else 50):
                comm.barrier()
                t0 = time.perf_counter()
                comm.allreduce_sum(buf)
                times.append(time.perf_counter() - t0)
            result[str(n)] = 1000 * statistics.median(times)
    else:
        result = _overlap(comm, steps)
    if comm.rank == 0:
        Path(out).write_text(json.dumps(result))


class _TimedWaits:
    """A communicator that adds up how long the gradient buckets' waits block."""

    def __init__(self, comm):
        self.comm, self.rank, self.size, self.waited = comm, comm.rank, comm.size, 0.0

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def start_allreduce_sum(self, buf):
        request, outer = self.comm.start_allreduce_sum(buf), self

        class Timed:
            def test(self):
                return request.test()

            def wait(self):
                t0 = time.perf_counter()
                request.wait()
                outer.waited += time.perf_counter() - t0

        return Timed()


def _overlap(comm, steps: int) -> dict:
    """ResNet-50, 4 examples per rank: waits per step against the exchange alone."""
    from netrun.train.config import config_from_dict
    from netrun.train.trainer import Trainer
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        path = Path(tmp) / "r50.npz"
        np.savez(path, x_train=rng.integers(0, 256, (64, 3, 224, 224), dtype=np.uint8),
                 y_train=rng.integers(0, 1000, 64), x_test=np.zeros((8, 3, 224, 224), np.uint8),
                 y_test=np.zeros(8, np.int64))
        cfg = config_from_dict({
            "model": str(REPO / "zoo/resnet50.yaml"),
            "data": {"source": "npz", "path": str(path), "batch_size": 8,
                     "num_classes": 1000},
            "solver": {"type": "sgd", "base_lr": 0.01, "momentum": 0.9, "max_iter": 1000,
                       "display": 0, "seed": 1, "test_interval": 0, "snapshot": 0}},
            path=Path(tmp) / "r50.yaml")
        timed = _TimedWaits(comm)
        trainer = Trainer(cfg, output=str(Path(tmp) / "run"), comm=timed)
        trainer.start()
        trainer.step()
        trainer.step()                                    # bound and warm
        timed.waited, step_times = 0.0, []
        for _ in range(steps):
            t0 = time.perf_counter()
            trainer.step()
            step_times.append(time.perf_counter() - t0)
        waited = 1000 * timed.waited / steps
        grads = [trainer.ws.fetch_blob(trainer.nets.grads[p]) for p in trainer.nets.params]
        flat = np.concatenate([g.reshape(-1) for g in grads])
        alone = []
        for _ in range(5):
            comm.barrier()
            t0 = time.perf_counter()
            comm.allreduce_sum(flat)
            alone.append(time.perf_counter() - t0)
        buckets = sum(o.type == "AllreduceStart" for o in trainer.nets.step.ops)
        return {"step_ms": 1000 * statistics.median(step_times), "wait_ms_per_step": waited,
                "exchange_alone_ms": 1000 * statistics.median(alone), "buckets": buckets,
                "values": int(flat.size)}


def under_mpi(mode: str, steps: int) -> dict:
    """Run this script's rank part with `mpiexec -n 2`; rank 0's result."""
    from netrun.train.dist.launch import find_mpiexec
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = {**os.environ, "NETRUN_THREADS": "1"}
        done = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, __file__, "--rank",
                               mode, "--steps", str(steps), "--out", str(out)],
                              env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{mode}: {done.stdout}{done.stderr}")
        return json.loads(out.read_text())


def ring_model(latency_ms: float, gbytes_per_s: float, nbytes: float, nodes: int) -> float:
    """Ring allreduce: 2 (p - 1) steps, each moving 1/p of the message, each paying latency."""
    p = nodes
    return 2 * (p - 1) * latency_ms + 2 * (p - 1) / p * nbytes / (gbytes_per_s * 1e9) * 1e3


def allreduce_report(times: dict) -> dict:
    """Latency and bandwidth from the measured times, and the model for 8 and 64 nodes."""
    small, large = times[str(SIZES[0])], times[str(SIZES[-1])]
    nbytes = SIZES[-1] * 4
    # Two ranks: one step each way, each moving half of the message (the ring with p = 2).
    bandwidth = nbytes / ((large - small) / 1e3) / 1e9
    out = {"times_ms": times, "latency_ms": small, "bandwidth_GBps": bandwidth,
           "resnet50_ms": large, "model_ms": {}}
    for name, lat, bw in (("this machine (shared memory)", small / 2, bandwidth),
                          ("25 Gb/s Ethernet, 25 us", 0.025, 25 / 8 * 0.9),
                          ("100 Gb/s InfiniBand, 3 us", 0.003, 100 / 8 * 0.9)):
        out["model_ms"][name] = {str(p): round(ring_model(lat, bw, nbytes, p), 1)
                                 for p in (2, 8, 64)}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="throughput,allreduce,overlap")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rank", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank:
        _rank_main(args.rank, args.steps, args.out)
        return 0
    parts = set(args.only.split(","))
    result: dict = {"load_average_before": os.getloadavg()[0]}
    if "allreduce" in parts:
        result["allreduce"] = allreduce_report(under_mpi("allreduce", args.steps))
        print(f"allreduce: {result['allreduce']}", file=sys.stderr)
    if "overlap" in parts:
        ov = under_mpi("overlap", max(3, args.steps // 4))
        ov["hidden_share"] = max(0.0, 1 - ov["wait_ms_per_step"] / ov["exchange_alone_ms"])
        result["overlap"] = ov
        print(f"overlap: {ov}", file=sys.stderr)
    if "throughput" in parts:
        result["throughput"] = throughput(args.steps)
    result["load_average_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
