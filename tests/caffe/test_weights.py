"""Caffe weight import: the protobuf wire decoder against a small encoder written here, binary
and HDF5 caffemodels into a workspace, mismatches listed before anything loads."""
from __future__ import annotations

import struct

import h5py
import numpy as np
import pytest

from netrun.caffe import load_caffe_weights, read_caffe_weights
from netrun.caffe.wire import WireError, parse_blob, parse_net, read_blobproto
from netrun.errors import CheckpointError
from tests.caffe.helpers import init_workspace, net_from_text, run


# A protobuf encoder for the test fixtures (the decoder under test is netrun.caffe.wire).
def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def length_field(number: int, payload: bytes) -> bytes:
    return key(number, 2) + varint(len(payload)) + payload


def blob_proto(a: np.ndarray, legacy: bool = False, packed: bool = True) -> bytes:
    a = np.asarray(a, np.float32)
    if legacy:  # num, channels, height, width, padded to 4-D in front
        dims = (1,) * (4 - a.ndim) + a.shape
        head = b"".join(key(n, 0) + varint(d) for n, d in zip((1, 2, 3, 4), dims))
    else:
        head = length_field(7, length_field(1, b"".join(varint(d) for d in a.shape)))
    if packed:
        data = length_field(5, a.astype("<f4").tobytes())
    else:
        data = b"".join(key(5, 5) + struct.pack("<f", v) for v in a.ravel())
    return head + data


def layer_proto(name: str, type_: str, blobs: list[bytes], v1: bool = False) -> bytes:
    if v1:   # V1LayerParameter: name=4, type=5 (enum), blobs=6
        return (length_field(4, name.encode()) + key(5, 0) + varint(int(type_))
                + b"".join(length_field(6, b) for b in blobs))
    # a trained LayerParameter also carries its prototxt fields: bottom=3 is skipped
    return (length_field(1, name.encode()) + length_field(2, type_.encode())
            + length_field(3, b"data") + b"".join(length_field(7, b) for b in blobs))


def net_proto(name: str, layers: list[bytes], v1: bool = False) -> bytes:
    return length_field(1, name.encode()) + b"".join(length_field(2 if v1 else 100, layer)
                                                     for layer in layers)


# The wire decoder ---------------------------------------------------------------------------
def test_blob_shapes_packed_unpacked_and_legacy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    for legacy, packed in ((False, True), (False, False), (True, True)):
        b = parse_blob(memoryview(blob_proto(a, legacy, packed)))
        want = a.reshape(1, 1, 3, 4) if legacy else a
        np.testing.assert_array_equal(b, want)


def test_net_layers_v2_and_v1():
    w = np.ones((2, 3), np.float32)
    name, layers = parse_net(net_proto("n", [layer_proto("fc", "InnerProduct",
                                                         [blob_proto(w)])]))
    assert name == "n" and [(x.name, x.type) for x in layers] == [("fc", "InnerProduct")]
    _, layers = parse_net(net_proto("n", [layer_proto("fc", "14", [blob_proto(w)], v1=True)],
                                    v1=True))
    assert layers[0].name == "fc" and layers[0].type == "14"
    np.testing.assert_array_equal(layers[0].blobs[0], w)


def test_truncated_or_bad_bytes_are_clear_errors(tmp_path):
    data = net_proto("n", [layer_proto("fc", "InnerProduct", [blob_proto(np.ones(4))])])
    path = tmp_path / "bad.caffemodel"
    path.write_bytes(data[:-3])
    with pytest.raises(WireError, match="bad.caffemodel: not a readable binary caffemodel"):
        read_caffe_weights(path)
    with pytest.raises(WireError, match="holds 3 values"):
        parse_blob(memoryview(length_field(7, length_field(1, varint(4)))
                              + length_field(5, np.ones(3, "<f4").tobytes())))


def test_read_blobproto_mean_file(tmp_path):
    mean = np.random.default_rng(0).uniform(0, 255, (1, 3, 4, 4)).astype(np.float32)
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(blob_proto(mean, legacy=True))
    np.testing.assert_array_equal(read_blobproto(path), mean)


# Importing into a model ---------------------------------------------------------------------
NET = """
name: "small"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc"
        inner_product_param { num_output: 2 } }
"""


def _weights(rng):
    return {"conv": [rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)],
            "bn": [rng.standard_normal(4) * 3, rng.uniform(1, 4, 4), np.array([3.0])],
            "fc": [rng.standard_normal((2, 36)), rng.standard_normal(2)]}


def _expected(x, w):
    """The small net in NumPy, with Caffe's BatchNorm statistics = blob / factor."""
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
    y = np.einsum("nchwij,ocij->nohw", windows, w["conv"][0]) + w["conv"][1][:, None, None]
    mean, var = w["bn"][0] / w["bn"][2][0], w["bn"][1] / w["bn"][2][0]
    y = (y - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    y = np.maximum(y, 0).reshape(len(x), -1)
    return y @ w["fc"][0].T + w["fc"][1]


@pytest.mark.parametrize("form", ["binary", "binary_v1_legacy", "hdf5"])
def test_load_weights_gives_the_caffe_outputs(tmp_path, form):
    model = net_from_text(tmp_path, NET)
    rng = np.random.default_rng(0)
    w = _weights(rng)
    path = tmp_path / "w.caffemodel"
    if form == "hdf5":
        path = tmp_path / "w.caffemodel.h5"
        with h5py.File(path, "w") as f:
            for layer, blobs in w.items():
                for i, b in enumerate(blobs):
                    f.create_dataset(f"data/{layer}/{i}", data=np.asarray(b, np.float32))
    else:
        v1 = form == "binary_v1_legacy"
        types = {"conv": "4", "bn": "0", "fc": "14"} if v1 else {
            "conv": "Convolution", "bn": "BatchNorm", "fc": "InnerProduct"}
        layers = [layer_proto(n, types[n], [blob_proto(b, legacy=v1) for b in blobs], v1)
                  for n, blobs in w.items()]
        layers.append(layer_proto("extra", "4" if v1 else "Convolution",
                                  [blob_proto(np.ones(3))], v1))
        path.write_bytes(net_proto("small", layers, v1))
    ws = init_workspace(model)
    if form != "hdf5":       # the 'extra' file layer makes the load partial
        with pytest.raises(CheckpointError, match="file layers the model lacks: extra"):
            load_caffe_weights(ws, path, model)
    report = load_caffe_weights(ws, path, model, partial=form != "hdf5")
    assert report.loaded == {"conv": ["conv_w", "conv_b"],
                             "bn": ["bn_mean", "bn_var", "bn_factor"], "fc": ["fc_w", "fc_b"]}
    assert report.ignored == ([] if form == "hdf5" else ["extra"])
    assert report.values == sum(np.size(b) for blobs in w.values() for b in blobs)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    out = run(model, {"data": x}, ws=ws)["fc"]
    np.testing.assert_allclose(out, _expected(x, w), rtol=1e-4, atol=1e-4)


def test_every_mismatch_is_listed_and_nothing_loads(tmp_path):
    model = net_from_text(tmp_path, NET)
    rng = np.random.default_rng(1)
    w = _weights(rng)
    w["conv"][0] = rng.standard_normal((5, 3, 3, 3))         # wrong num_output
    w["fc"] = [rng.standard_normal((2, 36))]                 # bias missing
    path = tmp_path / "w.caffemodel"
    path.write_bytes(net_proto("small", [layer_proto(n, "X", [blob_proto(b) for b in blobs])
                                         for n, blobs in w.items()]))
    ws = init_workspace(model)
    before = ws.fetch_blob("bn_mean").copy()
    with pytest.raises(CheckpointError) as err:
        load_caffe_weights(ws, path, model)
    text = str(err.value)
    assert "2 blob(s) do not fit" in text
    assert "layer 'conv' blob 0 ('conv_w'): the file has 5×3×3×3, the model 4×3×3×3" in text
    assert "layer 'fc': the file has 1 blob(s), the model 2 (fc_w, fc_b)" in text
    np.testing.assert_array_equal(ws.fetch_blob("bn_mean"), before)   # bn was not loaded


def test_missing_layers_keep_their_initial_values(tmp_path):
    model = net_from_text(tmp_path, NET)
    w = _weights(np.random.default_rng(2))
    path = tmp_path / "w.caffemodel"
    path.write_bytes(net_proto("small", [layer_proto("conv", "Convolution",
                                                     [blob_proto(b) for b in w["conv"]])]))
    ws = init_workspace(model)
    report = load_caffe_weights(ws, path, model, partial=True)
    assert report.missing == ["bn", "fc"] and "kept initial values for bn, fc" in report.summary()
    np.testing.assert_array_equal(ws.fetch_blob("conv_b"), np.float32(w["conv"][1]))


def test_not_a_caffemodel(tmp_path):
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("weights", data=np.ones(3))
    with pytest.raises(CheckpointError, match="'data' group"):
        read_caffe_weights(path)
    with pytest.raises(CheckpointError, match="no such weights file"):
        read_caffe_weights(tmp_path / "missing.caffemodel")


def test_an_empty_caffemodel_loads_nothing_and_fails(tmp_path):
    model = net_from_text(tmp_path, NET)
    path = tmp_path / "empty.caffemodel"
    path.write_bytes(b"")
    for partial in (False, True):          # loading nothing is never what anyone wants
        with pytest.raises(CheckpointError, match="no layer of the file matches"):
            load_caffe_weights(init_workspace(model), path, model, partial=partial)


def test_unloaded_layers_are_an_error_that_says_how_to_allow_them(tmp_path):
    model = net_from_text(tmp_path, NET)
    w = _weights(np.random.default_rng(2))
    path = tmp_path / "w.caffemodel"
    path.write_bytes(net_proto("small", [layer_proto("conv", "Convolution",
                                                     [blob_proto(b) for b in w["conv"]]),
                                         layer_proto("fc_old", "InnerProduct",
                                                     [blob_proto(b) for b in w["fc"]])]))
    ws = init_workspace(model)
    before = ws.fetch_blob("conv_w").copy()
    with pytest.raises(CheckpointError) as err:
        load_caffe_weights(ws, path, model)
    text = str(err.value)
    assert "model layers the file lacks (would keep initial values): bn, fc" in text
    assert "file layers the model lacks: fc_old" in text and "--weights-partial" in text
    np.testing.assert_array_equal(ws.fetch_blob("conv_w"), before)     # nothing loaded


@pytest.mark.parametrize("kind", ["external_link", "soft_link", "virtual", "external_storage",
                                  "huge", "compound"])
def test_hostile_hdf5_caffemodels_are_refused(tmp_path, kind):
    outside = tmp_path / "outside.h5"
    with h5py.File(outside, "w") as f:
        f.create_dataset("w", data=np.ones((4, 3, 3, 3), np.float32))
    path = tmp_path / "w.caffemodel.h5"
    with h5py.File(path, "w") as f:
        g = f.create_group("data/conv")
        if kind == "external_link":
            g["0"] = h5py.ExternalLink(str(outside), "w")
        elif kind == "soft_link":
            f.create_dataset("elsewhere", data=np.ones((4, 3, 3, 3), np.float32))
            g["0"] = h5py.SoftLink("/elsewhere")
        elif kind == "virtual":
            layout = h5py.VirtualLayout((4, 3, 3, 3), np.float32)
            layout[:] = h5py.VirtualSource(str(outside), "w", (4, 3, 3, 3))
            g.create_virtual_dataset("0", layout)
        elif kind == "external_storage":
            raw = tmp_path / "raw.bin"
            raw.write_bytes(np.ones(108, np.float32).tobytes())
            g.create_dataset("0", (4, 3, 3, 3), np.float32, external=[(str(raw), 0, 432)])
        elif kind == "huge":     # a chunked fill-value dataset: tiny file, 4 TB when read
            g.create_dataset("0", (1 << 40,), np.float32, chunks=(1024,))
        else:
            g.create_dataset("0", data=np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")]))
    with pytest.raises(CheckpointError, match="netrun does not read such files"):
        read_caffe_weights(path)
