"""netrun against PyTorch on the GPU, side by side in one process: nets and single convolutions.

    python benchmarks/bench_gpu.py [--quick] [--json] [--algo-mode heuristic|exhaustive]
                                   [--only lenet,cifar,resnet20,resnet50,convs] [--device gpu]

Nets (the same batch for both libraries): LeNet (64), Caffe's cifar10_quick (100), ResNet-20
on 32×32 (128) and ResNet-50 on 224×224 (32), one training iteration (forward, backward, SGD
momentum update) and one inference each. Convolutions: the shapes of benchmarks/bench_cpu.py,
each pass (forward, backward-data, backward-filter) separately, with the algorithm netrun
chose. Both libraries run on the same device in one process; every measurement alternates
them in blocks of iterations, each block timed between two device synchronizations (so
queued work is counted and the per-sync cost is amortized), medians reported. Ratios are
netrun / PyTorch time (below 1: netrun is faster); throughput is examples per second.
Both libraries compute convolutions in full float32 (PyTorch's cuDNN TF32 default turned off,
as netrun's default leaves cuDNN's TF32 engines out); --tf32 lets both use TF32 tensor cores
(PyTorch's default, netrun's --tf32). "host ms"
is how long netrun's run() takes to return without a device sync: when it is close to the
step's time, the step is bound by Python's launch overhead, not by the GPU.
`--device cpu` runs the same script on the CPU (a smoke test where there is no GPU).
PyTorch (with CUDA for --device gpu) is a test-only dependency: without it the script says so.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from torch_steps import torch_step as make_torch_step  # noqa: E402

from bench_cpu import CONV_SHAPES, torch_net as cpu_torch_net  # noqa: E402

NETS = {"lenet": ("zoo/lenet.yaml", 64), "cifar10_quick": ("zoo/cifar10_quick.yaml", 100),
        "resnet20": ("zoo/resnet20.yaml", 128), "resnet50": (None, 32)}
ONLY = {"lenet": ["lenet"], "cifar": ["cifar10_quick"], "resnet20": ["resnet20"],
        "resnet50": ["resnet50"]}


# Timing ---------------------------------------------------------------------------------------
def alternate(fns: dict, sync: dict, reps: int, block: int) -> dict[str, float]:
    """Median milliseconds per call of each callable, over blocks of `block` calls, each block
    timed between synchronizations and preceded by one untimed call; libraries alternate."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    while min(len(v) for v in times.values()) < reps:
        for name, fn in fns.items():
            fn()
            sync[name]()
            t0 = time.perf_counter()
            for _ in range(block):
                fn()
            sync[name]()
            times[name].append((time.perf_counter() - t0) * 1e3 / block)
    return {k: statistics.median(v) for k, v in times.items()}


# Models ---------------------------------------------------------------------------------------
def resnet50_yaml(classes: int = 1000) -> str:
    """ResNet-50 (v1.5: stride on the 3×3 conv) for 224×224 inputs as a netrun model file."""
    lines = ["name: ResNet50", "inputs: {data: [3, 224, 224], label: []}", "layers:"]

    def conv(name, inp, out, k, s=1, p=0):
        src = f", input: {inp}" if inp else ""
        lines.append(f"  - {{type: conv, name: {name}{src}, num_output: {out}, kernel: {k}, "
                     f"stride: {s}, pad: {p}, bias: false, weight_filler: msra}}")
        lines.append(f"  - {{type: spatial_bn, name: {name}_bn}}")
        return f"{name}_bn"

    x = conv("conv1", "data", 64, 7, 2, 3)
    lines.append(f"  - {{type: relu, name: conv1_relu, input: {x}}}")
    lines.append("  - {type: max_pool, name: pool1, kernel: 3, stride: 2, pad: 1}")
    x = "pool1"
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 1 else 1
            name = f"s{stage}b{b + 1}"
            y = conv(f"{name}_c1", x, width, 1)
            lines.append(f"  - {{type: relu, name: {name}_r1, input: {y}}}")
            y = conv(f"{name}_c2", f"{name}_r1", width, 3, stride, 1)
            lines.append(f"  - {{type: relu, name: {name}_r2, input: {y}}}")
            y = conv(f"{name}_c3", f"{name}_r2", width * 4, 1)
            short = conv(f"{name}_proj", x, width * 4, 1, stride) if b == 0 else x
            lines.append(f"  - {{type: add, name: {name}_sum, input: [{y}, {short}]}}")
            lines.append(f"  - {{type: relu, name: {name}_relu, input: {name}_sum}}")
            x = f"{name}_relu"
    lines.append(f"  - {{type: average_pool, name: pool5, input: {x}, global_pooling: true}}")
    lines.append(f"  - {{type: fc, name: fc, num_output: {classes}, weight_filler: msra}}")
    lines.append("loss: {type: softmax_cross_entropy, input: fc, label: label}")
    return "\n".join(lines) + "\n"


def torch_net(torch, name: str):
    """(module, per-example input shape, classes) of the same architecture in PyTorch."""
    nn = torch.nn
    if name in ("lenet", "cifar10_quick"):
        model, shape = cpu_torch_net(torch, name)
        return model, shape, 10

    def bn_conv(cin, cout, k, s=1, p=0):
        return nn.Sequential(nn.Conv2d(cin, cout, k, s, p, bias=False), nn.BatchNorm2d(cout))

    class Block(nn.Module):
        def __init__(self, body, shortcut):
            super().__init__()
            self.body, self.shortcut = body, shortcut

        def forward(self, x):
            return torch.relu(self.body(x) + (self.shortcut(x) if self.shortcut else x))

    layers = []
    if name == "resnet20":
        layers += [bn_conv(3, 16, 3, 1, 1), nn.ReLU()]
        cin = 16
        for stage, width in enumerate((16, 32, 64)):
            for b in range(3):
                s = 2 if b == 0 and stage > 0 else 1
                body = nn.Sequential(bn_conv(cin, width, 3, s, 1), nn.ReLU(),
                                     bn_conv(width, width, 3, 1, 1))
                layers.append(Block(body, bn_conv(cin, width, 1, s) if cin != width else None))
                cin = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
        return nn.Sequential(*layers), (3, 32, 32), 10
    layers += [bn_conv(3, 64, 7, 2, 3), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for b in range(blocks):
            s = 2 if b == 0 and stage > 0 else 1
            body = nn.Sequential(bn_conv(cin, width, 1), nn.ReLU(), bn_conv(width, width, 3, s, 1),
                                 nn.ReLU(), bn_conv(width, width * 4, 1))
            layers.append(Block(body, bn_conv(cin, width * 4, 1, s) if b == 0 else None))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers), (3, 224, 224), 1000


def _model_path(name: str, folder: Path) -> str:
    path, _ = NETS[name]
    if path is not None:
        return str(REPO / path)
    out = folder / "resnet50.yaml"
    out.write_text(resnet50_yaml())
    return str(out)


def bench_net(torch, name: str, device: str, reps: int, mode: str, folder: Path,
              tf32: bool = False, memory_plan: bool = True) -> list[dict]:
    from netrun import conv as algos
    from netrun.profile.targets import prepare

    _, batch = NETS[name]
    tdev = "cuda" if device.startswith("gpu") else "cpu"
    rows = []
    for phase in ("train", "inference"):
        target = prepare(_model_path(name, folder), batch, device,
                         forward_only=(phase == "inference"), memory_plan=memory_plan)
        backend = target.net.ws.backend
        getattr(backend, "reset_peak_memory", lambda: None)()   # this net's peak alone
        algos.configure(target.net.ws, mode=mode, tf32=tf32)
        model, shape, classes = torch_net(torch, name)
        model = model.to(tdev)
        x = torch.randn(batch, *shape, device=tdev)
        y = torch.randint(0, classes, (batch,), device=tdev)
        torch_step = make_torch_step(torch, model, x, y, phase)
        if tdev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        target.net.run()               # buffers, algorithm choices (a search in exhaustive mode)
        backend.synchronize()
        first = (time.perf_counter() - t0) * 1e3
        sync = {"netrun": backend.synchronize,
                "torch": torch.cuda.synchronize if tdev == "cuda" else (lambda: None)}
        times = alternate({"netrun": target.net.run, "torch": torch_step}, sync, reps,
                          block=5 if name == "resnet50" else 10)
        backend.synchronize()
        t0 = time.perf_counter()
        target.net.run()
        host = (time.perf_counter() - t0) * 1e3
        backend.synchronize()
        algos_used = sorted({o.ctx.state["algo"] for o in target.net.ops
                             if o.ctx.state.get("algo")})
        mem = getattr(backend, "memory_stats", lambda: {})()
        rows.append({"what": f"{name} {phase}", "batch": batch, **times,
                     "ratio": times["netrun"] / times["torch"],
                     "netrun_per_s": batch / times["netrun"] * 1e3,
                     "torch_per_s": batch / times["torch"] * 1e3,
                     "first_run_ms": first, "host_ms": host, "algos": algos_used,
                     "netrun_peak_mb": mem.get("peak_held_bytes", 0) / 2 ** 20,
                     "torch_peak_mb": (torch.cuda.max_memory_allocated() / 2 ** 20
                                       if tdev == "cuda" else 0.0),
                     # what PyTorch's caching allocator held: netrun's figure is CuPy's
                     # pool's, which also holds freed blocks
                     "torch_reserved_mb": (torch.cuda.max_memory_reserved() / 2 ** 20
                                           if tdev == "cuda" else 0.0)})
        del target, model, torch_step
        _free(torch, backend, tdev)
    return rows


def _free(torch, backend, tdev: str) -> None:
    """Give cached memory back between nets so both libraries have the device to themselves."""
    import gc

    gc.collect()
    if tdev == "cuda":
        backend.xp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()


# Single convolutions --------------------------------------------------------------------------
def bench_convs(torch, device: str, reps: int, mode: str, tf32: bool = False) -> list[dict]:
    import netrun
    from netrun import conv as algos
    from netrun.conv.algorithm import ConvProblem

    tdev = "cuda" if device.startswith("gpu") else "cpu"
    ws = netrun.Workspace(device)
    algos.configure(ws, mode=mode, persist=True, tf32=tf32)
    backend, xp = ws.backend, ws.backend.xp
    sync = {"netrun": backend.synchronize,
            "torch": torch.cuda.synchronize if tdev == "cuda" else (lambda: None)}
    aten, rows = torch.ops.aten, []
    for name, (n, c, h, w, k, ker, s, pad, d, g) in CONV_SHAPES.items():
        p = ConvProblem(n, c, h, w, k, ker, ker, s, s, pad, pad, pad, pad, d, d, g)
        rng = np.random.default_rng(0)
        host = {"x": rng.standard_normal((n, c, h, w), dtype=np.float32),
                "w": rng.standard_normal((k, c // g, ker, ker), dtype=np.float32),
                "dy": rng.standard_normal((n, k, p.oh, p.ow), dtype=np.float32),
                "b": rng.standard_normal(k, dtype=np.float32)}
        dev = {key: backend.to_device(v) for key, v in host.items()}
        outs = {"y": backend.empty(host["dy"].shape, "float32"),
                "dx": backend.empty(host["x"].shape, "float32"),
                "dw": backend.empty(host["w"].shape, "float32"),
                "db": backend.empty((k,), "float32")}
        t = {key: torch.from_numpy(v).to(tdev) for key, v in host.items()}
        flops = 2 * n * k * (c // g) * ker * ker * p.oh * p.ow
        passes = {
            "fwd": (("forward", (dev["x"], dev["w"]), outs["y"], {"bias": dev["b"]}),
                    lambda: torch.nn.functional.conv2d(t["x"], t["w"], t["b"], s, pad, d, g)),
            "bwd-data": (("backward_data", (dev["dy"], dev["w"]), outs["dx"], {}),
                         lambda: aten.convolution_backward(
                             t["dy"], t["x"], t["w"], None, [s, s], [pad, pad], [d, d], False,
                             [0, 0], g, [True, False, False])),
            "bwd-filter": (("backward_filter", (dev["x"], dev["dy"]), outs["dw"],
                            {"dbias": outs["db"]}),
                           lambda: aten.convolution_backward(
                               t["dy"], t["x"], t["w"], [k], [s, s], [pad, pad], [d, d], False,
                               [0, 0], g, [False, True, True])),
        }
        for pass_name, ((direction, args, out, extra), torch_fn) in passes.items():
            algo = _choose(ws, p, direction, args, out)
            method = getattr(algo, direction)

            def ours(method=method, args=args, out=out, extra=extra):
                method(xp, *args, p, out, ws.scratch, **extra)

            times = alternate({"netrun": ours, "torch": torch_fn}, sync, reps, block=5)
            rows.append({"what": f"conv {name} {pass_name}", "algo": algo.name, **times,
                         "ratio": times["netrun"] / times["torch"],
                         "tflops": flops / (times["netrun"] * 1e9),
                         "torch_tflops": flops / (times["torch"] * 1e9)})
        del dev, outs, t
        _free(torch, backend, tdev)
    return rows


def _choose(ws, p, direction: str, args, out):
    """The algorithm netrun would run for this pass on the workspace's backend."""
    from netrun.conv.select import choose, run_direction

    return choose(ws.conv, p, direction, ws.backend, "",
                  run_direction(direction, p, args, out, ws.scratch, ws.backend.xp))


# Report ---------------------------------------------------------------------------------------
def print_table(rows: list[dict], device_name: str, mode: str, tf32: bool = False) -> None:
    print(f"{'what':32s} {'netrun ms':>10s} {'torch ms':>10s} {'ratio':>6s} {'netrun/s':>10s} "
          f"{'torch/s':>10s}  notes")
    for r in rows:
        if "tflops" in r:
            rate = f"{r['tflops']:8.2f}TF {r['torch_tflops']:8.2f}TF"
            note = r["algo"]
        else:
            rate = f"{r['netrun_per_s']:10.0f} {r['torch_per_s']:10.0f}"
            note = (f"host {r['host_ms']:.1f} ms; first run {r['first_run_ms']:.0f} ms; "
                    f"peak MiB netrun "
                    f"{r['netrun_peak_mb']:.0f} torch {r['torch_peak_mb']:.0f}; "
                    + ",".join(r["algos"]))
        print(f"{r['what']:32s} {r['netrun']:10.3f} {r['torch']:10.3f} {r['ratio']:6.2f} "
              f"{rate}  {note}")
    print(f"device: {device_name}; algorithm mode {mode}; ratio = netrun / PyTorch time; "
          f"{'TF32' if tf32 else 'float32'} convolutions in both")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--algo-mode", default="heuristic",
                        choices=("heuristic", "exhaustive", "deterministic"))
    parser.add_argument("--only", default="lenet,cifar,resnet20,resnet50,convs",
                        help="comma-separated subset of lenet, cifar, resnet20, resnet50, convs")
    parser.add_argument("--device", default="gpu", help="gpu, gpu:N, or cpu (a smoke test)")
    parser.add_argument("--tf32", action="store_true",
                        help="let both libraries' cuDNN convolutions use TF32 tensor cores")
    parser.add_argument("--no-memory-plan", action="store_true",
                        help="netrun without lifetime planning of activations (every blob "
                             "its own buffer), to measure what the plan saves")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench_gpu.py compares against PyTorch, which is not installed (it is a "
              "test-only dependency: pip install 'netrun[test]').", file=sys.stderr)
        return 1
    if args.device.startswith("gpu") and not torch.cuda.is_available():
        print("bench_gpu.py --device gpu needs PyTorch built with CUDA (this one has no CUDA "
              "device); --device cpu runs the same comparison on the CPU.", file=sys.stderr)
        return 1
    from netrun.backends import get_backend
    from netrun.errors import BackendError

    try:
        backend = get_backend(args.device)
    except BackendError as e:
        print(f"bench_gpu.py: {e}", file=sys.stderr)
        return 2
    if args.device.startswith("gpu"):
        torch.cuda.set_device(backend.index)
        torch.backends.cudnn.allow_tf32 = args.tf32
        torch.backends.cuda.matmul.allow_tf32 = False
    reps = 3 if args.quick else 15
    only = set(args.only.split(","))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as folder:
        for key in ("lenet", "cifar", "resnet20", "resnet50"):
            if key in only:
                for name in ONLY[key]:
                    rows += bench_net(torch, name, args.device, reps, args.algo_mode,
                                      Path(folder), args.tf32, not args.no_memory_plan)
    if "convs" in only:
        rows += bench_convs(torch, args.device, max(3, reps // 3), args.algo_mode, args.tf32)
    if args.json:
        print(json.dumps({"device": backend.device_name, "algo_mode": args.algo_mode,
                          "tf32": args.tf32, "memory_plan": not args.no_memory_plan,
                          "rows": rows}, indent=2))
        return 0
    print_table(rows, backend.device_name, args.algo_mode, args.tf32)
    return 0


if __name__ == "__main__":
    sys.exit(main())
