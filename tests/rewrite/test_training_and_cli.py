"""The training rule (forward and gradients equal to the unfused step), the trainer's fused
test net following its parameters, and the switches: --no-fuse, `fuse: false`, inspect."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from netrun.cli import cli
from netrun.core.schema import all_schemas
from netrun.core.workspace import Workspace
from netrun.model import load_model
from netrun.rewrite import rewrite, with_train_net
from netrun.train.config import SolverConfig, load_config
from netrun.train.solver import build_training
from netrun.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
RESNET20 = str(REPO / "zoo" / "resnet20.yaml")

BN_MODEL = """\
name: TinyBN
inputs: {data: [1, 28, 28], label: []}
layers:
  - {type: conv, name: c1, input: data, num_output: 4, kernel: 5, stride: 3, bias: false}
  - {type: spatial_bn, name: bn1}
  - {type: relu, name: r1}
  - {type: fc, name: f1, num_output: 10}
loss: {type: softmax_cross_entropy, input: f1, label: label}
metrics: [{type: accuracy, input: f1, label: label}]
"""

needs_bn_relu = pytest.mark.skipif("SpatialBNRelu" not in all_schemas(),
                                   reason="SpatialBNRelu (helper D's op) is not registered")


def _write(tmp_path, fuse=None) -> str:
    (tmp_path / "bn.yaml").write_text(BN_MODEL)
    extra = "" if fuse is None else f"fuse: {str(fuse).lower()}\n"
    (tmp_path / "train.yaml").write_text(textwrap.dedent(f"""\
        model: bn.yaml
        data: {{source: generated, dir: {tmp_path / 'data'}, train_count: 160, test_count: 48,
               batch_size: 16, transform: {{scale: 0.00390625}}}}
        solver: {{type: sgd, base_lr: 0.05, momentum: 0.9, max_iter: 6, display: 0, seed: 3}}
        output: {tmp_path / 'run'}
        """) + extra)
    return str(tmp_path / "train.yaml")


@needs_bn_relu
def test_bn_relu_forward_and_gradients_equal_the_unfused_step(tmp_path):
    (tmp_path / "bn.yaml").write_text(BN_MODEL)
    model = load_model(tmp_path / "bn.yaml")
    done = rewrite(model.train_net, "training")
    assert done.counts() == {"bn_relu": 1}
    rng = np.random.default_rng(0)
    data = rng.standard_normal((8, 1, 28, 28)).astype(np.float32)
    label = rng.integers(0, 10, 8).astype(np.int32)
    results = []
    for m in (model, with_train_net(model, done.net)):
        nets = build_training(m, SolverConfig(type="sgd"))
        ws = Workspace("cpu", seed=1)
        ws.run_net_once(nets.init)
        ws.feed_blob("data", data)
        ws.feed_blob("label", label)
        ws.create_net(nets.step)
        ws.run_net(nets.step.name)
        names = [model.loss, "r1", *(nets.grads[p] for p in nets.params), "bn1_rm", "bn1_riv"]
        results.append({n: ws.fetch_blob(n) for n in names})
    assert "SpatialBNReluGradient" in {o.type for o in
                                       build_training(with_train_net(model, done.net),
                                                      SolverConfig()).step.ops}
    for name, want in results[0].items():
        np.testing.assert_allclose(results[1][name], want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_training_rule_waits_for_its_op():
    """Without SpatialBNRelu registered the rule is skipped, not an error."""
    model_net = load_model(RESNET20).train_net
    done = rewrite(model_net, "training")
    expected = 10 if "SpatialBNRelu" in all_schemas() else 0   # BN right before a ReLU
    assert done.counts().get("bn_relu", 0) == expected


def test_trainer_fused_test_net_follows_the_parameters(tmp_path):
    """After training steps the fused test net (folds recomputed) scores as the written one."""
    results = {}
    for fuse in (True, False):
        folder = tmp_path / str(fuse)
        folder.mkdir()
        trainer = Trainer(load_config(_write(folder, fuse)))
        assert bool(trainer.rewrites) is fuse
        trainer.start()
        for _ in range(4):
            trainer.step()
        results[fuse] = trainer.test()
        if fuse:
            assert trainer.rewrites["test"].counts() == {"fold_spatial_bn": 1, "conv_relu": 1}
            assert [o.type for o in trainer.bound.test.ops][0] == "Conv"
            # Checkpoints keep the nets as built.
            assert "SpatialBN" in {o.type for o in trainer.nets.test.ops}
    assert results[True].loss == pytest.approx(results[False].loss, rel=1e-4, abs=1e-5)
    assert results[True].metrics == pytest.approx(results[False].metrics, abs=1e-6)


CHAIN_MODEL = """\
name: TinyChain
inputs: {data: [1, 28, 28], label: []}
layers:
  - {type: conv, name: c1, input: data, num_output: 8, kernel: 3, pad: 1, bias: false}
  - {type: spatial_bn, name: bn1}
  - {type: relu, name: r1}
  - {type: conv, name: c2, num_output: 8, kernel: 3, pad: 1, bias: false}
  - {type: spatial_bn, name: bn2}
  - {type: add, name: sum, input: [bn2, r1]}
  - {type: relu, name: r2}
  - {type: average_pool, name: p, global_pooling: true}
  - {type: fc, name: f1, num_output: 10}
loss: {type: softmax_cross_entropy, input: f1, label: label}
metrics: [{type: accuracy, input: f1, label: label}]
"""


def test_trainer_test_net_gets_the_layout_plan(tmp_path):
    """With oneDNN, the trainer's test net is planned once the parameters exist (their data
    type decides), and scores as the unplanned one after training steps."""
    from netrun.kernels import onednn

    if not onednn.available():
        pytest.skip("oneDNN is not installed: there is no layout plan")
    results = {}
    for layouts in ("on", "off"):
        folder = tmp_path / layouts
        folder.mkdir()
        path = _write(folder)
        (folder / "bn.yaml").write_text(CHAIN_MODEL)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("NETRUN_LAYOUTS", layouts)
            trainer = Trainer(load_config(path))
            trainer.start()
            for _ in range(4):
                trainer.step()
            results[layouts] = trainer.test()
            planned = trainer.rewrites["test"].counts().get("blocked_layout", 0)
            assert (planned > 0) is (layouts == "on")
    assert results["on"].loss == pytest.approx(results["off"].loss, rel=1e-4, abs=1e-5)
    assert results["on"].metrics == pytest.approx(results["off"].metrics, abs=1e-6)


def test_fuse_in_the_config_must_be_a_boolean(tmp_path):
    path = _write(tmp_path, None)
    Path(path).write_text(Path(path).read_text() + "fuse: maybe\n")
    result = CliRunner().invoke(cli, ["train", path], prog_name="netrun")
    assert result.exit_code == 2 and "fuse" in result.output


def _run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), prog_name="netrun")
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def test_inspect_shows_the_rewritten_net_and_no_fuse_turns_it_off():
    plain = _run("inspect", RESNET20)
    fused = _run("inspect", RESNET20, "--rewritten")
    off = _run("inspect", RESNET20, "--rewritten", "--no-fuse")
    assert "AddRelu" in fused and "fold_spatial_bn: 'conv1' (Conv) + 'bn1'" in fused
    assert "AddRelu" not in plain and "SpatialBN" in plain and "rewrites" not in plain
    assert "AddRelu" not in off and "bind-time rewrites: none" in off
    nets = _run("inspect", RESNET20, "--nets", "--rewritten")
    assert "# predict net (rewritten)" in nets and 'name: "relu"' in nets


def test_inspect_shows_the_layout_plan(monkeypatch):
    """With oneDNN, the rewritten predict net is the one bound on this CPU: blocked convs
    (5-D shapes) up to the FC, which reads the pooled features blocked (no reorder);
    NETRUN_LAYOUTS=off shows none."""
    from netrun.kernels import onednn

    if not onednn.available():
        pytest.skip("oneDNN is not installed: there is no layout plan")
    planned = _run("inspect", RESNET20, "--rewritten")
    assert "blocked_layout:" in planned and "BlockedToNCHW" not in planned
    assert "1×2×32×32×8" in planned or "1×1×32×32×16" in planned
    # the pooled features: in blocks of 16 (AVX-512), or channels-last (AVX2: stage 3 of
    # 64 channels is a channels-last region)
    assert "1×1×1×1×64" in planned or "1×4×1×1×16" in planned
    assert ("'pool' (AveragePool) channels-last" in planned) == ("1×1×1×1×64" in planned)
    monkeypatch.setenv("NETRUN_LAYOUTS", "off")
    unplanned = _run("inspect", RESNET20, "--rewritten")
    assert "blocked_layout" not in unplanned and "BlockedToNCHW" not in unplanned


def test_profile_and_no_fuse(tmp_path):
    args = ("profile", RESNET20, "--forward-only", "--batch", "2", "--iters", "1",
            "--warmup", "0")
    fused, off = _run(*args), _run(*args, "--no-fuse")
    assert "fold_spatial_bn ×21, conv_relu ×10, add_relu ×9, conv_add_relu ×9" in fused
    assert "s1b1_conv2+s1b1_bn2+s1b1_sum+s1b1_relu" in fused
    assert "bind-time rewrites: off (--no-fuse)" in off and "AddRelu" not in off
    assert "SpatialBN" in off


def test_infer_with_and_without_fusion(tmp_path):
    config = _write(tmp_path, None)
    _run("train", config, "--no-fuse", "--max-iter", "2")
    ckpt = str(tmp_path / "run" / "last.h5")
    outputs = {}
    for flags in ((), ("--no-fuse",)):
        out = tmp_path / f"p{len(flags)}.npy"
        _run("infer", ckpt, "generated:test", "--data-dir", str(tmp_path / "data"),
             "-o", str(out), *flags)
        outputs[flags] = np.load(out)
    np.testing.assert_allclose(outputs[()], outputs[("--no-fuse",)], rtol=1e-4, atol=1e-6)
