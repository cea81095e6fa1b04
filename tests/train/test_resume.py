"""Resume is exact: 2N steps straight equal N + checkpoint + resume + N, bit for bit."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from netrun.train.config import load_config
from netrun.train.trainer import Callbacks, Trainer
from tests.test_determinism import small_config


def _train(config, output, until, resume=None, overrides=()):
    losses = []
    tr = Trainer(load_config(config, list(overrides)), output=str(output))
    tr.start(resume)
    tr.run(until, Callbacks(on_step=lambda r: losses.append(r.loss)))
    params = {p: tr.ws.fetch_blob(p) for p in tr.model.param_names + tr.nets.optimizer_state}
    return losses, params, tr


# Every solver type, and gradients accumulated over iter_size batches, on a net big enough
# that its conv and FC passes run on the worker threads (default thread settings: the results
# must not depend on them).
SOLVERS = {
    "sgd": [],
    "nesterov": ["solver.type=nesterov"],
    "adam": ["solver.type=adam", "solver.base_lr=0.002"],
    "adagrad": ["solver.type=adagrad", "solver.base_lr=0.01"],
    "rmsprop": ["solver.type=rmsprop", "solver.base_lr=0.001"],
    "sgd, iter_size 2": ["solver.iter_size=2"],
    "adam, iter_size 3": ["solver.type=adam", "solver.base_lr=0.002", "solver.iter_size=3"],
}


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_resume_is_bitwise_exact(solver, tmp_path):
    """2N steps straight equal N steps + checkpoint + resume + N steps, bit for bit."""
    config, overrides = small_config(tmp_path), SOLVERS[solver]
    straight, p_straight, _ = _train(config, tmp_path / "a", 8, overrides=overrides)
    first, _, tr = _train(config, tmp_path / "b", 4, overrides=overrides)
    assert tr.iteration == 4
    second, p_resumed, tr2 = _train(config, tmp_path / "c", 8, overrides=overrides,
                                    resume=str(tmp_path / "b" / "last.h5"))
    assert tr2.iteration == 8
    assert first + second == straight          # the same loss sequence, exactly
    assert p_straight.keys() == p_resumed.keys() and len(p_straight) > 8
    for name in p_straight:
        np.testing.assert_array_equal(p_resumed[name], p_straight[name], err_msg=name)


def test_training_learns(tiny_config, tmp_path):
    losses, _, tr = _train(tiny_config, tmp_path / "a", 40)
    assert np.mean(losses[-10:]) < np.mean(losses[:5])
    result = tr.test()
    assert result.examples == 96 and 0.0 <= result.accuracy <= 1.0


def test_relative_paths_resolve_against_the_config(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "c.yaml").write_text("model: ../zoo/m.yaml\noutput: ../runs/x\n"
                                                  "data: {source: generated}\n")
    cfg = load_config(tmp_path / "configs" / "c.yaml")
    assert Path(cfg.output).resolve() == (tmp_path / "runs" / "x").resolve()
    assert Path(cfg.model).resolve() == (tmp_path / "zoo" / "m.yaml").resolve()


def test_overrides_keep_live_data_values():
    """--set on a Caffe solver's config keeps a decoded mean image (an array, not its record)."""
    from netrun.train.config import config_from_dict, with_overrides

    cfg = config_from_dict({"model": "/m.yaml", "data": {"source": "generated"}})
    cfg.data["transform"] = {"mean": np.zeros((1, 2, 2), np.float32)}
    cfg.raw["data"] = {"source": "generated", "transform": {"mean": "array 1x2x2"}}
    out = with_overrides(cfg, ["solver.base_lr=0.5"], {"source": "npz"})
    assert isinstance(out.data["transform"]["mean"], np.ndarray)
    assert out.solver.base_lr == 0.5 and out.data["source"] == "npz"
