"""Issue 16's bar: Caffe's LeNet solver, its Data layers pointing at real LMDBs of the
mnist-10k split, trains to what it reaches on netrun's built-in MNIST source. The LMDBs are
built twice, by netrun's converter from PNG files and by an independent writer (the real
protobuf library for the Datums, the lmdb package directly), so a reader and a writer cannot
be wrong together. With the same examples in the same order, the three runs are the same
bits: the database path adds nothing and loses nothing."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from netrun.caffe import solver_to_config
from netrun.tools.imageset import build_database
from netrun.train.data import make_source
from netrun.train.data.images import encode_image
from netrun.train.trainer import Trainer
from tests.caffe.helpers import shared_model
from tests.test_datum import proto_datum

ITERATIONS = 300


def mnist_10k(data_dir):
    source = make_source({"source": "mnist", "split": "mnist-10k", "dir": str(data_dir / "mnist"),
                          "download": False})
    try:
        return source.train, source.test
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"the MNIST test split is not in {data_dir} ({e})")


def lmdb_by_protobuf(path, arrays):
    """Keys and records as Caffe's convert_mnist_data writes them, without netrun's code."""
    import lmdb

    datum = proto_datum()
    env = lmdb.open(str(path), map_size=1 << 30)
    with env.begin(write=True) as txn:
        for i, (image, label) in enumerate(zip(arrays.data, arrays.label)):
            pixels = image.astype(np.uint8)
            txn.put(b"%08d" % i, datum(channels=1, height=28, width=28, data=pixels.tobytes(),
                                       label=int(label)).SerializeToString())
    env.close()


def lmdb_by_converter(path, arrays, folder):
    """PNG files and a list file, then netrun's convert_imageset (gray: one channel)."""
    folder.mkdir()
    lines = []
    for i, (image, label) in enumerate(zip(arrays.data, arrays.label)):
        (folder / f"{i:05d}.png").write_bytes(encode_image(image.astype(np.uint8), "png"))
        lines.append(f"{i:05d}.png {int(label)}")
    listing = folder / "list.txt"
    listing.write_text("\n".join(lines) + "\n")
    summary = build_database(listing, path, root=folder, gray=True)
    assert summary["records"] == len(lines)


def train(solver, data_override, output):
    cfg = solver_to_config(solver, data_override)
    cfg.solver.max_iter, cfg.solver.test_interval, cfg.solver.snapshot = ITERATIONS, 0, 0
    cfg.solver.display, cfg.solver.test_iter = 0, 20            # 20 x 100: all 2,000
    cfg.data["shuffle"] = True          # netrun's order for all three (Caffe reads in order)
    trainer = Trainer(cfg, output=str(output))
    result = trainer.run()
    params = {name: trainer.ws.fetch_blob(name) for name in ("conv1_w", "ip2_w")}
    return result.metrics["accuracy"], params


@pytest.mark.slow
def test_lenet_on_real_lmdbs_trains_as_on_the_builtin_mnist(shared_data, tmp_path):
    train_part, test_part = mnist_10k(shared_data)
    assert (train_part.size, test_part.size) == (8000, 2000)
    folder = tmp_path / "lenet"
    folder.mkdir()
    lmdb_by_protobuf(folder / "proto_train_lmdb", train_part)
    lmdb_by_protobuf(folder / "proto_test_lmdb", test_part)
    lmdb_by_converter(folder / "conv_train_lmdb", train_part, tmp_path / "png_train")
    lmdb_by_converter(folder / "conv_test_lmdb", test_part, tmp_path / "png_test")
    net = shared_model("lenet/lenet_train_test.prototxt").read_text()
    shutil.copy(shared_model("lenet/lenet_solver.prototxt"), folder / "lenet_solver.prototxt")

    runs = {}
    for kind in ("proto", "conv"):
        text = net.replace("examples/mnist/mnist_train_lmdb", f"{kind}_train_lmdb")
        text = text.replace("examples/mnist/mnist_test_lmdb", f"{kind}_test_lmdb")
        (folder / "lenet_train_test.prototxt").write_text(text)
        runs[kind] = train(folder / "lenet_solver.prototxt", None, tmp_path / kind)
    (folder / "lenet_train_test.prototxt").write_text(net)
    runs["builtin"] = train(folder / "lenet_solver.prototxt",
                            {"source": "mnist", "split": "mnist-10k",
                             "dir": str(shared_data / "mnist"), "download": False},
                            tmp_path / "builtin")

    accuracy = {k: a for k, (a, _) in runs.items()}
    print("LeNet test accuracy after", ITERATIONS, "iterations:", accuracy)
    assert accuracy["builtin"] > 0.95, accuracy
    assert accuracy["proto"] == accuracy["conv"] == accuracy["builtin"], accuracy
    for kind in ("proto", "conv"):
        for name, value in runs["builtin"][1].items():
            np.testing.assert_array_equal(runs[kind][1][name], value, err_msg=f"{kind}: {name}")
