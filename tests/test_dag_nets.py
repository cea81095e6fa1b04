"""The dependency-graph executor changes no bit: every zoo net and the Caffe nets in the
shared folder train and predict the same under `executor: dag` as under the sequential
executor, planning on (dead values poisoned with NaN) and off; the trainer, and its resume,
too."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import netrun
from netrun.core.dag import DagNet
from netrun.core.workspace import Workspace
from tests import test_planner_nets as nets_
from tests.test_planner_nets import ZOO, _caffe, assert_same_bits, predict, train


class _Ordered(Workspace):
    """A DAG workspace whose nets run on one worker in a random order the graph allows."""

    def __init__(self, *args, order_seed: int, **kw):
        super().__init__(*args, executor="dag", **kw)
        self._order = np.random.default_rng(order_seed)

    def create_net(self, net, *args, **kw):
        bound = super().create_net(net, *args, **kw)
        bound.workers, bound.priority = 1, list(self._order.permutation(len(bound.ops)))
        return bound


def _with(monkeypatch, executor: str, order_seed: int | None = None) -> None:
    factory = (functools.partial(Workspace, executor=executor) if order_seed is None
               else functools.partial(_Ordered, order_seed=order_seed))
    monkeypatch.setattr(nets_.netrun, "Workspace", factory)


def _all_dag(ws) -> None:
    assert ws.nets() and all(isinstance(ws._nets[n], DagNet) for n in ws.nets())


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_training_is_bitwise_the_same_under_the_dag_executor(name, monkeypatch):
    batch, overrides = ZOO[name]
    model = netrun.load_model(str(nets_.REPO / "zoo" / f"{name}.yaml"))
    want, _ = train(model, False, batch, overrides)
    for plan, order in ((False, None), (True, None), (True, 7)):
        _with(monkeypatch, "dag", order)
        got, ws = train(model, plan, batch, overrides)
        _all_dag(ws)
        assert_same_bits(got, want)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_inference_is_bitwise_the_same_under_the_dag_executor(name, monkeypatch):
    batch, overrides = ZOO[name]
    model = netrun.load_model(str(nets_.REPO / "zoo" / f"{name}.yaml"))
    for rewritten in (False, True):
        monkeypatch.setattr(nets_.netrun, "Workspace", Workspace)
        want, _ = predict(model, False, batch, overrides, rewritten)
        for plan, order in ((False, None), (True, None), (True, 11)):
            _with(monkeypatch, "dag", order)
            got, ws = predict(model, plan, batch, overrides, rewritten)
            _all_dag(ws)
            assert_same_bits(got, want)


@pytest.mark.parametrize("relative", ["lenet/lenet_train_test.prototxt",
                                      "cifar10_quick/cifar10_quick_train_test.prototxt"])
def test_caffe_training_nets_under_the_dag_executor(relative, monkeypatch):
    model = _caffe(relative)
    want, _ = train(model, False, 4)
    _with(monkeypatch, "dag")
    got, _ = train(model, True, 4)
    assert_same_bits(got, want)


@pytest.mark.parametrize("relative", ["bvlc_alexnet/deploy.prototxt",
                                      "resnet50/ResNet-50-deploy.prototxt"])
def test_caffe_deploy_nets_under_the_dag_executor(relative, monkeypatch):
    model = _caffe(relative)
    want, _ = predict(model, False, 1)
    _with(monkeypatch, "dag")
    got, _ = predict(model, True, 1)
    assert_same_bits(got, want)


def test_the_trainer_and_its_resume_are_bitwise_the_same_under_the_dag_executor(
        tmp_path, monkeypatch):
    """The trainer's loop (dropout: random draws in order, iter_size accumulation, tests)
    with `executor: dag` and planning poisoned, against the sequential executor; and
    4 steps + checkpoint + resume + 4 equal 8 straight under the DAG executor."""
    from tests.test_determinism import small_config
    from tests.train.test_resume import _train

    config = small_config(tmp_path)
    overrides = ["solver.iter_size=2"]
    monkeypatch.setenv("NETRUN_PLAN_DEBUG", "1")
    want, p_want, _ = _train(config, tmp_path / "s", 8, overrides=[*overrides,
                                                                    "executor=simple"])
    dag = [*overrides, "executor=dag"]
    straight, p_straight, tr = _train(config, tmp_path / "a", 8, overrides=dag)
    _all_dag(tr.ws)
    assert any(o.type == "Dropout" for n in tr.ws.nets() for o in tr.ws._nets[n].def_.ops)
    assert straight == want
    first, _, _ = _train(config, tmp_path / "b", 4, overrides=dag)
    second, p_resumed, _ = _train(config, tmp_path / "c", 8, overrides=dag,
                                  resume=str(tmp_path / "b" / "last.h5"))
    assert first + second == straight
    for name in p_want:
        assert p_straight[name].tobytes() == p_want[name].tobytes(), name
        assert p_resumed[name].tobytes() == p_straight[name].tobytes(), name


def test_a_bad_executor_in_the_config_is_a_clear_error(tmp_path):
    from netrun.errors import ConfigError
    from netrun.train.config import load_config
    from tests.test_determinism import small_config

    with pytest.raises(ConfigError, match="executor.*simple, dag.*'fast'"):
        load_config(small_config(tmp_path), ["executor=fast"])
