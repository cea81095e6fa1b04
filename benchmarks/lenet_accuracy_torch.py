"""PyTorch reference for LeNet accuracy with Caffe's solver settings on the mnist-10k split.

Same data (t10k[:8000] train, t10k[8000:] test, pixels / 256, batch 64), same net (Caffe's
LeNet, Xavier weights, zero biases), same solver (SGD, momentum 0.9, weight decay 5e-4,
lr 0.01 with Caffe's inv policy gamma 1e-4 power 0.75), so netrun's accuracy can be read
against it:  python benchmarks/lenet_accuracy_torch.py --iters 10000
PyTorch is a test-only dependency; this script is a reference, not part of netrun.
"""
from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import sys

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    raise SystemExit("this reference needs PyTorch: pip install torch==2.13.0")

from netrun.train.data import make_source


def caffe_xavier(t: torch.Tensor) -> None:
    fan_in = t[0].numel()
    bound = math.sqrt(3.0 / fan_in)
    torch.nn.init.uniform_(t, -bound, bound)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=os.environ.get("NETRUN_DATA", str(
        Path(__file__).resolve().parents[1].parent / "shared" / "data")))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    source = make_source({"source": "mnist", "split": "mnist-10k",
                          "dir": str(Path(args.data_dir) / "mnist")})
    xtr = torch.tensor(source.train.data / 256.0, dtype=torch.float32)
    ytr = torch.tensor(source.train.label, dtype=torch.long)
    xte = torch.tensor(source.test.data / 256.0, dtype=torch.float32)
    yte = torch.tensor(source.test.label, dtype=torch.long)

    w = {"conv1": torch.empty(20, 1, 5, 5), "conv2": torch.empty(50, 20, 5, 5),
         "ip1": torch.empty(500, 800), "ip2": torch.empty(10, 500)}
    for t in w.values():
        caffe_xavier(t)
    b = {k: torch.zeros(v.shape[0]) for k, v in w.items()}
    params = [p.requires_grad_() for p in list(w.values()) + list(b.values())]

    def net(x):
        x = F.max_pool2d(F.conv2d(x, w["conv1"], b["conv1"]), 2, 2)
        x = F.max_pool2d(F.conv2d(x, w["conv2"], b["conv2"]), 2, 2)
        x = F.relu(F.linear(x.flatten(1), w["ip1"], b["ip1"]))
        return F.linear(x, w["ip2"], b["ip2"])

    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: (1 + 1e-4 * it) ** -0.75)
    rng = np.random.default_rng(args.seed)
    order, pos = rng.permutation(len(ytr)), 0
    start = time.perf_counter()
    for it in range(args.iters):
        if pos + 64 > len(order):
            order, pos = rng.permutation(len(ytr)), 0
        idx = torch.tensor(order[pos:pos + 64])
        pos += 64
        loss = F.cross_entropy(net(xtr[idx]), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        acc = (net(xte).argmax(1) == yte).float().mean().item()
    print(f"pytorch LeNet, mnist-10k, {args.iters} iterations: test accuracy {acc:.4f} "
          f"({seconds:.1f} s, {1000 * seconds / args.iters:.2f} ms/iteration)")


if __name__ == "__main__":
    main()
