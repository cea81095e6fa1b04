"""Training on the GPU: exact resume (device RNG state in checkpoints), the loss trajectory of
the CPU, checkpoints that move between devices, and (on a real GPU) LeNet's accuracy."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from netrun.infer import Predictor
from netrun.train.config import load_config
from netrun.train.trainer import Callbacks, Trainer
from tests.train.conftest import write_config

NO_DROPOUT = """\
name: TinyNoDropout
inputs: {data: [1, 28, 28], label: []}
layers:
  - {type: conv, name: c1, input: data, num_output: 4, kernel: 5, stride: 3}
  - {type: max_pool, name: p1, kernel: 2, stride: 2}
  - {type: relu, name: r1}
  - {type: fc, name: f1, num_output: 16}
  - {type: fc, name: f2, num_output: 10}
loss: {type: softmax_cross_entropy, input: f2, label: label}
metrics: [{type: accuracy, input: f2, label: label}]
"""


def _train(config, output, until, device, resume=None, overrides=()):
    losses = []
    tr = Trainer(load_config(config, list(overrides)), device=device, output=str(output))
    tr.start(resume)
    tr.run(until, Callbacks(on_step=lambda r: losses.append(r.loss)))
    params = {p: tr.ws.fetch_blob(p) for p in tr.model.param_names + tr.nets.optimizer_state}
    return losses, params, tr


def test_gpu_resume_is_bitwise_exact(gpu, tmp_path):
    """Dropout draws from the device generator, whose state the checkpoint carries."""
    config = write_config(tmp_path)
    straight, p_straight, tr = _train(config, tmp_path / "a", 12, "gpu")
    assert tr.ws.device == "gpu:0"
    first, _, _ = _train(config, tmp_path / "b", 6, "gpu")
    second, p_resumed, _ = _train(config, tmp_path / "c", 12, "gpu",
                                  resume=str(tmp_path / "b" / "last.h5"))
    assert first + second == straight
    for name in p_straight:
        np.testing.assert_array_equal(p_resumed[name], p_straight[name], err_msg=name)


def test_gpu_training_follows_the_cpu(gpu, tmp_path):
    (tmp_path / "m.yaml").write_text(NO_DROPOUT)
    config = write_config(tmp_path)
    text = (tmp_path / "train.yaml").read_text().replace("model: tiny.yaml", "model: m.yaml")
    (tmp_path / "train.yaml").write_text(text)
    cpu, p_cpu, _ = _train(config, tmp_path / "cpu", 10, "cpu")
    dev, p_gpu, _ = _train(config, tmp_path / "gpu", 10, "gpu")
    np.testing.assert_allclose(dev, cpu, rtol=1e-4)
    for name in p_cpu:
        np.testing.assert_allclose(p_gpu[name], p_cpu[name], rtol=1e-3, atol=1e-5, err_msg=name)


def test_checkpoints_move_between_devices(gpu, tmp_path):
    config = write_config(tmp_path)
    data = np.random.default_rng(0).random((5, 1, 28, 28)).astype(np.float32)
    for trained_on in ("gpu", "cpu"):
        _, _, tr = _train(config, tmp_path / trained_on, 4, trained_on)
        path = tr.snapshot("test")
        on_cpu = Predictor.from_checkpoint(path, device="cpu").predict(data)
        on_gpu = Predictor.from_checkpoint(path, device="gpu").predict(data)
        np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-5, atol=1e-6)


def test_a_cpu_checkpoint_resumes_on_the_gpu(gpu, tmp_path):
    """The CPU generator's state cannot be replayed on the device: training continues from a
    stream derived from it (the same one every time)."""
    config = write_config(tmp_path)
    _train(config, tmp_path / "cpu", 4, "cpu")
    runs = [_train(config, tmp_path / f"gpu{k}", 8, "gpu",
                   resume=str(tmp_path / "cpu" / "last.h5"))[0] for k in range(2)]
    assert len(runs[0]) == 4 and runs[0] == runs[1] and np.all(np.isfinite(runs[0]))


LENET = textwrap.dedent("""\
    model: {repo}/zoo/lenet.yaml
    data:
      source: generated
      dir: {data}
      train_count: 6000
      test_count: 1000
      batch_size: 64
      transform: {{scale: 0.00390625}}
    solver:
      type: sgd
      base_lr: 0.01
      momentum: 0.9
      weight_decay: 0.0005
      lr_policy: {{type: inv, gamma: 0.0001, power: 0.75}}
      max_iter: 300
      display: 0
      seed: 1
    output: {out}
    """)


@pytest.mark.gpu
@pytest.mark.slow
def test_lenet_reaches_the_cpu_accuracy_on_a_real_gpu(cuda, tmp_path):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    accuracy = {}
    for device in ("cpu", "gpu"):
        path = tmp_path / f"{device}.yaml"
        path.write_text(LENET.format(repo=repo, data=tmp_path / "data", out=tmp_path / device))
        tr = Trainer(load_config(str(path)), device=device)
        accuracy[device] = tr.run().accuracy
    assert accuracy["gpu"] > 0.9
    assert abs(accuracy["gpu"] - accuracy["cpu"]) < 0.02, accuracy
