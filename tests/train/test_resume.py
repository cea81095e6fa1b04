"""Resume is exact: N steps straight equal N/2 + checkpoint + resume + N/2, bit for bit."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from netrun.train.config import load_config
from netrun.train.trainer import Callbacks, Trainer


def _train(config, output, until, resume=None, overrides=()):
    losses = []
    tr = Trainer(load_config(config, list(overrides)), output=str(output))
    tr.start(resume)
    tr.run(until, Callbacks(on_step=lambda r: losses.append(r.loss)))
    params = {p: tr.ws.fetch_blob(p) for p in tr.model.param_names + tr.nets.optimizer_state}
    return losses, params, tr


def test_resume_is_bitwise_exact(tiny_config, tmp_path):
    straight, p_straight, _ = _train(tiny_config, tmp_path / "a", 40)
    first, _, tr = _train(tiny_config, tmp_path / "b", 20)
    assert tr.iteration == 20
    second, p_resumed, tr2 = _train(tiny_config, tmp_path / "b2", 40, resume=str(tmp_path / "b" / "last.h5"))
    assert tr2.iteration == 40
    assert first + second == straight          # the same loss sequence, exactly
    assert p_straight.keys() == p_resumed.keys() and len(p_straight) > 4
    for name in p_straight:
        np.testing.assert_array_equal(p_resumed[name], p_straight[name], err_msg=name)


def test_resume_with_adam_and_iter_size(tiny_config, tmp_path):
    overrides = ["solver.type=adam", "solver.base_lr=0.002", "solver.iter_size=2"]
    straight, p_straight, _ = _train(tiny_config, tmp_path / "a", 12, overrides=overrides)
    first, _, _ = _train(tiny_config, tmp_path / "b", 6, overrides=overrides)
    second, p_resumed, _ = _train(tiny_config, tmp_path / "c", 12, overrides=overrides,
                                  resume=str(tmp_path / "b" / "last.h5"))
    assert first + second == straight
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
