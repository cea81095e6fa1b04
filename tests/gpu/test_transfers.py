"""Blobs stay on the device: host↔device copies happen only at feeds, fetches and checkpoints.

The counters live in every backend (netrun.backends.base.TransferCounter), so the logic is
tested on the CPU too. On the GPU, a training step of each zoo model copies exactly its
feeds in and nothing out until the loss is fetched; on the emulator it also makes no hidden
host synchronization (float(), .item(), bool() of device arrays) and no hidden upload.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import netrun
from netrun.backends.base import Backend, TransferCounter

REPO = Path(__file__).resolve().parents[2]


def test_cpu_counts_feeds_and_fetches_and_nothing_else():
    ws = netrun.Workspace("cpu")
    before = ws.backend.transfers.snapshot()
    ws.feed_blob("X", np.ones((2, 3), np.float32))
    ws.feed_blob("W", np.ones((4, 3), np.float32))
    ws.feed_blob("b", np.zeros(4, np.float32))
    ws.create_net(netrun.NetDef("n", [netrun.op("FC", ["X", "W", "b"], ["Y"]),
                                      netrun.op("Relu", ["Y"], ["Y"])]))
    ws.run_net("n", iterations=3)
    assert ws.backend.transfers.since(before) == TransferCounter(3, 24 + 48 + 16, 0, 0)
    ws.fetch_blob("Y")
    assert ws.backend.transfers.since(before) == TransferCounter(3, 88, 1, 32)


def test_the_cpu_learning_rate_reads_the_iteration_on_the_host():
    """Why the GPU has its own LearningRate kernel: on the CPU it copies iter out each run."""
    ws = netrun.Workspace("cpu")
    ws.feed_blob("it", np.array([3], np.int64))
    before = ws.backend.transfers.snapshot()
    ws.run_operator_once(netrun.op("LearningRate", ["it"], ["lr"], base_lr=0.1))
    assert ws.backend.transfers.since(before).to_host == 1


def test_every_backend_class_is_counted():
    class Toy(Backend):
        name = "toy"

        def to_device(self, array):
            return np.array(array)

        def to_host(self, array):
            return np.array(array)

    toy = Toy()
    toy.to_device(np.zeros(5, np.float64))
    toy.to_host(np.zeros(2, np.float32))
    toy.to_host(np.zeros(1, np.float32))
    assert toy.transfers == TransferCounter(1, 40, 2, 12)
    snap = toy.transfers.snapshot()
    toy.transfers.reset()
    assert toy.transfers == TransferCounter() and snap.to_host == 2


@pytest.mark.parametrize("model, batch", [("lenet", 4), ("cifar10_quick", 2), ("resnet20", 2)])
def test_a_gpu_training_step_copies_only_its_feeds(gpu, model, batch):
    from netrun.profile.targets import prepare

    target = prepare(str(REPO / "zoo" / f"{model}.yaml"), batch, "gpu", forward_only=False)
    ws, net = target.net.ws, target.net
    loss = next(o.outputs[1] for o in net.def_.ops if o.type == "SoftmaxWithLoss")
    target.feed()
    net.run()                       # first run: buffers, algorithm choices, constants
    emulated = gpu.device_name.startswith("Emulated")
    if emulated:
        from tests.gpu.emulator import COUNTERS

        COUNTERS.reset()
    before = gpu.transfers.snapshot()
    for _ in range(2):
        target.feed()
        net.run()
    value = float(ws.fetch_blob(loss))
    delta = gpu.transfers.since(before)
    assert delta.to_device == 2 * 2 and delta.to_host == 1, delta     # data and labels
    assert np.isfinite(value)
    if emulated:
        assert COUNTERS.host_syncs == 0 and COUNTERS.hidden_to_device == 0, COUNTERS.events
