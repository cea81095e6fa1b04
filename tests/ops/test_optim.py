"""Update operators vs torch.optim over several steps, NumPy references, schemas and in-place."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import netrun
from netrun.core.schema import TensorSpec
from netrun.errors import SchemaError, ShapeError
from netrun.ops.lr_policy import lr_at
from tests.opcheck import run_op
from tests.checks import checks_ops, requires_torch, torch

STEPS = 6
SHAPE = (3, 5)


def _grads(seed: int, n: int = STEPS, shape=SHAPE, dtype=np.float32) -> list[np.ndarray]:
    """Gradients bounded away from 0, so eps placement differences stay below rounding."""
    rng = np.random.default_rng(seed)
    return [(rng.choice([-1.0, 1.0], shape) * rng.uniform(0.5, 1.5, shape)).astype(dtype)
            for _ in range(n)]


def _param(seed: int = 7, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(dtype)


def _solver_net(update: netrun.OperatorDef, lr: dict) -> netrun.NetDef:
    """LearningRate, the update, then Iter: the first step sees iter = 0 (t = 1 for Adam)."""
    return netrun.NetDef("step", [
        netrun.op("LearningRate", ["iter"], ["lr"], **lr),
        update,
        netrun.op("Iter", ["iter"], ["iter"]),
    ])


def _run_netrun(device, update, blobs, grads, lr, fetch=("param",)):
    """Feed the state, run the solver net once per gradient; yield fetched blobs per step."""
    ws = netrun.Workspace(device)
    for name, value in blobs.items():
        ws.feed_blob(name, value)
    ws.feed_blob("iter", np.array(0, dtype=np.int64))
    ws.create_net(_solver_net(update, lr))
    out = []
    for g in grads:
        ws.feed_blob("grad", g)
        ws.run_net("step")
        out.append({n: ws.fetch_blob(n) for n in fetch})
    return ws, out


def _run_torch(opt_cls, p0, grads, state_keys=(), **kw):
    p = torch.tensor(p0.copy(), requires_grad=True)
    opt = opt_cls([p], **kw)
    out = []
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
        state = opt.state[p]
        out.append({"param": p.detach().numpy().copy(),
                    **{k: state[k].numpy().copy() for k in state_keys}})
    return out


def _close(a, b, rtol=2e-5, atol=2e-6, msg=""):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=msg)


# Iter and LearningRate ------------------------------------------------------------------
@checks_ops("Iter", kind="reference")
def test_iter_increments_in_place(device):
    ws = netrun.Workspace(device)
    ws.feed_blob("iter", np.array([41], dtype=np.int64))
    before = ws.get_blob("iter")
    ws.create_net(netrun.NetDef("n", [netrun.op("Iter", ["iter"], ["iter"])]))
    ws.run_net("n", iterations=3)
    it = ws.fetch_blob("iter")
    assert it.dtype == np.int64 and it.tolist() == [44]
    assert ws.get_blob("iter") is before


@checks_ops("LearningRate", kind="reference")
@pytest.mark.parametrize("lr", [
    dict(policy="fixed"),
    dict(policy="step", gamma=0.5, stepsize=3),
    dict(policy="multistep", gamma=0.1, stepvalues=[2, 5]),
    dict(policy="exp", gamma=0.9),
    dict(policy="inv", gamma=0.1, power=0.75),
    dict(policy="poly", power=2.0, max_iter=10),
    dict(policy="sigmoid", gamma=0.5, stepsize=4),
    dict(policy="step", gamma=0.5, stepsize=3, warmup_iters=4, warmup_start=0.25),
])
def test_learning_rate_is_negative_policy_value(device, lr):
    ws = netrun.Workspace(device)
    ws.feed_blob("iter", np.array(0, dtype=np.int64))
    ws.create_net(netrun.NetDef("n", [
        netrun.op("LearningRate", ["iter"], ["lr"], base_lr=0.2, **lr),
        netrun.op("Iter", ["iter"], ["iter"])]))
    cfg = {**lr, "base_lr": 0.2}
    for it in range(8):
        ws.run_net("n")
        got = ws.fetch_blob("lr")
        assert got.dtype == np.float32 and got.shape == ()
        np.testing.assert_allclose(got, np.float32(-lr_at(cfg, it)), rtol=1e-7)
        assert got < 0


# WeightedSum ----------------------------------------------------------------------------
@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=0, max_size=3), pairs=st.integers(1, 4),
       seed=st.integers(0, 2**16), dtype=st.sampled_from([np.float32, np.float64]))
def test_weighted_sum_matches_numpy(shape, pairs, seed, dtype):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(shape).astype(dtype) for _ in range(pairs)]
    ws_ = [np.array([rng.standard_normal()], dtype=np.float32) for _ in range(pairs)]
    names = [n for i in range(pairs) for n in (f"X{i}", f"w{i}")]
    feeds = {**{f"X{i}": x for i, x in enumerate(xs)}, **{f"w{i}": w for i, w in enumerate(ws_)}}
    (y,) = run_op(netrun.op("WeightedSum", names, ["Y"]), feeds)
    expect = sum(w.astype(np.float64)[0] * x.astype(np.float64) for x, w in zip(xs, ws_))
    assert y.dtype == dtype and y.shape == tuple(shape)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, expect, rtol=tol, atol=tol * 4)


def test_weighted_sum_out_of_place_leaves_x0(device):
    x0, x1 = _param(1), _param(2)
    ws = netrun.Workspace(device)
    feeds = {"X0": x0, "X1": x1, "a": np.float32(2.0), "b": np.array([-1.0], np.float32)}
    for n, v in feeds.items():
        ws.feed_blob(n, v)
    ws.run_operator_once(netrun.op("WeightedSum", ["X0", "a", "X1", "b"], ["Y"]))
    np.testing.assert_array_equal(ws.fetch_blob("X0"), x0)
    _close(ws.fetch_blob("Y"), 2 * x0 - x1, rtol=1e-6)


@checks_ops("WeightedSum", kind="torch")
@requires_torch
def test_plain_sgd_and_weight_decay_match_torch(device):
    """SGD: grad += decay*param (WeightedSum in place on grad), param += lr*grad."""
    p0, grads = _param(), _grads(1)
    ws = netrun.Workspace(device)
    ws.feed_blob("param", p0)
    ws.feed_blob("one", np.array([1.0], np.float32))
    ws.feed_blob("decay", np.array([5e-2], np.float32))
    ws.feed_blob("iter", np.array(0, dtype=np.int64))
    ws.create_net(netrun.NetDef("step", [
        netrun.op("LearningRate", ["iter"], ["lr"], base_lr=0.1, policy="fixed"),
        netrun.op("WeightedSum", ["grad", "one", "param", "decay"], ["grad"]),
        netrun.op("WeightedSum", ["param", "one", "grad", "lr"], ["param"]),
        netrun.op("Iter", ["iter"], ["iter"])]))
    ref = _run_torch(torch.optim.SGD, p0, grads, lr=0.1, weight_decay=5e-2)
    param = ws.get_blob("param")
    for g, r in zip(grads, ref):
        ws.feed_blob("grad", g)
        ws.run_net("step")
        _close(ws.fetch_blob("param"), r["param"])
    assert ws.get_blob("param") is param  # updated in place, never reallocated


# MomentumSGDUpdate ----------------------------------------------------------------------
@checks_ops("MomentumSGDUpdate", kind="torch")
@requires_torch
@pytest.mark.parametrize("nesterov", [0, 1])
def test_momentum_sgd_matches_torch_with_constant_lr(device, nesterov):
    p0, grads = _param(), _grads(2)
    update = netrun.op("MomentumSGDUpdate", ["grad", "mom", "lr", "param"],
                       ["grad", "mom", "param"], momentum=0.9, nesterov=nesterov)
    _, got = _run_netrun(device, update, {"param": p0, "mom": np.zeros_like(p0)}, grads,
                         dict(base_lr=0.05), fetch=("param", "mom"))
    ref = _run_torch(torch.optim.SGD, p0, grads, ["momentum_buffer"], lr=0.05, momentum=0.9,
                     nesterov=bool(nesterov))
    for step, (a, b) in enumerate(zip(got, ref)):
        _close(a["param"], b["param"], msg=f"param after step {step}")
        # Caffe2's buffer holds lr: m = -lr * torch's b
        _close(a["mom"], -0.05 * b["momentum_buffer"], msg=f"momentum after step {step}")


def _caffe_momentum(p, grads, lrs, mu, nesterov):
    """The documented Caffe2 formula in float64 (lr < 0): m = mu*m + lr*g; param += step."""
    m = np.zeros_like(p)
    for g, lr in zip(grads, lrs):
        m_new = mu * m + lr * g
        p = p + ((1 + mu) * m_new - mu * m if nesterov else m_new)
        m = m_new
    return p


@pytest.mark.parametrize("nesterov", [0, 1])
def test_momentum_sgd_follows_caffe_formula_when_lr_changes(device, nesterov):
    p0, grads = _param(dtype=np.float64), _grads(3, dtype=np.float64)
    lr = dict(base_lr=0.1, policy="step", gamma=0.1, stepsize=2)
    update = netrun.op("MomentumSGDUpdate", ["grad", "mom", "lr", "param"],
                       ["grad", "mom", "param"], momentum=0.9, nesterov=nesterov)
    _, got = _run_netrun(device, update, {"param": p0, "mom": np.zeros_like(p0)}, grads, lr)
    lrs = [-lr_at(lr, it) for it in range(STEPS)]
    # lr is a float32 blob: the reference uses the same rounded rates
    lrs = [float(np.float32(v)) for v in lrs]
    np.testing.assert_allclose(got[-1]["param"], _caffe_momentum(p0, grads, lrs, 0.9, nesterov),
                               rtol=1e-12, atol=1e-12)
    # ... which is not PyTorch's rule once lr has changed (lr rescales the whole buffer there)
    b, p = np.zeros_like(p0), p0.copy()
    for g, lr_t in zip(grads, lrs):
        b = 0.9 * b + g
        p = p + lr_t * ((g + 0.9 * b) if nesterov else b)
    assert np.abs(got[-1]["param"] - p).max() > 1e-3


def test_momentum_sgd_output_grad_is_the_step(device):
    p0, (g,) = _param(), _grads(4, n=1)
    m0 = _param(5) * 0.1
    op = netrun.op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g_out", "m", "p"], momentum=0.5)
    g_out, m, p = run_op(op, {"g": g, "m": m0, "lr": np.array([-0.1], np.float32), "p": p0},
                         device)
    _close(m, 0.5 * m0 - 0.1 * g, rtol=1e-6)
    _close(g_out, m, rtol=0, atol=0)
    _close(p, p0 + m, rtol=1e-6)


# Adam -----------------------------------------------------------------------------------
@checks_ops("Adam", kind="torch")
@requires_torch
def test_adam_matches_torch(device):
    p0, grads = _param(), _grads(5)
    update = netrun.op("Adam", ["param", "m1", "m2", "grad", "lr", "iter"],
                       ["param", "m1", "m2"], beta1=0.9, beta2=0.999, epsilon=1e-8)
    zeros = np.zeros_like(p0)
    ws, got = _run_netrun(device, update, {"param": p0, "m1": zeros, "m2": zeros}, grads,
                          dict(base_lr=0.01), fetch=("param", "m1", "m2"))
    ref = _run_torch(torch.optim.Adam, p0, grads, ["exp_avg", "exp_avg_sq"], lr=0.01)
    for step, (a, b) in enumerate(zip(got, ref)):
        _close(a["param"], b["param"], msg=f"param after step {step}")
        _close(a["m1"], b["exp_avg"], msg=f"moment1 after step {step}")
        _close(a["m2"], b["exp_avg_sq"], msg=f"moment2 after step {step}")
    assert all(ws.fetch_blob(n).dtype == np.float32 for n in ("param", "m1", "m2"))


@settings(max_examples=12, deadline=None)
@given(beta1=st.floats(0.0, 0.99), beta2=st.floats(0.5, 0.999), eps=st.floats(1e-3, 1.0),
       start=st.integers(0, 50), seed=st.integers(0, 2**16))
def test_adam_follows_caffe2_formula(beta1, beta2, eps, start, seed):
    """float64; a large epsilon shows where it goes: added to the uncorrected sqrt(m2)."""
    rng = np.random.default_rng(seed)
    p, m1, m2, g = (rng.standard_normal(SHAPE) for _ in range(4))
    m2 = np.abs(m2)
    lr, t = -0.01, start + 1
    op = netrun.op("Adam", ["p", "m1", "m2", "g", "lr", "it"], ["p", "m1", "m2"],
                   beta1=beta1, beta2=beta2, epsilon=eps)
    got = run_op(op, {"p": p, "m1": m1, "m2": m2, "g": g, "lr": np.array([lr]),
                      "it": np.array([start], np.int64)})
    e1 = beta1 * m1 + (1 - beta1) * g
    e2 = beta2 * m2 + (1 - beta2) * g * g
    corr = np.sqrt(1 - beta2**t) / (1 - beta1**t)
    for a, b in zip(got, [p + lr * corr * e1 / (np.sqrt(e2) + eps), e1, e2]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# Adagrad --------------------------------------------------------------------------------
@checks_ops("Adagrad", kind="torch")
@requires_torch
def test_adagrad_matches_torch(device):
    p0, grads = _param(), _grads(6)
    update = netrun.op("Adagrad", ["param", "hist", "grad", "lr"], ["param", "hist"],
                       epsilon=1e-6)
    _, got = _run_netrun(device, update, {"param": p0, "hist": np.zeros_like(p0)}, grads,
                         dict(base_lr=0.1), fetch=("param", "hist"))
    ref = _run_torch(torch.optim.Adagrad, p0, grads, ["sum"], lr=0.1, eps=1e-6)
    for step, (a, b) in enumerate(zip(got, ref)):
        _close(a["param"], b["param"], msg=f"param after step {step}")
        _close(a["hist"], b["sum"], msg=f"history after step {step}")


def test_adagrad_decay_follows_caffe2_formula(device):
    rng = np.random.default_rng(8)
    p, h, g = (rng.standard_normal(SHAPE) for _ in range(3))
    h = np.abs(h)
    op = netrun.op("Adagrad", ["p", "h", "g", "lr"], ["p", "h"], epsilon=0.5, decay=0.8)
    p1, h1 = run_op(op, {"p": p, "h": h, "g": g, "lr": np.array(-0.3)}, device)
    eh = 0.8 * h + g * g
    np.testing.assert_allclose(h1, eh, rtol=1e-12)
    np.testing.assert_allclose(p1, p - 0.3 * g / (np.sqrt(eh) + 0.5), rtol=1e-12)


# RmsProp --------------------------------------------------------------------------------
@checks_ops("RmsProp", kind="torch")
@requires_torch
@pytest.mark.parametrize("momentum", [0.0, 0.5])
@pytest.mark.parametrize("fused", [False, True])
def test_rmsprop_matches_torch(device, momentum, fused):
    """With eps tiny, inside (netrun) or outside (torch) the root no longer matters."""
    p0, grads = _param(), _grads(9)
    zeros = np.zeros_like(p0)
    if fused:
        update = netrun.op("RmsProp", ["grad", "ms", "mom", "lr", "param"],
                           ["grad", "ms", "mom", "param"], decay=0.9, momentum=momentum,
                           epsilon=1e-12)
        _, got = _run_netrun(device, update, {"param": p0, "ms": zeros, "mom": zeros}, grads,
                             dict(base_lr=0.01), fetch=("param", "ms"))
    else:  # Caffe2's form: RmsProp writes the step into grad, then param += grad
        ws = netrun.Workspace(device)
        for n, v in {"param": p0, "ms": zeros, "mom": zeros, "one": np.float32(1),
                     "iter": np.array(0, np.int64)}.items():
            ws.feed_blob(n, v)
        ws.create_net(netrun.NetDef("step", [
            netrun.op("LearningRate", ["iter"], ["lr"], base_lr=0.01),
            netrun.op("RmsProp", ["grad", "ms", "mom", "lr"], ["grad", "ms", "mom"],
                      decay=0.9, momentum=momentum, epsilon=1e-12),
            netrun.op("WeightedSum", ["param", "one", "grad", "one"], ["param"]),
            netrun.op("Iter", ["iter"], ["iter"])]))
        got = []
        for g in grads:
            ws.feed_blob("grad", g)
            ws.run_net("step")
            got.append({"param": ws.fetch_blob("param"), "ms": ws.fetch_blob("ms")})
    ref = _run_torch(torch.optim.RMSprop, p0, grads, ["square_avg"], lr=0.01, alpha=0.9,
                     eps=1e-12, momentum=momentum)
    for step, (a, b) in enumerate(zip(got, ref)):
        _close(a["param"], b["param"], msg=f"param after step {step}")
        _close(a["ms"], b["square_avg"], msg=f"mean squares after step {step}")


def test_rmsprop_eps_goes_inside_the_root(device):
    rng = np.random.default_rng(10)
    g, ms, mom, p = (rng.standard_normal(SHAPE) for _ in range(4))
    ms = np.abs(ms)
    op = netrun.op("RmsProp", ["g", "ms", "mom", "lr", "p"], ["g2", "ms", "mom", "p"],
                   decay=0.7, momentum=0.3, epsilon=0.25)
    g2, ms1, mom1, p1 = run_op(op, {"g": g, "ms": ms, "mom": mom, "lr": np.array([-0.2]),
                                    "p": p}, device)
    ems = 0.7 * ms + 0.3 * g * g
    emom = 0.3 * mom - 0.2 * g / np.sqrt(ems + 0.25)
    for a, b in [(ms1, ems), (mom1, emom), (g2, emom), (p1, p + emom)]:
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


# ClipGradientsByNorm --------------------------------------------------------------------
@checks_ops("ClipGradientsByNorm", kind="torch")
@requires_torch
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_gradients_matches_torch(device, max_norm):
    rng = np.random.default_rng(11)
    grads = [rng.standard_normal(s).astype(np.float32) for s in [(4, 3), (3,), (2, 2, 2)]]
    names = [f"g{i}" for i in range(len(grads))]
    ws = netrun.Workspace(device)
    for n, g in zip(names, grads):
        ws.feed_blob(n, g)
    ws.run_operator_once(netrun.op("ClipGradientsByNorm", names, names, max_norm=max_norm))
    ts = [torch.tensor(g) for g in grads]
    for t in ts:
        t.grad = t.clone()
    torch.nn.utils.clip_grad_norm_(ts, max_norm)
    for n, t, g in zip(names, ts, grads):
        got = ws.fetch_blob(n)
        if max_norm > 100:  # below the threshold nothing changes, bit for bit
            np.testing.assert_array_equal(got, g)
        # torch divides by (norm + 1e-6): a 1e-7 relative difference at these norms
        _close(got, t.grad.numpy(), rtol=1e-5)
    total = np.sqrt(sum(np.sum(ws.fetch_blob(n).astype(np.float64) ** 2) for n in names))
    assert total <= max_norm * (1 + 1e-6)


# Schemas: in place, bad arguments, shapes, no gradient ------------------------------------
@pytest.mark.parametrize("op", [
    netrun.op("Iter", ["iter"], ["iter2"]),
    netrun.op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m_new", "p"]),
    netrun.op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p_new"]),
    netrun.op("Adam", ["p", "m1", "m2", "g", "lr", "it"], ["p_new", "m1", "m2"]),
    netrun.op("Adagrad", ["p", "h", "g", "lr"], ["p", "h_new"]),
    netrun.op("RmsProp", ["g", "ms", "mom", "lr"], ["g", "ms", "mom_new"]),
    netrun.op("RmsProp", ["g", "ms", "mom", "lr", "p"], ["g", "ms", "mom", "p_new"]),
    netrun.op("ClipGradientsByNorm", ["a", "b"], ["a", "b_clipped"], max_norm=1.0),
])
def test_non_inplace_state_output_is_rejected_at_build_time(op):
    ws = netrun.Workspace("cpu")
    with pytest.raises(SchemaError, match="must be the same blob"):
        ws.create_net(netrun.NetDef("n", [op]))


@pytest.mark.parametrize("op, match", [
    (netrun.op("WeightedSum", ["X", "w", "Y"], ["X"]), "pairs"),
    (netrun.op("WeightedSum", ["X", "w", "Y", "v"], ["Y"]), "in place over input 2"),
    (netrun.op("RmsProp", ["g", "ms", "mom", "lr", "p"], ["g", "ms", "mom"]), "4 outputs"),
    (netrun.op("ClipGradientsByNorm", ["a", "b"], ["a"], max_norm=1.0), "one output per input"),
    (netrun.op("ClipGradientsByNorm", ["a"], ["a"], max_norm=0.0), "'max_norm' must be > 0"),
    (netrun.op("LearningRate", ["it"], ["lr"], base_lr=0.1, policy="step", gamma=0.1),
     "needs 'stepsize'"),
    (netrun.op("LearningRate", ["it"], ["lr"], base_lr=0.1, policy="stpe"), "allowed values"),
    (netrun.op("LearningRate", ["it"], ["lr"], base_lr=-0.1), "base_lr must be >= 0"),
    (netrun.op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"], nesterov=2),
     "nesterov"),
    (netrun.op("Adam", ["p", "m1", "m2", "g", "lr", "it"], ["p", "m1", "m2"], epsilo=0.1),
     "did you mean 'epsilon'"),
])
def test_bad_definitions_fail_at_build_time_naming_the_op(op, match):
    with pytest.raises(SchemaError, match=match) as info:
        netrun.get_schema(op.type).verify(op)
    assert op.type in str(info.value)


def _specs(*shapes, dtype="float32"):
    return [TensorSpec(s, dtype) for s in shapes]


@pytest.mark.parametrize("op, ins, feeds", [
    (netrun.op("Iter", ["it"], ["it"]), [TensorSpec((1,), "int64")],
     {"it": np.zeros(1, np.int64)}),
    (netrun.op("LearningRate", ["it"], ["lr"], base_lr=0.1), [TensorSpec((), "int64")],
     {"it": np.array(3, np.int64)}),
    (netrun.op("WeightedSum", ["X", "a", "Y", "b"], ["X"]), _specs((2, 3), (1,), (2, 3), ()),
     {"X": np.ones((2, 3), np.float32), "a": np.ones(1, np.float32),
      "Y": np.ones((2, 3), np.float32), "b": np.float32(2)}),
    (netrun.op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"]),
     _specs((4,), (4,), (), (4,)), {k: np.ones(s, np.float32) for k, s in
                                    [("g", 4), ("m", 4), ("lr", ()), ("p", 4)]}),
    (netrun.op("Adam", ["p", "m1", "m2", "g", "lr", "it"], ["p", "m1", "m2"]),
     _specs((2, 2), (2, 2), (2, 2), (2, 2), (1,)) + [TensorSpec((1,), "int64")],
     {**{k: np.ones((2, 2), np.float32) for k in ("p", "m1", "m2", "g")},
      "lr": np.ones(1, np.float32), "it": np.zeros(1, np.int64)}),
    (netrun.op("RmsProp", ["g", "ms", "mom", "lr", "p"], ["g", "ms", "mom", "p"]),
     _specs((3,), (3,), (3,), (), (3,)),
     {**{k: np.ones(3, np.float32) for k in ("g", "ms", "mom", "p")}, "lr": np.float32(-1)}),
    (netrun.op("ClipGradientsByNorm", ["a", "b"], ["a", "b"], max_norm=1.0), _specs((2,), (3, 1)),
     {"a": np.ones(2, np.float32), "b": np.ones((3, 1), np.float32)}),
])
def test_shape_inference_matches_outputs_and_costs_are_positive(op, ins, feeds):
    schema = netrun.get_schema(op.type)
    args = schema.verify(op)
    outs = schema.infer_shapes(op, args, ins)
    got = run_op(op, feeds)
    assert [(tuple(o.shape), o.dtype) for o in outs] == [(g.shape, g.dtype.name) for g in got]
    cost = schema.cost(args, ins, outs)
    assert cost.flops > 0 and cost.bytes_read > 0 and cost.bytes_written > 0
    assert schema.no_gradient and netrun.gradient_ops(op) == ([], {n: None for n in op.inputs})


@pytest.mark.parametrize("op, ins, match", [
    (netrun.op("MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"]),
     _specs((4, 3), (4, 3), (), (3, 4)), "'grad' has shape 4×3 but 'param' has shape 3×4"),
    (netrun.op("Adam", ["p", "m1", "m2", "g", "lr", "it"], ["p", "m1", "m2"]),
     _specs((2,), (2,), (2,), (2,), (2,), ()), "'lr' must be a one-element blob"),
    (netrun.op("Iter", ["it"], ["it"]), _specs(()), "integer"),
    (netrun.op("WeightedSum", ["X", "a", "Y", "b"], ["X"]), _specs((2,), (1,), (3,), (1,)),
     "'X0' has shape 2 but 'X1' has shape 3"),
])
def test_shape_mismatch_names_roles_and_shapes(op, ins, match):
    schema = netrun.get_schema(op.type)
    with pytest.raises(ShapeError, match=match):
        schema.infer_shapes(op, schema.verify(op), ins)
