"""Caffe's Datum against an independent encoder: the real protobuf library with the message
type built at run time (caffe.proto's Datum, proto2: float_data unpacked as Caffe writes it),
so netrun's hand-written reader and writer cannot be wrong together."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from netrun.errors import DataError, ShapeError
from netrun.train.data.datum import (
    Datum,
    datum_from_image,
    datum_image,
    datum_label,
    decode_datum,
    encode_datum,
)
from netrun.train.data.images import encode_image

F = descriptor_pb2.FieldDescriptorProto
DATUM_FIELDS = [("channels", 1, F.TYPE_INT32, False), ("height", 2, F.TYPE_INT32, False),
                ("width", 3, F.TYPE_INT32, False), ("data", 4, F.TYPE_BYTES, False),
                ("label", 5, F.TYPE_INT32, False), ("float_data", 6, F.TYPE_FLOAT, True),
                ("encoded", 7, F.TYPE_BOOL, False)]


@functools.cache
def proto_datum(packed: bool = False):
    """The caffe.Datum message class (float_data packed or not: readers take both)."""
    file = descriptor_pb2.FileDescriptorProto(name=f"datum_{int(packed)}.proto",
                                              package=f"caffe{int(packed)}", syntax="proto2")
    message = file.message_type.add(name="Datum")
    for name, number, kind, repeated in DATUM_FIELDS:
        field = message.field.add(name=name, number=number, type=kind,
                                  label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if repeated and packed:
            field.options.packed = True
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"caffe{int(packed)}.Datum"))


def pixels(shape=(3, 4, 5), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


# --------------------------------------------------------------------- protobuf -> netrun
def test_raw_record_written_by_protobuf():
    image = pixels()
    buf = proto_datum()(channels=3, height=4, width=5, data=image.tobytes(),
                        label=7).SerializeToString()
    datum = decode_datum(buf)
    assert (datum.channels, datum.height, datum.width, datum.label, datum.encoded) == \
        (3, 4, 5, 7, False)
    assert datum.float_data is None
    np.testing.assert_array_equal(datum_image(datum), image)
    assert datum_label(buf) == 7


def test_encoded_record_written_by_protobuf():
    image = pixels((3, 6, 7), seed=1)
    png = encode_image(image)
    buf = proto_datum()(data=png, label=2, encoded=True).SerializeToString()
    datum = decode_datum(buf)
    assert datum.encoded and datum.data == png and (datum.channels, datum.height) == (0, 0)
    np.testing.assert_array_equal(datum_image(datum), image)
    assert datum_image(datum, color=False).shape == (1, 6, 7)


@pytest.mark.parametrize("packed", [False, True])
def test_float_data_packed_or_not(packed):
    values = np.linspace(-2, 3, 24, dtype=np.float32)
    buf = proto_datum(packed)(channels=2, height=3, width=4, float_data=values.tolist(),
                              label=1).SerializeToString()
    datum = decode_datum(buf)
    np.testing.assert_array_equal(datum.float_data, values)
    example = datum_image(datum)
    assert example.dtype == np.float32 and example.shape == (2, 3, 4)
    np.testing.assert_array_equal(example.reshape(-1), values)


def test_negative_label_and_unknown_fields():
    msg = proto_datum()(channels=1, height=1, width=2, data=b"\x01\x02", label=-3)
    # Fields from a newer or forked schema (15: a varint, 14: bytes) are skipped, as
    # protobuf skips them.
    buf = msg.SerializeToString() + bytes([15 << 3 | 0, 5, 14 << 3 | 2, 2, 0xAA, 0xBB])
    assert decode_datum(buf).label == -3 and datum_label(buf) == -3


# --------------------------------------------------------------------- netrun -> protobuf
@pytest.mark.parametrize("kind", ["raw", "encoded", "float", "negative"])
def test_what_netrun_writes_protobuf_reads(kind):
    image = pixels((3, 2, 3), seed=2)
    datum = {
        "raw": lambda: datum_from_image(image, 4),
        "encoded": lambda: datum_from_image(image, 5, encoded=encode_image(image, "jpg")),
        "float": lambda: datum_from_image(image.astype(np.float32) / 7, 6),
        "negative": lambda: Datum(1, 1, 1, b"\x09", -2_000_000_000),
    }[kind]()
    msg = proto_datum()()
    msg.ParseFromString(encode_datum(datum))
    assert (msg.channels, msg.height, msg.width, msg.label, msg.encoded) == \
        (datum.channels, datum.height, datum.width, datum.label, datum.encoded)
    assert msg.data == datum.data
    if kind == "float":
        np.testing.assert_array_equal(np.array(msg.float_data, np.float32),
                                      (image.astype(np.float32) / 7).reshape(-1))
        assert not msg.data
    else:
        assert len(msg.float_data) == 0
    # And protobuf's own bytes of the same message read back as the same Datum.
    again = decode_datum(msg.SerializeToString())
    assert again.label == datum.label and again.data == datum.data


def test_encoded_records_leave_the_shape_unset_as_convert_imageset():
    datum = datum_from_image(pixels(), 3, encoded=b"\x89PNG...")
    msg = proto_datum()()
    msg.ParseFromString(encode_datum(datum))
    assert not msg.HasField("channels") and not msg.HasField("height") and msg.encoded
    assert msg.HasField("label")                  # Caffe always sets the label, 0 included
    zero = proto_datum()()
    zero.ParseFromString(encode_datum(datum_from_image(pixels(), 0)))
    assert zero.HasField("label") and zero.label == 0


# --------------------------------------------------------------------- damage
def test_damaged_bytes_raise_data_errors():
    good = proto_datum()(channels=1, height=2, width=2, data=b"abcd", label=1).SerializeToString()
    for cut in range(1, len(good)):
        try:
            datum = decode_datum(good[:cut], where="db/records 00000001")
        except DataError as e:
            assert "db/records 00000001: not a Caffe Datum" in str(e)
            continue
        # A cut between fields is a valid, shorter message; what it lacks is noticed later.
        if datum.data != b"abcd":
            with pytest.raises(DataError):
                datum_image(datum)
    crafted = {
        "varint longer than 10 bytes": b"\x08" + b"\xff" * 11,
        "runs past the end": b"\x22\x7f" + b"x" * 10,                 # data claims 127 bytes
        "wire type": b"\x2a\x01\x00",                                # label as a length field
        "field number 0": b"\x00\x01",
        "partial element": b"\x32\x03\x00\x00\x00",                  # 3 bytes of packed floats
    }
    for why, buf in crafted.items():
        with pytest.raises(DataError, match="not a Caffe Datum"):
            decode_datum(buf)
    with pytest.raises(DataError, match="not a Caffe Datum"):
        datum_label(b"\x28")                                          # label with no value


def test_records_whose_sizes_disagree():
    with pytest.raises(DataError, match=r"r1: the record says channels x height x width = "
                                        r"3 x 4 x 5 but holds 59 pixel bytes"):
        datum_image(Datum(3, 4, 5, b"x" * 59), where="r1")
    with pytest.raises(DataError, match="holds 3 float_data values"):
        datum_image(Datum(1, 2, 2, float_data=np.zeros(3, np.float32)))
    with pytest.raises(DataError, match="3 x -1 x 5"):
        datum_image(decode_datum(encode_datum(Datum(3, -1, 5, b"x" * 15))))
    with pytest.raises(DataError, match="holds no data"):
        datum_image(Datum(label=1))
    with pytest.raises(DataError, match="r2: not a readable image"):
        datum_image(Datum(data=b"not an image", encoded=True), where="r2")
    with pytest.raises(DataError, match="expected a C x H x W example"):
        datum_from_image(np.zeros((4, 4), np.uint8), 0)
    with pytest.raises(DataError, match="expected uint8 pixels or float features, got int64"):
        datum_from_image(np.zeros((1, 4, 4), np.int64), 0)
    assert not issubclass(DataError, ShapeError)
