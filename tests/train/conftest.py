"""A tiny model and config that train in seconds (dropout included, so RNG state matters)."""
from __future__ import annotations

import textwrap

import pytest

TINY_MODEL = """\
name: Tiny
inputs: {data: [1, 28, 28], label: []}
layers:
  - {type: conv, name: c1, input: data, num_output: 4, kernel: 5, stride: 3}
  - {type: relu, name: r1}
  - {type: fc, name: f1, num_output: 16}
  - {type: dropout, name: d1, ratio: 0.3}
  - {type: fc, name: f2, num_output: 10}
loss: {type: softmax_cross_entropy, input: f2, label: label}
metrics: [{type: accuracy, input: f2, label: label}]
"""


def write_config(tmp_path, solver: str = "", **data) -> str:
    """A config training the tiny model on a small generated dataset under tmp_path."""
    (tmp_path / "tiny.yaml").write_text(TINY_MODEL)
    data = {"source": "generated", "dir": tmp_path / "data", "train_count": 480,
            "test_count": 96, "batch_size": 16, "transform": "{scale: 0.00390625}", **data}
    lines = "".join(f"  {k}: {v}\n" for k, v in data.items())
    (tmp_path / "train.yaml").write_text("model: tiny.yaml\ndata:\n" + lines + textwrap.dedent("""\
        solver:
          type: sgd
          base_lr: 0.05
          momentum: 0.9
          weight_decay: 0.0005
          lr_policy: {type: inv, gamma: 0.001, power: 0.75}
          max_iter: 40
          display: 0
          seed: 3
        """) + textwrap.indent(textwrap.dedent(solver), "  ") + f"output: {tmp_path / 'run'}\n")
    return str(tmp_path / "train.yaml")


@pytest.fixture
def tiny_config(tmp_path):
    return write_config(tmp_path)
