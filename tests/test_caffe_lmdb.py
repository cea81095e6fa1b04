"""Caffe nets reading users' own data: LeNet whose Data layers point at LMDBs built here (from
rendered digits) builds with the shapes of the records and trains through the Trainer; an
ImageData layer reads its list file."""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

from netrun.caffe import data_config, load_caffe_model, solver_to_config
from netrun.errors import ConfigError, ParseError
from netrun.train.data import make_source
from netrun.train.data.databases import DatabaseWriter
from netrun.train.data.datum import datum_from_image, encode_datum
from netrun.train.data.images import encode_image
from tests.caffe.helpers import shared_model


def digits_lmdb(path, part: str, count: int, backend: str = "lmdb"):
    """An MNIST-like database of rendered digits, keys as convert_mnist_data writes them."""
    arrays = getattr(make_source({"source": "generated", "seed": 3, "train_count": count,
                                  "test_count": count, "cache": False}), part)
    with DatabaseWriter(path, backend) as writer:
        for i, (image, label) in enumerate(zip(arrays.data, arrays.label)):
            writer.put(b"%08d" % i, encode_datum(datum_from_image(image.astype(np.uint8),
                                                                  int(label))))
    return path


@pytest.fixture(scope="module")
def lenet_with_lmdbs(tmp_path_factory):
    """LeNet's solver and net copied beside two LMDBs, the net's sources pointing at them.
    The names carry no 'mnist', so nothing is guessed: the databases must be read."""
    folder = tmp_path_factory.mktemp("lenet")
    digits_lmdb(folder / "digits_train_lmdb", "train", 320)
    digits_lmdb(folder / "digits_test_lmdb", "test", 100)
    net = shared_model("lenet/lenet_train_test.prototxt").read_text()
    net = net.replace("examples/mnist/mnist_train_lmdb", "digits_train_lmdb")
    net = net.replace("examples/mnist/mnist_test_lmdb", "digits_test_lmdb")
    # Caffe's backend field is not trusted: the files say LMDB.
    net = net.replace("backend: LMDB", "backend: LEVELDB")
    assert net.count("digits_") == 2 and "LEVELDB" in net
    (folder / "lenet_train_test.prototxt").write_text(net)
    shutil.copy(shared_model("lenet/lenet_solver.prototxt"), folder / "lenet_solver.prototxt")
    return folder


def test_lenet_builds_with_shapes_from_the_database(lenet_with_lmdbs):
    model = load_caffe_model(lenet_with_lmdbs / "lenet_train_test.prototxt")
    assert model.inputs["data"].shape == (1, 28, 28)
    assert {d.phase: d.source for d in model.data_layers} == {
        "TRAIN": "digits_train_lmdb", "TEST": "digits_test_lmdb"}


def test_lenet_solver_maps_its_data_layers_to_the_databases(lenet_with_lmdbs):
    cfg = solver_to_config(lenet_with_lmdbs / "lenet_solver.prototxt")
    assert cfg.data == {"source": "db", "train": str(lenet_with_lmdbs / "digits_train_lmdb"),
                        "test": str(lenet_with_lmdbs / "digits_test_lmdb"), "batch_size": 64,
                        "test_batch_size": 100, "transform": {"scale": 0.00390625}}
    source = make_source({k: v for k, v in cfg.data.items()
                          if k not in ("batch_size", "test_batch_size", "transform")})
    assert source.train.size == 320 and source.test.size == 100
    assert source.train.data.dtype == np.uint8 and source.num_classes == 10


def test_lenet_trains_from_the_lmdb(lenet_with_lmdbs, tmp_path):
    from netrun.train.trainer import Trainer

    cfg = solver_to_config(lenet_with_lmdbs / "lenet_solver.prototxt")
    cfg.solver.max_iter, cfg.solver.test_iter, cfg.solver.display = 12, 1, 1
    cfg.solver.test_interval, cfg.solver.snapshot = 0, 0
    trainer = Trainer(cfg, output=str(tmp_path / "run"))
    result = trainer.run()
    losses = [h["loss"] for h in trainer.history if "loss" in h]
    assert len(losses) == 12 and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-3:]) < losses[0]                     # it learns
    assert result.examples == 100 and 0.0 <= result.metrics["accuracy"] <= 1.0


NET = """
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { crop_size: CROP }
        data_param { source: "examples/own/train_db" batch_size: 4 backend: LEVELDB } }
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TEST }
        transform_param { crop_size: CROP }
        data_param { source: "TEST_DB" batch_size: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def small_db(path, shape=(3, 10, 12), backend="leveldb"):
    images = np.random.default_rng(0).integers(0, 256, (5, *shape), dtype=np.uint8)
    with DatabaseWriter(path, backend) as writer:
        for i, image in enumerate(images):
            writer.put(b"%08d" % i, encode_datum(datum_from_image(image, i % 3)))


def test_data_layer_shape_and_crop_from_a_leveldb(tmp_path):
    small_db(tmp_path / "train_db")          # found by basename, as Caffe's example paths
    net = tmp_path / "net.prototxt"
    net.write_text(NET.replace("CROP", "0").replace("TEST_DB", "train_db"))
    model = load_caffe_model(net)
    assert model.inputs["data"].shape == (3, 10, 12)
    cfg = data_config(model)
    assert cfg["source"] == "db" and cfg["train"] == cfg["test"] == str(tmp_path / "train_db")
    net.write_text(NET.replace("CROP", "8").replace("TEST_DB", "train_db"))
    assert load_caffe_model(net).inputs["data"].shape == (3, 8, 8)
    # input_shapes still win over the database.
    assert load_caffe_model(net, input_shapes={"data": (3, 9, 9)}).inputs["data"].shape == \
        (3, 9, 9)


def test_a_missing_test_database_and_a_damaged_one(tmp_path):
    small_db(tmp_path / "train_db")
    net = tmp_path / "net.prototxt"
    net.write_text(NET.replace("CROP", "0").replace("TEST_DB", "gone_db"))
    model = load_caffe_model(net, input_shapes={"data": (3, 10, 12)})
    with pytest.raises(ConfigError, match=r"Data layer 'd' reads the database folder 'gone_db',"
                                          r" which is not at .*gone_db \(the TRAIN layer's is "
                                          r"at .*train_db\)"):
        data_config(model)
    (tmp_path / "junk_db").mkdir()
    (tmp_path / "junk_db" / "data.mdb").write_bytes(b"\x00" * 100)
    net.write_text(NET.replace("CROP", "0").replace("TEST_DB", "junk_db"))
    with pytest.raises(ParseError, match=r"layer 'd' \(Data\): cannot read the first example "
                                         r"of source 'junk_db': .*junk_db: cannot open the LMDB"):
        load_caffe_model(net)


def test_without_the_database_the_guess_stays(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text(NET.replace("CROP", "0").replace("TEST_DB", "mnist_test_lmdb")
                   .replace("examples/own/train_db", "mnist_train_lmdb"))
    model = load_caffe_model(net)
    assert model.inputs["data"].shape == (1, 28, 28)             # the MNIST guess
    assert data_config(model)["source"] == "mnist"


IMAGE_NET = """
layer { name: "img" type: "ImageData" top: "data" top: "label" include { phase: TRAIN }
        image_data_param { source: "lists/train.txt" root_folder: "pics/" batch_size: 2
                           shuffle: true SIZES } }
layer { name: "img" type: "ImageData" top: "data" top: "label" include { phase: TEST }
        image_data_param { source: "lists/train.txt" root_folder: "pics/" batch_size: 1
                           SIZES } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_image_data_layer_reads_its_list(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "lists").mkdir()
    images = np.random.default_rng(2).integers(0, 256, (3, 3, 5, 6), dtype=np.uint8)
    for i, image in enumerate(images):
        (tmp_path / "pics" / f"{i}.png").write_bytes(encode_image(image))
    (tmp_path / "lists" / "train.txt").write_text("0.png 0\n1.png 1\n2.png 1\n")
    net = tmp_path / "net.prototxt"
    net.write_text(IMAGE_NET.replace("SIZES", ""))
    model = load_caffe_model(net)
    assert model.inputs["data"].shape == (3, 5, 6)                 # from the first image
    cfg = data_config(model)
    assert cfg == {"source": "imagedata", "train": str(tmp_path / "lists" / "train.txt"),
                   "test": str(tmp_path / "lists" / "train.txt"), "is_color": True,
                   "shuffle": True, "root_folder": str(tmp_path / "pics"),
                   "batch_size": 2, "test_batch_size": 1}
    source = make_source({k: v for k, v in cfg.items() if not k.endswith("batch_size")})
    np.testing.assert_array_equal(source.train.data[:], images)
    net.write_text(IMAGE_NET.replace("SIZES", "new_height: 4 new_width: 4 is_color: false"))
    model = load_caffe_model(net)
    assert model.inputs["data"].shape == (1, 4, 4)
    cfg = data_config(model)
    assert (cfg["new_height"], cfg["new_width"], cfg["is_color"]) == (4, 4, False)
    other = IMAGE_NET.replace("SIZES", "new_height: 4 new_width: 4")
    other = other.replace('root_folder: "pics/" batch_size: 1', 'root_folder: "val/" batch_size: 1')
    net.write_text(other)
    with pytest.raises(ConfigError, match=r"TRAIN and TEST ImageData layers differ in "
                                          r"root_folder; netrun reads both parts with one"):
        data_config(load_caffe_model(net))
