"""Activations share device memory by lifetime on the GPU, as on the CPU: one CuPy byte array
per workspace, the planned blobs slices of it. Training and prediction give the same bits with
the plan on (every dead value poisoned with NaN as it dies) as with it off, and on a real GPU
the plan holds less of the device."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import netrun
from netrun.core.schema import TensorSpec
from netrun.train.config import SolverConfig
from netrun.train.solver import build_training
from tests.test_planner_nets import REPO, assert_same_bits, predict, train

# Small enough for the emulator, which runs every CUDA thread in turn on the host.
NETS = {"lenet": (2, {}), "resnet20": (2, {"data": TensorSpec((2, 3, 16, 16))})}


def _arena_on_device(ws, net: str) -> None:
    plan = ws.memory.net_plans[net]
    assert plan.lifetimes.values and plan.placement.size < plan.placement.unshared
    arena = ws.memory.activations.array
    assert ws.backend.is_array(arena) and type(arena) is not np.ndarray   # device memory
    # Blobs the ops wrote live in it (the kept ones, the loss and outputs, do not).
    in_arena = [n for n in ws.blobs()
                if ws.backend.xp.may_share_memory(ws.get_blob(n), arena)]
    assert len(in_arena) >= 3, in_arena


@pytest.mark.parametrize("name", sorted(NETS))
def test_training_on_the_gpu_is_bitwise_the_same_with_planning(gpu, name):
    batch, overrides = NETS[name]
    model = netrun.load_model(str(REPO / "zoo" / f"{name}.yaml"))
    want, _ = train(model, False, batch, overrides, device="gpu")
    got, ws = train(model, True, batch, overrides, device="gpu")
    assert_same_bits(got, want)
    _arena_on_device(ws, build_training(model, SolverConfig()).step.name)
    # The gradients of the activations were written into the arena, not fresh pool memory.
    assert ws.memory.stats.planned_bytes == 0     # no host blocks on a device


@pytest.mark.parametrize("rewritten", [False, True])
def test_prediction_on_the_gpu_is_bitwise_the_same_with_planning(gpu, rewritten):
    batch, overrides = NETS["resnet20"]
    model = netrun.load_model(str(REPO / "zoo" / "resnet20.yaml"))
    want, _ = predict(model, False, batch, overrides, rewritten, device="gpu")
    got, ws = predict(model, True, batch, overrides, rewritten, device="gpu")
    assert_same_bits(got, want)
    _arena_on_device(ws, "predict")


@pytest.mark.gpu
def test_the_plan_holds_less_of_a_real_gpu(cuda):
    """ResNet-20's training step at batch 64: the pool's peak with the plan against without."""
    model = netrun.load_model(str(REPO / "zoo" / "resnet20.yaml"))
    pool = cuda.xp.get_default_memory_pool()
    peaks = {}
    for plan in (False, True):
        gc.collect()            # the previous workspace's blocks back to the pool, then freed:
        pool.free_all_blocks()  # each net's figure is what it alone made the pool hold
        before = pool.total_bytes()
        _, ws = train(model, plan, 64, device="gpu", steps=2)
        cuda.synchronize()
        peaks[plan] = pool.total_bytes() - before
        del ws
    assert peaks[True] < 0.75 * peaks[False], peaks
