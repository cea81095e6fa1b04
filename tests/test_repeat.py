"""An op's run repeated by its kernel's bound calls alone (OpContext.repeat_with): when it
applies, when it stops applying, and oneDNN's convolutions giving the same bits that way."""
from __future__ import annotations

import numpy as np
import pytest

import netrun
from netrun.conv.cpu import onednn as onednn_conv
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, register_schema
from netrun.errors import InternalError
from netrun.kernels import onednn
from netrun.ops.common import same_as_input

register_schema("TestRepeatable", inputs=2, shape_fn=same_as_input(0),
                args=[Arg("fail", "int", 0, doc="1: raise after offering to repeat")])
CALLS: dict[str, int] = {}
CHECK = {"ok": True}


class _Bound:
    """Y = X + W again, on the arrays of the run that bound it."""

    def __init__(self, x, w, y):
        self.x, self.w, self.y, self.closed = x, w, y, False

    def run(self):
        CALLS["bound"] = CALLS.get("bound", 0) + 1
        np.add(self.x, self.w, out=self.y)

    def close(self):
        self.closed = True
        CALLS["closed"] = CALLS.get("closed", 0) + 1


class _Check:
    """CHECK["ok"]; `steady` (the part a whole net's pass checks) where CHECK["steady"]."""

    def __init__(self):
        self.steady = self._steady if CHECK.get("steady") else None

    def _steady(self):
        CALLS["steady"] = CALLS.get("steady", 0) + 1
        return CHECK["ok"]

    def __call__(self):
        return CHECK["ok"]


@register_kernel("TestRepeatable")
def _repeatable(ctx, X, W):
    CALLS["kernel"] = CALLS.get("kernel", 0) + 1
    Y = ctx.output(0, X.shape, X.dtype)
    np.add(X, W, out=Y)
    ctx.repeat_with(_Bound(X, W, Y), _Check(), unchanged=(ctx.def_.inputs[1],))
    if ctx.args.fail:
        raise ValueError("after offering to repeat")


def _net(ws, **args):
    ws.create_net(netrun.NetDef(name="n", ops=[netrun.op("TestRepeatable", ["X", "W"], ["Y"],
                                                         **args)]))


def _chain(ws, second_w="W"):
    """Y = X + W, Z = Y + second_w: two repeating ops, the second reading the first's output."""
    ws.create_net(netrun.NetDef(name="n", ops=[
        netrun.op("TestRepeatable", ["X", "W"], ["Y"]),
        netrun.op("TestRepeatable", ["Y", second_w], ["Z"])]))


@pytest.fixture(autouse=True)
def _clean():
    CALLS.clear()
    CHECK.clear()
    CHECK["ok"] = True


def test_a_run_repeats_by_its_bound_calls_while_nothing_moved():
    ws = netrun.Workspace()
    ws.feed_blob("X", np.ones(4, np.float32))
    ws.feed_blob("W", np.full(4, 2.0, np.float32))
    _net(ws)
    ws.run_net("n")
    before = ws.version("Y")
    ws.run_net("n", iterations=3)
    assert CALLS == {"kernel": 1, "bound": 3}
    assert ws.version("Y") == before + 3     # its outputs count as written, as by the kernel
    ws.get_blob("X")[...] = 5.0              # new values in the same array: read by the calls
    ws.run_net("n")
    np.testing.assert_array_equal(ws.fetch_blob("Y"), np.full(4, 7.0))
    assert CALLS["kernel"] == 1


@pytest.mark.parametrize("change", ["feed X", "touch W", "check", "replace Y"])
def test_the_kernel_runs_again_when_something_moved(change):
    ws = netrun.Workspace()
    ws.feed_blob("X", np.ones(4, np.float32))
    ws.feed_blob("W", np.full(4, 2.0, np.float32))
    _net(ws)
    ws.run_net("n", iterations=2)
    assert CALLS == {"kernel": 1, "bound": 1}
    if change == "feed X":
        ws.feed_blob("X", np.full(4, 3.0, np.float32))   # a new array under the name
    elif change == "touch W":
        ws.get_blob("W")[...] = 4.0
        ws.touch("W")                                     # written in place, and said so
    elif change == "check":
        CHECK["ok"] = False
    else:
        ws._blobs["Y"] = np.zeros(4, np.float32)          # another net's buffer under Y
    ws.run_net("n")
    assert CALLS["kernel"] == 2 and CALLS["closed"] == 1
    want = ws.fetch_blob("X") + ws.fetch_blob("W")
    np.testing.assert_array_equal(ws.fetch_blob("Y"), want)


def test_a_kernel_that_fails_after_offering_leaves_nothing_to_repeat():
    ws = netrun.Workspace()
    ws.feed_blob("X", np.ones(4, np.float32))
    ws.feed_blob("W", np.ones(4, np.float32))
    _net(ws, fail=1)
    for _ in range(2):
        with pytest.raises(InternalError, match="after offering to repeat"):
            ws.run_net("n")
    assert CALLS == {"kernel": 2}


needs_onednn = pytest.mark.skipif(not onednn.available(), reason="oneDNN is not installed")


@needs_onednn
@pytest.mark.parametrize("residual", [False, True])
def test_onednn_convolutions_repeat_their_bound_calls_with_the_same_bits(residual,
                                                                         monkeypatch):
    """One image's convolution runs as one oneDNN call on a team: from the second run on,
    its filters are kept and the call is bound; the bound call gives the kernel's bits, reads
    new input values, and gives way when the filters are written. An NCHW residual is summed
    by netrun after the call, so that op never repeats by its calls alone."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    s = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    inputs = ["X", "W", "b"] + (["S"] if residual else [])
    op = netrun.op("Conv", inputs, ["Y"], kernel=3, pad=1, relu=1, algo="onednn")

    def run(bind: bool, steps) -> list[np.ndarray]:
        monkeypatch.setattr(onednn_conv.OneDNNConv, "binds_calls", bind)
        ws = netrun.Workspace()
        for name, value in zip(["X", "W", "b", "S"], [x, w, b, s]):
            ws.feed_blob(name, value)
        ws.create_net(netrun.NetDef(name="n", ops=[op]))
        out = []
        for step in steps:
            step(ws)
            ws.run_net("n")
            out.append(ws.fetch_blob("Y"))
        repeated = ws._nets["n"].ops[0]._repeat is not None
        return out, repeated

    def same(ws):
        pass

    def new_x(ws):
        ws.get_blob("X")[...] = ws.get_blob("X") * 0.5    # in place: the same array

    def new_w(ws):
        ws.get_blob("W")[...] = ws.get_blob("W")[::-1]
        ws.touch("W")

    steps = [same, same, same, new_x, same, new_w, same, same]
    bound, repeated = run(True, steps)
    plain, never = run(False, steps)
    assert repeated == (not residual) and not never
    for i, (a, c) in enumerate(zip(bound, plain)):
        assert np.array_equal(a, c), f"run {i}: the bound call and the kernel differ"
    assert not np.array_equal(bound[2], bound[3]) and not np.array_equal(bound[4], bound[5])


@needs_onednn
def test_a_bound_call_follows_its_scratch_region_when_it_moves():
    from netrun.conv.problem import ConvProblem
    from netrun.kernels.onednn import conv as engine

    p = ConvProblem(1, 16, 10, 10, 16, 3, 3, 1, 1, 1, 1, 1, 1)
    d = engine.plan(onednn_conv.spec(p), "forward", 1)
    assert d.region_bytes   # at least the filters' reorder lives there
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16, 10, 10)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    want = np.empty((1, 16, 10, 10), np.float32)
    engine.run(d, 1, netrun.Workspace().scratch, src=x, weights=w, dst=want)
    regions = []   # every region asked for stays alive: each one is somewhere new

    def scratch(key, shape, dtype="float32"):
        regions.append(np.empty(shape, dtype))
        return regions[-1]

    y = np.full_like(want, np.nan)
    bound = engine.bind(d, 1, scratch, None, src=x, weights=w, dst=y)
    seen = set()
    for _ in range(3):
        y[...] = np.nan
        bound.run()
        seen.add(bound.base)
        assert np.array_equal(y, want)
    assert len(seen) == 3
    bound.close()


def test_refilling_a_blob_keeps_its_array_and_counts_the_write():
    ws = netrun.Workspace()
    ws.feed_blob("X", np.zeros((2, 3), np.float32))
    array, before = ws.get_blob("X"), ws.version("X")
    ws.refill_blob("X", np.ones((2, 3), np.float32))
    assert ws.get_blob("X") is array and ws.version("X") == before + 1
    np.testing.assert_array_equal(array, np.ones((2, 3)))
    ws.refill_blob("X", np.ones((4, 3), np.float32))   # another shape: fed as a new array
    assert ws.get_blob("X") is not array and ws.get_blob("X").shape == (4, 3)
    ws.refill_blob("X", np.ones((4, 3)))                # another dtype too, as feed_blob does
    assert ws.get_blob("X").dtype == np.float64


def test_batches_refilled_into_the_input_keep_its_reader_repeating():
    ws = netrun.Workspace()
    ws.feed_blob("X", np.ones(4, np.float32))
    ws.feed_blob("W", np.full(4, 2.0, np.float32))
    _net(ws)
    for value in range(5):
        ws.refill_blob("X", np.full(4, value, np.float32))
        ws.run_net("n")
        np.testing.assert_array_equal(ws.fetch_blob("Y"), np.full(4, value + 2.0))
    assert CALLS == {"kernel": 1, "bound": 4}


@needs_onednn
def test_a_training_steps_convolutions_repeat_their_bound_calls_with_the_same_bits(
        monkeypatch):
    """Training: the forward pass reorders filters that change every step and the gradients'
    batch chunks run as one team call; both are bound once and repeated (the filters'
    reorder among their calls), give the kernels' bits step after step while W, X and dY
    change in place, and bind again when an input is a new array."""
    from netrun.kernels import omp, parallel

    if not omp.usable(np):
        pytest.skip("Numba's OpenMP threading layer is not available here")
    monkeypatch.setattr(onednn_conv, "CHUNK_MIN_FLOPS", 1)   # chunks of the batch of 6
    monkeypatch.setattr(onednn_conv, "CHUNK_FLOPS", 1)
    monkeypatch.setattr(parallel, "thread_count", lambda: 2)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 16, 10, 10)).astype(np.float32)
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((6, 24, 10, 10)).astype(np.float32)
    conv = netrun.op("Conv", ["X", "W"], ["Y"], kernel=3, pad=1, algo="onednn", no_bias=1)
    grads = netrun.gradient_ops(conv)[0]
    assert [g.outputs for g in grads] == [("W_grad", "X_grad")]
    update = netrun.op("Scale", ["W"], ["W"], scale=0.5)   # in place, as an update op writes

    def run(bind: bool) -> tuple[list, list]:
        monkeypatch.setattr(onednn_conv.OneDNNConv, "binds_calls", bind)
        ws = netrun.Workspace()
        for name, value in (("X", x), ("W", w), ("Y_grad", dy)):
            ws.feed_blob(name, value.copy())
        ws.create_net(netrun.NetDef(name="step", ops=[conv, *grads, update]))
        out, repeating = [], []
        for step in range(7):
            if step == 3:    # new values in place
                ws.get_blob("X")[...] *= -1
                ws.get_blob("Y_grad")[...] *= 2
            if step == 5:    # a new array: the calls bind again
                ws.feed_blob("X", x[::-1].copy())
            ws.run_net("step")
            out.append([ws.fetch_blob(n).copy() for n in ("Y", "W_grad", "X_grad")])
            repeating.append([o._repeat for o in ws._nets["step"].ops[:2]])
        return out, repeating

    bound, repeating = run(True)
    plain, never = run(False)
    assert not any(r for step in never for r in step)
    # bound in the first run (the forward pass: once W is seen changing), kept until X moved
    assert all(r is not None for step in repeating[1:] for r in step)
    for op in (0, 1):
        kept = [repeating[i][op] for i in range(1, 7)]
        assert all(r is kept[0] for r in kept[:4]) and kept[4] is not kept[0], op
    for i, (a, c) in enumerate(zip(bound, plain)):
        for name, u, v in zip(("Y", "dW", "dX"), a, c):
            assert np.array_equal(u, v), f"step {i} {name}: the bound calls and the kernel differ"
    assert not np.array_equal(bound[2][0], bound[3][0])   # they read the new values


def test_the_scratch_mark_holds_while_an_ops_regions_stay_where_they_are():
    from netrun.core.memory import ScratchArena

    # small blocks (a real arena reserves address space, SCRATCH_RESERVE at a time)
    arena = ScratchArena(lambda nbytes, reserve=False: bytearray(1 << 12))

    class Op:
        scratch_room = None

    a, b = Op(), Op()
    arena.rewind(a)
    arena.get("x", (8,), "float32")
    first = arena.mark()
    arena.rewind(b)
    arena.get("y", (16,), "float32")
    assert arena.mark() != first            # another op's regions
    arena.rewind(a)
    arena.get("x", (8,), "float32")         # found where it was: nothing carved
    assert arena.mark() == first
    arena.get("x", (64,), "float32")        # grown: carved anew, elsewhere
    assert arena.mark() != first
    a.scratch_room = np.zeros(256, np.uint8)   # a new plan for the op: new regions
    arena.rewind(a)
    assert arena.mark() != first
    arena.rewind(None)                       # an op that will not run again
    assert arena.mark() is None


def test_an_fc_and_a_global_pooling_repeat_their_one_call_as_inputs_change_in_place():
    """A classifier's head at batch 1: the FC's one BLAS call and the blocked global
    pooling's one compiled call repeat, following X and W refilled in place, and the kernels
    run again when X is a new array."""
    from netrun.kernels import jit

    rng = np.random.default_rng(11)
    ws = netrun.Workspace()
    net = netrun.NetDef(name="head", ops=[
        netrun.op("AveragePool", ["X"], ["P"], global_pooling=1),
        netrun.op("FC", ["P", "W", "b"], ["Y"])])

    def want(x, w, b):
        pooled = x.mean(axis=(2, 3)).reshape(x.shape[0], -1)
        return pooled @ w.T + b

    x = rng.standard_normal((1, 2, 4, 4, 8)).astype(np.float32)   # blocked: 16 channels
    w, b = rng.standard_normal((5, 16)).astype(np.float32), np.ones(5, np.float32)
    for name, value in (("X", x), ("W", w), ("b", b)):
        ws.feed_blob(name, value)
    ws.create_net(net)
    ws.run_net("head")
    ops = ws._nets["head"].ops
    # the pooling's one call is the compiled kernel's (NumPy's reduction does not offer it)
    offered = [True, True] if jit.enabled(np) else [False, True]
    assert [o._repeat is not None for o in ops] == offered
    for step in range(3):
        x, w = x + 1, w * 0.5
        ws.refill_blob("X", x)
        ws.refill_blob("W", w)
        ws.run_net("head")
        assert [o._repeat is not None for o in ops] == offered
        np.testing.assert_allclose(ws.fetch_blob("Y"), want(x, w, b), rtol=1e-5, atol=1e-5)
    ws.feed_blob("X", x[:, :, :2])          # a new array: both kernels run again
    ws.run_net("head")
    np.testing.assert_allclose(ws.fetch_blob("Y"), want(x[:, :, :2], w, b), rtol=1e-5,
                               atol=1e-5)


@needs_onednn
def test_a_nets_repeating_convolutions_make_their_calls_together_with_the_same_bits(
        monkeypatch):
    """ResNet-20's predict net at batch 1, bound and planned: from the second run on, its
    convolutions hand their bound calls to the net, which makes consecutive ones in one loop
    (Operator.deferred), and once every op repeated, the net checks and makes the whole pass
    at once (netrun.core.bound_pass). The bits equal the op-by-op runs (a profiling hook
    makes the net run each op itself), run after run, as the input changes in place."""
    from pathlib import Path

    from netrun.kernels.onednn import conv as engine
    from netrun.model import load_model
    from netrun.rewrite import bind_rewrite

    model = load_model(Path(__file__).resolve().parents[1] / "zoo" / "resnet20.yaml")
    rng = np.random.default_rng(12)
    ws = netrun.Workspace("cpu", seed=0)
    ws.run_net_once(model.init_net)
    ws.feed_blob("data", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    done = bind_rewrite(model.predict_net, ws, "inference", keep=model.outputs)
    ws.create_net(done.net)
    net = ws._nets[done.net.name]
    made = []
    batched = engine.run_bound_lists

    def counting(lib, count, lists):
        made.append(len(lists))
        batched(lib, count, lists)
    monkeypatch.setattr(engine, "run_bound_lists", counting)
    engine.runner.cache_clear()   # runners made after the patch call it
    out = model.outputs[0]
    for step in range(3):
        ws.refill_blob("data", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
        net.run(hook=lambda i, o: None)        # op by op
        want = ws.fetch_blob(out).copy()
        made.clear()
        net.run()                              # the convolutions' calls together
        assert np.array_equal(ws.fetch_blob(out), want), f"step {step}"
        if step:
            # all 21 convolutions repeat; a run of consecutive ones goes out as one batch
            assert sum(made) == 21 and len(made) < 21, made
            # every op repeated: the whole pass is checked and made at once (BoundPass)
            assert net._bound is not None
    # another thread count: the convolutions' steady checks fail, the ops bind again
    old = net._bound
    monkeypatch.setenv("NETRUN_THREADS", "1")
    net.run()
    assert net._bound is None and np.array_equal(ws.fetch_blob(out), want)
    for _ in range(2):
        net.run()
        assert np.array_equal(ws.fetch_blob(out), want)
    assert net._bound is not None and net._bound is not old
    engine.runner.cache_clear()


# A whole net's pass (netrun.core.bound_pass) ---------------------------------------------------
def _chained_ws():
    CHECK["steady"] = True
    ws = netrun.Workspace()
    ws.feed_blob("X", np.ones(4, np.float32))
    ws.feed_blob("W", np.full(4, 2.0, np.float32))
    _chain(ws)
    return ws


def test_a_run_in_which_every_op_repeated_becomes_the_nets_bound_pass():
    ws = _chained_ws()
    net = ws._nets["n"]
    ws.run_net("n", iterations=2)                 # bound, then repeated op by op
    assert net._bound is not None and CALLS["kernel"] == 2 and CALLS["bound"] == 2
    assert "steady" not in CALLS                  # the op-by-op run checked each op itself
    before = ws.version("Z")
    for value in range(3):
        ws.refill_blob("X", np.full(4, value, np.float32))   # same array: the pass holds
        ws.run_net("n")
        np.testing.assert_array_equal(ws.fetch_blob("Z"), np.full(4, value + 4.0))
    assert CALLS["kernel"] == 2 and CALLS["bound"] == 2 + 2 * 3
    assert CALLS["steady"] == 2 * 3               # each op's steady part, once a pass
    assert ws.version("Z") == before + 3          # outputs counted as written


@pytest.mark.parametrize("change", ["feed X", "touch W", "check", "replace Y"])
def test_the_bound_pass_gives_way_when_something_an_op_checks_moved(change):
    ws = _chained_ws()
    net = ws._nets["n"]
    ws.run_net("n", iterations=3)
    assert net._bound is not None and CALLS["kernel"] == 2
    if change == "feed X":
        ws.feed_blob("X", np.full(4, 3.0, np.float32))
    elif change == "touch W":
        ws.get_blob("W")[...] = 4.0
        ws.touch("W")
    elif change == "check":
        CHECK["ok"] = False
    else:
        ws._blobs["Y"] = np.zeros(4, np.float32)
    ws.run_net("n")
    assert net._bound is None
    want = ws.fetch_blob("X") + 2 * ws.fetch_blob("W")
    np.testing.assert_array_equal(ws.fetch_blob("Z"), want)
    # the kernels that saw a change ran again (a new X leaves the second op its Y)
    assert CALLS["kernel"] == {"feed X": 3, "touch W": 4, "check": 4, "replace Y": 4}[change]


def test_no_bound_pass_where_an_op_must_check_itself_in_its_turn():
    CHECK["steady"] = False    # a check with no net-level part (its own state moves each run)
    ws = netrun.Workspace()
    ws.feed_blob("X", np.ones(4, np.float32))
    ws.feed_blob("W", np.full(4, 2.0, np.float32))
    _chain(ws)
    ws.run_net("n", iterations=3)
    assert ws._nets["n"]._bound is None and CALLS["bound"] == 4


def test_no_bound_pass_where_an_op_reads_a_kept_copy_of_a_blob_the_net_writes():
    """Z = Y + Y with Y `unchanged` for the second op: written by the first op in the same
    pass, it would fail the second op's check in its turn, which a check at the pass's
    start cannot see."""
    CHECK["steady"] = True
    ws = netrun.Workspace()
    ws.feed_blob("X", np.ones(4, np.float32))
    ws.feed_blob("W", np.full(4, 2.0, np.float32))
    ws.create_net(netrun.NetDef(name="n", ops=[
        netrun.op("TestRepeatable", ["X", "W"], ["Y"]),
        netrun.op("TestRepeatable", ["X", "Y"], ["Z"])]))
    ws.run_net("n", iterations=3)
    assert ws._nets["n"]._bound is None
    np.testing.assert_array_equal(ws.fetch_blob("Z"), np.full(4, 4.0))
