"""Peak resident memory of binding a net and running it three times, planning on and off.

Every measurement runs in a fresh process (this script started again with --child), which
reads /proc/self/status: VmRSS after its imports, VmRSS after the parameters exist (init net
run, or the PyTorch model built), and VmHWM (the peak) after three runs. Reported:

  peak        VmHWM minus the RSS after imports (imports excluded)
  above init  VmHWM minus the RSS once the parameters exist: activations, gradients,
              optimizer state, scratch, and what binding costs (compiled kernels,
              bind-time rewrites and warm-ups)
  above bind  VmHWM minus the RSS once the nets are bound, before the first feed plans
              them: activations, gradients, optimizer state, scratch, per-run temporaries
              (PyTorch binds nothing ahead: its "above bind" is its "above init")
  vs unpl.    "above bind" against planning off

Cases: ResNet-50 at batch 8 (zoo/resnet50.yaml; inference and one SGD-momentum training
step), ResNet-20 at batch 128 (training and inference), and the Caffe deploy nets found in
the shared folder (inference; GoogLeNet where present). PyTorch (a test-only reference,
imported only here, only in its child process) runs the same ResNet training steps.
Nets are bound as `netrun train` and `netrun infer` bind them (bind-time rewrites on).

    python benchmarks/bench_memory.py [--json] [--only resnet50-train] [--runs 3]
    python benchmarks/bench_memory.py --speed [--only ...] [--runs 5]

--speed times the same cases in this one process instead, planning off and on in two
workspaces, runs alternating (median seconds per run of the bound nets, after a warm-up).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NETRUN_SHARED", REPO.parent / "shared"))
CAFFE = SHARED / "models" / "caffe"

# name -> (model file, batch, phase)
CASES = {
    "resnet50-infer": ("zoo/resnet50.yaml", 8, "infer"),
    "resnet50-train": ("zoo/resnet50.yaml", 8, "train"),
    "resnet20-infer": ("zoo/resnet20.yaml", 128, "infer"),
    "resnet20-train": ("zoo/resnet20.yaml", 128, "train"),
    "googlenet-infer": ("zoo/googlenet.yaml", 8, "infer"),
    "googlenet-train": ("zoo/googlenet.yaml", 8, "train"),
    "lenet-train": ("zoo/lenet.yaml", 64, "train"),
    "lenet-infer-b1": ("zoo/lenet.yaml", 1, "infer"),
    "alexnet-infer": ("caffe:bvlc_alexnet/deploy.prototxt", 8, "infer"),
    "caffe-resnet50-infer": ("caffe:resnet50/ResNet-50-deploy.prototxt", 8, "infer"),
}
TORCH = {"resnet50-train": "resnet50", "resnet20-train": "resnet20",
         "resnet50-infer": "resnet50", "resnet20-infer": "resnet20"}


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _path(model: str) -> Path:
    return CAFFE / model[6:] if model.startswith("caffe:") else REPO / model


def bind(case: str, plan: bool):
    """(workspace, net names to run, feeds, (RSS once the parameters exist, RSS once the
    nets are bound)) of one case, bound as the CLI binds it."""
    import numpy as np

    import netrun
    from netrun.rewrite import bind_rewrite, rewrite, with_train_net
    from netrun.train.config import SolverConfig
    from netrun.train.solver import LR, build_training

    model_file, batch, phase = CASES[case]
    model = netrun.load_model(str(_path(model_file)))
    ws = netrun.Workspace(seed=0, memory_plan=plan)
    rng = np.random.default_rng(0)
    specs = model.input_specs(batch, {})
    params = set(model.param_names)
    feeds = {n: (rng.integers(0, 10, s.shape).astype(s.dtype) if n in model.labels
                 else rng.standard_normal(s.shape).astype(s.dtype))
             for n, s in specs.items() if n not in params}
    if phase == "train":
        done = rewrite(model.train_net, "training")
        nets = build_training(with_train_net(model, done.net),
                              SolverConfig(type="sgd", momentum=0.9, weight_decay=5e-4))
        ws.run_net_once(nets.init)
        inited = _status()["VmRSS"]
        keep = [model.loss, *model.metrics, LR]
        for net in (nets.step, nets.update):
            ws.create_net(net, keep=keep)
        names = [nets.step.name, nets.update.name]
    else:
        ws.run_net_once(model.init_net)
        inited = _status()["VmRSS"]
        net = model.predict_net.copy()
        net.name = "predict"
        out = (list(model.outputs) or [net.ops[-1].outputs[0]])[:1]
        done = bind_rewrite(net, ws, "inference", keep=out)
        ws.create_net(done.net, keep=out)
        names = ["predict"]
        feeds = {n: v for n, v in feeds.items() if n not in model.labels}
    return ws, names, feeds, (inited, _status()["VmRSS"])


def run_once(ws, names, feeds, marks=None) -> float:
    """Feed, run the nets once; seconds for the runs."""
    for n, v in feeds.items():
        ws.feed_blob(n, v)
    t0 = time.perf_counter()
    for name in names:
        ws.run_net(name)
    return time.perf_counter() - t0


def child_netrun(case: str, plan: bool, runs: int) -> dict:
    """Bind and run one case with netrun in this (fresh) process."""
    import numpy  # noqa: F401  (imports before the first reading)

    import netrun
    import netrun.rewrite
    import netrun.train.solver  # noqa: F401

    imported = _status()["VmRSS"]
    ws, names, feeds, (inited, bound) = bind(case, plan)
    times = []
    for _ in range(runs):
        times.append(run_once(ws, names, feeds))
    end = _status()
    plans = {n: p.summary() for n, p in ws.memory.net_plans.items()}
    return {"imports": imported, "inited": inited, "bound": bound, "hwm": end["VmHWM"],
            "peak": end["VmHWM"] - imported, "above_init": end["VmHWM"] - inited,
            "above_bind": end["VmHWM"] - bound, "seconds": times, "plans": plans}


def child_torch(case: str, runs: int) -> dict:
    """The same step in PyTorch (eager, SGD with momentum) in this (fresh) process."""
    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    from resnets import torch_resnet
    from torch_steps import torch_step

    imported = _status()["VmRSS"]
    _, batch, phase = CASES[case]
    model, shape, classes = torch_resnet(torch, TORCH[case])
    inited = _status()["VmRSS"]
    torch.manual_seed(0)
    x = torch.randn(batch, *shape)
    y = torch.randint(0, classes, (batch,))
    step = torch_step(torch, model, x, y, "train" if phase == "train" else "infer")
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    end = _status()
    # Nothing is bound ahead in PyTorch: its peak above the model is its peak above bind.
    return {"imports": imported, "inited": inited, "bound": inited, "hwm": end["VmHWM"],
            "peak": end["VmHWM"] - imported, "above_init": end["VmHWM"] - inited,
            "above_bind": end["VmHWM"] - inited, "seconds": times}


def speed(cases: list[str], runs: int) -> dict:
    """Median seconds per run, planning off and on, in this one process, alternating."""
    out = {}
    for case in cases:
        bound = {plan: bind(case, plan) for plan in (False, True)}
        times = {False: [], True: []}
        for plan in (False, True):
            run_once(*bound[plan])          # warm-up
        for _ in range(runs):
            for plan in (False, True):
                times[plan].append(run_once(*bound[plan]))
        med = {p: sorted(t)[len(t) // 2] for p, t in times.items()}
        out[case] = {"unplanned": med[False], "planned": med[True],
                     "ratio": med[True] / med[False]}
        del bound
    return out


def measure(case: str, who: str, runs: int) -> dict | None:
    """One fresh process for one case: who is 'planned', 'unplanned' or 'torch'."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, __file__, "--child", case, who, "--runs", str(runs)],
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        print(f"{case} {who} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="Print the results as JSON.")
    ap.add_argument("--only", action="append", choices=sorted(CASES), help="Cases to run.")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true", help="Leave PyTorch out.")
    ap.add_argument("--speed", action="store_true",
                    help="Time planning off and on in this process instead.")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        case, who = args.child
        result = (child_torch(case, args.runs) if who == "torch"
                  else child_netrun(case, who == "planned", args.runs))
        print(json.dumps(result))
        return
    if args.speed:
        cases = [c for c in args.only or list(CASES) if _path(CASES[c][0]).is_file()]
        result = speed(cases, args.runs)
        if args.json:
            print(json.dumps(result, indent=1))
        for case, r in result.items():
            print(f"{case:22} unplanned {r['unplanned']:.4f} s  planned {r['planned']:.4f} s  "
                  f"planned/unplanned {r['ratio']:.3f}", file=sys.stderr if args.json else None)
        return
    results = {}
    for case in args.only or list(CASES):
        if case.split("-")[0] in ("googlenet", "alexnet", "caffe") and \
                not _path(CASES[case][0]).is_file():
            print(f"{case}: {_path(CASES[case][0])} not found, skipped", file=sys.stderr)
            continue
        row = {who: measure(case, who, args.runs) for who in ("unplanned", "planned")}
        if case in TORCH and not args.no_torch:
            row["torch"] = measure(case, "torch", args.runs)
        results[case] = row
    if args.json:
        print(json.dumps(results, indent=1))
        return
    mb = lambda n: f"{n / 2**20:8.0f}"
    print(f"{'case':22} {'who':10} {'peak MB':>8} {'>init MB':>8} {'>bind MB':>8} "
          f"{'vs unpl.':>8} {'median s':>8}")
    for case, row in results.items():
        base = row.get("unplanned")
        for who, r in row.items():
            if r is None:
                continue
            saved = (f"{100 * (1 - r['above_bind'] / base['above_bind']):7.0f}%"
                     if base else "")
            med = sorted(r["seconds"])[len(r["seconds"]) // 2]
            print(f"{case:22} {who:10} {mb(r['peak'])} {mb(r['above_init'])} "
                  f"{mb(r['above_bind'])} {saved:>8} "
                  f"{med:8.3f}")


if __name__ == "__main__":
    main()
