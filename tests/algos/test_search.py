"""Choosing algorithms: modes, the timing search, the warm cache, determinism, limits."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import netrun
from netrun import conv as algos
from netrun.backends import get_backend
from netrun.conv import cache, select
from netrun.conv.algorithm import algorithms, applicable_algorithms
from netrun.conv.problem import ConvProblem
from netrun.conv.rules import rule_choice
from netrun.conv.state import SearchStats
from netrun.core.net import SimpleNet
from netrun.errors import ConfigError
from netrun.kernels import jit, onednn

ALGORITHMS = algorithms("cpu")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_state():
    """No cache objects from other tests (the counters live on each workspace, ws.conv)."""
    cache.forget_loaded()
    yield
    cache.forget_loaded()


def conv_net(ws, x_shape=(4, 3, 10, 10), k=8, kernel=3, pad=1, seed=0, planned=False, **args):
    """A bound net: Conv and its gradient (with dX), inputs fed (planned: bound through
    ws.create_net, which plans its memory)."""
    rng = np.random.default_rng(seed)
    c = x_shape[1]
    ws.feed_blob("X", rng.standard_normal(x_shape).astype(np.float32))
    ws.feed_blob("W", rng.standard_normal((k, c, kernel, kernel)).astype(np.float32))
    ws.feed_blob("b", rng.standard_normal(k).astype(np.float32))
    fwd = netrun.op("Conv", ["X", "W", "b"], ["Y"], kernel=kernel, pad=pad, name="conv", **args)
    grads, _ = netrun.gradient_ops(fwd)
    h = x_shape[2] + 2 * pad - kernel + 1
    ws.feed_blob("Y_grad", rng.standard_normal((x_shape[0], k, h, h)).astype(np.float32))
    net = netrun.NetDef("n", [fwd, *grads])
    return ws.create_net(net) if planned else SimpleNet(net, ws)


def fake_times(monkeypatch, times: dict[str, float]):
    """time_algorithm returns fixed numbers (counting calls) instead of measuring."""
    calls = []

    def fake(run, algo, backend, stats=None):
        run(algo)
        calls.append(algo.name)
        return times.get(algo.name, 10.0)

    monkeypatch.setattr(select, "time_algorithm", fake)
    return calls


def test_heuristic_mode_never_times_or_writes(tmp_path):
    ws = netrun.Workspace()
    algos.configure(ws, cache_dir=str(tmp_path))
    net = conv_net(ws)
    net.run()
    net.run()
    assert ws.conv.stats.searches == 0 and ws.conv.stats.timed_runs == 0
    assert list(tmp_path.iterdir()) == []
    # C·kw = 9: im2col's rule (a layer this small is below oneDNN's ONEDNN_MIN_FLOPS)
    assert net.ops[0].ctx.state["algo"] == "im2col_gemm"


def test_exhaustive_mode_picks_the_fastest_and_remembers_it(tmp_path, monkeypatch):
    calls = fake_times(monkeypatch, {"fft": 1.0, "winograd_f2x2": 2.0})
    ws = netrun.Workspace()
    algos.configure(ws, mode="exhaustive", cache_dir=str(tmp_path))
    net = conv_net(ws)
    net.run()
    assert ws.conv.stats.searches == 3   # forward, backward_filter, backward_data
    assert net.ops[0].ctx.state["algo"] == "fft" and net.ops[1].ctx.state["algo"] == "fft"
    timed = set(calls)
    assert timed == {"im2col_gemm", "shift_gemm", "fft", "dft_gemm", "winograd_f2x2",
                     "winograd_f4x4"} | ({"winograd_jit"} if jit.available() else set()) \
        | ({"onednn"} if onednn.available() else set())
    net.run()                           # same shapes: nothing is searched or looked up again
    assert ws.conv.stats.searches == 3 and ws.conv.stats.cache_hits == 0
    _, entries = cache.read_file(cache.list_files(tmp_path)[0])
    assert sorted(k.split("|")[0] for k in entries) == ["backward_data", "backward_filter",
                                                        "forward"]
    assert all(e.times_ms["fft"] == 1.0 for e in entries.values())


WARM_SCRIPT = textwrap.dedent("""
    import json, numpy as np, netrun
    from netrun import conv as algos
    from netrun.core.net import SimpleNet
    ws = netrun.Workspace()
    algos.configure(ws, mode="exhaustive")
    rng = np.random.default_rng(0)
    ws.feed_blob("X", rng.standard_normal((4, 3, 10, 10)).astype(np.float32))
    ws.feed_blob("W", rng.standard_normal((8, 3, 3, 3)).astype(np.float32))
    ws.feed_blob("Y_grad", rng.standard_normal((4, 8, 10, 10)).astype(np.float32))
    fwd = netrun.op("Conv", ["X", "W"], ["Y"], kernel=3, pad=1)
    net = SimpleNet(netrun.NetDef("n", [fwd, *netrun.gradient_ops(fwd)[0]]), ws)
    net.run()
    stats = ws.conv.stats
    print(json.dumps({"searches": stats.searches, "hits": stats.cache_hits,
                      "timed": stats.timed_runs,
                      "algos": [o.ctx.state["algo"] for o in net.ops]}))
""")


def test_a_second_process_with_a_warm_cache_does_no_search(tmp_path):
    env = {**os.environ, "NETRUN_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}

    def run_process():
        out = subprocess.run([sys.executable, "-c", WARM_SCRIPT], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = run_process()
    assert cold["searches"] == 3 and cold["hits"] == 0 and cold["timed"] > 3 * 3
    warm = run_process()
    assert warm == {"searches": 0, "hits": 3, "timed": 0, "algos": cold["algos"]}


def test_deterministic_mode_is_bitwise_reproducible_and_ignores_the_cache(tmp_path,
                                                                           monkeypatch):
    # A cache that claims FFT is fastest for everything must not change deterministic runs.
    fake_times(monkeypatch, {"fft": 0.001})
    poisoner = netrun.Workspace()
    algos.configure(poisoner, mode="exhaustive", cache_dir=str(tmp_path))
    conv_net(poisoner).run()
    assert poisoner.conv.stats.searches == 3
    results = []
    for _ in range(2):
        ws = netrun.Workspace()
        algos.configure(ws, mode="deterministic", cache_dir=str(tmp_path))
        net = conv_net(ws)
        for _ in range(2):
            net.run()
        # the rules' picks (the layer is below oneDNN's ONEDNN_MIN_FLOPS)
        assert [o.ctx.state["algo"] for o in net.ops] == ["im2col_gemm", "im2col_gemm"]
        results.append({n: ws.fetch_blob(n).tobytes() for n in ("Y", "W_grad", "b_grad",
                                                                 "X_grad")})
        assert ws.conv.stats.cache_hits == 0 and ws.conv.stats.searches == 0
    assert results[0] == results[1]


def test_a_fixed_algorithm_wins_over_every_mode(tmp_path, monkeypatch):
    calls = fake_times(monkeypatch, {})
    ws = netrun.Workspace()
    algos.configure(ws, mode="exhaustive", cache_dir=str(tmp_path))
    net = conv_net(ws, algo="winograd_f4x4")
    net.run()
    assert calls == [] and ws.conv.stats.searches == 0
    assert [o.ctx.state["algo"] for o in net.ops] == ["winograd_f4x4", "winograd_f4x4"]


def test_the_workspace_limit_leaves_out_big_algorithms(tmp_path, monkeypatch):
    p = ConvProblem(4, 3, 10, 10, 8, 3, 3, 1, 1, 1, 1, 1, 1)
    need = {a.name: a.workspace_bytes(p) for a in applicable_algorithms(p)}
    limit = sorted(need.values())[1]             # the two smallest fit
    fits = {n for n, b in need.items() if b <= limit}
    calls = fake_times(monkeypatch, {})
    ws = netrun.Workspace()
    algos.configure(ws, mode="exhaustive", workspace_limit=limit, cache_dir=str(tmp_path))
    conv_net(ws).run()
    assert set(calls) == fits
    entry = next(iter(cache.read_file(cache.list_files(tmp_path)[0])[1].values()))
    assert set(entry.skipped) == set(need) - fits and entry.limit == limit
    # Nothing fits a zero limit: the least demanding algorithm still runs the conv.
    algos.configure(ws, mode="heuristic", workspace_limit=0)
    pool = select.candidates(p, algos.settings_of(ws))
    assert [a.name for a in pool] == [min(need, key=need.get)]


def test_a_larger_limit_later_searches_what_was_skipped(tmp_path, monkeypatch):
    calls = fake_times(monkeypatch, {})
    p = ConvProblem(4, 3, 10, 10, 8, 3, 3, 1, 1, 1, 1, 1, 1)
    second = sorted(a.workspace_bytes(p) for a in applicable_algorithms(p))[1]
    ws = netrun.Workspace()
    algos.configure(ws, mode="exhaustive", workspace_limit=second, cache_dir=str(tmp_path))
    net = conv_net(ws)
    net.run()
    assert ws.conv.stats.searches == 3 and len(set(calls)) == 2
    algos.configure(ws, workspace_limit=None)    # ops re-pick after configure
    net.run()
    applicable = applicable_algorithms(p)
    assert ws.conv.stats.searches == 6 and len(set(calls)) == len(applicable)


def test_persist_false_keeps_results_in_memory_only(tmp_path, monkeypatch):
    fake_times(monkeypatch, {})
    counts = []
    for _ in range(2):   # the second workspace finds the first one's times in memory
        ws = netrun.Workspace()
        algos.configure(ws, mode="exhaustive", cache_dir=str(tmp_path), persist=False)
        conv_net(ws).run()
        counts.append((ws.conv.stats.searches, ws.conv.stats.cache_hits))
    assert counts == [(3, 0), (0, 3)]
    assert list(tmp_path.iterdir()) == []


def test_time_algorithm_excludes_the_first_call():
    class Clock:
        t = 0.0

        def now(self):
            return self.t

    clock, runs = Clock(), []

    def run(algo):   # the first call is slow (page faults, compilation), later ones fast
        clock.t += 1.0 if not runs else 0.001
        runs.append(algo)

    stats = SearchStats()
    ms = select.time_algorithm(run, ALGORITHMS["im2col_gemm"], clock, stats)
    assert ms == pytest.approx(1.0) and len(runs) == select.MAX_REPS + 1
    assert stats.timed_runs == len(runs)


def _directions_of(op) -> list[str]:
    return algos.op_directions(op.def_.type, len(op.def_.outputs), bool(op.args.no_bias))


def test_compare_algorithms_for_a_problem_and_for_a_bound_op():
    p = ConvProblem(2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1)
    cpu = get_backend("cpu")
    rows = algos.compare_algorithms(p, cpu, ["forward"])
    assert {name for name, _ in rows} == {a.name for a in applicable_algorithms(p)}
    assert [ms for _, ms in rows] == sorted(ms for _, ms in rows) and rows[0][1] > 0
    ws = netrun.Workspace()
    net = conv_net(ws, x_shape=(2, 3, 8, 8), k=4)
    net.run()
    grad_op = net.ops[1]
    assert _directions_of(net.ops[0]) == ["forward"]
    assert _directions_of(grad_op) == ["backward_filter", "backward_data"]
    plan = grad_op.ctx.state["plan"]   # what a bound op compares: its plan's problem
    assert plan.problem == p
    names = {n for n, _ in algos.compare_algorithms(plan.problem, grad_op.ws.backend,
                                                    _directions_of(grad_op), ws.scratch)}
    assert names == {n for n, _ in rows}
    assert ws.conv.stats.searches == 0
    # an op that has not run yet has no plan (no problem to compare)
    assert "plan" not in SimpleNet(netrun.NetDef("m", [grad_op.def_]), ws).ops[0].ctx.state


def test_compare_algorithms_times_only_the_backends_own_algorithms(monkeypatch):
    """On another backend (a GPU) the CPU algorithms are not timed, though they would run."""
    from netrun.conv import compare

    def other(backend_name):
        class Other:
            name, device, device_name = backend_name, "cpu", "stand-in"

            def __getattr__(self, attr):
                return getattr(get_backend("cpu"), attr)

        return Other()

    p = ConvProblem(2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1)
    assert compare.compare_algorithms(p, other("tpu"), ["forward"]) == []   # no algorithms
    assert compare.compare_algorithms(p, get_backend("cpu"), ["forward"])
    # named "gpu" (NumPy arrays underneath): only the GPU registry's algorithms are timed
    timed = []
    monkeypatch.setattr(compare, "time_algorithm",
                        lambda run, algo, backend, stats=None: timed.append(algo.name) or 1.0)
    rows = compare.compare_algorithms(p, other("gpu"), ["forward"])
    assert timed and set(timed) == {a.name for a in applicable_algorithms(p, "gpu")}
    assert not set(timed) & set(ALGORITHMS)
    assert {n for n, _ in rows} == set(timed)


def test_configure_checks_its_arguments():
    ws = netrun.Workspace()
    with pytest.raises(ConfigError, match="unknown algorithm mode 'exhaustiv'.*'exhaustive'"):
        algos.configure(ws, mode="exhaustiv")
    with pytest.raises(ConfigError, match="must not be negative"):
        algos.configure(ws, workspace_limit=-1)
    settings = algos.configure(ws, mode="exhaustive", workspace_limit=algos.parse_bytes("64M"))
    assert settings.workspace_limit == 64 << 20 and algos.settings_of(ws) is settings
    assert algos.configure(ws, mode="heuristic").workspace_limit == 64 << 20   # kept
    assert algos.settings_of(netrun.Workspace()).mode == "heuristic"           # default
    with pytest.raises(ConfigError, match="cannot read 'lots' as a size"):
        algos.parse_bytes("lots")


def test_heuristic_respects_the_candidates(monkeypatch):
    monkeypatch.setenv("NETRUN_ONEDNN", "off")   # the NumPy rules (tests/algos/test_onednn.py)
    p = ConvProblem(2, 4, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1)
    assert rule_choice(p, applicable_algorithms(p)).name == "im2col_gemm"
    wide = ConvProblem(2, 16, 24, 24, 4, 3, 3, 1, 1, 1, 1, 1, 1)
    assert rule_choice(wide, applicable_algorithms(wide)).name == "shift_gemm"
    only = [ALGORITHMS["winograd_f2x2"], ALGORITHMS["im2col_gemm"]]
    assert rule_choice(p, only, "forward").name == "im2col_gemm"
    assert rule_choice(p, [ALGORITHMS["fft"]], "forward").name == "fft"


# Bind time: the rules' picks and warm-ups ------------------------------------------------------
def test_binding_picks_and_warms_so_the_first_run_works_nothing_out(monkeypatch):
    """The memory plan made at bind asks for each direction's algorithm (remembered on the
    workspace) and warms it on a one-image copy; the first run then neither recomputes the
    rules nor runs anything but the full batch."""
    monkeypatch.setenv("NETRUN_ONEDNN", "off")   # the NumPy rules: im2col_gemm for C = 3
    seen = []
    real_candidates = select.candidates
    monkeypatch.setattr(select, "candidates", lambda p, s, backend="cpu": seen.append(
        ("rules", p.n)) or real_candidates(p, s, backend))
    algo = ALGORITHMS["im2col_gemm"]
    for direction in ("forward", "backward_data", "backward_filter"):
        real = getattr(algo, direction)
        monkeypatch.setattr(algo, direction, lambda xp, a, b, p, *rest, real=real, d=direction,
                            **kw: seen.append((d, p.n)) or real(xp, a, b, p, *rest, **kw))
    ws = netrun.Workspace()
    net = conv_net(ws, x_shape=(4, 3, 9, 9), planned=True)    # binds: plan, picks, warm-ups
    assert ("forward", 1) in seen and ("backward_filter", 1) in seen
    assert ("backward_data", 1) in seen
    assert ws.conv.stats.warm_ups == 3 and len(ws.conv.warmed) == 3
    assert all(n == 4 for what, n in seen if what == "rules")   # picked for the real batch
    seen.clear()
    net.run()
    assert [s for s in seen if s[0] == "rules"] == []
    assert {n for _, n in seen} == {4}
    assert [o.ctx.state["algo"] for o in net.ops] == ["im2col_gemm", "im2col_gemm"]
    assert all(o.ctx.state["plan"].warmed for o in net.ops)
    for o in net.ops:   # a plan's scratch: its chosen algorithms' largest
        plan = o.ctx.state["plan"]
        assert plan.scratch_bytes == max(a.workspace_bytes(plan.problem)
                                         for a in plan.algos.values()) > 0
    # the same workspace binding the same problem again: picks and warm-ups are remembered
    seen.clear()
    conv_net(ws, x_shape=(4, 3, 9, 9), planned=True)
    assert seen == [] and ws.conv.stats.warm_ups == 3
    # another workspace with the same problem: picks and warms again (both are per workspace)
    seen.clear()
    other = netrun.Workspace()
    conv_net(other, x_shape=(4, 3, 9, 9), planned=True)
    assert ("rules", 4) in seen and ("forward", 1) in seen
    assert other.conv.stats.warm_ups == 3 and ws.conv.stats.warm_ups == 3


def test_changing_the_settings_changes_the_remembered_picks(tmp_path):
    ws = netrun.Workspace()
    p = ConvProblem(4, 64, 9, 9, 64, 3, 3, 1, 1, 1, 1, 1, 1)
    first = select.choose(ws.conv, p, "forward", ws.backend)
    algos.configure(ws, workspace_limit=0)        # nothing fits: the least scratch wins
    limited = select.choose(ws.conv, p, "forward", ws.backend)
    assert limited.workspace_bytes(p) == min(a.workspace_bytes(p) for a in
                                             applicable_algorithms(p))
    algos.configure(ws, workspace_limit=None)
    assert select.choose(ws.conv, p, "forward", ws.backend) is first
