"""Data sources: IDX files, MNIST and its splits, downloads, HDF5, npz, make_source."""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netrun.errors import ConfigError, NetrunError
from netrun.train.data import (BatchLoader, download, expand_path, make_source, parse_spec,
                               resolve_data_dir)
from netrun.train.data.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx, write_idx
from netrun.train.data.mnist import FILES

# The published class counts of the MNIST test set (t10k labels).
T10K_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """No test may reach the network: every urlopen fails as it does offline."""
    import urllib.error
    import urllib.request

    def offline(*args, **kwargs):
        url = args[0].full_url if hasattr(args[0], "full_url") else args[0]
        if str(url).startswith("file:"):
            return _real_urlopen(*args, **kwargs)
        raise urllib.error.URLError("network disabled in tests")

    _real_urlopen = urllib.request.urlopen
    monkeypatch.setattr(urllib.request, "urlopen", offline)


def write_mnist(folder: Path, group: str, n: int, seed: int = 0, gz: bool = True) -> tuple:
    """Small synthetic IDX image + label files of one group ('train' or 't10k')."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    names = FILES[group] if gz else [f.removesuffix(".gz") for f in FILES[group]]
    write_idx(folder / names[0], images)
    write_idx(folder / names[1], labels)
    return images, labels


# ----------------------------------------------------------------------------------- IDX


@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from(["uint8", "int8", "int16", "int32", "float32", "float64"]),
       shape=st.lists(st.integers(0, 5), min_size=1, max_size=4), gz=st.booleans())
def test_idx_round_trip(tmp_path_factory, dtype, shape, gz):
    path = tmp_path_factory.mktemp("idx") / ("a.idx.gz" if gz else "a.idx")
    array = (np.arange(int(np.prod(shape))) % 100 - 50).astype(dtype).reshape(shape)
    if dtype == "uint8":
        array = (array + 50).astype(dtype)
    write_idx(path, array)
    back = read_idx(path)
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    assert back.flags.writeable


def test_idx_magic_numbers_match_mnist(tmp_path):
    write_idx(tmp_path / "img.gz", np.zeros((2, 28, 28), np.uint8))
    write_idx(tmp_path / "lab", np.zeros(2, np.uint8))
    assert (tmp_path / "img.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress((tmp_path / "img.gz").read_bytes())[:4] == b"\x00\x00\x08\x03"
    assert (tmp_path / "lab").read_bytes()[:4] == b"\x00\x00\x08\x01"
    assert read_idx(tmp_path / "img.gz", IMAGES_MAGIC).shape == (2, 28, 28)
    assert read_idx(tmp_path / "lab", LABELS_MAGIC).shape == (2,)
    with pytest.raises(NetrunError, match=r"lab: IDX magic number 0x00000801, expected 0x00000803"):
        read_idx(tmp_path / "lab", IMAGES_MAGIC)


def test_idx_corrupt_magic_names_the_file(tmp_path):
    bad = tmp_path / "bad-images.idx"
    bad.write_bytes(b"\x12\x34\x08\x03" + b"\x00" * 20)
    with pytest.raises(NetrunError, match=r"bad-images.idx: not an IDX file"):
        read_idx(bad)
    (tmp_path / "tiny").write_bytes(b"\x00\x00")
    with pytest.raises(NetrunError, match="shorter than a header"):
        read_idx(tmp_path / "tiny")


def test_idx_truncated_and_trailing_bytes(tmp_path):
    path = tmp_path / "t10k-images.idx"
    write_idx(path, np.ones((3, 4, 5), np.uint8))
    raw = path.read_bytes()
    path.write_bytes(raw[:-7])
    with pytest.raises(NetrunError, match=r"t10k-images.idx: IDX file truncated: a 3 x 4 x 5 uint8 "
                                          r"array needs 76 bytes, the file has 69"):
        read_idx(path)
    path.write_bytes(raw + b"xx")
    with pytest.raises(NetrunError, match="trailing bytes"):
        read_idx(path)
    path.write_bytes(raw[:10])
    with pytest.raises(NetrunError, match="truncated IDX header"):
        read_idx(path)


def test_idx_truncated_gzip(tmp_path):
    path = tmp_path / "labels.gz"
    write_idx(path, np.arange(1000, dtype=np.uint8) % 10)
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(NetrunError, match=r"labels.gz: corrupt or truncated gzip"):
        read_idx(path)
    with pytest.raises(NetrunError, match="no such file"):
        read_idx(tmp_path / "absent.gz")


# --------------------------------------------------------------------------------- MNIST


def test_mnist_standard_split_from_idx_files(tmp_path):
    train_x, train_y = write_mnist(tmp_path, "train", 30, seed=1)
    test_x, test_y = write_mnist(tmp_path, "t10k", 20, seed=2, gz=False)   # raw files work too
    source = make_source({"source": "mnist", "download": False}, tmp_path)
    assert source.input_shape == (1, 28, 28) and source.num_classes == 10
    assert source.train.data.shape == (30, 1, 28, 28) and source.train.data.dtype == np.float32
    assert source.train.label.dtype == np.int32
    np.testing.assert_array_equal(source.train.data[:, 0], train_x.astype(np.float32))
    np.testing.assert_array_equal(source.test.data[:, 0], test_x)
    np.testing.assert_array_equal(source.test.label, test_y)
    assert source.part("test") is source.test


def test_fashion_mnist_uses_the_same_file_names(tmp_path):
    write_mnist(tmp_path / "fashion-mnist", "t10k", 10)
    source = make_source({"source": "fashion-mnist"}, tmp_path)   # root with fashion-mnist/
    assert source.name == "fashion-mnist" and source.test.data.shape == (10, 1, 28, 28)


def test_mnist_10k_split_sizes_and_labels(shared_data, monkeypatch):
    monkeypatch.setattr(download, "download_files", _forbidden_download)
    source = make_source("mnist-10k", shared_data)
    train, test = source.train, source.test
    assert train.data.shape == (8000, 1, 28, 28) and test.data.shape == (2000, 1, 28, 28)
    assert train.data.dtype == np.float32 and float(train.data.max()) == 255.0
    counts_train = np.bincount(train.label, minlength=10)
    counts_test = np.bincount(test.label, minlength=10)
    assert (counts_train + counts_test).tolist() == T10K_COUNTS
    assert counts_test.min() >= 150          # every class is in the held-out 2,000
    # The split is t10k[:8000] / t10k[8000:] of the standard test part.
    full = make_source({"source": "mnist", "download": False}, shared_data / "mnist").test
    np.testing.assert_array_equal(full.data[8000:], test.data)
    np.testing.assert_array_equal(full.label[:8000], train.label)


def test_data_spec_names_split_and_part():
    assert parse_spec("mnist-10k:test") == ({"source": "mnist-10k"}, "test")
    assert parse_spec("generated") == ({"source": "generated"}, None)
    with pytest.raises(ConfigError, match="expected SOURCE"):
        parse_spec(":test")


def _forbidden_download(*args, **kwargs):
    raise AssertionError(f"download attempted: {args}")


def test_missing_train_files_give_a_clear_message(tmp_path, monkeypatch):
    write_mnist(tmp_path, "t10k", 10)
    source = make_source({"source": "mnist"}, tmp_path)
    with pytest.raises(NetrunError) as err:
        source.train
    text = str(err.value)
    for needle in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", str(tmp_path),
                   "NETRUN_DATA", "--data-dir", "mnist-10k", "network disabled in tests"):
        assert needle in text, (needle, text)
    assert not any(tmp_path.glob(".*part"))             # no half-written download left
    assert source.test.data.shape == (10, 1, 28, 28)     # the test part needs only t10k


def test_missing_files_without_download(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "download_files", _forbidden_download)
    monkeypatch.setenv("NETRUN_DATA", str(tmp_path / "root"))
    source = make_source({"source": "mnist", "download": False})
    assert source.directory == tmp_path / "root" / "mnist"
    with pytest.raises(NetrunError, match=r"downloading is off.*NETRUN_DATA") as err:
        source.test
    assert "under $NETRUN_DATA" in str(err.value) and "mnist-10k" not in str(err.value)


def test_mnist_10k_never_downloads_train_files(tmp_path, monkeypatch):
    asked = []

    def record(dataset, names, directory, **kwargs):
        asked.extend(names)
        raise download.DownloadError("offline", {n: "offline" for n in names})

    monkeypatch.setattr(download, "download_files", record)
    source = make_source({"source": "mnist", "split": "mnist-10k"}, tmp_path)
    with pytest.raises(NetrunError, match="t10k-images-idx3-ubyte.gz"):
        source.train
    with pytest.raises(NetrunError):
        source.test
    assert asked and all(name.startswith("t10k") for name in asked)


def test_mnist_10k_needs_ten_thousand_examples(tmp_path):
    write_mnist(tmp_path, "t10k", 50)
    with pytest.raises(NetrunError, match="needs the 10,000"):
        make_source("mnist-10k", tmp_path).train


def test_bad_labels_and_mismatched_counts(tmp_path):
    write_mnist(tmp_path, "t10k", 10)
    write_idx(tmp_path / FILES["t10k"][1], np.arange(9, dtype=np.uint8))
    with pytest.raises(NetrunError, match="holds 10 images but .* holds 9 labels"):
        make_source({"source": "mnist"}, tmp_path).test
    write_idx(tmp_path / FILES["t10k"][1], np.full(10, 12, np.uint8))
    with pytest.raises(NetrunError, match="label 12 is not a class 0-9"):
        make_source({"source": "mnist"}, tmp_path).test


def test_split_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown split 'mnist10k'.*did you mean 'mnist-10k'"):
        make_source({"source": "mnist", "split": "mnist10k"}, tmp_path)
    with pytest.raises(ConfigError, match="contradicts"):
        make_source({"source": "mnist-10k", "split": "standard"}, tmp_path)


# ----------------------------------------------------------------------------- downloads


def _serve(tmp_path: Path, name: str, payload: bytes) -> str:
    served = tmp_path / "mirror"
    served.mkdir(exist_ok=True)
    (served / name).write_bytes(payload)
    return served.as_uri() + "/"


def test_fetch_verifies_and_renames_atomically(tmp_path):
    payload = b"netrun" * 1000
    base = _serve(tmp_path, "f.bin", payload)
    dest = tmp_path / "data" / "f.bin"
    digest = download.fetch(base + "f.bin", dest, size=len(payload),
                            md5=hashlib.md5(payload).hexdigest(),
                            sha256=hashlib.sha256(payload).hexdigest())
    assert dest.read_bytes() == payload and digest == hashlib.sha256(payload).hexdigest()
    for kwargs, message in (({"md5": "0" * 32}, "MD5"), ({"sha256": "f" * 64}, "SHA-256"),
                            ({"size": 5}, "got 6000 bytes")):
        target = tmp_path / "data" / "g.bin"
        with pytest.raises(NetrunError, match=message):
            download.fetch(base + "f.bin", target, **kwargs)
        assert not target.exists()
        assert list((tmp_path / "data").iterdir()) == [dest]   # no temporary file left


def test_download_files_tries_mirrors_and_records_sha256(tmp_path):
    payload = b"\x00\x01" * 300
    good = _serve(tmp_path, "x.gz", payload)
    recipes = {"toy": {"urls": [(tmp_path / "nowhere").as_uri() + "/", good],
                       "files": {"x.gz": {"bytes": len(payload),
                                          "md5": hashlib.md5(payload).hexdigest(),
                                          "sha256": None}}}}
    out = tmp_path / "out"
    download.download_files("toy", ["x.gz"], out, recipes)
    assert (out / "x.gz").read_bytes() == payload
    sums = (out / "SHA256SUMS").read_text()
    assert sums == f"{hashlib.sha256(payload).hexdigest()}  x.gz\n"
    with pytest.raises(download.DownloadError, match="not in the 'toy' recipe") as err:
        download.download_files("toy", ["y.gz"], out, recipes)
    assert set(err.value.reasons) == {"y.gz"}


def test_recipes_record_known_checksums(shared_data):
    recipes = download.load_recipes()
    for dataset in ("mnist", "fashion-mnist"):
        files = recipes[dataset]["files"]
        assert set(files) == {n for group in FILES.values() for n in group}
        for spec in files.values():
            assert spec["bytes"] > 0 and len(spec["md5"]) == 32
    # The SHA-256 values we give are the ones of the files we have; the rest stay unset.
    for name, spec in recipes["mnist"]["files"].items():
        path = shared_data / "mnist" / name
        if path.exists():
            raw = path.read_bytes()
            assert spec["sha256"] == hashlib.sha256(raw).hexdigest()
            assert spec["md5"] == hashlib.md5(raw).hexdigest() and spec["bytes"] == len(raw)
        else:
            assert spec["sha256"] is None


# ---------------------------------------------------------------------------------- HDF5


def _h5(path: Path, data: np.ndarray, label: np.ndarray, data_key="data", label_key="label"):
    with h5py.File(path, "w") as f:
        f[data_key] = data
        f[label_key] = label


@pytest.fixture
def h5_files(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((25, 2, 3, 3)).astype(np.float32)
    label = (np.arange(25) % 4).astype(np.float32)[:, None]     # Caffe: float, N x 1
    paths = []
    for k, (a, b) in enumerate(((0, 10), (10, 18), (18, 25))):
        paths.append(tmp_path / f"part{k}.h5")
        _h5(paths[-1], data[a:b], label[a:b])
    (tmp_path / "train.txt").write_text("\n".join(p.name for p in paths) + "\n\n")
    return tmp_path, data, label[:, 0].astype(np.int32)


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("spec", ["train.txt", "part*.h5", ["part0.h5", "part1.h5", "part2.h5"]])
def test_hdf5_multi_file(h5_files, spec, lazy):
    folder, data, label = h5_files
    source = make_source({"source": "hdf5", "train": spec, "test": "part1.h5", "lazy": lazy},
                         config_dir=folder)
    train = source.train
    assert source.input_shape == (2, 3, 3) and source.num_classes == 4
    np.testing.assert_array_equal(train.label, label)
    assert train.label.dtype == np.int32 and train.data.shape == (25, 2, 3, 3)
    idx = np.array([24, 3, 11, 3, 17, 0])
    np.testing.assert_array_equal(train.data[idx], data[idx])      # across files, any order
    np.testing.assert_array_equal(train.data[2:12], data[2:12])
    assert source.test.data.shape == (8, 2, 3, 3)


def test_lazy_hdf5_feeds_the_loader_like_memory(h5_files):
    folder, _, _ = h5_files
    parts = [make_source({"source": "hdf5", "train": "train.txt", "lazy": lazy},
                         config_dir=folder).train for lazy in (False, True)]
    eager, lazy = (BatchLoader(p, 7, seed=3, prefetch=False) for p in parts)
    for _ in range(6):
        (x0, y0), (x1, y1) = next(eager), next(lazy)
        np.testing.assert_array_equal(x0, x1)
        np.testing.assert_array_equal(y0, y1)


def test_hdf5_keys_shapes_and_labels(tmp_path):
    _h5(tmp_path / "a.h5", np.zeros((4, 5, 5)), np.array([0.0, 1, 2, 3]), "x", "y")
    source = make_source({"source": "hdf5", "train": "a.h5", "data_key": "x", "label_key": "y"},
                         config_dir=tmp_path)
    assert source.train.data.shape == (4, 1, 5, 5)                 # H x W rows get a channel
    with pytest.raises(NetrunError, match=r"a.h5: no dataset 'data' \(it has: x, y\)"):
        make_source({"source": "hdf5", "train": "a.h5"}, config_dir=tmp_path).train
    _h5(tmp_path / "b.h5", np.zeros((2, 4, 4)), np.array([0.5, 1.0]))
    with pytest.raises(NetrunError, match="not whole numbers"):
        make_source({"source": "hdf5", "train": str(tmp_path / "b.h5")}).train
    targets = make_source({"source": "hdf5", "train": "b.h5", "label_dtype": "float32"},
                          tmp_path).train.label
    assert targets.dtype == np.float32 and targets.tolist() == [0.5, 1.0]
    _h5(tmp_path / "c.h5", np.zeros((2, 5, 5)), np.zeros(2))
    with pytest.raises(NetrunError, match=r"c.h5: 'data' rows are \(5, 5\), earlier files"):
        make_source({"source": "hdf5", "train": ["b.h5", "c.h5"]}, config_dir=tmp_path).train
    _h5(tmp_path / "d.h5", np.zeros((3, 5, 5)), np.zeros(2))
    with pytest.raises(NetrunError, match="3 examples but 2 labels"):
        make_source({"source": "hdf5", "train": "d.h5"}, config_dir=tmp_path).train
    with pytest.raises(NetrunError, match="lists .*missing.h5, which does not exist"):
        (tmp_path / "list.txt").write_text("missing.h5\n")
        make_source({"source": "hdf5", "train": "list.txt"}, config_dir=tmp_path)
    with pytest.raises(ConfigError, match="needs 'train:'"):
        make_source({"source": "hdf5"})


# ----------------------------------------------------------------------------------- npz


def test_npz_per_part_and_shared_files(tmp_path):
    x = np.arange(2 * 6 * 6, dtype=np.uint8).reshape(2, 6, 6)
    np.savez(tmp_path / "train.npz", data=x, label=np.array([1, 2]))
    np.savez(tmp_path / "test.npz", x=x[:1], y=np.array([[3]]))
    source = make_source({"source": "npz", "train": "train.npz", "test": "test.npz"}, tmp_path)
    assert source.train.data.shape == (2, 1, 6, 6) and source.train.data.dtype == np.float32
    assert source.test.label.tolist() == [3] and source.num_classes == 3
    np.savez(tmp_path / "keras.npz", x_train=x, y_train=np.array([0, 1]), x_test=x[:1],
             y_test=np.array([1]))
    shared = make_source({"source": "npz", "path": "keras.npz"}, config_dir=tmp_path)
    assert len(shared.train.label) == 2 and len(shared.test.label) == 1
    np.savez(tmp_path / "custom.npz", img=x, cls=np.array([0, 1]))
    custom = make_source({"source": "npz", "train": "custom.npz", "data_key": "img",
                          "label_key": "cls"}, config_dir=tmp_path)
    assert custom.input_shape == (1, 6, 6)


def test_npz_errors(tmp_path):
    np.savez(tmp_path / "odd.npz", images=np.zeros((2, 3)), labels=np.zeros(2))
    with pytest.raises(NetrunError, match=r"no arrays data/label or x/y \(it has: images, labels"):
        make_source({"source": "npz", "train": "odd.npz"}, config_dir=tmp_path).train
    np.save(tmp_path / "obj.npy", np.zeros(1))      # not a zip archive
    (tmp_path / "obj.npz").write_bytes((tmp_path / "obj.npy").read_bytes())
    with pytest.raises(NetrunError, match="cannot read as .npz"):
        make_source({"source": "npz", "train": "obj.npz"}, config_dir=tmp_path).train
    np.savez(tmp_path / "pickled.npz", data=np.array([{"a": 1}, None], dtype=object),
             label=np.zeros(2))
    with pytest.raises(NetrunError, match="cannot read as .npz"):
        make_source({"source": "npz", "train": "pickled.npz"}, config_dir=tmp_path).train
    with pytest.raises(NetrunError, match="no such file"):
        make_source({"source": "npz", "train": "absent.npz"}, config_dir=tmp_path)


# ------------------------------------------------------------------- names and folders


def test_unknown_source_suggests():
    with pytest.raises(ConfigError, match=r"unknown data source 'mnsit', did you mean 'mnist'"):
        make_source({"source": "mnsit"})
    with pytest.raises(ConfigError, match="missing 'source'"):
        make_source({"dir": "/tmp"})
    with pytest.raises(ConfigError, match="has no part 'valid'"):
        make_source({"source": "generated", "train_count": 10, "test_count": 10,
                     "cache": False}).part("valid")


def test_expand_path(monkeypatch):
    monkeypatch.setenv("NR_A", "/data")
    monkeypatch.setenv("NR_EMPTY", "")
    monkeypatch.delenv("NR_UNSET", raising=False)
    monkeypatch.setenv("HOME", "/fakehome")
    assert expand_path("${NR_A:-/x}/mnist") == "/data/mnist"
    assert expand_path("${NR_UNSET:-~/.cache/netrun}/mnist") == "/fakehome/.cache/netrun/mnist"
    assert expand_path("${NR_EMPTY:-/fallback}") == "/fallback"
    assert expand_path("$NR_A/x/${NR_A}") == "/data/x//data"
    assert expand_path("${NR_UNSET}/y") == "/y"


def test_data_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NETRUN_DATA", raising=False)
    assert resolve_data_dir("mnist")[0] == tmp_path / "home" / ".cache" / "netrun" / "mnist"
    monkeypatch.setenv("NETRUN_DATA", str(tmp_path / "env"))
    assert resolve_data_dir("mnist")[0] == tmp_path / "env" / "mnist"
    (tmp_path / "root" / "mnist").mkdir(parents=True)
    assert resolve_data_dir("mnist", tmp_path / "root")[0] == tmp_path / "root" / "mnist"
    assert resolve_data_dir("mnist", tmp_path / "flat")[0] == tmp_path / "flat"
    assert resolve_data_dir("mnist", "rel", tmp_path)[0] == tmp_path / "rel"
    # --data-dir wins over data.dir, which wins over NETRUN_DATA.
    cfg = {"source": "mnist", "dir": str(tmp_path / "cfg")}
    assert make_source(cfg).directory == tmp_path / "cfg"
    assert make_source(cfg, tmp_path / "cli").directory == tmp_path / "cli"
    monkeypatch.setenv("NR_ROOT", str(tmp_path))
    assert make_source({"source": "mnist", "dir": "${NR_ROOT}/m"}).directory == tmp_path / "m"
    assert json.dumps(make_source("mnist-10k").split) == '"mnist-10k"'
