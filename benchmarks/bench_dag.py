"""The dependency-graph executor against the sequential one: seconds per run, in one process.

Each case is bound twice as the CLI binds it (bind-time rewrites on, memory planning on),
once with `executor: simple` and once with `executor: dag`; after a warm-up run of each, runs
alternate between the two and the median of each is reported, with the ratio dag / simple.
Intra-op threads are as they are (NETRUN_THREADS, default: the usable cores). Also
reported: how many of the net's ops have another op they may run beside (no path between
the two in the graph), a ceiling on what the graph can overlap.

    python benchmarks/bench_dag.py [--only resnet20-train ...] [--runs 5] [--json]
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_memory

# name -> (model file, batch, phase); small enough that both executors' runs of every case
# take a couple of minutes of CPU at most on 2 cores.
CASES = {
    "resnet20-train": ("zoo/resnet20.yaml", 32, "train"),
    "resnet20-infer-b1": ("zoo/resnet20.yaml", 1, "infer"),
    "resnet50-infer-b1": ("zoo/resnet50.yaml", 1, "infer"),
    "resnet50-train-b2": ("zoo/resnet50.yaml", 2, "train"),
    "googlenet-infer-b1": ("zoo/googlenet.yaml", 1, "infer"),
    "googlenet-infer-b8": ("zoo/googlenet.yaml", 8, "infer"),
    "lenet-train": ("zoo/lenet.yaml", 64, "train"),
    "lenet-infer-b1": ("zoo/lenet.yaml", 1, "infer"),
    "alexnet-infer-b1": ("caffe:bvlc_alexnet/deploy.prototxt", 1, "infer"),
    "caffe-resnet50-infer-b1": ("caffe:resnet50/ResNet-50-deploy.prototxt", 1, "infer"),
    "caffe-cifar10-train": ("caffe:cifar10_quick/cifar10_quick_train_test.prototxt", 64,
                            "train"),
}


def bind(case: str, executor: str, workers: int = 2, fuse: bool = True):
    """bench_memory.bind with the workspace running its nets by `executor` (and without
    the bind-time rewrites if not fuse)."""
    import netrun
    import netrun.rewrite
    from netrun.core.workspace import Workspace

    bench_memory.CASES[case] = CASES[case]
    saved = netrun.Workspace, netrun.rewrite.bind_rewrite
    netrun.Workspace = functools.partial(Workspace, executor=executor)
    if not fuse:
        netrun.rewrite.bind_rewrite = functools.partial(saved[1], enabled=False)
    try:
        ws, names, feeds, _ = bench_memory.bind(case, True)
    finally:
        netrun.Workspace, netrun.rewrite.bind_rewrite = saved
    for name in names:
        if executor == "dag":
            ws._nets[name].workers = workers
    return ws, names, feeds


def overlap(ws, names) -> tuple[int, int]:
    """(ops that have an op they may run beside, ops) over the nets `names`."""
    from netrun.core.dag import DagNet

    free, total = 0, 0
    for name in names:
        net = ws._nets[name]
        assert isinstance(net, DagNet)
        sched = net.schedule()
        n = len(net.ops)
        # ancestors as bit sets, in the net's order (edges go forward)
        before = [0] * n
        preds = [[] for _ in range(n)]
        for j, succ in enumerate(sched.succ):
            for i in succ:
                preds[i].append(j)
        for i in range(n):
            for j in preds[i]:
                before[i] |= before[j] | (1 << j)
        after = [0] * n
        for i in range(n):
            for j in range(i):
                if before[i] >> j & 1:
                    after[j] |= 1 << i
        everyone = (1 << n) - 1
        for i in range(n):
            if everyone & ~(before[i] | after[i] | (1 << i)):
                free += 1
        total += n
    return free, total


def measure(case: str, runs: int, workers: int = 2, fuse: bool = True) -> dict:
    """Median seconds per run of the case's nets under each executor, runs alternating."""
    bound = {ex: bind(case, ex, workers, fuse) for ex in ("simple", "dag")}
    times: dict[str, list[float]] = {ex: [] for ex in bound}
    for case_args in bound.values():
        bench_memory.run_once(*case_args)     # warm-up
    for _ in range(runs):
        for ex, case_args in bound.items():
            times[ex].append(bench_memory.run_once(*case_args))
    arena = {ex: bound[ex][0].memory.activations.size for ex in bound}
    med = {ex: sorted(t)[len(t) // 2] for ex, t in times.items()}
    free, total = overlap(bound["dag"][0], bound["dag"][1])
    same = all(bound["simple"][0].fetch_blob(n).tobytes() == bound["dag"][0].fetch_blob(n).tobytes()
               for n in _results(bound["simple"][0], bound["simple"][1]))
    return {"simple_s": med["simple"], "dag_s": med["dag"], "ratio": med["dag"] / med["simple"],
            "ops_with_a_sibling": free, "ops": total, "same_bits": same,
            "arena_simple": arena["simple"], "arena_dag": arena["dag"],
            "times": times}


def _results(ws, names):
    """The nets' last outputs (what both workspaces must agree on)."""
    out = []
    for name in names:
        last = ws._nets[name].def_.ops[-1].outputs[0]
        out.append(last)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, choices=sorted(CASES))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workers", type=int, default=2, help="the DAG executor's threads")
    ap.add_argument("--no-fuse", action="store_true", help="nets as written (no rewrites)")
    args = ap.parse_args()
    from netrun.kernels import parallel

    result = {"threads": parallel.thread_count(), "workers": args.workers,
              "fuse": not args.no_fuse, "cases": {}}
    if not args.json:
        print(f"intra-op threads {result['threads']}, DAG workers {args.workers}, "
              f"rewrites {'off' if args.no_fuse else 'on'}")
    for case in args.only or list(CASES):
        t0 = time.perf_counter()
        r = measure(case, args.runs, args.workers, not args.no_fuse)
        result["cases"][case] = r
        if not args.json:
            print(f"{case:26s} simple {r['simple_s'] * 1e3:9.1f} ms   dag {r['dag_s'] * 1e3:9.1f} ms"
                  f"   dag/simple {r['ratio']:.3f}   ops beside another "
                  f"{r['ops_with_a_sibling']}/{r['ops']}   same bits {r['same_bits']}"
                  f"   arena {r['arena_simple'] >> 20}/{r['arena_dag'] >> 20} MiB"
                  f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.json:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
