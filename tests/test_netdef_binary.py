"""Caffe2's binary NetDef (netrun.proto.netdef_binary, `.pb` in netrun.proto.io), checked
against google.protobuf's own encoder and decoder for the caffe2 schema (tests/caffe2_proto)."""
from __future__ import annotations

import numpy as np
import pytest

from netrun.errors import NetrunError, ParseError
from netrun.proto.defs import NetDef, op
from netrun.proto.io import load_netdef, save_netdef
from netrun.proto.netdef_binary import netdef_from_bytes, netdef_to_bytes
from netrun.proto.pbtxt import netdef_to_text
from netrun.proto.wire import WireError, Writer
from tests.caffe2_proto import from_proto, messages, same_floats, to_proto

SAMPLE = NetDef("sample", [
    op("Conv", ["data", "conv1_w", "conv1_b"], ["conv1"], name="conv1", kernel=3,
       pads=[1, 0, -1, 2], stride=1, order="NCHW", engine="CUDNN", device="gpu:1"),
    op("Relu", "conv1", "conv1", device="cpu"),
    op("Scale", "conv1", "scaled", scale=0.1, weights=[0.5, -1.25, 3.0e-7], device="gpu"),
    op("Custom", ["scaled"], ["out", "aux"], names=["a", "é", ""], empty=[], big=-(1 << 63),
       top=(1 << 63) - 1, text="ünïcode", neg_list=[-1, -(1 << 40)], device="cpu:0"),
], ["data", "conv1_w", "conv1_b"], ["out"])


def proto_bytes(net: NetDef, packed: bool = False) -> bytes:
    return to_proto(net, packed).SerializeToString()


def parse_proto(data: bytes, packed: bool = False):
    msg = messages(packed)["NetDef"]()
    msg.ParseFromString(data)
    return msg


def same_net(a: NetDef, b: NetDef) -> bool:
    """Equal nets, float lists compared as float32 (what the file holds)."""
    if (a.name, a.external_inputs, a.external_outputs, len(a.ops)) != (
            b.name, b.external_inputs, b.external_outputs, len(b.ops)):
        return False
    for x, y in zip(a.ops, b.ops):
        if x.with_(args={}) != y.with_(args={}) or list(x.args) != list(y.args):
            return False
        for k in x.args:
            u, v = x.args[k], y.args[k]
            if isinstance(u, float) or (isinstance(u, list) and u and isinstance(u[0], float)):
                if not same_floats(np.float32(u).reshape(-1).tolist(),
                                   np.float32(v).reshape(-1).tolist()):
                    return False
            elif u != v:
                return False
    return True


# Both directions, every field ------------------------------------------------------------
def test_protobuf_bytes_read_as_the_same_net():
    net = netdef_from_bytes(proto_bytes(SAMPLE), "sample.pb")
    assert same_net(net, SAMPLE)
    assert net.ops[0].device == "gpu:1" and net.ops[0].engine == "CUDNN"
    assert net.ops[2].device == "gpu" and net.ops[3].device == "cpu:0"
    assert net.ops[3].args["big"] == -(1 << 63) and net.ops[3].args["top"] == (1 << 63) - 1
    assert net.ops[3].args["neg_list"] == [-1, -(1 << 40)]
    assert net.ops[3].args["names"] == ["a", "é", ""] and net.ops[3].args["empty"] == []
    # a float argument reads back as the shortest decimal of its float32: what was written
    assert net.ops[2].args["scale"] == 0.1


def test_netrun_bytes_are_protobufs_bytes():
    data = netdef_to_bytes(SAMPLE)
    # field-number order and unpacked repeated numbers, as protobuf's serializer writes proto2
    assert data == proto_bytes(SAMPLE)
    assert same_net(from_proto(parse_proto(data)), SAMPLE)
    assert netdef_to_bytes(netdef_from_bytes(data)) == data            # deterministic


def test_packed_repeated_fields_read_too():
    data = proto_bytes(SAMPLE, packed=True)
    assert data != proto_bytes(SAMPLE)
    assert same_net(netdef_from_bytes(data), SAMPLE)


def test_text_and_binary_of_one_caffe2_net_read_the_same(tmp_path):
    # f: 0.1 in text and the float32 0.1 in binary are the same argument value
    save_netdef(SAMPLE, tmp_path / "a.pb")
    (tmp_path / "a.pbtxt").write_text(netdef_to_text(load_netdef(tmp_path / "a.pb")))
    assert load_netdef(tmp_path / "a.pbtxt") == load_netdef(tmp_path / "a.pb")


def test_a_long_float_list_reads_exactly():
    values = np.random.default_rng(0).standard_normal(100_003).astype(np.float32)
    values[:3] = [np.nan, np.inf, -0.0]
    net = NetDef("init", [op("GivenTensorFill", [], ["w"], shape=[100_003],
                             values=values.tolist())])
    raw = to_proto(net).SerializeToString()
    got = netdef_from_bytes(raw).ops[0].args["values"]
    assert np.array_equal(np.float32(got), values, equal_nan=True)
    assert np.signbit(np.float32(got[2]))
    assert netdef_to_bytes(netdef_from_bytes(raw)) == raw


def test_float_runs_next_to_other_fields():
    # floats, then the name, then more floats: one list, in order
    arg = Writer().float(5, 1.5).float(5, 2.5).bytes(1, "v").float(5, -3.0).to_bytes()
    opdef = Writer().bytes(4, "T").bytes(5, arg).to_bytes()
    net = netdef_from_bytes(Writer().bytes(2, opdef).to_bytes())
    assert net.ops[0].args == {"v": [1.5, 2.5, -3.0]}


# Fields netrun skips or refuses ----------------------------------------------------------
def _with_proto(edit) -> bytes:
    msg = to_proto(SAMPLE)
    edit(msg)
    return msg.SerializeToString()


def test_hints_and_unknown_fields_are_skipped():
    def edit(m):
        m.type, m.num_workers = "dag", 4
        m.arg.add(name="num_workers", i=4)
        m.op[0].is_gradient_op = True
        m.op[0].debug_info = "made by test"
        m.op[0].op_version = 3
        m.op[0].domain = "caffe2"
        m.op[0].device_option.random_seed = 7
        m.op[0].device_option.node_name = "node"
        m.op[0].device_option.extra_info.append("x")
    data = _with_proto(edit)
    # fields no caffe2 schema knows: in the net, an op, an argument, a device option
    unknown = Writer().int(99, 5).bytes(100, b"\x00\xff").to_bytes()
    opdef = Writer().bytes(4, "T").bytes(5, Writer().bytes(1, "a").int(3, -2).to_bytes()
                                         + unknown).bytes(6, Writer().int(1, 1).to_bytes()
                                                          + unknown).to_bytes() + unknown
    extra = Writer().bytes(2, opdef).to_bytes() + unknown
    net = netdef_from_bytes(data + extra)
    assert same_net(NetDef(net.name, net.ops[:-1], net.external_inputs, net.external_outputs),
                    SAMPLE)
    assert net.ops[-1] == op("T", a=-2, device="gpu")


def test_the_nets_device_option_goes_to_ops_without_one():
    data = _with_proto(lambda m: m.device_option.MergeFrom(
        messages()["DeviceOption"](device_type=1, device_id=2)))
    devices = [o.device for o in netdef_from_bytes(data).ops]
    assert devices == ["gpu:1", "cpu", "gpu", "cpu:0"]
    msg = to_proto(NetDef("n", [op("Relu", "x", "y")]))
    msg.device_option.device_type = 1
    assert netdef_from_bytes(msg.SerializeToString()).ops[0].device == "gpu"


def test_a_device_option_given_twice_is_merged_as_protobuf_merges_it():
    device = messages()["DeviceOption"]
    first = device(device_type=1).SerializeToString()
    second = device(device_id=3).SerializeToString()
    msg = to_proto(NetDef("n", [op("Relu", "x", "y")]))
    # Field 6 of OperatorDef and field 5 of NetDef, each written twice by hand.
    op_bytes = msg.op[0].SerializeToString()
    op_bytes += Writer().bytes(6, first).bytes(6, second).to_bytes()
    twice = Writer().bytes(2, op_bytes).to_bytes()
    merged = parse_proto(twice).op[0].device_option
    assert (merged.device_type, merged.device_id) == (1, 3)          # protobuf's reading
    assert netdef_from_bytes(twice).ops[0].device == "gpu:3"
    net_level = to_proto(NetDef("n", [op("Relu", "x", "y")])).SerializeToString()
    net_level += Writer().bytes(5, first).bytes(5, second).to_bytes()
    assert netdef_from_bytes(net_level).ops[0].device == "gpu:3"


@pytest.mark.parametrize("edit, fragment", [
    (lambda m: m.op[1].control_input.append("conv1"), r"op 1 \(Relu\) has a control input"),
    (lambda m: setattr(m.op[0], "domain", "aten"), "'aten' operator library"),
    (lambda m: m.op[0].arg.add(name="sub").n.MergeFrom(messages()["NetDef"](name="x")),
     r"argument 'sub' of op 0 \('conv1', Conv\) holds a NetDef"),
    (lambda m: m.op[2].arg.add(name="ts").tensors.add(dims=[1]), "holds TensorProtos"),
    (lambda m: m.op[2].arg.add(name="t").t.dims.append(1), "holds a TensorProto"),
    (lambda m: m.op[2].arg.add(name="q").qtensors.add(dims=[1]), "QTensorProtos"),
    (lambda m: m.op[2].arg.add(name="nn").nets.add(name="x"), "NetDefs"),
    (lambda m: m.op[1].arg.add(name="both", i=1, f=2.0), "argument 'both' .* both 'f' and 'i'"),
    (lambda m: m.op[1].arg.add(i=1), "op 1 \\(Relu\\) has an argument with no name"),
    (lambda m: m.op[1].arg.add(name="bytes", s=b"\xff\xfe"), "argument 'bytes' .* not UTF-8"),
    (lambda m: m.op[1].arg.add(name="x", strings=[b"ok", b"\xc3"]), "not UTF-8"),
    (lambda m: [m.op[1].arg.add(name="d", i=i) for i in (1, 2)],
     "argument 'd' is given more than once"),
    (lambda m: m.op[1].ClearField("type"), "op 1 has no type"),
    (lambda m: setattr(m.op[1].device_option, "device_type", 2),
     "op 1 \\(Relu\\) has device_type 2, which netrun does not run"),
    (lambda m: setattr(m.op[1].device_option, "device_id", -1), "device_id -1"),
])
def test_what_netrun_cannot_hold_is_refused_by_name(edit, fragment):
    with pytest.raises(ParseError, match=fragment) as info:
        netdef_from_bytes(_with_proto(edit), "model/predict_net.pb")
    assert str(info.value).startswith("model/predict_net.pb: ")


def test_non_utf8_names_are_refused():
    data = Writer().bytes(1, b"net\xff").to_bytes()
    with pytest.raises(ParseError, match="NetDef.name is not UTF-8 text .*0xff"):
        netdef_from_bytes(data, "x.pb")


# Damaged bytes ---------------------------------------------------------------------------
def test_every_truncation_is_an_error_or_a_shorter_net():
    data = netdef_to_bytes(SAMPLE)
    for end in range(len(data)):
        try:
            netdef_from_bytes(data[:end], "cut.pb")
        except (WireError, ParseError) as e:
            assert str(e).startswith("cut.pb: ")


def test_flipped_bytes_never_crash():
    data = bytearray(netdef_to_bytes(SAMPLE))
    rng = np.random.default_rng(1)
    for _ in range(300):
        damaged = bytearray(data)
        for i in rng.integers(0, len(data), 3):
            damaged[i] = int(rng.integers(0, 256))
        try:
            netdef_from_bytes(bytes(damaged), "flip.pb")
        except NetrunError:
            pass


@pytest.mark.parametrize("data, fragment", [
    (b"\x0a\x05ab", "field 1 runs past the end"),
    (b"\x08\x01", "NetDef.name is not a string"),
    (b"\x12\x03\x22\x05x", "runs past the end"),
    (b"\x12\x02\x28\x01", "OperatorDef.arg is not a message"),
    (Writer().bytes(2, Writer().bytes(4, "T").bytes(5, b"\x0a\x01a\x10\x01").to_bytes())
     .to_bytes(), "Argument.f is not a float"),
    (Writer().bytes(2, Writer().bytes(4, "T").bytes(5, b"\x0a\x01a\x2a\x03abc").to_bytes())
     .to_bytes(), "partial element"),
    (b"\x0b", "unsupported wire type 3"),
    (b"\x00", "field number 0"),
    (b"\x12\x80", "truncated varint"),
])
def test_damaged_bytes_are_wire_errors_naming_the_file(data, fragment):
    with pytest.raises(WireError, match=fragment) as info:
        netdef_from_bytes(data, "bad/init_net.pb")
    assert str(info.value).startswith("bad/init_net.pb: not a readable Caffe2 NetDef (")


# Writing what Caffe2 cannot hold ---------------------------------------------------------
@pytest.mark.parametrize("o, fragment", [
    (op("T", big=1 << 63), "outside int64"),
    (op("T", big=[0, -(1 << 64)]), "outside int64"),
    (op("T", x=1e39), "beyond float32's range"),
    (op("T", x=[1.0, -1e40]), "beyond float32's range"),
    (op("T", x=[1, "a"]), "mixes strings and numbers"),
    (op("T", device="tpu"), "'cpu', 'gpu' or 'gpu:N'"),
    (op("T", device="gpu:x"), "'cpu', 'gpu' or 'gpu:N'"),
])
def test_writing_refuses_what_the_format_cannot_hold(o, fragment):
    with pytest.raises(NetrunError, match=fragment):
        netdef_to_bytes(NetDef("n", [o]))


def test_infinities_and_nan_are_written():
    net = netdef_from_bytes(netdef_to_bytes(NetDef("n", [op("T", a=float("inf"),
                                                             b=float("nan"))])))
    assert net.ops[0].args["a"] == float("inf") and np.isnan(net.ops[0].args["b"])


# Files -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["predict_net.pb", "NET.PB"])
def test_pb_files_are_read_and_written_as_binary(tmp_path, name):
    path = tmp_path / name
    save_netdef(SAMPLE, path)
    assert path.read_bytes() == proto_bytes(SAMPLE)
    assert load_netdef(path) == netdef_from_bytes(proto_bytes(SAMPLE))
    assert [p.name for p in tmp_path.iterdir()] == [name]   # no temporary file left


def test_pb_file_errors_name_the_file(tmp_path):
    with pytest.raises(NetrunError, match="cannot read .*missing.pb.*no such file"):
        load_netdef(tmp_path / "missing.pb")
    with pytest.raises(NetrunError, match="it is a directory"):
        (tmp_path / "dir.pb").mkdir() or load_netdef(tmp_path / "dir.pb")
    (tmp_path / "cut.pb").write_bytes(netdef_to_bytes(SAMPLE)[:-3])
    with pytest.raises(WireError, match=r"cut.pb: not a readable Caffe2 NetDef"):
        load_netdef(tmp_path / "cut.pb")
    with pytest.raises(NetrunError, match="cannot write"):
        save_netdef(SAMPLE, tmp_path / "no" / "dir" / "net.pb")
