"""Crashes the fuzz suite found in the readers, each kept as a small named case."""
from __future__ import annotations

import io
import zipfile

import h5py
import numpy as np
import pytest

from netrun.errors import NetrunError, ParseError
from netrun.proto.textformat import parse
from netrun.train.data import make_source
from netrun.train.data.generated import read_cache
from netrun.train.data.hdf5 import h5_read
from netrun.train.data.numpy_files import NpzArchive, load_npy


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _lying_npy(shape: tuple[int, ...]) -> bytes:
    """A valid .npy header that claims `shape` (float32), followed by 24 bytes of data."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue() + bytes(24)


def test_npy_header_claiming_more_than_the_file_holds_is_refused(tmp_path):
    path = tmp_path / "huge.npy"
    path.write_bytes(_lying_npy((1_000_000, 1_000_000)))
    with pytest.raises(NetrunError, match=r"huge.npy: .*1000000×1000000 float32 array "
                                          r"\(4,000,000,000,000 bytes\) but only 24 bytes"):
        load_npy(path)


def test_truncated_npy_and_npz_are_clear_errors(tmp_path):
    raw = _npy(np.arange(100, dtype=np.float32))
    (tmp_path / "cut.npy").write_bytes(raw[:-7])
    with pytest.raises(NetrunError, match="cut.npy: .*truncated or damaged"):
        load_npy(tmp_path / "cut.npy")
    np.savez(tmp_path / "a.npz", data=np.ones(50))
    data = bytearray((tmp_path / "a.npz").read_bytes())
    data[200] ^= 0xFF                             # inside the array: the CRC catches it
    (tmp_path / "bad.npz").write_bytes(bytes(data))
    with pytest.raises(NetrunError, match=r"bad.npz: cannot read as .npz"):
        with NpzArchive(tmp_path / "bad.npz") as f:
            f["data"]
    (tmp_path / "nozip.npz").write_bytes(b"PK\x03\x04" + b"\0" * 40)
    with pytest.raises(NetrunError, match="nozip.npz: cannot read as .npz"):
        make_source({"source": "npz", "train": str(tmp_path / "nozip.npz")}).train


def test_npz_member_header_claiming_more_than_it_holds_is_refused(tmp_path):
    path = tmp_path / "lie.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("data.npy", _lying_npy((10**9,)))
        z.writestr("label.npy", _npy(np.zeros(2)))
    with pytest.raises(NetrunError, match=r"lie.npz: array 'data': .*"
                                          r"only 24 bytes follow"):
        make_source({"source": "npz", "train": str(path)}).train


def test_hdf5_external_link_and_group_are_refused(tmp_path):
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["data"] = np.zeros((2, 3))
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["data"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "data")
        f.create_group("label")
    with pytest.raises(NetrunError, match="'data' is a link to another file"):
        h5_read(tmp_path / "in.h5", ("data",))
    with h5py.File(tmp_path / "group.h5", "w") as f:
        f["data"] = np.zeros((2, 3))
        f.create_group("label")
    with pytest.raises(NetrunError, match="'label' is a group, not a dataset"):
        make_source({"source": "hdf5", "train": str(tmp_path / "group.h5")}).train


def test_damaged_hdf5_is_a_clear_error(tmp_path):
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f["data"] = np.zeros((4, 3), np.float32)
        f["label"] = np.zeros(4)
    raw = bytearray(path.read_bytes())
    for i in range(0, len(raw), 97):             # damage the structures, not only the data
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    with pytest.raises(NetrunError, match="d.h5"):
        make_source({"source": "hdf5", "train": str(path)}).train


def test_pbtxt_number_with_thousands_of_digits_is_a_parse_error():
    with pytest.raises(ParseError, match=r"2:4: invalid number '1111.*longer than 4300"):
        parse("a: 1\nb: " + "1" * 5000)


def test_pbtxt_error_early_in_a_long_file_points_at_it():
    with pytest.raises(ParseError, match=r"<string>:2:3: expected a field name, found ','$"):
        parse("a: 1\n" + ", " * 200_000)    # the 400,000-character line is not quoted


def test_damaged_generated_cache_reads_as_absent(tmp_path):
    path = tmp_path / "cache.npz"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    assert read_cache(path, 20) is None
    np.savez(path, images=np.zeros((20, 28, 28), np.uint8), labels=np.full(20, 99))
    assert read_cache(path, 20) is None          # labels outside 0-9: rendered again


def test_infer_input_labels_must_be_numbers(tmp_path):
    from netrun.infer import _numbers
    from netrun.train.data.base import as_labels

    with pytest.raises(NetrunError, match="labels have dtype <U1"):
        as_labels(np.array(["a", "b"]), "x.npz: labels")
    with pytest.raises(NetrunError, match="dtype"):
        _numbers(np.array([("a", 1)], dtype=[("s", "U1"), ("i", "i4")]), "x.npy: data")
    with pytest.raises(NetrunError, match="too large to be a class index"):
        as_labels(np.array([1e12]), "x.npz: labels")


def test_infer_label_outside_the_classes_is_a_clear_error():
    from netrun.infer import score

    with pytest.raises(NetrunError, match="label 50 is not a class of this model"):
        score(np.full((2, 10), 0.1), np.array([3, 50]))


def test_npy_header_length_beyond_the_file_is_refused_before_reading(tmp_path):
    raw = bytearray(_npy(np.zeros(4, np.uint8)))
    raw[6:8] = b"\x02\x00"                         # version 2.0: a 4-byte header length
    raw[8:12] = (1 << 31).to_bytes(4, "little")
    (tmp_path / "h.npy").write_bytes(bytes(raw))
    with pytest.raises(NetrunError, match=r"h.npy: the array header claims 2,147,483,648 bytes"):
        load_npy(tmp_path / "h.npy")


def test_yaml_integer_too_long_to_parse_is_a_parse_error():
    from netrun.util.safe_yaml import safe_load

    with pytest.raises(ParseError, match=r"x.yaml:1:4: .*integer of 5,000 digits"):
        safe_load("a: " + "7" * 5000 + "\n", "x.yaml")


@pytest.mark.parametrize("value", ["null", "{}", "[1, {a: 2}]"])
def test_yaml_op_argument_that_is_no_number_or_string_is_refused(tmp_path, value):
    from netrun.model import load_model

    path = tmp_path / "net.yaml"
    path.write_text("name: n\ninputs: {data: [1, 4]}\nops:\n"
                    f"  - {{type: Dropout, inputs: [data], outputs: [y], args: {{ratio: {value}}}}}\n")
    with pytest.raises(NetrunError, match="argument 'ratio' must be a number"):
        load_model(path)


@pytest.mark.parametrize("dim", ["1.5", "nan", "true", "{ }"])
def test_caffe_legacy_input_dim_of_the_wrong_type_is_a_listed_problem(tmp_path, dim):
    from netrun.model import load_model

    path = tmp_path / "net.prototxt"
    path.write_text(f'name: "n"\ninput: "data"\ninput_dim: 1\ninput_dim: {dim}\n'
                    'input_dim: 4\ninput_dim: 4\nlayer { name: "r" type: "ReLU" '
                    'bottom: "data" top: "data" }\n')
    with pytest.raises(NetrunError, match="input_dim"):
        load_model(path)


def test_a_filler_option_that_is_no_number_is_refused(tmp_path):
    from netrun.model import load_model

    path = tmp_path / "net.yaml"
    path.write_text("name: n\ninputs: {data: [1, 4]}\nlayers:\n"
                    "  - {type: fc, name: f, input: data, num_output: 2,\n"
                    "     weight_filler: {type: constant, value: {}}}\n")
    with pytest.raises(NetrunError, match="option 'value' must be a number"):
        load_model(path)


def test_checkpoint_attributes_other_than_small_scalars_are_damage(tmp_path):
    # A variable-length string attribute can send HDF5 looping on a damaged heap reference.
    from netrun.core.db import small_attr

    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.attrs["n"] = 3
        f.attrs["s"] = np.bytes_("<f4")
        f.attrs["v"] = "<f4"                      # h5py stores a str as variable-length
        f.attrs["arr"] = np.arange(4)
    with h5py.File(tmp_path / "a.h5", "r") as f:
        assert small_attr(f, "n") == 3 and small_attr(f, "s") == b"<f4"
        assert small_attr(f, "missing", 7) == 7
        for name in ("v", "arr"):
            with pytest.raises(ValueError):
                small_attr(f, name)


def test_exponent_numbers_without_a_dot_are_floats():
    # PyYAML alone (YAML 1.1) reads `1e-3` as the string '1e-3'.
    from netrun.util.safe_yaml import safe_load

    assert safe_load("a: 1e-3\nb: 5E2\nc: 1e\nd: 7\n") == {"a": 0.001, "b": 500.0, "c": "1e",
                                                          "d": 7}
