"""netrun against PyTorch on the CPU, side by side in one run: nets and single convolutions.

    python benchmarks/bench_cpu.py [--quick] [--json] [--algo-mode heuristic|exhaustive]
                                   [--only lenet,cifar,convs] [--threads 2] [--same-process]

Every measurement alternates netrun and PyTorch in blocks of repetitions (so both see the same
machine state; each block starts with an untimed run so that the other library's spinning
worker threads are not charged to it) and reports medians. netrun runs in a process of its
own, as users run it, and times itself there (own_process.py: in PyTorch's process, PyTorch's
GNU OpenMP would serve netrun's OpenMP teams with its long spin); `--same-process` runs it
here. Nets: LeNet (batch 64) and Caffe's
cifar10_quick (batch 100), one training iteration (forward, backward, SGD momentum update)
and one inference, each also with its first iteration in a fresh process (median of 3, or 5
without --quick) over the steady time. Convolutions: the issue-5 shapes, each pass (forward,
backward-data, backward-filter) separately, with the algorithm netrun chose. Ratios are
netrun / PyTorch (below 1: netrun is faster). PyTorch runs with 2 threads (`--threads`);
NumPy's BLAS as is. PyTorch is a test-only dependency: without it the script says so and stops.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from own_process import InProcess, InProcessNet, OwnProcess, OwnProcessNet  # noqa: E402
from torch_steps import torch_step as make_torch_step  # noqa: E402

CONV_SHAPES = {   # name: (N, C, H, W, K, kernel, stride, pad, dilation, group)
    "a 3x3 p1": (32, 64, 56, 56, 64, 3, 1, 1, 1, 1),
    "b 1x1": (32, 64, 56, 56, 256, 1, 1, 0, 1, 1),
    "c 3x3 s2": (32, 128, 28, 28, 128, 3, 2, 1, 1, 1),
    "d 5x5 C1": (64, 1, 28, 28, 20, 5, 1, 0, 1, 1),
    "e depthwise": (32, 32, 56, 56, 32, 3, 1, 1, 1, 32),
    "f 3x3 d2": (16, 256, 14, 14, 256, 3, 1, 2, 2, 1),
}
NETS = {"lenet": ("zoo/lenet.yaml", 64), "cifar10_quick": ("zoo/cifar10_quick.yaml", 100)}


# ONNX Runtime's intra-op workers keep spinning ~80 ms after a run (measured: netrun's
# ResNet-20 batch-1 pass took 2x its time for the first 80 ms after an ORT block), so 30 ms
# of settling charged ORT's spin to netrun; 150 ms covers it.
SETTLE_MS = 150.0


def alternate(fns: dict, reps: int, block: int = 4) -> dict[str, float]:
    """Median milliseconds of each callable, measured in interleaved blocks of repetitions.

    Each block starts with untimed runs, at least one and together at least SETTLE_MS: the
    previous library's worker threads (OpenMP and OpenBLAS spin for several milliseconds
    after each call) would otherwise be charged to this one, most of all on sub-millisecond
    passes. A callable whose `times_itself` is true returns its own milliseconds (a net run
    in another process: own_process.OwnProcessNet); one with a `block` method makes a whole
    block, settling included, itself (back to back there, as here).
    """
    times: dict[str, list[float]] = {k: [] for k in fns}
    while min(len(v) for v in times.values()) < reps:
        for k, f in fns.items():
            if hasattr(f, "block"):   # netrun's own process runs the block itself
                times[k] += f.block(SETTLE_MS, min(block, reps - len(times[k])) or 1)
                continue
            settle = time.perf_counter() + SETTLE_MS / 1e3
            f()
            while time.perf_counter() < settle:
                f()
            for _ in range(min(block, reps - len(times[k])) or 1):
                t0 = time.perf_counter()
                own = f()
                times[k].append(own if getattr(f, "times_itself", False)
                                else (time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


# Nets ---------------------------------------------------------------------------------------
def torch_net(torch, name: str):
    """The same architecture in PyTorch (Caffe's ceil-mode pooling for cifar10_quick)."""
    nn = torch.nn
    if name == "lenet":
        return nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5),
                             nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(),
                             nn.Linear(500, 10)), (1, 28, 28)
    return nn.Sequential(
        nn.Conv2d(3, 32, 5, padding=2), nn.MaxPool2d(3, 2, ceil_mode=True), nn.ReLU(),
        nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True),
        nn.Flatten(), nn.Linear(1024, 64), nn.Linear(64, 10)), (3, 32, 32)


def bench_net(torch, name: str, reps: int, mode: str, first_samples: int,
              same_process: bool = False) -> list[dict]:
    path, batch = NETS[name]
    runner = InProcessNet if same_process else OwnProcessNet
    rows = []
    for phase in ("train", "inference"):
        model, shape = torch_net(torch, name)
        x = torch.randn(batch, *shape)
        y = torch.randint(0, 10, (batch,))
        torch_step = make_torch_step(torch, model, x, y, phase)
        # binding runs the net once: it picks the algorithms (a timing search in exhaustive
        # mode with a cold cache, which it then fills)
        with runner(str(REPO / path), batch, phase == "inference", mode) as net:
            times = alternate({"netrun": net, "torch": torch_step}, reps, block=10)
            algos_used = net.info["algos"]
        firsts = [fresh_first_run(name, phase, mode) for _ in range(first_samples)]
        first = statistics.median(firsts)
        rows.append({"what": f"{name} {phase}", "batch": batch, **times,
                     "ratio": times["netrun"] / times["torch"], "first_run_ms": first,
                     "first_run_samples_ms": firsts, "first_over_steady": first / times["netrun"],
                     "algos": algos_used})
    return rows


# First iterations ------------------------------------------------------------------------------
# Issue 5: a second process (warm algorithm cache) runs its first iteration in at most 1.5× a
# steady one. Each sample is a fresh Python process that binds the net as above and times its
# first run: what a user's next run pays. The median is reported, since one sample on a shared
# VM can be off by a factor (page faults there sometimes cost the host's faults too).
def fresh_first_run(name: str, phase: str, mode: str) -> float:
    """Milliseconds of the first run of a net bound in a new Python process."""
    out = subprocess.run([sys.executable, __file__, "--first-run", name, phase,
                          "--algo-mode", mode], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["first_run_ms"])


def first_run(name: str, phase: str, mode: str) -> float:
    """Bind the net as bench_net does and time its first run (the --first-run child)."""
    from netrun import conv as algos
    from netrun.profile.targets import prepare

    path, batch = NETS[name]
    target = prepare(str(REPO / path), batch, "cpu", forward_only=(phase == "inference"))
    algos.configure(target.net.ws, mode=mode)
    t0 = time.perf_counter()
    target.net.run()
    return (time.perf_counter() - t0) * 1e3


# Single convolutions --------------------------------------------------------------------------
PASSES = {"fwd": "forward", "bwd-data": "backward_data", "bwd-filter": "backward_filter"}


def conv_arrays(name: str) -> dict:
    """The problem and arrays of CONV_SHAPES[name], the same in every process (seed 0)."""
    from netrun.conv.algorithm import ConvProblem

    n, c, h, w, k, ker, s, pad, d, g = CONV_SHAPES[name]
    p = ConvProblem(n, c, h, w, k, ker, ker, s, s, pad, pad, pad, pad, d, d, g)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((k, c // g, ker, ker), dtype=np.float32)
    dy = rng.standard_normal((n, k, p.oh, p.ow), dtype=np.float32)
    bias = rng.standard_normal(k, dtype=np.float32)
    return {"p": p, "x": x, "w": wt, "dy": dy, "bias": bias}


class ConvPass:
    """One pass of a CONV_SHAPES convolution with the algorithm netrun picks for it (an
    own_process target: calling it runs the pass once; `info` names the algorithm)."""

    def __init__(self, name: str, pass_name: str, mode: str):
        import netrun
        from netrun import conv as algos
        from netrun.conv.select import choose, run_direction

        a = conv_arrays(name)
        p, x, wt, dy = a["p"], a["x"], a["w"], a["dy"]
        self.ws = netrun.Workspace()
        algos.configure(self.ws, mode=mode, persist=True)
        direction = PASSES[pass_name]
        args, out = {"forward": ((x, wt), np.empty(dy.shape, np.float32)),
                     "backward_data": ((dy, wt), np.empty(x.shape, np.float32)),
                     "backward_filter": ((x, dy), np.empty(wt.shape, np.float32))}[direction]
        run = run_direction(direction, p, args, out, self.ws.scratch, np)
        algo = choose(self.ws.conv, p, direction, self.ws.backend, "", run)
        extra = {"forward": {"bias": a["bias"]},
                 "backward_filter": {"dbias": np.empty(p.k, np.float32)}}.get(direction, {})
        self._run = partial(getattr(algo, direction), np, *args, p, out, self.ws.scratch,
                            **extra)
        self.info = {"algo": algo.name}

    def __call__(self) -> None:
        self._run()


def bench_convs(torch, reps: int, mode: str, same_process: bool = False) -> list[dict]:
    runner = InProcess if same_process else OwnProcess
    rows = []
    aten = torch.ops.aten
    for name, (n, c, h, w, k, ker, s, pad, d, g) in CONV_SHAPES.items():
        a = conv_arrays(name)
        tx, tw, tdy, tb = (torch.from_numpy(a[key]) for key in ("x", "w", "dy", "bias"))
        flops = 2 * n * k * (c // g) * ker * ker * a["p"].oh * a["p"].ow
        torch_passes = {
            "fwd": lambda: torch.nn.functional.conv2d(tx, tw, tb, s, pad, d, g),
            "bwd-data": lambda: aten.convolution_backward(
                tdy, tx, tw, None, [s, s], [pad, pad], [d, d], False, [0, 0], g,
                [True, False, False]),
            "bwd-filter": lambda: aten.convolution_backward(
                tdy, tx, tw, [k], [s, s], [pad, pad], [d, d], False, [0, 0], g,
                [False, True, True]),
        }
        for pass_name, torch_fn in torch_passes.items():
            with runner(ConvPass, name, pass_name, mode) as ours:
                times = alternate({"netrun": ours, "torch": torch_fn}, reps, block=2)
            rows.append({"what": f"conv {name} {pass_name}", "algo": ours.info["algo"], **times,
                         "ratio": times["netrun"] / times["torch"],
                         "gflops": flops / (times["netrun"] * 1e6),
                         "torch_gflops": flops / (times["torch"] * 1e6)})
    return rows


def gemm_peak(reps: int) -> float:
    """NumPy SGEMM GFLOP/s on 1024² matrices, best of `reps` (the 'percent of peak' basis)."""
    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, a, out=out)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.matmul(a, a, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2 * 1024 ** 3 / (best * 1e9)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--algo-mode", default="heuristic",
                        choices=("heuristic", "exhaustive", "deterministic"))
    parser.add_argument("--only", default="lenet,cifar,convs",
                        help="comma-separated subset of lenet, cifar, convs")
    parser.add_argument("--threads", type=int, default=2, help="PyTorch threads (default 2)")
    parser.add_argument("--same-process", action="store_true",
                        help="run netrun in this process, beside PyTorch's libgomp (default: a "
                             "process of its own, as users run it)")
    parser.add_argument("--first-run", nargs=2, metavar=("NET", "PHASE"),
                        help="(internal) time one fresh first run of NET and PHASE, print JSON")
    args = parser.parse_args(argv)
    if args.first_run:
        name, phase = args.first_run
        print(json.dumps({"first_run_ms": first_run(name, phase, args.algo_mode)}))
        return 0
    try:
        import torch
    except ImportError:
        print("bench_cpu.py compares against PyTorch, which is not installed (it is a "
              "test-only dependency: pip install 'netrun[test]').", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    reps = 5 if args.quick else 20
    first_samples = 3 if args.quick else 5
    only = set(args.only.split(","))
    peak = gemm_peak(20)   # first, before either library's threads have run
    rows: list[dict] = []
    if "lenet" in only:
        rows += bench_net(torch, "lenet", reps, args.algo_mode, first_samples,
                          args.same_process)
    if "cifar" in only:
        rows += bench_net(torch, "cifar10_quick", reps, args.algo_mode, first_samples,
                          args.same_process)
    if "convs" in only:
        rows += bench_convs(torch, max(3, reps // 4), args.algo_mode, args.same_process)
    if args.json:
        print(json.dumps({"gemm_peak_gflops": peak, "torch_threads": args.threads,
                          "algo_mode": args.algo_mode, "rows": rows}, indent=2))
        return 0
    print(f"{'what':34s} {'netrun ms':>10s} {'torch ms':>10s} {'ratio':>6s} {'GFLOP/s':>8s} "
          f"{'% peak':>6s}  algorithm")
    for r in rows:
        gf = r.get("gflops")
        extra = r.get("algo", "")
        if "first_run_ms" in r:
            extra = (f"first run {r['first_run_ms']:.1f} ms = {r['first_over_steady']:.2f}× steady"
                     f" (median of {len(r['first_run_samples_ms'])} fresh processes)")
        print(f"{r['what']:34s} {r['netrun']:10.2f} {r['torch']:10.2f} {r['ratio']:6.2f} "
              f"{(f'{gf:8.1f}' if gf else ' ' * 8)} "
              f"{(f'{100 * gf / peak:6.0f}' if gf else ' ' * 6)}  {extra}")
    print(f"NumPy SGEMM peak (1024², best of 20): {peak:.0f} GFLOP/s; torch threads "
          f"{args.threads}; algorithm mode {args.algo_mode}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
