"""Workspace memory: output buffers planned at bind time, the per-op scratch arena, and the
results neither may change (netrun.core.memory). The output blocks are tested with lifetime
planning off (memory_plan=False); the lifetime planner in tests/test_planner*.py."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import netrun
from netrun.backends.cpu import HostBlock, host_block
from netrun.core import memory
from netrun.core.memory import MIN_PLAN_BYTES, ScratchArena, UnknownInput, WorkspaceMemory, plan_net
from netrun.core.net import SimpleNet
from netrun.core.schema import TensorSpec
from netrun.kernels import jit

REPO = Path(__file__).resolve().parents[1]
X_SHAPE, W_SHAPE = (8, 8, 32, 32), (16, 8, 3, 3)
ALIGN_SLACK = 3 * 256   # the alignment of three buffers


def _net() -> netrun.NetDef:
    """Conv, pool and ReLU: three outputs that together are worth a plan."""
    return netrun.NetDef("n", [netrun.op("Conv", ["X", "W", "b"], ["Y"], kernel=3, pad=1),
                               netrun.op("MaxPool", ["Y"], ["P"], kernel=2, stride=2),
                               netrun.op("Relu", ["P"], ["R"])])


def _feed(ws, names="XWb") -> None:
    rng = np.random.default_rng(0)
    shapes = {"X": X_SHAPE, "W": W_SHAPE, "b": (W_SHAPE[0],)}
    for name in names:
        ws.feed_blob(name, rng.standard_normal(shapes[name]).astype(np.float32))


def _output_bytes() -> int:
    y = 8 * 16 * 32 * 32 * 4
    return y + 2 * y // 4   # Y, then P and R at half the height and width


def test_a_bound_net_gets_its_outputs_from_memory_faulted_in_at_bind():
    assert _output_bytes() >= MIN_PLAN_BYTES
    ws = netrun.Workspace(memory_plan=False)
    _feed(ws)
    net = ws.create_net(_net())
    stats = ws.memory.stats
    assert stats.planned_outputs == 3 and stats.planned_bytes >= _output_bytes()
    before = stats.outputs_from_plan
    net.run()
    assert stats.outputs_from_plan - before == 3
    assert all(isinstance(ws.get_blob(n).base, HostBlock) for n in "YPR")
    # The same net without a plan (bound directly): NumPy's buffers, the same bits.
    ref = netrun.Workspace()
    _feed(ref)
    SimpleNet(_net(), ref).run()
    assert ref.memory.stats.planned_outputs == 0 and ref.get_blob("Y").base is None
    for name in "YPR":
        np.testing.assert_array_equal(ws.fetch_blob(name), ref.fetch_blob(name))


def test_a_net_bound_before_its_inputs_are_fed_is_planned_by_the_feeds():
    ws = netrun.Workspace(memory_plan=False)
    _feed(ws, "W")
    net = ws.create_net(_net())
    assert [n.name for n in ws.memory.pending] == ["n"]
    _feed(ws, "X")   # b is still missing
    assert [n.name for n in ws.memory.pending] == ["n"]
    assert ws.memory.stats.planned_outputs == 0
    _feed(ws, "b")
    assert ws.memory.pending == [] and ws.memory.stats.planned_outputs == 3
    net.run()
    assert ws.memory.stats.outputs_from_plan == 3


def test_training_nets_bound_before_the_first_batch_are_planned_by_its_feed():
    """The trainer's order: bind step, update and test nets, then feed. The update net reads
    gradients only the step net writes: it is planned from the step net's plan."""
    from netrun.train.config import SolverConfig
    from netrun.train.solver import build_training

    model = netrun.load_model(str(REPO / "zoo" / "lenet.yaml"))
    nets = build_training(model, SolverConfig(type="sgd", momentum=0.9))
    ws = netrun.Workspace(seed=0, memory_plan=False)
    ws.run_net_once(nets.init)
    for net in (nets.step, nets.update, nets.test):
        ws.create_net(net)
    assert ws.memory.pending
    rng = np.random.default_rng(0)
    for name, spec in model.input_specs(16, {}).items():
        ws.feed_blob(name, rng.integers(0, 10, spec.shape).astype(spec.dtype))
    assert ws.memory.pending == []
    stats = ws.memory.stats
    unplanned = stats.outputs_unplanned
    ws.run_net(nets.step.name)
    ws.run_net(nets.update.name)
    assert stats.outputs_unplanned == unplanned and stats.outputs_from_plan > 10


def test_steady_state_runs_reuse_every_buffer():
    ws = netrun.Workspace(memory_plan=False)
    _feed(ws)
    net = ws.create_net(_net())
    net.run()
    blobs = {n: ws.get_blob(n) for n in "YPR"}
    stats, peak = (ws.memory.stats.outputs_from_plan, ws.memory.stats.outputs_unplanned), \
        ws.memory.scratch_bytes
    assert peak > 0   # the conv's columns and the pool's planes came from the arena
    net.run()
    assert all(ws.get_blob(n) is blobs[n] for n in "YPR")
    assert (ws.memory.stats.outputs_from_plan, ws.memory.stats.outputs_unplanned) == stats
    assert ws.memory.scratch_bytes == peak


def test_backend_treats_block_buffers_as_owned_and_their_views_as_views():
    ws = netrun.Workspace(memory_plan=False)
    block_buffer = np.ndarray((4, 4), np.float32, buffer=host_block(1 << 16))
    assert ws.backend.owns_data(block_buffer) and ws.backend.owns_data(np.ones(3))
    assert not ws.backend.owns_data(block_buffer.view())
    assert not ws.backend.owns_data(block_buffer.reshape(16))


def test_host_blocks_are_zeroed_page_multiples_populated_or_reserved():
    for kwargs in ({}, {"populate": True}, {"reserve": True}):
        block = host_block(5000, **kwargs)
        assert len(block) == 8192
        data = np.ndarray((len(block),), np.uint8, buffer=block)
        assert not data.any()
        data[:] = 7   # writable
    assert len(host_block(3 << 20)) == 4 << 20   # whole huge pages


def test_scratch_arena_hands_each_op_the_same_memory_and_each_key_its_own():
    arena = ScratchArena(host_block)
    a = arena.get("a", (1000,), "float32")
    b = arena.get("b", (10, 50), "float64")
    assert not np.shares_memory(a, b) and b.shape == (10, 50) and b.dtype == np.float64
    assert np.shares_memory(arena.get("a", (10, 10), "float32"), a)   # same key, same op
    grown = arena.get("a", (4000,), "float32")
    assert not np.shares_memory(grown, a) and not np.shares_memory(grown, b)
    assert not np.shares_memory(arena.get("a", (1000,), "int32"), grown)   # dtype is the key too
    used = arena.peak
    arena.rewind()   # the next op
    c = arena.get("c", (1000,), "float32")
    assert np.shares_memory(c, a)
    assert arena.peak == used


class _Op:
    """Stands for an Operator: the arena remembers regions per op object."""


def test_an_op_that_runs_again_gets_its_regions_back_without_carving():
    arena = ScratchArena(host_block)
    first, second = _Op(), _Op()
    arena.rewind(first)
    x = arena.get("x", (100,), "float32")
    arena.rewind(second)
    assert np.shares_memory(arena.get("y", (100,), "float32"), x)   # ops take turns
    arena.rewind(first)
    again = arena.get("x", (100,), "float32")
    assert again.__array_interface__["data"] == x.__array_interface__["data"]
    assert not np.shares_memory(arena.get("z", (100,), "float32"), x)
    del first, second
    assert len(arena._ops) == 0   # forgotten with their ops


def test_scratch_arena_keys_from_several_threads_never_overlap():
    arena = ScratchArena(host_block)

    def ask(t):
        return [arena.get(f"k{i}#{t}", (257 * (i + 1),), "float32") for i in range(20)]

    with ThreadPoolExecutor(4) as pool:
        regions = [r for rs in pool.map(ask, range(4)) for r in rs]
    spans = sorted((r.__array_interface__["data"][0], r.nbytes) for r in regions)
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))


def test_scratch_outside_net_runs_keeps_a_buffer_per_key():
    ws = netrun.Workspace()
    a = ws.scratch("k", (4,))
    ws.memory.begin_op()
    inside = ws.scratch("k", (4,))
    ws.memory.end_run()
    assert not np.shares_memory(a, inside)
    assert np.shares_memory(ws.scratch("k", (2, 2)), a)


def test_plan_skips_buffers_ops_reuse_and_waits_for_unknown_inputs():
    spec = TensorSpec((4, 5))
    in_place, out = netrun.op("Relu", ["X"], ["X"]), netrun.op("Relu", ["X"], ["Y"])
    buffers = {"X": spec}
    assert plan_net(netrun.NetDef("n", [in_place, out]), {"X": spec}, buffers).outputs == [spec]
    assert buffers == {"X": spec, "Y": spec}
    # Y exists but with another shape (or as a view: not in buffers): a new buffer
    assert plan_net(netrun.NetDef("n", [out]), {"X": spec},
                    {"Y": TensorSpec((2,))}).outputs == [spec]
    with pytest.raises(UnknownInput, match="Z"):
        plan_net(netrun.NetDef("n", [netrun.op("Relu", ["Z"], ["Y"])]), {"X": spec}, {})


def test_scratch_estimates_fault_the_arena_in_when_the_net_is_bound(monkeypatch):
    seen = []

    def conv_estimate(ws, op, args, ins):
        seen.append((ws, op.type, args.kernel, ins[0].shape))
        return 16 << 20

    monkeypatch.setitem(memory._SCRATCH_ESTIMATES, "Conv", conv_estimate)
    monkeypatch.setitem(memory._SCRATCH_ESTIMATES, "Relu", lambda ws, op, args, ins: 1 / 0)
    ws = netrun.Workspace()
    _feed(ws)
    net = ws.create_net(_net())
    assert seen == [(ws, "Conv", 3, X_SHAPE)]
    assert ws.memory.stats.scratch_prefaulted == 16 << 20 == ws.memory.arena.prefaulted
    net.run()   # the conv's columns (8 × 72 × 1024 floats, 2.4 MB) fit in what was faulted in
    assert 0 < ws.memory.scratch_bytes <= 16 << 20
    with pytest.raises(ValueError, match="twice"):
        memory.register_scratch_estimate("Conv")(conv_estimate)


class _DeviceBackend:
    """A backend with its own allocator (as CuPy's pool on GPU) and no activation arena."""

    host_memory = False
    plans_activations = False

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)


def test_backends_without_host_memory_keep_scratch_per_key_and_plan_nothing():
    mem = WorkspaceMemory(_DeviceBackend())
    mem.begin_op()
    a = mem.scratch("k", (8,))
    mem.begin_op()
    assert np.shares_memory(mem.scratch("k", (8,)), a)
    mem.plan(_net(), {})
    assert mem.pending == [] and mem.output_buffer((8,), "float32") is None
    assert mem.stats.planned_bytes == 0


def _train(model: str, poison: int | None) -> dict[str, np.ndarray]:
    from netrun.profile.targets import prepare

    # Every blob is compared: lifetime planning off (with it, dead blobs are overwritten;
    # tests/test_planner_nets.py poisons scratch and dead values with planning on).
    target = prepare(str(REPO / "zoo" / model), 8, "cpu", forward_only=False,
                     memory_plan=False)
    ws = target.net.ws
    ws.memory.arena.poison = poison
    for _ in range(2):
        target.net.run()
    assert ws.memory.scratch_bytes > 0
    return {n: ws.fetch_blob(n) for n in ws.blobs()}


@pytest.mark.parametrize("engine", ["jit", "numpy"])
@pytest.mark.parametrize("model", ["lenet.yaml", "cifar10_quick.yaml"])
def test_no_op_reads_scratch_another_op_wrote(model, engine):
    """Every op's scratch is filled with NaN bytes when it returns: two training steps give
    the same bits as without, so no op of the zoo nets relies on scratch outliving it."""
    if engine == "numpy":
        with jit.disabled():
            plain, poisoned = _train(model, None), _train(model, 0xFF)
    else:
        plain, poisoned = _train(model, None), _train(model, 0xFF)
    assert plain.keys() == poisoned.keys()
    for name in plain:
        np.testing.assert_array_equal(poisoned[name], plain[name], err_msg=name)


def test_poisoned_scratch_is_seen_by_a_reader_in_the_next_op():
    """The check above can fail: scratch read after its op ended holds the poison."""
    arena = ScratchArena(host_block)
    arena.poison = 0xFF
    arena.get("k", (16,), "float32")[...] = 1.0
    arena.rewind()
    assert np.isnan(arena.get("k", (16,), "float32")).all()


def test_binding_a_net_again_replaces_its_plan():
    ws = netrun.Workspace(memory_plan=False)
    _feed(ws)
    ws.create_net(_net()).run()
    ws.feed_blob("X", np.ones((16,) + X_SHAPE[1:], np.float32))   # a larger batch
    net = ws.create_net(_net())
    assert len(ws.memory._planned.blocks) == 1   # the first plan's block is let go
    assert ws.memory.reserved_unused >= 2 * _output_bytes()
    net.run()
    assert ws.fetch_blob("R").shape[0] == 16 and ws.memory.reserved_unused < ALIGN_SLACK
