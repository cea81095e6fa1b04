"""The generated digits: deterministic, balanced, cached, and learnable but not trivial."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netrun.errors import ConfigError
from netrun.train.data import generated, make_source
from netrun.train.data.generated import CHUNK, GeneratedDigits, generate, load_or_generate
from netrun.train.data.glyphs import build_templates


def test_same_seed_same_images_other_seed_other_images():
    a, b = generate(300, seed=7), generate(300, seed=7)
    np.testing.assert_array_equal(a.data, b.data)
    np.testing.assert_array_equal(a.label, b.label)
    c = generate(300, seed=8)
    assert not np.array_equal(a.data, c.data)
    test = generate(300, seed=7, part="test")
    assert not np.array_equal(a.data, test.data)           # parts draw from separate streams


def test_a_longer_dataset_starts_with_the_shorter_one():
    short, long = generate(CHUNK // 2, seed=3), generate(CHUNK + 200, seed=3)
    np.testing.assert_array_equal(long.data[:CHUNK // 2], short.data)
    np.testing.assert_array_equal(long.label[:CHUNK // 2], short.label)


@settings(max_examples=10, deadline=None)
@given(count=st.integers(1, 400), seed=st.integers(0, 2**32 - 1))
def test_shape_range_and_balance(count, seed):
    arrays = generate(count, seed)
    assert arrays.data.shape == (count, 1, 28, 28) and arrays.data.dtype == np.float32
    assert arrays.label.shape == (count,) and arrays.label.dtype == np.int32
    assert arrays.data.min() >= 0 and arrays.data.max() <= 255
    np.testing.assert_array_equal(arrays.data, np.rint(arrays.data))     # uint8 values
    counts = np.bincount(arrays.label, minlength=10)
    assert counts.sum() == count and counts.max() - counts.min() <= 1


def test_classes_are_balanced_in_every_run_of_ten():
    label = generate(CHUNK + 30, seed=1).label
    assert all(sorted(label[i:i + 10]) == list(range(10)) for i in range(0, len(label), 10))


def test_images_look_like_centred_digits():
    arrays = generate(1000, seed=2)
    ink = arrays.data[:, 0] > 128
    assert 0.05 < ink.mean() < 0.35                          # strokes, not blobs or blanks
    assert ink.reshape(1000, -1).sum(1).min() > 15            # every image has a digit
    border = np.concatenate([ink[:, :2].ravel(), ink[:, -2:].ravel(), ink[:, :, :2].ravel(),
                             ink[:, :, -2:].ravel()])
    assert border.mean() < ink[:, 8:20, 8:20].mean() / 5      # ink sits in the middle


def test_learnable_but_not_trivial():
    train, test = generate(2000, seed=1), generate(1000, seed=1, part="test")
    x = train.data.reshape(2000, -1) / 255
    centroids = np.stack([x[train.label == k].mean(0) for k in range(10)])
    xt = test.data.reshape(1000, -1) / 255
    distance = ((xt[:, None] - centroids[None]) ** 2).sum(-1)
    accuracy = float((distance.argmin(1) == test.label).mean())
    # Far above chance for a nearest-mean classifier, yet far from solved by one: the
    # affine and elastic variation is what a convnet has to learn.
    assert 0.4 < accuracy < 0.9, accuracy


def test_templates_fill_the_unit_box():
    points, digit = build_templates()
    assert points.shape[1:] == (96, 2) and len(points) == len(digit)
    assert sorted(set(digit.tolist())) == list(range(10))
    assert points.min() >= -0.05 and points.max() <= 1.05
    for d in range(10):                                      # every digit spans the box height
        ys = points[digit == d][..., 1]
        assert ys.min(1).max() < 0.1 and ys.max(1).min() > 0.9
    steps = np.hypot(*np.diff(points, axis=1).transpose(2, 0, 1))
    typical = np.median(steps, axis=1, keepdims=True)
    # Evenly spaced along the strokes: apart from jumps between strokes, steps are equal.
    assert np.mean(np.abs(steps - typical) < 0.01 * typical + 1e-3) > 0.9


def test_cache_is_written_and_read_back(tmp_path, monkeypatch):
    first = load_or_generate(120, 5, "train", tmp_path)
    files = list(tmp_path.glob("*.npz"))
    assert [f.name for f in files] == [f"digits-v{generated.VERSION}-train-seed5-n120.npz"]

    def no_render(*args):
        raise AssertionError("rendered although cached")

    monkeypatch.setattr(generated, "generate", no_render)
    again = load_or_generate(120, 5, "train", tmp_path)
    np.testing.assert_array_equal(first.data, again.data)
    np.testing.assert_array_equal(first.label, again.label)
    files[0].write_bytes(b"damaged")                         # rendered again, not an error
    monkeypatch.undo()
    np.testing.assert_array_equal(load_or_generate(120, 5, "train", tmp_path).data, first.data)


def test_make_source_generated_and_alias(tmp_path, monkeypatch):
    source = make_source({"source": "digits", "seed": 3, "train_count": 50, "test_count": 20},
                         tmp_path)
    assert isinstance(source, GeneratedDigits) and source.name == "generated"
    assert source.input_shape == (1, 28, 28) and source.num_classes == 10
    assert len(source.train.label) == 50 and len(source.test.label) == 20
    assert len(list(tmp_path.glob("digits-v*.npz"))) == 2
    with pytest.raises(ConfigError, match="counts >= 1"):
        make_source({"source": "generated", "train_count": 0})
    with pytest.raises(ConfigError, match="must be integers"):
        make_source({"source": "generated", "seed": "abc"})


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into read-only folders")
def test_read_only_cache_folder_still_works(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        arrays = load_or_generate(30, 1, "test", folder)
    finally:
        folder.chmod(0o700)
    assert len(arrays.label) == 30 and not list(folder.iterdir())


def test_unwritable_cache_path_still_works(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    arrays = load_or_generate(30, 1, "test", blocker / "cache")     # mkdir fails
    assert len(arrays.label) == 30
