"""Where the solver puts the gradient exchange: buckets in the order backward finishes the
gradients, each started right after the op that finishes its last one, waited for at the
end; one process gets no exchange at all."""
from __future__ import annotations

import numpy as np

import netrun
from netrun.core.workspace import Workspace
from netrun.train.config import SolverConfig
from netrun.train.solver import build_training
from tests.checks import checks_ops


def test_buckets_start_as_soon_as_their_gradients_are_done():
    model = netrun.load_model("zoo/lenet.yaml")
    single = build_training(model, SolverConfig())
    assert not any(o.type.startswith("Allreduce") for o in single.step.ops)
    nets = build_training(model, SolverConfig(), ranks=2, bucket_bytes=100_000)
    ops = nets.step.ops
    starts = [i for i, o in enumerate(ops) if o.type == "AllreduceStart"]
    waits = [i for i, o in enumerate(ops) if o.type == "AllreduceWait"]
    assert len(starts) == len(waits) >= 2 and max(starts) < min(waits)
    assert waits == list(range(len(ops) - len(waits), len(ops)))     # all at the very end
    sent = [g for i in starts for g in ops[i].inputs]
    assert sorted(sent) == sorted(nets.grads[p] for p in nets.params)  # each gradient once
    for i in starts:
        last_write = max(j for j, o in enumerate(ops[:i]) for g in ops[i].inputs
                         if g in o.outputs)
        assert last_write == i - 1 or ops[i - 1].type == "AllreduceStart"
    # The last layer's gradients are done first, so they travel first.
    assert "ip2_w_grad" in ops[starts[0]].inputs and "conv1_w_grad" in ops[starts[-1]].inputs


@checks_ops("AllreduceStart", "AllreduceWait", kind="reference")
def test_the_exchange_ops_run_on_one_process_as_the_mean_of_one():
    ws = Workspace("cpu")
    g = np.arange(6, dtype=np.float32).reshape(2, 3)
    ws.feed_blob("g", g.copy())
    ws.feed_blob("h", np.ones(4, np.float32))
    ws.run_operator_once(netrun.op("AllreduceStart", ["g", "h"], ["t"], bucket="b"))
    ws.run_operator_once(netrun.op("AllreduceWait", ["t", "g", "h"], ["g", "h"], bucket="b"))
    np.testing.assert_array_equal(ws.fetch_blob("g"), g)
    assert not ws.collectives
