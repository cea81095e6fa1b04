"""The CIFAR-10 binary reader and source, on small files written here."""
from __future__ import annotations

import numpy as np
import pytest

from netrun.errors import NetrunError
from netrun.train.data import make_source
from netrun.train.data.cifar import RECORD, read_batches


def _write(path, labels, rng):
    records = np.zeros((len(labels), RECORD), np.uint8)
    records[:, 0] = labels
    records[:, 1:] = rng.integers(0, 256, size=(len(labels), RECORD - 1))
    records.tofile(path)
    return records


def test_reader_layout(tmp_path):
    rng = np.random.default_rng(0)
    rec = _write(tmp_path / "b.bin", [3, 7], rng)
    arrays = read_batches([tmp_path / "b.bin"])
    assert arrays.data.shape == (2, 3, 32, 32) and arrays.data.dtype == np.float32
    assert arrays.label.tolist() == [3, 7]
    # The green plane of image 1 is bytes 1025..2048 of its record.
    np.testing.assert_array_equal(arrays.data[1, 1].ravel(), rec[1, 1 + 1024:1 + 2048])


def test_source_parts_and_truncation(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar10" / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    for i in range(1, 6):
        _write(folder / f"data_batch_{i}.bin", [i, 0, 9], rng)
    _write(folder / "test_batch.bin", [5], rng)
    source = make_source({"source": "cifar10", "dir": str(tmp_path / "cifar10")})
    assert source.train.data.shape == (15, 3, 32, 32) and source.test.label.tolist() == [5]
    (folder / "test_batch.bin").write_bytes(b"\x01" * 100)
    with pytest.raises(NetrunError, match="not a whole number"):
        make_source({"source": "cifar10", "dir": str(tmp_path / "cifar10")}).test


def test_missing_files_name_the_fix(tmp_path):
    source = make_source({"source": "cifar10", "dir": str(tmp_path), "download": False})
    with pytest.raises(NetrunError, match="NETRUN_DATA"):
        source.train
