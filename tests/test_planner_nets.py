"""Lifetime memory planning never changes a bit: every zoo net and the Caffe nets in the
shared folder train and predict the same with planning on (and every dead value poisoned
with NaN, netrun.core.activations.POISON) as with planning off."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import netrun
from netrun.core.schema import TensorSpec
from netrun.rewrite import bind_rewrite
from netrun.train.config import SolverConfig
from netrun.train.solver import LR, build_training

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NETRUN_SHARED", REPO.parent / "shared"))
CAFFE = SHARED / "models" / "caffe"


def _feeds(model, batch: int, overrides: dict, labels: bool = True) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    params = set(model.param_names)
    for name, spec in model.input_specs(batch, overrides).items():
        if name in params:
            continue
        if name in model.labels:
            if labels:
                out[name] = rng.integers(0, 10, spec.shape).astype(spec.dtype)
        else:
            out[name] = rng.standard_normal(spec.shape).astype(spec.dtype)
    return out


def train(model, plan: bool, batch: int, overrides: dict | None = None, steps: int = 2,
          solver: str = "sgd", device: str = "cpu") -> tuple[dict, netrun.Workspace]:
    """Parameters, gradients, optimizer state, losses and test metrics after `steps` steps
    of the trainer's nets (step, update, test), bound as the trainer binds them."""
    cfg = SolverConfig(type=solver, momentum=0.9) if solver == "sgd" else SolverConfig(type=solver)
    nets = build_training(model, cfg)
    ws = netrun.Workspace(device, seed=0, memory_plan=plan, plan_debug=plan)
    ws.run_net_once(nets.init)
    keep = [model.loss, *model.metrics, LR]
    for net in (nets.step, nets.update, nets.test):
        ws.create_net(net, keep=keep)
    feeds = _feeds(model, batch, overrides or {})
    out = {}
    for step in range(steps):
        for name, value in feeds.items():
            ws.feed_blob(name, value * (step + 1) if value.dtype.kind == "f" else value)
        ws.run_net(nets.step.name)
        ws.run_net(nets.update.name)
        out[f"loss {step}"] = ws.fetch_blob(model.loss)
        out[f"lr {step}"] = ws.fetch_blob(LR)
    ws.run_net(nets.test.name)
    for name in (model.loss, *model.metrics):
        out[f"test {name}"] = ws.fetch_blob(name)
    for p in nets.params:
        out[p] = ws.fetch_blob(p)
        out[nets.grads[p]] = ws.fetch_blob(nets.grads[p])
    for name in (*nets.optimizer_state, *nets.state):
        out[name] = ws.fetch_blob(name)
    return out, ws


def predict(model, plan: bool, batch: int, overrides: dict | None = None,
            rewritten: bool = False, device: str = "cpu") -> tuple[dict, Any]:
    """The predict net's outputs, three runs on different inputs (rewritten: after the
    bind-time inference rewrites, as infer runs it)."""
    ws = netrun.Workspace(device, seed=0, memory_plan=plan, plan_debug=plan)
    ws.run_net_once(model.init_net)
    rng = np.random.default_rng(1)
    for p in model.params:   # plausible BatchNorm statistics: no NaN hiding a difference
        if p.role in ("running_var", "running_factor"):
            ws.feed_blob(p.name, rng.uniform(0.5, 2.0, ws.get_blob(p.name).shape)
                         .astype(np.float32))
    net = model.predict_net.copy()
    net.name = "predict"
    outputs = list(model.outputs) or [net.ops[-1].outputs[0]]
    if rewritten:
        net = bind_rewrite(net, ws, "inference", keep=outputs).net
    ws.create_net(net, keep=outputs)
    feeds = _feeds(model, batch, overrides or {}, labels=False)
    out = {}
    for run in range(3):
        for name, value in feeds.items():
            if name in [i for o in net.ops for i in o.inputs]:
                ws.feed_blob(name, value + run)
        ws.run_net("predict")
        for name in outputs:
            out[f"{name} {run}"] = ws.fetch_blob(name)
    return out, ws


def assert_same_bits(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].tobytes() == want[name].tobytes(), f"{name} differs with planning on"


def _planned_something(ws, net: str) -> None:
    plan = ws.memory.net_plans[net]
    assert plan.lifetimes.values and plan.placement.size < plan.placement.unshared


ZOO = {"lenet": (8, {}), "mlp": (8, {}), "cifar10_quick": (4, {}), "resnet20": (4, {}),
       "resnet50": (1, {"data": TensorSpec((1, 3, 64, 64))}), "googlenet": (1, {})}


@pytest.mark.parametrize("name", sorted(set(ZOO) - {"googlenet"}))   # 224² only: 12 s
def test_zoo_training_is_bitwise_the_same_with_planning(name):
    batch, overrides = ZOO[name]
    model = netrun.load_model(str(REPO / "zoo" / f"{name}.yaml"))
    want, _ = train(model, False, batch, overrides)
    got, ws = train(model, True, batch, overrides)
    assert_same_bits(got, want)
    _planned_something(ws, build_training(model, SolverConfig()).step.name)


@pytest.mark.parametrize("rewritten", [False, True])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_inference_is_bitwise_the_same_with_planning(name, rewritten):
    batch, overrides = ZOO[name]
    model = netrun.load_model(str(REPO / "zoo" / f"{name}.yaml"))
    want, _ = predict(model, False, batch, overrides, rewritten)
    got, ws = predict(model, True, batch, overrides, rewritten)
    assert_same_bits(got, want)
    if name != "mlp":   # MLP's two hidden layers are live together at its second FC
        _planned_something(ws, "predict")


def test_adam_and_iteration_state_are_never_shared():
    model = netrun.load_model(str(REPO / "zoo" / "lenet.yaml"))
    want, _ = train(model, False, 8, solver="adam", steps=3)
    got, ws = train(model, True, 8, solver="adam", steps=3)
    assert_same_bits(got, want)
    nets = build_training(model, SolverConfig(type="adam"))
    planned = {n for p in ws.memory.net_plans.values() for v in p.lifetimes.values
               for n in v.names}
    never = set(nets.params) | {nets.grads[p] for p in nets.params} | set(nets.optimizer_state) \
        | set(nets.state) | {LR, model.loss}
    assert not planned & never


def _caffe(relative: str):
    path = CAFFE / relative
    if not path.is_file():
        pytest.skip(f"{path} not found (set NETRUN_SHARED to the shared folder)")
    return netrun.load_model(str(path))


@pytest.mark.parametrize("relative", ["lenet/lenet_train_test.prototxt",
                                      "cifar10_quick/cifar10_quick_train_test.prototxt"])
def test_caffe_training_nets_are_bitwise_the_same_with_planning(relative):
    model = _caffe(relative)
    want, _ = train(model, False, 4)
    got, _ = train(model, True, 4)
    assert_same_bits(got, want)


@pytest.mark.parametrize("relative", ["lenet/lenet.prototxt", "cifar10_quick/cifar10_quick.prototxt",
                                      "bvlc_alexnet/deploy.prototxt",
                                      "resnet50/ResNet-50-deploy.prototxt"])
def test_caffe_deploy_nets_are_bitwise_the_same_with_planning(relative):
    model = _caffe(relative)
    want, _ = predict(model, False, 1)
    got, ws = predict(model, True, 1)
    assert_same_bits(got, want)
    assert all(np.isfinite(v).all() for v in got.values())
    plan = ws.memory.net_plans["predict"]
    assert plan.planned_peak < plan.unplanned_peak
    if "resnet" in relative:     # deep nets: most activations share
        assert plan.planned_peak < 0.3 * plan.unplanned_peak


TRAINER_SOLVERS = {"sgd, iter_size 2": ["solver.iter_size=2"],
                   "adam, iter_size 3": ["solver.type=adam", "solver.base_lr=0.002",
                                         "solver.iter_size=3"]}


@pytest.mark.parametrize("solver", sorted(TRAINER_SOLVERS))
def test_the_trainer_is_bitwise_the_same_with_planning(solver, tmp_path, monkeypatch):
    """The trainer's own loop (dropout, gradients accumulated over iter_size runs of the
    step net, tests, the learning rate read back) with `memory_plan: false` and with
    planning on and every dead value poisoned."""
    from netrun.train.config import load_config
    from netrun.train.trainer import Callbacks, Trainer
    from tests.test_determinism import small_config

    config = small_config(tmp_path)
    runs = []
    for plan in (False, True):
        monkeypatch.setenv("NETRUN_PLAN_DEBUG", "1" if plan else "0")
        cfg = load_config(config, [*TRAINER_SOLVERS[solver], "solver.test_interval=2",
                                  f"memory_plan={str(plan).lower()}"])
        assert cfg.memory_plan is plan
        tr = Trainer(cfg, output=str(tmp_path / f"run{plan}"))
        tr.start()
        steps: list = []
        tests: list = []
        tr.run(4, Callbacks(on_step=lambda r, steps=steps: steps.append((r.loss, r.lr)),
                            on_test=lambda r, tests=tests: tests.append((r.loss, r.metrics))))
        assert bool(tr.ws.memory.net_plans) is plan and len(tests) >= 2
        params = {p: tr.ws.fetch_blob(p).tobytes()
                  for p in tr.model.param_names + tr.nets.optimizer_state}
        runs.append((steps, tests, params))
    assert runs[0] == runs[1]
