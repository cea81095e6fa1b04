"""netrun against PyTorch and ONNX Runtime on ResNet-20 and ResNet-50, side by side in one run.

    python benchmarks/bench_resnet.py [--threads 2] [--only resnet20,resnet50,train,infer]
                                      [--quick] [--json] [--algo-mode heuristic]
                                      [--batch N] [--reps N] [--profile-iters N] [--no-ort]
                                      [--same-process]
    python benchmarks/bench_resnet.py --show RESULT.json     (the tables of a --json run)

The rows are issue 14's table: ResNet-20 (zoo/resnet20.yaml) training at batches 32 and 128
and inference at 1 and 128; ResNet-50 (zoo/resnet50.yaml, see benchmarks/resnets.py)
inference at 1 and 8 and training at 8. A training step is forward, backward and an SGD
momentum update (netrun: the step and update nets bound as one, as `netrun profile` and
bench_cpu.py bind them; PyTorch: eager, benchmarks/torch_steps.py); inference is netrun's
predict net, PyTorch's model in eval mode under no_grad, and ONNX Runtime running the model
exported from that PyTorch model (inference only: ORT has no training step to compare).
All three alternate in blocks of repetitions (bench_cpu.alternate); medians are reported,
and ratios are netrun / other (below 1: netrun is faster). netrun runs in a process of its
own, as users run it, and times each run there (benchmarks/own_process.py says why: in this
process PyTorch's libgomp, loaded first, would serve netrun's OpenMP teams with its long
spin); `--same-process` binds it here instead, to measure that case.

`--threads` (default 2) is every library's thread count: NETRUN_THREADS for netrun's
workers, torch.set_num_threads, and ORT's intra-op threads. "Where the time goes" is
netrun's per-op-type totals from its profiler (netrun/profile) for each row. Before timing,
each net's two descriptions are checked to be the same architecture: parameter count,
output shape and convolution FLOPs of the netrun YAML and the PyTorch model must agree, or
the script stops. PyTorch is required (a test-only dependency); ONNX Runtime is optional
(pip install onnxruntime onnx): without it the ORT columns are empty.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_cpu import SETTLE_MS, alternate  # noqa: E402
from own_process import InProcessNet, OwnProcessNet  # noqa: E402
from resnets import torch_resnet  # noqa: E402
from torch_steps import torch_step  # noqa: E402

NETS = {"resnet20": "zoo/resnet20.yaml", "resnet50": "zoo/resnet50.yaml"}
TITLES = {"resnet20": "ResNet-20", "resnet50": "ResNet-50"}
PHASES = ("train", "infer")
# Issue 14's table, in its order: (net, phase, batch).
ROWS = (("resnet20", "train", 32), ("resnet20", "train", 128), ("resnet20", "infer", 1),
        ("resnet20", "infer", 128), ("resnet50", "infer", 1), ("resnet50", "infer", 8),
        ("resnet50", "train", 8))
TOP_TYPES = 5      # op types shown per row under "where the time goes"


class Unfair(Exception):
    """netrun's and PyTorch's descriptions of a net are not the same architecture."""


# Same architecture? ---------------------------------------------------------------------
def architecture(model, torch_model, torch, shape) -> dict:
    """Parameter counts, output shapes and conv FLOPs (batch 1) of both descriptions."""
    from torch.utils.flop_counter import FlopCounterMode

    trainable = sum(math.prod(p.shape) for p in model.params if p.trainable)
    shapes = model.infer_shapes("predict", 1)
    conv_flops = sum(c.cost.flops for c, op in zip(shapes.ops, model.predict_net.ops)
                     if op.type == "Conv" and c.cost)
    torch_model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        out = torch_model(torch.zeros(1, *shape))
    torch_conv = sum(n for op, n in counter.get_flop_counts()["Global"].items()
                     if "convolution" in str(op))
    return {
        "params": {"netrun": trainable,
                   "torch": sum(p.numel() for p in torch_model.parameters())},
        # Running statistics too (Caffe counts them; PyTorch keeps them as buffers).
        "params_and_stats": {"netrun": model.param_count(),
                             "torch": sum(p.numel() for p in torch_model.parameters())
                             + sum(b.numel() for k, b in torch_model.named_buffers()
                                   if not k.endswith("num_batches_tracked"))},
        "output_shape": {"netrun": list(shapes.blobs[model.outputs[0]].shape),
                         "torch": list(out.shape)},
        "conv_flops": {"netrun": conv_flops, "torch": torch_conv},
    }


def check_same(name: str, arch: dict) -> None:
    """Raise Unfair, naming what differs, unless every measure agrees."""
    bad = [f"{k} {v['netrun']} (netrun) vs {v['torch']} (PyTorch)" for k, v in arch.items()
           if v["netrun"] != v["torch"]]
    if bad:
        raise Unfair(f"{name}: netrun's and PyTorch's nets differ: {'; '.join(bad)}")


# One row ------------------------------------------------------------------------------------
def ort_session(ort, torch, model, x, threads: int):
    """An ONNX Runtime session on `model` exported at x's shape (TorchScript exporter:
    needs no network and no onnxscript)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the legacy exporter's deprecation notice
        torch.onnx.export(model, (x,), buf, dynamo=False, input_names=["x"],
                          output_names=["y"])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(buf.getvalue(), opts, providers=["CPUExecutionProvider"])
    feed = {"x": x.numpy()}
    return lambda: session.run(None, feed)


def bench_row(torch, ort, net: str, phase: str, batch: int, args) -> dict:
    """Time one row with every library, then profile netrun's ops by type."""
    torch.manual_seed(0)
    model, shape, classes = torch_resnet(torch, net)
    x = torch.randn(batch, *shape)
    y = torch.randint(0, classes, (batch,))
    others = {"torch": torch_step(torch, model, x, y, "train" if phase == "train" else "infer")}
    if ort is not None and phase == "infer":
        others["ort"] = ort_session(ort, torch, model, x, args.threads)
    runner = InProcessNet if args.same_process else OwnProcessNet
    with runner(str(REPO / NETS[net]), batch, phase == "infer", args.algo_mode) as netrun:
        times = alternate({"netrun": netrun, **others}, args.reps, block=args.block)
        # the last block's library spins its threads for a while (ONNX Runtime's ~80 ms):
        # a profile made inside that window timed ResNet-20's batch-1 pass at 10× its length
        time.sleep(SETTLE_MS / 1e3)
        prof = netrun.profile(args.profile_iters)
    row = {"net": net, "phase": phase, "batch": batch, "netrun": times["netrun"],
           "torch": times["torch"], "ort": times.get("ort"),
           "netrun_over_torch": times["netrun"] / times["torch"],
           "netrun_over_ort": times["netrun"] / times["ort"] if "ort" in times else None,
           "torch_loaded_beside_netrun": netrun.info["torch_loaded"], **prof}
    return row


# Output -----------------------------------------------------------------------------------------
def _ms(v) -> str:
    return "—" if v is None else (f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}")


def _ratio(v) -> str:
    return "—" if v is None else f"{v:.2f}"


def print_report(console, result: dict) -> None:
    """The issue's table, the fairness check and where netrun's time goes, with rich."""
    from rich.table import Table

    fair = Table(title="Same architecture (netrun YAML vs PyTorch model)")
    for col in ("net", "parameters", "with BN statistics", "output (batch 1)", "conv GFLOP"):
        fair.add_column(col, justify="right" if col != "net" else "left")
    for net, arch in result["architecture"].items():
        cells = [arch["params"], arch["params_and_stats"], arch["output_shape"]]
        fair.add_row(TITLES[net], *(f"{c['netrun']}" if c["netrun"] == c["torch"]
                                    else f"{c['netrun']} ≠ {c['torch']}" for c in cells),
                     f"{arch['conv_flops']['netrun'] / 1e9:.3f}")
    console.print(fair)

    table = Table(title=f"netrun vs PyTorch {result['torch_version']} and ONNX Runtime "
                        f"{result['ort_version'] or '(not installed)'}, {result['threads']} "
                        f"threads, medians of {result['reps']}")
    for col in ("", "netrun ms", "PyTorch ms", "ORT ms", "netrun/PyTorch", "netrun/ORT"):
        table.add_column(col, justify="left" if not col else "right")
    for r in result["rows"]:
        what = f"{TITLES[r['net']]} {'train' if r['phase'] == 'train' else 'inference'}, " \
               f"batch {r['batch']}"
        table.add_row(what, _ms(r["netrun"]), _ms(r["torch"]), _ms(r["ort"]),
                      _ratio(r["netrun_over_torch"]), _ratio(r["netrun_over_ort"]))
    console.print(table)

    where = Table(title="Where netrun's time goes (per op type, netrun's profiler)")
    where.add_column("")
    where.add_column("sum of ops ms", justify="right")
    where.add_column(f"top {TOP_TYPES} op types: ms (share of the sum), ops")
    for r in result["rows"]:
        total = r["profile_sum_of_ops_ms"] or 1.0
        top = ", ".join(f"{t['type']} {_ms(t['ms'])} ({100 * t['ms'] / total:.0f}%) ×{t['count']}"
                        for t in r["by_type"][:TOP_TYPES])
        where.add_row(f"{TITLES[r['net']]} {r['phase']} {r['batch']}",
                      _ms(r["profile_sum_of_ops_ms"]), top)
    console.print(where)
    where_run = ("in the benchmark's process, beside PyTorch" if result.get("same_process")
                 else "in a process of its own")
    console.print(f"algorithm mode {result['algo_mode']}; netrun {result['netrun_threads']} "
                  f"worker threads, {where_run}; ratios below 1: netrun is faster.")
    if "load_average_before" in result:
        console.print(f"1-minute load average {result['load_average_before']:.2f} before, "
                      f"{result['load_average_after']:.2f} after, on {result['cpus']} CPUs (this run "
                      f"adds about {result['threads']}; the rest was other processes).")


# Main ---------------------------------------------------------------------------------------------
def selected_rows(only: str, batch: int | None) -> list[tuple[str, str, int]]:
    """The table's rows that --only keeps; with --batch, each (net, phase) once at that batch."""
    tokens = {t.strip() for t in only.split(",") if t.strip()} if only else set()
    unknown = tokens - set(NETS) - set(PHASES)
    if unknown:
        raise SystemExit(f"--only: unknown {', '.join(sorted(unknown))} (known: "
                         f"{', '.join((*NETS, *PHASES))})")
    nets = tokens & set(NETS) or set(NETS)
    phases = tokens & set(PHASES) or set(PHASES)
    rows = [r for r in ROWS if r[0] in nets and r[1] in phases]
    if batch is not None:
        rows = list(dict.fromkeys((n, p, batch) for n, p, _ in rows))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2,
                        help="threads for netrun, PyTorch and ONNX Runtime (default 2)")
    parser.add_argument("--only", default="",
                        help="comma-separated subset of resnet20, resnet50, train, infer")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--algo-mode", default="heuristic",
                        choices=("heuristic", "exhaustive", "deterministic"))
    parser.add_argument("--batch", type=int, help="every selected (net, phase) at this batch")
    parser.add_argument("--reps", type=int, help="timed repetitions per library and row")
    parser.add_argument("--profile-iters", type=int, help="iterations of netrun's profiler")
    parser.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime out")
    parser.add_argument("--same-process", action="store_true",
                        help="run netrun in this process, beside PyTorch's libgomp (default: "
                             "a process of its own, as users run it)")
    parser.add_argument("--show", metavar="JSON", help="print the tables of a saved --json result")
    args = parser.parse_args(argv)
    if args.show:
        from rich.console import Console
        print_report(Console(width=None if sys.stdout.isatty() else 150),
                     json.loads(Path(args.show).read_text()))
        return 0
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    rows = selected_rows(args.only, args.batch)
    args.reps = args.reps or (3 if args.quick else 10)
    args.profile_iters = args.profile_iters or (1 if args.quick else 3)
    args.block = min(4, args.reps)
    # Before netrun starts its workers (when the first net is bound).
    os.environ["NETRUN_THREADS"] = str(args.threads)
    try:
        import torch
    except ImportError:
        print("bench_resnet.py compares against PyTorch, which is not installed (it is a "
              "test-only dependency: pip install 'netrun[test]').", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    ort = None
    if not args.no_ort:
        try:
            import onnxruntime as ort
        except ImportError:
            print("ONNX Runtime is not installed (pip install onnxruntime onnx): its columns "
                  "stay empty.", file=sys.stderr)

    from rich.console import Console
    from netrun.kernels.parallel import thread_count
    from netrun.model import load_model

    log = Console(stderr=True)
    result = {"threads": args.threads, "netrun_threads": thread_count(),
              "torch_version": torch.__version__,
              "ort_version": ort.__version__ if ort else None, "reps": args.reps,
              "algo_mode": args.algo_mode, "same_process": args.same_process,
              "architecture": {}, "rows": [],
              "cpus": os.cpu_count(), "load_average_before": os.getloadavg()[0]}
    for net in dict.fromkeys(n for n, _, _ in rows):
        model, shape, _ = torch_resnet(torch, net)
        arch = architecture(load_model(str(REPO / NETS[net])), model, torch, shape)
        result["architecture"][net] = arch
        try:
            check_same(TITLES[net], arch)
        except Unfair as e:
            print(f"bench_resnet.py: {e}; the comparison would not be fair.", file=sys.stderr)
            return 1
    for net, phase, batch in rows:
        log.print(f"[dim]timing {TITLES[net]} {phase}, batch {batch}...[/dim]")
        result["rows"].append(bench_row(torch, ort, net, phase, batch, args))
    # Other processes' load skews PyTorch most (its OpenMP threads wait at barriers for a
    # descheduled peer), so the report says what the machine was doing.
    result["load_average_after"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        # Wide enough for the tables when the output goes to a file or a pipe.
        print_report(Console(width=None if sys.stdout.isatty() else 150), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
