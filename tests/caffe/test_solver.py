"""Caffe solver prototxt -> TrainConfig, data layers -> data config, and LeNet's solver
training a few iterations through the Trainer."""
from __future__ import annotations

import math
import shutil

import h5py
import numpy as np
import pytest

from netrun.caffe import data_config, is_solver_file, load_caffe_model, solver_to_config
from netrun.errors import ConfigError, ParseError
from netrun.ops.lr_policy import lr_at
from tests.caffe.helpers import shared_model
from tests.caffe.test_weights import blob_proto

NET = """
name: "tiny"
layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.00390625 }
        data_param { source: "mnist_train_lmdb" batch_size: 16 } }
layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TEST }
        transform_param { scale: 0.00390625 }
        data_param { source: "mnist_test_lmdb" batch_size: 50 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 10 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _solver(tmp_path, text: str, net: str = NET):
    (tmp_path / "tiny_train_test.prototxt").write_text(net)
    path = tmp_path / "solver.prototxt"
    path.write_text(text)
    return path


def test_lenet_solver_fields():
    path = shared_model("lenet/lenet_solver.prototxt")
    assert is_solver_file(path) and not is_solver_file(shared_model("lenet/lenet.prototxt"))
    cfg = solver_to_config(path, {"source": "mnist", "split": "mnist-10k"}, weights="w.caffemodel")
    s = cfg.solver
    assert (s.type, s.base_lr, s.momentum, s.weight_decay) == ("sgd", 0.01, 0.9, 0.0005)
    assert s.lr_policy == {"type": "inv", "gamma": 0.0001, "power": 0.75}
    assert (s.max_iter, s.test_iter, s.test_interval, s.snapshot, s.display) == \
        (10000, 100, 500, 5000, 100)
    assert s.test_initialization is True          # Caffe's default
    assert cfg.output == "runs/lenet"             # snapshot_prefix examples/mnist/lenet
    assert cfg.data == {"source": "mnist", "split": "mnist-10k", "batch_size": 64,
                        "test_batch_size": 100, "transform": {"scale": 0.00390625}}
    assert cfg.raw["weights"] == "w.caffemodel"
    assert any("solver_mode: GPU is ignored" in n for n in cfg.raw["notes"])
    adam = solver_to_config(shared_model("lenet/lenet_solver_adam.prototxt"), {"source": "mnist"})
    assert (adam.solver.type, adam.solver.momentum2, adam.solver.lr_policy) == \
        ("adam", 0.999, {"type": "fixed"})


POLICIES = {
    "fixed": ("", lambda it: 1.0),
    "step": ("gamma: 0.5 stepsize: 30", lambda it: 0.5 ** (it // 30)),
    "exp": ("gamma: 0.99", lambda it: 0.99 ** it),
    "inv": ("gamma: 0.001 power: 0.75", lambda it: (1 + 0.001 * it) ** -0.75),
    "multistep": ("gamma: 0.1 stepvalue: 20 stepvalue: 70",
                  lambda it: 0.1 ** ((it >= 20) + (it >= 70))),
    "poly": ("power: 2", lambda it: (1 - it / 100) ** 2),
    "sigmoid": ("gamma: -0.1 stepsize: 50", lambda it: 1 / (1 + math.exp(0.1 * (it - 50)))),
}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_caffe_lr_policy(tmp_path, policy):
    keys, factor = POLICIES[policy]
    path = _solver(tmp_path, f'net: "tiny_train_test.prototxt" base_lr: 0.2 max_iter: 100 '
                             f'lr_policy: "{policy}" {keys}')
    cfg = solver_to_config(path, {"source": "mnist"})
    for it in (0, 1, 19, 20, 45, 70, 99):
        assert math.isclose(lr_at({**cfg.solver.lr_policy, "base_lr": 0.2,
                                   **({"max_iter": 100} if policy == "poly" else {})}, it),
                            0.2 * factor(it), rel_tol=1e-12), (policy, it)


def test_solver_types(tmp_path):
    for caffe, ours in (("Nesterov", "nesterov"), ("AdaGrad", "adagrad"), ("RMSProp", "rmsprop")):
        path = _solver(tmp_path, f'net: "tiny_train_test.prototxt" base_lr: 0.1 type: "{caffe}" '
                                 f'momentum: 0.9 rms_decay: 0.95 delta: 1e-6')
        s = solver_to_config(path, {"source": "mnist"}).solver
        assert (s.type, s.delta) == (ours, 1e-6)
        assert s.momentum == (0.9 if ours == "nesterov" else 0.0)   # unused by Caffe there
    path = _solver(tmp_path, 'net: "tiny_train_test.prototxt" base_lr: 0.1 solver_type: NESTEROV')
    assert solver_to_config(path, {"source": "mnist"}).solver.type == "nesterov"


def test_unsupported_solver_settings_are_listed_at_once(tmp_path):
    path = _solver(tmp_path, """net: "tiny_train_test.prototxt"
base_lr: 0.1
type: "AdaDelta"
regularization_type: "L1"
frobnicate: 3
""")
    with pytest.raises(ParseError) as err:
        solver_to_config(path, {"source": "mnist"})
    message = str(err.value)
    assert f"{path}:3:1: solver: solver type AdaDelta is not supported" in message
    assert f"{path}:5:1: solver field 'frobnicate' is not supported" in message
    path.write_text('net: "tiny_train_test.prototxt"\nbase_lr: 0.1\nregularization_type: "L1"\n')
    with pytest.raises(ParseError, match=r"solver.prototxt:3:1: solver: regularization_type "
                                         r"'L1' is not supported \(netrun's solver does L2"):
        solver_to_config(path, {"source": "mnist"})


def test_net_path_is_found_like_caffe_examples(tmp_path):
    path = _solver(tmp_path, 'net: "examples/tiny/tiny_train_test.prototxt"\nbase_lr: 0.1\n')
    assert solver_to_config(path, {"source": "mnist"}).model == str(
        tmp_path / "tiny_train_test.prototxt")                  # by basename next to the solver
    path.write_text('net: "examples/nowhere.prototxt"\nbase_lr: 0.1\n')
    with pytest.raises(ParseError, match=r"solver.prototxt:1:1: solver: net 'examples/nowhere."
                                         r"prototxt' not found \(looked at .*nowhere.prototxt"):
        solver_to_config(path)


def test_data_source_guess_and_override(tmp_path):
    path = _solver(tmp_path, 'net: "tiny_train_test.prototxt" base_lr: 0.1')
    cfg = solver_to_config(path)
    assert cfg.data == {"source": "mnist", "batch_size": 16, "test_batch_size": 50,
                        "transform": {"scale": 0.00390625}}
    other = NET.replace("mnist_train_lmdb", "imagenet_lmdb").replace('"mnist"', '"imagenet"')
    (tmp_path / "other.prototxt").write_text(other)
    model = load_caffe_model(tmp_path / "other.prototxt", input_shapes={"data": (1, 28, 28)})
    with pytest.raises(ConfigError, match=r"Data layer 'imagenet' reads 'imagenet_lmdb', which "
                                          r"netrun cannot read .* --data SOURCE\[:SPLIT\]"):
        data_config(model)
    assert data_config(model, {"source": "generated", "batch_size": 8})["batch_size"] == 8


def test_cifar_solver_with_its_mean_file(tmp_path):
    for name in ("cifar10_quick_solver.prototxt", "cifar10_quick_train_test.prototxt"):
        shutil.copy(shared_model(f"cifar10_quick/{name}"), tmp_path / name)
    mean = np.random.default_rng(0).uniform(0, 255, (1, 3, 32, 32)).astype(np.float32)
    (tmp_path / "examples" / "cifar10").mkdir(parents=True)
    (tmp_path / "examples" / "cifar10" / "mean.binaryproto").write_bytes(blob_proto(mean))
    cfg = solver_to_config(tmp_path / "cifar10_quick_solver.prototxt")
    assert cfg.data["source"] == "cifar10" and cfg.data["batch_size"] == 100
    np.testing.assert_array_equal(cfg.data["transform"]["mean"], mean[0])
    assert cfg.raw["data"]["transform"]["mean"] == "array 3x32x32"    # raw stays JSON
    assert cfg.solver.lr_policy == {"type": "fixed"} and cfg.solver.weight_decay == 0.004


def test_hdf5_data_layer_reads_its_file_list(tmp_path):
    with h5py.File(tmp_path / "train.h5", "w") as f:
        f["x"] = np.zeros((10, 7), np.float32)
        f["y"] = np.zeros(10, np.float32)
    (tmp_path / "train.txt").write_text("train.h5\n")
    net = """layer { name: "d" type: "HDF5Data" top: "x" top: "y"
                     hdf5_data_param { source: "examples/hdf5/train.txt" batch_size: 5 } }
    layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip"
            inner_product_param { num_output: 3 } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "y" top: "loss" }"""
    path = _solver(tmp_path, 'net: "tiny_train_test.prototxt" base_lr: 0.1', net)
    cfg = solver_to_config(path)
    assert cfg.data == {"source": "hdf5", "data_key": "x", "label_key": "y",
                        "train": str(tmp_path / "train.txt"), "test": str(tmp_path / "train.txt"),
                        "batch_size": 5, "test_batch_size": 5}
    model = load_caffe_model(tmp_path / "tiny_train_test.prototxt")
    assert model.inputs["x"].shape == (7,) and model.labels == ["y"]


def test_lenet_solver_trains_through_the_trainer(tmp_path, shared_data):
    from netrun.caffe import CaffeModel
    from netrun.train.trainer import Trainer

    cfg = solver_to_config(shared_model("lenet/lenet_solver.prototxt"),
                           {"source": "mnist", "split": "mnist-10k"})
    cfg.solver.max_iter, cfg.solver.test_iter, cfg.solver.display = 12, 2, 1
    cfg.solver.test_interval, cfg.solver.snapshot = 0, 0
    trainer = Trainer(cfg, output=str(tmp_path / "run"), data_dir=str(shared_data))
    result = trainer.run()
    assert isinstance(trainer.model, CaffeModel)
    losses = [h["loss"] for h in trainer.history if "loss" in h]
    assert len(losses) == 12 and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-3:]) < losses[0]                # it learns
    assert result.examples == 200 and 0.0 <= result.metrics["accuracy"] <= 1.0
    assert (tmp_path / "run" / "last.h5").exists()


def test_schedule_fields(tmp_path):
    path = _solver(tmp_path, """net: "tiny_train_test.prototxt" base_lr: 0.05 max_iter: 30
iter_size: 4 clip_gradients: 10 average_loss: 20 random_seed: 7 test_initialization: false
test_iter: 5 test_iter: 6 snapshot_prefix: "/abs/snaps" display: 3""")
    cfg = solver_to_config(path, {"source": "mnist"})
    s = cfg.solver
    assert (s.iter_size, s.clip_gradients, s.average_loss, s.seed) == (4, 10.0, 20, 7)
    assert (s.test_initialization, s.test_iter, s.display) == (False, 5, 3)
    assert cfg.output == "/abs/snaps"
    assert any("test_iter has 2 values" in n for n in cfg.raw["notes"])
