"""The dependency-graph executor (netrun.core.dag): its edges, its errors, its hooks, and
bitwise the same results as the sequential executor on random nets in any order the graph
allows, planning on (dead values poisoned) and off."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import netrun
from netrun.core.dag import DagNet, blob_edges
from netrun.core.net import SimpleNet
from netrun.errors import NetrunError, ShapeError
from tests.test_planner import random_nets, with_backward_pass

op = netrun.op


def _deps(*ops):
    return [sorted(d) for d in blob_edges(netrun.NetDef("n", list(ops)))]


def test_edges_read_after_write_write_after_read_and_write_after_write():
    assert _deps(op("Relu", ["x"], ["a"]),           # 0
                 op("Relu", ["x"], ["b"]),           # 1: independent of 0
                 op("Sum", ["a", "b"], ["c"]),       # 2: reads a and b
                 op("Relu", ["x"], ["a"]),           # 3: rewrites a after 2 read it
                 op("Relu", ["x"], ["a"])) == [[], [], [0, 1], [0, 2], [3]]


def test_edges_of_in_place_ops_and_of_views():
    # Flatten's output is its input's storage: writing t0 in place waits for t1's reader.
    assert _deps(op("Scale", ["x"], ["t0"], scale=0.5),   # 0
                 op("Flatten", ["t0"], ["t1"]),           # 1
                 op("Relu", ["t1"], ["u"]),               # 2 reads t0's storage
                 op("Relu", ["t0"], ["t0"]),              # 3 in place over it
                 op("Relu", ["t1"], ["t1"])) == [[], [0], [0, 1], [0, 1, 2], [1, 2, 3]]


def test_random_draws_keep_their_order():
    deps = _deps(op("Dropout", ["x"], ["a", "ma"], ratio=0.5),
                 op("Dropout", ["x"], ["b", "mb"], ratio=0.5),
                 op("Relu", ["x"], ["c"]),
                 op("GaussianFill", [], ["d"], shape=[2]))
    assert deps == [[], [0], [], [1]]


def _ws(executor="dag", plan=True, debug=True, **blobs) -> netrun.Workspace:
    ws = netrun.Workspace(seed=0, memory_plan=plan, plan_debug=debug, executor=executor)
    ws.memory.min_bytes = 0
    for name, value in blobs.items():
        ws.feed_blob(name, value)
    return ws


def test_the_executor_is_chosen_per_workspace_and_per_net():
    net = netrun.NetDef("n", [op("Relu", ["x"], ["y"])])
    ws = _ws("simple", x=np.ones(3, np.float32))
    assert type(ws.create_net(net)) is SimpleNet
    assert type(ws.create_net(net, executor="dag")) is DagNet
    assert type(_ws(x=np.ones(3, np.float32)).create_net(net)) is DagNet
    with pytest.raises(NetrunError, match="unknown executor 'fast'.*simple, dag"):
        ws.create_net(net, executor="fast")
    with pytest.raises(NetrunError, match="unknown executor"):
        netrun.Workspace(executor="fast")


def _run(net, executor, plan, feeds, names, priority=None, iterations=2):
    ws = _ws(executor, plan, **feeds)
    bound = ws.create_net(net, keep=names)
    if priority is not None:
        bound.workers, bound.priority = 1, priority
    ws.run_net(net.name, iterations)
    return {n: ws.fetch_blob(n).tobytes() for n in names}


def _same_under_any_order(net, feeds, names, order_seed):
    from netrun.core import dag

    want = _run(net, "simple", False, feeds, names)
    rng = np.random.default_rng(order_seed)
    # Window 0: lifetimes not widened, so every byte shared rests on the plan's edges.
    for plan, window in ((False, dag.WINDOW), (True, dag.WINDOW), (True, 0)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(dag, "WINDOW", window)
            assert _run(net, "dag", plan, feeds, names) == want
            # One worker taking ready ops in a random order: any order the graph allows.
            order = list(rng.permutation(len(net.ops)))
            assert _run(net, "dag", plan, feeds, names, order) == want, order


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_nets(), st.integers(0, 2**31))
def test_random_nets_give_the_same_bits_in_any_order_the_graph_allows(net, seed):
    x = np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32)
    names = sorted({n for o in net.ops for n in o.outputs})
    _same_under_any_order(net, {"x": x}, names, seed)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_nets(), st.integers(0, 2**31))
def test_random_nets_with_their_backward_pass_in_any_order(net, seed):
    train_net, names, feeds = with_backward_pass(net)
    _same_under_any_order(train_net, feeds, names, seed)


def test_an_in_place_write_waits_for_the_other_readers_of_its_input():
    """Found by the test above: the plan lets Scale write x_grad_autosplit_1 over t1_grad,
    its last reader in the net's order, while Copy (t1_grad -> x_grad) is unordered with it
    by blobs; Scale must wait for Copy."""
    from netrun.core.gradient import add_gradient_ops

    net = netrun.NetDef("g", [op("Relu", ["x"], ["t0"]), op("Scale", ["x"], ["t1"], scale=0.5),
                              op("Sum", ["t1", "x"], ["t1"]), op("Mul", ["t1", "w"], ["m"]),
                              op("AveragedLoss", ["m"], ["loss"])])
    grads = add_gradient_ops(net, ["loss"])
    names = sorted({grads["x"], grads["w"], "loss"})
    copy = next(i for i, o in enumerate(net.ops) if o.type == "Copy")
    scale = next(i for i, o in enumerate(net.ops) if o.type == "Scale" and i > copy)
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((8, 32)).astype(np.float32),
             "w": rng.standard_normal((8, 32)).astype(np.float32)}
    want = _run(net, "simple", False, feeds, names)
    order = list(range(len(net.ops)))
    order[copy], order[scale] = order[scale], order[copy]    # Scale first, where allowed
    assert _run(net, "dag", True, feeds, names, order) == want
    ws = _ws(x=feeds["x"], w=feeds["w"])
    bound = ws.create_net(net, keep=names)
    assert ws.memory.net_plans["g"].lifetimes.writes.get((scale, 0)) is not None
    ws.run_net("g")
    assert scale in bound.schedule().succ[copy]


def _dag_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("netrun-dag")]


def test_an_op_that_raises_in_a_worker_raises_from_run_and_leaves_no_thread_waiting():
    # Two independent branches; the second fails (shapes that do not add) while the first
    # may still be running on the other worker.
    ops = [op("Relu", ["x"], [f"a{i}"]) for i in range(6)]
    ops.append(op("Add", ["x", "bad"], ["y"]))
    ops += [op("Relu", ["a0"], ["z"])]
    net = netrun.NetDef("n", ops)
    feeds = {"x": np.ones((64, 64), np.float32), "bad": np.ones((3,), np.float32)}
    errors = []
    for executor in ("simple", "dag"):
        ws = _ws(executor, **feeds)
        bound = ws.create_net(net)
        with pytest.raises(ShapeError) as e:
            ws.run_net("n")
        errors.append(str(e.value))
        if executor == "dag":
            mine = [t for t in _dag_threads() if t in bound._pool.threads]
            assert len(mine) == bound.workers - 1 and all(t.is_alive() for t in mine)
            with pytest.raises(ShapeError):   # the workers take the next run as before
                ws.run_net("n")
            ws.feed_blob("bad", np.ones((64, 64), np.float32))
            ws.run_net("n")
            np.testing.assert_array_equal(ws.fetch_blob("z"), np.ones((64, 64)))
            bound.close()
            assert not any(t.is_alive() for t in mine)
    assert errors[0] == errors[1]


def test_the_earliest_failing_op_is_the_error_raised():
    net = netrun.NetDef("n", [op("Add", ["x", "bad"], ["y"]),
                              op("Relu", ["missing"], ["z"])])
    feeds = {"x": np.ones((4,), np.float32), "bad": np.ones((3,), np.float32)}
    for _ in range(5):
        ws = _ws(**feeds)
        ws.create_net(net)
        with pytest.raises(ShapeError):
            ws.run_net("n")


def test_workers_stop_when_the_workspace_goes():
    import gc

    before = set(_dag_threads())
    ws = _ws(x=np.ones((4,), np.float32))
    ws.create_net(netrun.NetDef("n", [op("Relu", ["x"], ["a"]), op("Relu", ["x"], ["b"])]))
    ws.run_net("n")
    mine = set(_dag_threads()) - before
    assert mine
    del ws
    gc.collect()
    for t in mine:
        t.join(5)
        assert not t.is_alive()


def test_hooks_come_one_at_a_time_in_the_nets_order():
    ops = [op("Relu", ["x"], [f"a{i}"]) for i in range(8)]
    ops += [op("Sum", [f"a{i}" for i in range(8)], ["s"])]
    ws = _ws(x=np.ones((256, 256), np.float32))
    bound = ws.create_net(netrun.NetDef("n", ops))
    seen, inside = [], []
    lock = threading.Lock()

    def hook(i, o):
        assert lock.acquire(blocking=False), "two hook calls at once"
        try:
            assert o is bound.ops[i]
            seen.append(i)
        finally:
            lock.release()

    bound.run(hook)
    assert seen == list(range(9))
    assert not inside


def _resnet20_step(executor):
    from netrun.train.config import SolverConfig
    from netrun.train.solver import build_training

    model = netrun.load_model("zoo/resnet20.yaml")
    nets = build_training(model, SolverConfig(type="sgd", momentum=0.9))
    ws = _ws(executor)
    ws.run_net_once(nets.init)
    bound = ws.create_net(nets.step)
    for name, spec in model.input_specs(4, {}).items():
        if name not in model.param_names:
            ws.feed_blob(name, np.zeros(spec.shape, spec.dtype))
    return bound, ws.memory.net_plans[nets.step.name]


def _ancestors(deps):
    out = []
    for d in deps:
        a = set(d)
        for j in d:
            a |= out[j]
        out.append(a)
    return out


def test_the_plan_of_a_dag_net_keeps_unordered_neighbours_apart(monkeypatch):
    """A DAG net's values live from the first op within dag.WINDOW that their writer does
    not wait for (memory.py): bytes are shared between unordered ops only further apart,
    where the plan's edges (plan_edges) order them. With an unbounded window those edges
    add nothing the blob edges do not imply; with the default one the arena stays near the
    sequential plan's while many ops keep a neighbour to overlap with."""
    import copy

    from netrun.core import dag
    from netrun.core.dag import plan_edges

    simple_size = _resnet20_step("simple")[1].placement.size
    for window, most in ((10**6, None), (dag.WINDOW, 1.1)):
        monkeypatch.setattr(dag, "WINDOW", window)
        bound, plan = _resnet20_step("dag")
        assert plan.placement.size < plan.placement.unshared     # something is shared
        deps = blob_edges(bound.def_)
        more = copy.deepcopy(deps)
        plan_edges(bound.def_, plan, more)
        extra = [(j, i) for i, (d, m) in enumerate(zip(deps, more)) for j in m - d]
        ancestors = _ancestors(deps)
        if most is None:
            assert all(j in ancestors[i] for j, i in extra)
        else:
            assert plan.placement.size <= most * simple_size
            assert any(j not in ancestors[i] for j, i in extra)   # the edges do work here
            final = _ancestors(more)
            n = len(final)
            free = sum(1 for i in range(n) if any(j not in final[i] and i not in final[j]
                                                  for j in range(n) if j != i))
            assert free > n // 3


def test_an_op_drawing_random_numbers_unannounced_fails_loudly(monkeypatch):
    from netrun.core import dag
    from netrun.errors import InternalError

    net = netrun.NetDef("n", [op("Dropout", ["x"], ["y", "m"], ratio=0.5)])
    monkeypatch.setattr(dag, "RANDOM_OPS", frozenset())
    ws = _ws(x=np.ones((8, 8), np.float32))
    ws.create_net(net)
    with pytest.raises(InternalError, match="Dropout.*RANDOM_OPS"):
        ws.run_net("n")
