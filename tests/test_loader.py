"""Transforms (Caffe's order) and the batch loader: order, wrap-around, resume, prefetch."""
from __future__ import annotations

import gc
import json
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netrun.errors import ConfigError, NetrunError, ShapeError
from netrun.train.data import BatchLoader, Transform, iterate_once, make_transform


def caffe_transform(datum, h_off, w_off, crop, mirror, mean, scale):
    """Caffe's DataTransformer::Transform for one C x H x W datum, loop for loop."""
    channels, height, width = datum.shape
    crop_h, crop_w = (crop, crop) if crop else (height, width)
    out = np.empty((channels, crop_h, crop_w))
    for c in range(channels):
        for h in range(crop_h):
            for w in range(crop_w):
                top_w = crop_w - 1 - w if mirror else w
                value = datum[c, h_off + h, w_off + w]
                if mean is not None:
                    m = mean if np.ndim(mean) == 0 else (
                        mean[c] if np.ndim(mean) == 1 else mean[c, h_off + h, w_off + w])
                    value = value - m
                out[c, h, top_w] = value * scale
    return out


def match_caffe(x, y, crop, mirror, mean, scale):
    """For each example, the (h_off, w_off, flip) under which Caffe gives y (or fail)."""
    _, _, height, width = x.shape
    crop_h = crop or height
    found = []
    for i in range(len(x)):
        options = [(h, w, f) for h in range(height - crop_h + 1)
                   for w in range(width - crop_h + 1) for f in ((False, True) if mirror else
                                                                (False,))]
        hits = [o for o in options
                if np.allclose(caffe_transform(x[i], *o[:2], crop, o[2], mean, scale), y[i],
                               rtol=1e-6, atol=1e-5)]
        assert hits, f"example {i} matches no crop/flip of Caffe's transform"
        found.append(hits[0])
    return found


@pytest.mark.parametrize("mean_kind", ["none", "scalar", "channel", "image"])
def test_transform_follows_caffe_order(mean_kind):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (12, 3, 6, 7)).astype(np.float32)
    mean = {"none": None, "scalar": 100.0, "channel": np.array([10.0, 120.0, 30.0]),
            "image": rng.uniform(0, 255, (3, 6, 7)).astype(np.float32)}[mean_kind]
    t = Transform(scale=0.125, mean=mean, crop_size=4, mirror=True)
    y = t(x, np.random.default_rng(5), train=True)
    assert y.shape == (12, 3, 4, 4) and y.dtype == np.float32
    found = match_caffe(x, y, 4, True, mean, 0.125)
    assert len(set(found)) > 3                            # offsets and flips really vary
    assert {f for _, _, f in found} == {False, True}
    # Test phase: the centre crop, never flipped.
    y_test = t(x, None, train=False)
    for i in range(len(x)):
        np.testing.assert_allclose(y_test[i], caffe_transform(x[i], 1, 1, 4, False, mean, 0.125),
                                   rtol=1e-6, atol=1e-5)


def test_transform_mean_then_scale():
    x = np.full((2, 1, 2, 2), 20.0, np.float32)
    y = make_transform({"scale": 0.5, "mean": 10})(x, None, train=False)
    np.testing.assert_array_equal(y, np.full_like(x, 5.0))          # (20 - 10) * 0.5
    y = make_transform({"mean_value": [4, 8], "scale": 2})(np.ones((1, 2, 1, 1)), train=False)
    assert y.ravel().tolist() == [-6.0, -14.0]
    plain = np.arange(6, dtype=np.uint8).reshape(2, 3)
    out = make_transform(None)(plain, train=False)
    assert out.dtype == np.float32 and out.tolist() == plain.tolist()


def test_transform_mean_file_and_errors(tmp_path):
    np.save(tmp_path / "mean.npy", np.full((1, 1, 4, 4), 3.0))
    t = make_transform({"mean_file": "mean.npy", "crop_size": 2}, tmp_path)
    assert t.mean.shape == (1, 4, 4) and t.output_shape((1, 4, 4)) == (1, 2, 2)
    np.testing.assert_array_equal(t(np.full((1, 1, 4, 4), 5.0), train=False),
                                  np.full((1, 1, 2, 2), 2.0))
    with pytest.raises(ShapeError, match=r"mean image is 1 x 4 x 4 but the data is 1 x 5 x 5"):
        t.output_shape((1, 5, 5))
    with pytest.raises(ConfigError, match="only one of mean, mean_file"):
        make_transform({"mean": 1, "mean_file": "mean.npy"})
    with pytest.raises(ConfigError, match="unknown key 'crop'.*did you mean 'crop_size'"):
        make_transform({"crop": 3})
    with pytest.raises(ShapeError, match="crop_size 9 is larger than the 4 x 4"):
        Transform(crop_size=9).output_shape((1, 4, 4))
    with pytest.raises(ShapeError, match="mean has 2 values; give 1 or one per channel"):
        Transform(mean=[1, 2]).output_shape((3, 4, 4))
    with pytest.raises(ConfigError, match="neither a .npy file nor a Caffe .binaryproto"):
        make_transform({"mean_file": "m.txt"}, tmp_path)


# ---------------------------------------------------------------------------- the loader


def dataset(n=50, shape=(1, 4, 4)):
    data = np.arange(n * int(np.prod(shape)), dtype=np.float32).reshape(n, *shape)
    return data, np.arange(n, dtype=np.int32)


def take(loader, count):
    return [tuple(a.copy() for a in next(loader)) for _ in range(count)]


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 40), batch=st.integers(1, 17), seed=st.integers(0, 2**31),
       shuffle=st.booleans())
def test_stream_is_epoch_orders_back_to_back(n, batch, seed, shuffle):
    data, label = dataset(n)
    with BatchLoader((data, label), batch, shuffle=shuffle, seed=seed, prefetch=False) as loader:
        epochs = -(-3 * batch // n) + 1
        stream = np.concatenate([y for _, y in take(loader, 3)])
        order = [np.random.default_rng([seed, e]).permutation(n) if shuffle else np.arange(n)
                 for e in range(epochs)]
        np.testing.assert_array_equal(stream, np.concatenate(order)[:3 * batch])
        for e in range(3 * batch // n):                  # each whole epoch: every example once
            assert sorted(stream[e * n:(e + 1) * n].tolist()) == list(range(n))
        assert loader.state()["epoch"] == (3 * batch) // n


def test_wrap_around_and_drop_last():
    data, label = dataset(10)
    wrap = BatchLoader((data, label), 4, shuffle=False, prefetch=False)
    assert [y.tolist() for _, y in take(wrap, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1],
                                                      [2, 3, 4, 5]]
    assert wrap.state()["epoch"] == 1 and wrap.batches_per_epoch == 2.5
    drop = BatchLoader((data, label), 4, shuffle=False, drop_last=True, prefetch=False)
    assert [y.tolist() for _, y in take(drop, 3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    assert drop.batches_per_epoch == 2
    x, y = take(BatchLoader((data, label), 4, shuffle=False, prefetch=False), 1)[0]
    np.testing.assert_array_equal(x, data[:4])
    assert x.dtype == np.float32 and y.dtype == np.int32


def test_same_seed_same_batches_and_prefetch_changes_nothing():
    data, label = dataset(37)
    t = Transform(scale=0.5, crop_size=3, mirror=True)
    runs = [take(BatchLoader((data, label), 8, seed=4, transform=t, prefetch=p), 12)
            for p in (True, False, True)]
    for a, b in zip(runs[0], runs[1]):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    for a, b in zip(runs[0], runs[2]):
        np.testing.assert_array_equal(a[0], b[0])
    other = take(BatchLoader((data, label), 8, seed=5, transform=t), 12)
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(runs[0], other))


@pytest.mark.parametrize("prefetch", [True, False])
def test_resume_sees_exactly_the_same_batches(prefetch):
    data, label = dataset(45, (2, 5, 5))
    t = Transform(scale=1 / 256, mean=[3.0, 7.0], crop_size=4, mirror=True)
    kwargs = dict(batch_size=16, seed=11, transform=t, prefetch=prefetch)
    with BatchLoader((data, label), **kwargs) as straight:
        expected = take(straight, 100)
    with BatchLoader((data, label), **kwargs) as first:
        head = take(first, 50)
        saved = json.loads(json.dumps(first.state()))       # what a checkpoint stores
    with BatchLoader((data, label), **kwargs) as resumed:
        take(resumed, 7)                                   # a fresh loader that already ran
        resumed.load_state(saved)
        tail = take(resumed, 50)
    assert len(expected) == len(head + tail) == 100
    for (x0, y0), (x1, y1) in zip(expected, head + tail):
        np.testing.assert_array_equal(y0, y1)
        np.testing.assert_array_equal(x0, x1)
    assert saved["epoch"] == 50 * 16 // 45


def test_load_state_rejects_a_different_dataset():
    data, label = dataset(20)
    loader = BatchLoader((data, label), 4, seed=1, prefetch=False)
    with pytest.raises(NetrunError, match="size=30 but this loader has size=20"):
        loader.load_state({"epoch": 0, "index": 0, "size": 30, "seed": 1})
    with pytest.raises(NetrunError, match="seed=2"):
        loader.load_state({"epoch": 0, "index": 0, "size": 20, "seed": 2})
    with pytest.raises(NetrunError, match="outside a dataset of 20"):
        loader.load_state({"epoch": 0, "index": 20})


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "netrun-prefetch" and t.is_alive()]


def test_prefetch_thread_stops_on_close_and_with_the_loader():
    data, label = dataset(30)
    before = len(_prefetch_threads())
    with BatchLoader((data, label), 4, depth=2) as loader:
        next(loader)
        assert len(_prefetch_threads()) == before + 1
        thread = loader._holder.prefetcher.thread
        assert thread.daemon
    assert not thread.is_alive()
    next(loader)                                   # a closed loader restarts where it was
    loader.close()
    dropped = BatchLoader((data, label), 4)
    next(dropped)
    thread = dropped._holder.prefetcher.thread
    del dropped
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_errors_in_the_prefetch_thread_reach_the_caller():
    data, label = dataset(30)

    class Broken(Transform):
        def __call__(self, x, rng=None, train=True, out=None):
            if x[0, 0, 0, 0] >= 0:
                raise ValueError("bad example")
            return super().__call__(x, rng, train, out)

    before = len(_prefetch_threads())
    loader = BatchLoader((data, label), 4, transform=Broken(scale=2.0))
    start = time.monotonic()
    for _ in range(2):                              # fails again, never hangs
        with pytest.raises(ValueError, match="bad example"):
            next(loader)
    assert time.monotonic() - start < 30
    assert loader.state()["index"] == 0
    assert loader._holder.prefetcher is None and len(_prefetch_threads()) == before


def test_reuse_buffers_gives_the_same_values_in_a_ring():
    data, label = dataset(23)
    plain = take(BatchLoader((data, label), 5, seed=2), 9)
    loader = BatchLoader((data, label), 5, seed=2, reuse_buffers=True, depth=2)
    seen = []
    for expected in plain:
        batch = next(loader)
        np.testing.assert_array_equal(batch[0], expected[0])
        np.testing.assert_array_equal(batch[1], expected[1])
        seen.append(batch[0])
    loader.close()
    assert seen[0] is seen[4] and seen[0] is not seen[1]        # ring of depth + 2 = 4 slots


def test_loader_argument_errors():
    data, label = dataset(5)
    with pytest.raises(NetrunError, match="array 1 has 4 rows"):
        BatchLoader((data, label[:4]), 2)
    with pytest.raises(NetrunError, match="batch_size must be >= 1"):
        BatchLoader((data, label), 0)
    with pytest.raises(NetrunError, match="leaves no batch"):
        BatchLoader((data, label), 6, drop_last=True)
    with pytest.raises(NetrunError, match="empty"):
        BatchLoader((data[:0], label[:0]), 2)


def test_iterate_once_covers_the_data_in_order():
    data, label = dataset(11, (1, 6, 6))
    t = Transform(crop_size=4, mirror=True, scale=2.0)
    batches = list(iterate_once((data, label), 4, t))
    assert [len(y) for _, y in batches] == [4, 4, 3]
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), label)
    np.testing.assert_array_equal(batches[0][0], data[:4, :, 1:5, 1:5] * 2.0)   # centre, no flip
