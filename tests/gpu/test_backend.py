"""The GPU backend itself: device and stream, copies, events, memory, versions, and the
counter-based device generator with Dropout drawing from it."""
from __future__ import annotations

import json

import numpy as np
import pytest

import netrun
from netrun.backends.cuda.random import GOLDEN, MASK64, DeviceGenerator, mix64
from tests.opcheck import run_op

# The device code (netrun.backends.cuda) is CUDA source text: importing it loads no CuPy and
# registers nothing, so it is imported here like any module.


def _generator(xp, seed):
    return DeviceGenerator(xp, seed)


def host_uniform(seed: int, counter: int, count: int, dtype=np.float32) -> np.ndarray:
    """DeviceGenerator(seed)'s draws from `counter` on, computed with NumPy (SplitMix64)."""
    key = np.uint64(mix64((seed * GOLDEN + GOLDEN) & MASK64))
    index = np.arange(counter, counter + count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = key + (index + np.uint64(1)) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    if np.dtype(dtype) == np.float32:
        return (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def test_device_stream_and_names(gpu):
    ws = netrun.Workspace("gpu")
    assert ws.device == "gpu:0" and gpu.device == "gpu:0" and gpu.name == "gpu"
    assert isinstance(gpu.device_name, str) and gpu.device_name
    # the workspace made the backend's stream current; it orders itself against the legacy
    # default stream (a blocking stream)
    assert gpu.xp.cuda.get_current_stream().ptr == gpu.stream.ptr
    assert gpu.stream.is_non_blocking is False
    versions = gpu.library_versions()
    assert {"cupy", "cuda_runtime", "cuda_driver", "compute_capability"} <= set(versions)


def test_copies_round_trip_and_are_counted(gpu):
    before = gpu.transfers.snapshot()
    for host in (np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],   # not contiguous
                 np.float64(2.5), np.zeros((0, 3), np.int64), np.array([True, False])):
        dev = gpu.to_device(host)
        assert isinstance(dev, gpu.xp.ndarray) and dev.shape == np.shape(host)
        back = gpu.to_host(dev)
        assert isinstance(back, np.ndarray) and back.dtype == np.asarray(host).dtype
        np.testing.assert_array_equal(back, host)
    delta = gpu.transfers.since(before)
    assert delta.to_device == 4 and delta.to_host == 4


def test_event_timers_and_memory_stats(gpu):
    start = gpu.record_event()
    x = gpu.to_device(np.ones((64, 64), np.float32))
    gpu.xp.matmul(x, x)
    assert gpu.elapsed_s(start, gpu.record_event()) >= 0.0
    with gpu.timer() as t:
        gpu.xp.matmul(x, x)
    assert t[0] >= 0.0
    stats = gpu.memory_stats()
    assert set(stats) == {"used_bytes", "held_bytes", "peak_held_bytes", "device_free_bytes",
                          "device_total_bytes"}
    assert stats["peak_held_bytes"] >= stats["held_bytes"] >= 0
    assert gpu.peak_memory_bytes() >= stats["held_bytes"]


def test_device_generator_matches_its_host_reference_bit_for_bit(gpu):
    gen = _generator(gpu.xp, 11)
    a = gpu.to_host(gen.random(1000, dtype=np.float32))
    b = gpu.to_host(gen.random((3, 5), dtype="float64"))
    np.testing.assert_array_equal(a, host_uniform(11, 0, 1000, np.float32))
    np.testing.assert_array_equal(b.reshape(-1), host_uniform(11, 1000, 15, np.float64))
    assert gen.state["counter"] == 1015 and 0.0 <= a.min() and a.max() < 1.0
    normal = gpu.to_host(gen.standard_normal(20000, dtype=np.float32))
    assert abs(normal.mean()) < 0.03 and abs(normal.std() - 1) < 0.03
    out = gpu.empty((4, 4), "float32")
    assert gen.random(out.shape, dtype=gpu.xp.float32, out=out) is out   # Dropout's call
    with pytest.raises(ValueError, match="does not match"):
        gen.random((2, 2), out=out)


def test_device_generator_state_is_json_and_exact(gpu):
    gen = _generator(gpu.xp, 3)
    gen.random(7)
    state = json.loads(json.dumps(gen.bit_generator.state))
    first = gpu.to_host(gen.random(50))
    other = _generator(gpu.xp, 99)
    other.bit_generator.state = state
    np.testing.assert_array_equal(gpu.to_host(other.random(50)), first)
    # a NumPy (CPU) generator's state: a new stream, derived from it deterministically
    pcg = np.random.Generator(np.random.PCG64(5)).bit_generator.state
    one, two = _generator(gpu.xp, 1), _generator(gpu.xp, 2)
    one.bit_generator.state, two.bit_generator.state = pcg, pcg
    np.testing.assert_array_equal(gpu.to_host(one.random(9)), gpu.to_host(two.random(9)))


def test_dropout_masks_come_from_the_device_stream(gpu):
    x = np.random.default_rng(0).standard_normal((6, 50)).astype(np.float32)
    op = netrun.op("Dropout", ["X"], ["Y", "mask"], ratio=0.3)
    y, mask = run_op(op, {"X": x}, "gpu", seed=4)
    want = host_uniform(4, 0, x.size, np.float32).reshape(x.shape) >= np.float32(0.3)
    np.testing.assert_array_equal(mask, want)
    np.testing.assert_array_equal(y, x * want * np.float32(1 / 0.7))
    # the same seed repeats, the next run draws new numbers; gradient uses the mask
    ws = netrun.Workspace("gpu", seed=4)
    ws.feed_blob("X", x)
    ws.run_operator_once(op)
    np.testing.assert_array_equal(ws.fetch_blob("mask"), mask)
    ws.run_operator_once(op)
    assert not np.array_equal(ws.fetch_blob("mask"), mask)
    in_place = netrun.op("Dropout", ["X"], ["X", "mask"], ratio=0.5)
    ws.feed_blob("X", x)
    ws.run_operator_once(in_place)
    np.testing.assert_array_equal(ws.fetch_blob("X"), x * ws.fetch_blob("mask") * 2)
    assert run_op(netrun.op("Dropout", ["X"], ["Y"], is_test=1), {"X": x}, "gpu")[0].tolist() \
        == x.tolist()
