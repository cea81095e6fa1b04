"""The lifetime planner (netrun.core.lifetimes, netrun.core.planner) and its use by a
workspace (netrun.core.activations): lifetimes, in-place reuse, views, what is never
shared, offsets, the NaN debug mode, and randomized nets bitwise equal with and without."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import netrun
from netrun.core import memory
from netrun.core.lifetimes import Value, external_reads, lifetimes, persistent_names
from netrun.core.planner import Placement, aligned, live_set, place
from netrun.core.schema import TensorSpec

REPO = Path(__file__).resolve().parents[1]
SPEC = TensorSpec((4, 64))            # 1 KiB: planned at the default threshold
op = netrun.op


def _net(*ops, outputs=()) -> netrun.NetDef:
    return netrun.NetDef("n", list(ops), external_outputs=list(outputs))


def _lifetimes(net, persistent=None, **kw):
    specs = [[SPEC] * len(o.outputs) for o in net.ops]
    keep = persistent_names(net) if persistent is None else persistent
    return lifetimes(net, specs, keep, **kw)


# Lifetimes ------------------------------------------------------------------------------
def test_a_value_lives_from_its_write_to_its_last_read():
    net = _net(op("Relu", ["x"], ["a"]), op("Relu", ["a"], ["b"]), op("Relu", ["x"], ["c"]),
               op("Sum", ["a", "c"], ["d"]), op("Relu", ["d"], ["y"]))
    lt = _lifetimes(net)
    a, c = lt.values[lt.writes[(0, 0)]], lt.values[lt.writes[(2, 0)]]
    assert (c.start, c.end) == (2, 3)
    # Sum may write in place over its first input, whose last read it is: d continues a
    assert lt.writes[(3, 0)] == lt.writes[(0, 0)] and (a.start, a.end) == (0, 4)
    assert lt.values[lt.writes[(0, 0)]].names == ["a", "d"]
    assert "x" in lt.persistent and "y" in lt.persistent and (4, 0) not in lt.writes
    # b is never read: a result of the net, kept out of sharing
    assert "b" in lt.persistent and (1, 0) not in lt.writes


def test_in_place_reuse_only_when_the_input_has_no_later_reader():
    dead = _net(op("Relu", ["x"], ["a"]), op("Relu", ["a"], ["b"]), op("Relu", ["b"], ["y"]))
    lt = _lifetimes(dead)
    assert lt.writes[(0, 0)] == lt.writes[(1, 0)]          # Relu may run in place
    read_later = _net(op("Relu", ["x"], ["a"]), op("Relu", ["a"], ["b"]),
                      op("Sum", ["a", "b"], ["y"]))
    lt = _lifetimes(read_later)
    assert lt.writes[(0, 0)] != lt.writes[(1, 0)]
    off = _lifetimes(dead, inplace=False)
    assert off.writes[(0, 0)] != off.writes[(1, 0)]
    # FC's schema allows no in-place: its own value
    fc = _net(op("Relu", ["x"], ["a"]), op("FC", ["a", "w", "bias"], ["b"]),
              op("Relu", ["b"], ["y"]))
    lt = _lifetimes(fc)
    assert lt.writes[(0, 0)] != lt.writes[(1, 0)]


def test_a_conv_writes_over_the_residual_it_reads_last():
    """Conv's in-place pair is (S, Y): a residual block's sum writes its output over the
    shortcut (oneDNN's in-place sum), never over X, and not over an S read later."""
    block = _net(op("Relu", ["x"], ["s"]), op("Relu", ["s"], ["h"]),
                 op("Conv", ["h", "w", "b", "s"], ["y"], kernel=1), op("Relu", ["y"], ["z"]))
    lt = _lifetimes(block)
    assert lt.writes[(2, 0)] == lt.writes[(0, 0)] != lt.writes[(1, 0)]
    kept = _net(op("Relu", ["x"], ["s"]), op("Relu", ["s"], ["h"]),
                op("Conv", ["h", "w", "b", "s"], ["y"], kernel=1), op("Sum", ["y", "s"], ["z"]))
    lt = _lifetimes(kept)
    assert lt.writes[(2, 0)] not in (lt.writes[(0, 0)], lt.writes[(1, 0)])
    # block after block: each sum continues the value the last one wrote
    blocks = [op("Relu", ["x"], ["s0"])]
    for i in range(3):
        blocks += [op("Relu", [f"s{i}"], [f"h{i}"]),
                   op("Conv", [f"h{i}", "w", "b", f"s{i}"], [f"s{i + 1}"], kernel=1)]
    lt = _lifetimes(_net(*blocks, op("Relu", ["s3"], ["y"])))
    assert len({lt.writes[(i, 0)] for i in (0, 2, 4, 6)}) == 1
    assert lt.values[lt.writes[(0, 0)]].names == ["s0", "s1", "s2", "s3"]


def test_a_value_with_a_view_is_not_written_in_place():
    """Its source may still be read: a Relu over the view's value gets its own buffer."""
    net = _net(op("Relu", ["x"], ["a"]), op("Flatten", ["a"], ["v"]),
               op("Relu", ["v"], ["b"]), op("Sum", ["a", "b"], ["y"]))
    lt = _lifetimes(net)
    assert lt.writes[(2, 0)] != lt.writes[(0, 0)]
    chained = _net(op("Relu", ["x"], ["a"]), op("Relu", ["a"], ["c"]),
                   op("Flatten", ["c"], ["v"]), op("Relu", ["v"], ["b"]),
                   op("Sum", ["c", "b"], ["y"]))
    lt = _lifetimes(chained)
    assert lt.writes[(1, 0)] == lt.writes[(0, 0)] != lt.writes[(3, 0)]


def test_a_view_shares_its_source_and_keeps_it_alive():
    net = _net(op("Relu", ["x"], ["a"]), op("Flatten", ["a"], ["f"]), op("Relu", ["x"], ["c"]),
               op("Sum", ["f", "c"], ["y"]))
    lt = _lifetimes(net)
    v = lt.writes[(0, 0)]
    assert lt.writes[(1, 0)] == v and (1, 0) in lt.views
    assert lt.values[v].end == 3 and lt.values[v].names == ["a", "f"]


def test_what_is_never_shared():
    step = _net(op("FC", ["data", "w", "b"], ["h"]), op("Relu", ["h"], ["r"]),
                op("FC", ["r", "w2", "b2"], ["logits"]), op("Relu", ["logits"], ["w_grad"]),
                op("Relu", ["logits"], ["acc"]), op("Relu", ["acc"], ["out"]),
                outputs=["out"])
    update = _net(op("WeightedSum", ["w", "one", "w_grad", "lr"], ["w"]))
    keep = persistent_names(step, [update], keep=["acc"])
    # read before written (params, data), read by another net (the gradient), asked for
    # (acc), external outputs, results nobody reads
    assert {"data", "w", "b", "w2", "b2", "w_grad", "acc", "out"} <= keep
    assert not {"h", "r", "logits"} & keep
    assert external_reads(update) == {"w", "one", "w_grad", "lr"}
    # the same net's next iteration reads what it wrote before: an accumulator
    acc = _net(op("Sum", ["g", "g_acc"], ["g_acc"]), op("Relu", ["g_acc"], ["y"]))
    assert "g_acc" in persistent_names(acc)


def test_small_and_unknown_outputs_keep_their_own_buffers():
    net = _net(op("Relu", ["x"], ["a"]), op("Relu", ["a"], ["b"]), op("Relu", ["b"], ["y"]))
    small = lifetimes(net, [[TensorSpec((4,))]] * 3, persistent_names(net), min_bytes=1024)
    assert not small.values
    unknown = lifetimes(net, [[SPEC], None, None], persistent_names(net))
    assert [(v.start, v.end) for v in unknown.values] == [(0, 1)]


# Offsets --------------------------------------------------------------------------------
def test_values_that_never_live_together_share_bytes():
    vals = [Value(1000, 0, 1), Value(1000, 2, 3), Value(500, 1, 2)]
    p = place(vals)
    assert p.offsets[0] == p.offsets[1] and p.size == aligned(1000) + aligned(500)
    assert p.unshared == 2 * aligned(1000) + aligned(500)
    assert live_set(vals) == (aligned(1000) + aligned(500), 1)


def test_best_fit_picks_the_smallest_gap_that_holds():
    # Two gaps free during [5, 5]: 512 bytes (between a and b) and 2048 (above b ... c)
    vals = [Value(4096, 0, 9), Value(512, 0, 4), Value(256, 0, 9), Value(512, 5, 5)]
    p = place(vals)
    assert p.offsets[3] == p.offsets[1]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(0, 8)),
                min_size=1, max_size=40))
def test_no_two_live_values_overlap_and_the_arena_is_at_least_the_live_set(specs):
    vals = [Value(n, s, s + d) for n, s, d in specs]
    p: Placement = place(vals)
    for i, a in enumerate(vals):
        assert p.offsets[i] % 256 == 0 and p.offsets[i] + a.nbytes <= p.size
        for j in range(i):
            b = vals[j]
            if a.start <= b.end and b.start <= a.end:
                assert (p.offsets[i] + a.nbytes <= p.offsets[j]
                        or p.offsets[j] + b.nbytes <= p.offsets[i]), (i, j)
    assert live_set(vals)[0] <= p.size <= p.unshared


# A workspace's plan -----------------------------------------------------------------------
def _ws(plan=True, debug=True, **blobs) -> netrun.Workspace:
    ws = netrun.Workspace(seed=0, memory_plan=plan, plan_debug=debug)
    ws.memory.min_bytes = 0
    for name, value in blobs.items():
        ws.feed_blob(name, value)
    return ws


def _chain():
    return _net(op("Relu", ["x"], ["a"]), op("Scale", ["a"], ["b"], scale=2.0),
                op("Relu", ["x"], ["c"]), op("Sum", ["b", "c"], ["y"]))


def test_ops_write_into_their_planned_views_and_results_stay_readable():
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    ws = _ws(x=x)
    ws.create_net(_chain())
    ws.run_net("n", 2)
    record = ws.memory.net_plans["n"]
    assert len(record.lifetimes.values) == 2 and record.placement.size == 2 * x.nbytes
    np.testing.assert_array_equal(ws.fetch_blob("y"), 3 * np.maximum(x, 0))
    # a and b (in place) died at op 3: poisoned in debug mode
    assert np.isnan(ws.fetch_blob("b")).all()
    kept = _ws(x=x)
    kept.create_net(_chain(), keep=["b"])
    kept.run_net("n")
    np.testing.assert_array_equal(kept.fetch_blob("b"), 2 * np.maximum(x, 0))


def test_planning_is_off_by_default_and_with_memory_plan_false():
    x = np.ones((64, 256), np.float32)
    for ws in (netrun.Workspace(), _ws(plan=False, x=x)):
        ws.feed_blob("x", x)
        ws.create_net(_chain())
        ws.run_net("n")
        assert not ws.memory.net_plans
        np.testing.assert_array_equal(ws.fetch_blob("b"), 2 * x)


def test_debug_mode_from_the_environment(monkeypatch):
    monkeypatch.setenv("NETRUN_PLAN_DEBUG", "1")
    assert netrun.Workspace(memory_plan=True).memory.debug
    monkeypatch.setenv("NETRUN_PLAN_DEBUG", "0")
    assert not netrun.Workspace(memory_plan=True).memory.debug


def test_a_wrong_plan_fails_loudly_in_debug_mode(monkeypatch):
    """The bitwise tests can fail: with every value at offset 0, results change."""
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    right = _ws(x=x)
    right.create_net(_chain())
    right.run_net("n")

    def overlapping(values):
        p = place(values)
        return Placement([0] * len(values), p.size, p.live_peak, p.peak_op, p.unshared)

    monkeypatch.setattr(memory, "place", overlapping)
    wrong = _ws(x=x)
    wrong.create_net(_chain())
    wrong.run_net("n")
    assert not np.array_equal(wrong.fetch_blob("y"), right.fetch_blob("y"))


def test_a_net_bound_later_that_reads_a_shared_blob_unshares_it():
    x = np.ones((64, 256), np.float32)
    ws = _ws(x=x)
    ws.create_net(_chain())
    assert "a" in {n for v in ws.memory.net_plans["n"].lifetimes.values for n in v.names}
    reader = netrun.NetDef("reader", [op("Relu", ["a"], ["z"])])
    ws.create_net(reader)
    assert "a" not in {n for v in ws.memory.net_plans["n"].lifetimes.values for n in v.names}
    ws.run_net("n")
    ws.run_net("reader")
    np.testing.assert_array_equal(ws.fetch_blob("z"), x)


def test_an_undeclared_view_into_the_arena_is_copied_out():
    """A kernel returning a view of a planned input the plan did not expect (Transpose is
    not declared a view) still gives the right bits: the output is copied out."""
    x = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    net = _net(op("Relu", ["x"], ["a"]), op("Flatten", ["a"], ["f"]),
               op("Scale", ["f"], ["s"], scale=3.0), op("Relu", ["s"], ["y"]))
    got, want = _ws(x=x), _ws(plan=False, x=x)
    for ws in (got, want):
        ws.create_net(net)
        ws.run_net("n", 2)
    assert got.fetch_blob("y").tobytes() == want.fetch_blob("y").tobytes()


def test_a_smaller_batch_than_planned_allocates_its_own_buffers():
    x = np.random.default_rng(2).standard_normal((64, 256)).astype(np.float32)
    ws = _ws(x=x)
    ws.create_net(_chain())
    ws.run_net("n")
    ws.feed_blob("x", x[:10])
    ws.run_net("n")
    np.testing.assert_array_equal(ws.fetch_blob("y"), 3 * np.maximum(x[:10], 0))


# Randomized nets ---------------------------------------------------------------------------
UNARY = ["Relu", "Scale", "Copy", "Flatten", "Sigmoid", "Tanh", "Softmax"]
BINARY = ["Sum", "Add", "Mul"]


@st.composite
def random_nets(draw):
    """Nets of elementwise ops over (8, 32) blobs with branches, joins, nets written in
    place, views, and some intermediate results also read at the end."""
    names = ["x"]
    ops = []
    for i in range(draw(st.integers(2, 14))):
        kind = draw(st.sampled_from(["unary", "unary", "binary", "inplace", "sum_into"]))
        src = draw(st.sampled_from(names))
        if kind == "sum_into" and src != "x":    # accumulate into a blob, as gradients do
            ops.append(op("Sum", [src, draw(st.sampled_from([n for n in names if n != src]))],
                          [src]))
            continue
        if kind == "binary" and len(names) > 1:
            other = draw(st.sampled_from(names))
            ops.append(op(draw(st.sampled_from(BINARY)), [src, other], [f"t{i}"]))
        elif kind == "inplace" and src != "x":
            ops.append(op(draw(st.sampled_from(["Relu", "Scale"])), [src], [src]))
            continue
        else:
            t = draw(st.sampled_from(UNARY))
            ops.append(op(t, [src], [f"t{i}"], **({"scale": 0.5} if t == "Scale" else {})))
        names.append(f"t{i}")
    return netrun.NetDef("r", ops)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_nets(), st.booleans())
def test_random_nets_give_the_same_bits_with_and_without_a_plan(net, twice):
    x = np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32)
    results = []
    for plan in (True, False):
        ws = _ws(plan=plan, x=x)
        ws.create_net(net)
        ws.run_net("r", 2 if twice else 1)
        written = {n for o in net.ops for n in o.outputs}
        kept = written - {n for v in (ws.memory.net_plans["r"].lifetimes.values
                                      if plan and "r" in ws.memory.net_plans else ())
                          for n in v.names}
        results.append({n: ws.fetch_blob(n).tobytes() for n in sorted(kept)})
    assert results[0] == {n: results[1][n] for n in results[0]}


def test_writing_a_view_in_place_leaves_its_source_alone():
    """Found by the test above: Relu(t1) -> t1 over a view t1 of t0 gets a buffer of its
    own without a plan (a view is not reused), so t0 keeps its values with one too."""
    net = netrun.NetDef("r", [op("Scale", ["x"], ["t0"], scale=0.5),
                              op("Flatten", ["t0"], ["t1"]), op("Relu", ["t1"], ["t1"]),
                              op("Scale", ["t0"], ["t6"], scale=0.5),
                              op("Relu", ["t1"], ["t8"])])
    lt = _lifetimes(net)
    assert lt.writes[(1, 0)] == lt.writes[(0, 0)] and lt.writes[(2, 0)] != lt.writes[(0, 0)]
    x = np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32)
    got, want = _ws(x=x), _ws(plan=False, x=x)
    for ws in (got, want):
        ws.create_net(net)
        ws.run_net("r")
    for name in ("t6", "t8"):
        assert got.fetch_blob(name).tobytes() == want.fetch_blob(name).tobytes()


def with_backward_pass(net):
    """(net "g" with a loss and its backward pass, the names to compare, the feeds) for a
    random net; hypothesis skips nets whose backward pass cannot be built."""
    from hypothesis import assume

    from netrun.core.gradient import add_gradient_ops
    from netrun.errors import NetrunError

    last = net.ops[-1].outputs[0]
    train_net = netrun.NetDef("g", [*net.ops, op("Mul", [last, "w"], ["m"]),
                                    op("AveragedLoss", ["m"], ["loss"])])
    try:
        grads = add_gradient_ops(train_net, ["loss"])
    except NetrunError:
        assume(False)
    names = sorted({grads[b] for b in ("x", "w") if b in grads} | {"loss"})
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((8, 32)).astype(np.float32),
             "w": rng.standard_normal((8, 32)).astype(np.float32)}
    return train_net, names, feeds


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_nets())
def test_random_nets_with_their_backward_pass_give_the_same_gradients(net):
    """The same nets with a loss and the gradient builder's backward pass: gradients of
    branches summed, gradient ops run in place, activations read by them kept alive."""
    train_net, want_names, feeds = with_backward_pass(net)
    results = []
    for plan in (True, False):
        ws = _ws(plan=plan, **feeds)
        ws.create_net(train_net, keep=want_names)
        ws.run_net("g", 2)
        results.append({n: ws.fetch_blob(n).tobytes() for n in want_names})
    assert results[0] == results[1]


def test_estimated_scratch_gets_room_in_the_activation_arena():
    """Ops with a scratch estimate carve their scratch from the arena where no value
    live at the op is; the workspace's own scratch arena is then neither reserved nor
    faulted in for them."""
    model = netrun.load_model(str(REPO / "zoo" / "lenet.yaml"))
    ws = netrun.Workspace(seed=0, memory_plan=True, plan_debug=True)
    ws.run_net_once(model.init_net)
    net = model.predict_net.copy()
    net.name = "predict"
    bound = ws.create_net(net, keep=model.outputs)
    ws.feed_blob("data", np.random.default_rng(0).standard_normal((16, 1, 28, 28))
                 .astype(np.float32))
    rooms = [o for o in bound.ops if o.scratch_room is not None]
    assert rooms and ws.memory.stats.scratch_prefaulted == 0
    ws.run_net("predict")
    arena = ws.memory.activations.array
    assert ws.memory.scratch_bytes > 0 and not ws.memory.arena._blocks.blocks
    for o in rooms:
        assert np.shares_memory(o.scratch_room, arena)
