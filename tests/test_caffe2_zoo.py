"""Caffe2 model-zoo pairs (predict_net + init_net, binary and text) run in netrun.

The pairs are written the way Caffe2 wrote them (google.protobuf's encoder, tests/caffe2_proto;
data first among the external inputs, then every weight; kernel hints and `order` on every
op; Concat's and Dropout's second outputs) and must give what the same net written in
netrun's own terms gives with the same weights.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import netrun
from netrun.cli import cli
from netrun.core.workspace import Workspace
from netrun.errors import CheckpointError, NetrunError
from netrun.infer import Predictor
from netrun.model.init_net import as_init_net, init_net_specs, with_init_net
from netrun.proto.defs import NetDef, op
from netrun.proto.io import load_netdef, save_netdef
from netrun.weights import load_weights
from tests.caffe2_proto import to_proto, to_text

BATCH = 3


class Builder:
    """Ops and weights of one net, in Caffe2's conventions (caffe2=True) or netrun's."""

    def __init__(self, caffe2: bool, seed: int = 0):
        self.caffe2, self.rng = caffe2, np.random.default_rng(seed)
        self.ops: list = []
        self.weights: dict[str, np.ndarray] = {}

    def hints(self, **extra) -> dict:
        """What Caffe2's model builders add and netrun's schemas do not take."""
        return {**extra, "order": "NCHW"} if self.caffe2 else {}

    def weight(self, name: str, shape, scale: float = 0.2, offset: float = 0.0) -> str:
        self.weights[name] = (self.rng.standard_normal(shape) * scale + offset).astype(np.float32)
        return name

    def conv(self, x: str, y: str, cin: int, cout: int, k: int, stride: int = 1, pad: int = 0,
             bias: bool = True, relu: bool = True) -> str:
        ins = [x, self.weight(f"{y}_w", (cout, cin, k, k))]
        if bias:
            ins.append(self.weight(f"{y}_b", (cout,), 0.1))
        extra = self.hints(exhaustive_search=0) if self.caffe2 else {}
        self.ops.append(op("Conv", ins, [y], stride=stride, pad=pad, kernel=k, **extra,
                           engine="CUDNN" if self.caffe2 else ""))
        if relu:
            self.relu(y)
        return y

    def relu(self, x: str) -> str:
        extra = self.hints(cudnn_exhaustive_search=0)
        self.ops.append(op("Relu", [x], [x], **extra))
        return x

    def bn(self, x: str, y: str, c: int) -> str:
        ins = [x] + [self.weight(f"{y}_{s}", (c,), sc, off) for s, sc, off in
                     (("s", 0.1, 1.0), ("b", 0.1, 0.0), ("rm", 0.1, 0.0), ("riv", 0.1, 1.0))]
        self.weights[f"{y}_riv"] = np.abs(self.weights[f"{y}_riv"])
        self.ops.append(op("SpatialBN", ins, [y], is_test=1, epsilon=1e-5, **self.hints()))
        return y

    def concat(self, xs: list[str], y: str) -> str:
        args = {"order": "NCHW"} if self.caffe2 else {"axis": 1}
        self.ops.append(op("Concat", xs, [y, f"_{y}_dims"], **args))
        return y

    def nets(self, name: str, data: str, output: str) -> tuple[NetDef, NetDef]:
        """(predict net, init net): data first among the external inputs, then the weights."""
        predict = NetDef(name, list(self.ops), [data, *self.weights], [output])
        init = NetDef(f"{name}_init", [
            op("GivenTensorFill", [], [n], shape=list(a.shape), values=a.reshape(-1).tolist())
            for n, a in self.weights.items()], [], list(self.weights))
        return predict, init


def squeezenet(caffe2: bool) -> tuple[NetDef, NetDef, dict]:
    """Conv, MaxPool (Caffe's ceil rounding), LRN, a fire module, Dropout, global pooling."""
    b = Builder(caffe2)
    x = b.conv("data", "conv1", 3, 8, 3, stride=2)
    legacy = 3 if caffe2 else "CAFFE_LEGACY_POOLING"     # Caffe2 stores the enum's number
    b.ops.append(op("MaxPool", [x], ["pool1"], kernel=3, stride=2, legacy_pad=legacy,
                    **b.hints()))
    b.ops.append(op("LRN", ["pool1"], ["norm1", "_norm1_scale"], size=5, alpha=1e-4,
                    beta=0.75, bias=1.0, **b.hints()))
    s = b.conv("norm1", "fire2/squeeze1x1", 8, 4, 1)
    e1 = b.conv(s, "fire2/expand1x1", 4, 8, 1)
    e3 = b.conv(s, "fire2/expand3x3", 4, 8, 3, pad=1)
    c = b.concat([e1, e3], "fire2/concat")
    b.ops.append(op("Dropout", [c], [c, "_fire2/concat_mask"], ratio=0.5, is_test=1))
    y = b.conv(c, "conv10", 16, 10, 1)
    b.ops.append(op("AveragePool", [y], ["pool10"], global_pooling=1, **b.hints()))
    b.ops.append(op("Softmax", ["pool10"], ["softmaxout"], **b.hints()))
    return (*b.nets("squeezenet", "data", "softmaxout"), b.weights)


def resnet(caffe2: bool) -> tuple[NetDef, NetDef, dict]:
    """Bias-free convs with SpatialBN, a residual Sum, average pooling, FC, Softmax."""
    b = Builder(caffe2, seed=1)
    x = b.relu(b.bn(b.conv("gpu_0/data", "conv1", 3, 8, 3, pad=1, bias=False, relu=False),
                    "conv1_bn", 8))
    b.ops.append(op("MaxPool", [x], ["pool1"], kernel=2, stride=2, **b.hints()))
    a = b.relu(b.bn(b.conv("pool1", "res2_branch2a", 8, 4, 1, bias=False, relu=False),
                    "res2_branch2a_bn", 4))
    a = b.bn(b.conv(a, "res2_branch2b", 4, 8, 3, pad=1, bias=False, relu=False),
             "res2_branch2b_bn", 8)
    s = b.bn(b.conv("pool1", "res2_branch1", 8, 8, 1, bias=False, relu=False),
             "res2_branch1_bn", 8)
    b.ops.append(op("Sum", [a, s], ["res2_sum"], **b.hints()))
    b.relu("res2_sum")
    b.ops.append(op("AveragePool", ["res2_sum"], ["pool5"], kernel=8, stride=1, **b.hints()))
    b.ops.append(op("FC", ["pool5", b.weight("pred_w", (10, 8)), b.weight("pred_b", (10,))],
                    ["pred"], **({"use_cudnn": 1} if caffe2 else {})))
    b.ops.append(op("Softmax", ["pred"], ["gpu_0/softmax"]))
    return (*b.nets("resnet", "gpu_0/data", "gpu_0/softmax"), b.weights)


MODELS = {"squeezenet": squeezenet, "resnet": resnet}


def images(n: int = BATCH, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 16, 16)).astype(np.float32)


def write_pair(folder: Path, model: str, text: bool = False) -> tuple[Path, Path]:
    """predict_net and init_net as Caffe2 wrote them (.pb, or .pbtxt with text=True)."""
    predict, init, _ = MODELS[model](caffe2=True)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, net in (("predict_net", predict), ("init_net", init)):
        if text:
            path = folder / f"{name}.pbtxt"
            path.write_text(to_text(to_proto(net)))
        else:
            path = folder / f"{name}.pb"
            path.write_bytes(to_proto(net).SerializeToString())
        paths.append(path)
    return paths[0], paths[1]


def run_netrun_net(model: str, x: np.ndarray) -> np.ndarray:
    """The same net in netrun's terms, its weights fed straight into a workspace."""
    predict, _, weights = MODELS[model](caffe2=False)
    ws = Workspace("cpu")
    for name, value in weights.items():
        ws.feed_blob(name, value)
    ws.feed_blob(predict.external_inputs[0], x)
    ws.create_net(predict)
    ws.run_net(predict.name)
    return ws.fetch_blob(predict.external_outputs[0]).reshape(len(x), -1)


def run(*args, code: int = 0):
    result = CliRunner().invoke(cli, [str(a) for a in args], prog_name="netrun")
    assert result.exit_code == code, result.output + repr(result.exception)
    return result


# The zoo pairs ---------------------------------------------------------------------------
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("text", [False, True], ids=["pb", "pbtxt"])
def test_a_zoo_pair_gives_what_the_netrun_net_gives(tmp_path, model, text):
    predict_path, init_path = write_pair(tmp_path, model, text)
    x = images()
    predictor = Predictor.from_model(predict_path, init_path)
    assert predictor.example_shape is None          # zoo predict nets carry no shapes
    got = predictor.predict(x, batch_size=2)        # two batch sizes: 2, then 1
    want = run_netrun_net(model, x)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
    assert got.shape == (BATCH, 10) and not np.allclose(got[0], got[1])


def test_a_zoo_pair_on_every_device(tmp_path, device):
    predict_path, init_path = write_pair(tmp_path, "resnet")
    x = images()
    got = Predictor.from_model(predict_path, init_path, device).predict(x)
    np.testing.assert_allclose(got, run_netrun_net("resnet", x), rtol=1e-4, atol=1e-6)


def test_binary_and_text_pairs_load_the_same_nets(tmp_path):
    pb = write_pair(tmp_path / "pb", "squeezenet")
    txt = write_pair(tmp_path / "txt", "squeezenet", text=True)
    assert load_netdef(pb[0]) == load_netdef(txt[0])
    init_pb, init_txt = load_netdef(pb[1]), load_netdef(txt[1])
    assert len(init_pb.ops) == len(init_txt.ops) == 10
    for x, y in zip(init_pb.ops, init_txt.ops):
        # text holds each value's shortest decimal, binary its float32: equal as float32
        assert x.with_(args={}) == y.with_(args={}) and x.args["shape"] == y.args["shape"]
        assert np.array_equal(np.float32(x.args["values"]), np.float32(y.args["values"]))


def test_caffe2_only_arguments_are_dropped_or_translated(tmp_path):
    predict_path, _ = write_pair(tmp_path, "squeezenet")
    model = netrun.load_model(predict_path)
    ours, _, _ = squeezenet(caffe2=False)
    got = {(o.type, tuple(o.outputs)): o.args for o in model.predict_net.ops}
    for o in ours.ops:
        args = dict(got[(o.type, tuple(o.outputs))])
        if o.type == "MaxPool":
            args["legacy_pad"] = "CAFFE_LEGACY_POOLING"  # the enum's name for its number
        # `order` stays where netrun's schema takes it (Conv, pools, LRN), hints go
        want = {**o.args, **({"order": "NCHW"} if netrun.get_schema(o.type).arg_spec("order")
                             else {})}
        assert args == want, o.type
    assert model.data_inputs == ["data"] and len(model.params) == 10
    assert model.outputs == ["softmaxout"]


def test_netrun_to_pb_and_back_is_bitwise(tmp_path):
    predict, init, _ = squeezenet(caffe2=False)
    save_netdef(predict, tmp_path / "predict_net.pb")
    save_netdef(init, tmp_path / "init_net.pb")
    assert load_netdef(tmp_path / "predict_net.pb") == predict
    assert load_netdef(tmp_path / "init_net.pb").ops == init.ops     # values exact in float32
    x = images()
    got = Predictor.from_model(tmp_path / "predict_net.pb", tmp_path / "init_net.pb",
                               fuse=False).predict(x)
    save_netdef(predict, tmp_path / "predict_net.pbtxt")
    save_netdef(init, tmp_path / "init_net.pbtxt")
    want = Predictor.from_model(tmp_path / "predict_net.pbtxt", tmp_path / "init_net.pbtxt",
                                fuse=False).predict(x)
    assert np.array_equal(got, want)
    np.testing.assert_array_equal(got, run_netrun_net("squeezenet", x))


def test_weights_shapes_come_from_the_init_net(tmp_path):
    predict_path, init_path = write_pair(tmp_path, "resnet")
    model = with_init_net(netrun.load_model(predict_path), load_netdef(init_path), "init")
    shapes = {p.name: p.shape for p in model.params}
    assert shapes["conv1_w"] == (8, 3, 3, 3) and shapes["pred_w"] == (10, 8)
    assert model.param_count() == sum(a.size for a in resnet(True)[2].values())


# Init nets as weights --------------------------------------------------------------------
def _pair_with_init(tmp_path: Path, edit) -> tuple[Path, Path]:
    predict_path, init_path = write_pair(tmp_path, "squeezenet")
    init = load_netdef(init_path)
    init.ops = edit(init.ops)
    init_path.write_bytes(to_proto(init).SerializeToString())
    return predict_path, init_path


def test_a_data_placeholder_and_typed_fills_in_the_init_net(tmp_path):
    # Zoo init nets often fill the data blob too; Caffe2 gives dtype as a number.
    extra = [op("ConstantFill", [], ["data"], shape=[1, 3, 16, 16], value=0.0, dtype=1),
             op("GivenTensorIntFill", [], ["step"], shape=[2], values=[3, -4])]
    paths = _pair_with_init(tmp_path, lambda ops: extra + ops)
    with pytest.raises(CheckpointError, match="(?s)does not cover this net exactly.*lacks: step"):
        Predictor.from_model(*paths)
    ws = Workspace("cpu")
    summary = load_weights(ws, paths[1], netrun.load_model(paths[0]), partial=True)
    assert "ignored step" in summary and not ws.has_blob("step") and not ws.has_blob("data")
    assert ws.fetch_blob("conv1_w").shape == (8, 3, 3, 3)


def test_typed_fills_make_their_dtypes():
    net = as_init_net(NetDef("i", [
        op("GivenTensorIntFill", [], ["a"], shape=[2], values=[3, -4]),
        op("GivenTensorInt64Fill", [], ["b"], values=[1 << 40]),
        op("GivenTensorBoolFill", [], ["c"], values=[1, 0]),
        op("GivenTensorDoubleFill", [], ["d"], values=[0.5]),
        op("ConstantFill", [], ["e"], shape=[1], dtype=10, value=2)]), "init.pb")
    specs = init_net_specs(net, "init.pb")
    assert [specs[n].dtype for n in "abcde"] == ["int32", "int64", "bool", "float64", "int64"]
    ws = Workspace("cpu")
    ws.run_net_once(net)
    assert ws.fetch_blob("b").tolist() == [1 << 40]
    assert ws.fetch_blob("c").tolist() == [True, False]
    with pytest.raises(NetrunError, match="beyond what netrun's GivenTensorFill keeps exactly"):
        as_init_net(NetDef("i", [op("GivenTensorInt64Fill", [], ["b"], values=[(1 << 53) + 1])]),
                    "init.pb")
    with pytest.raises(NetrunError, match="dtype 4 .*TensorProto.DataType"):
        as_init_net(NetDef("i", [op("ConstantFill", [], ["b"], shape=[1], dtype=4)]), "init.pb")
    # a typed fill may repeat its dtype, not contradict it
    same = as_init_net(NetDef("i", [op("GivenTensorIntFill", [], ["a"], values=[1], dtype=2)]),
                       "init.pb")
    assert same.ops[0].args["dtype"] == "int32" and same.ops[0].type == "GivenTensorFill"
    with pytest.raises(NetrunError, match="has dtype float32, but its type says int32"):
        as_init_net(NetDef("i", [op("GivenTensorIntFill", [], ["a"], values=[1], dtype=1)]),
                    "init.pb")


@pytest.mark.parametrize("edit, fragment", [
    (lambda ops: ops + [op("Relu", ["conv1_w"], ["conv1_w"])],
     "op 10 Relu .* is not a fill op; an init net \\(weights\\) may only create blobs"),
    (lambda ops: [op("GivenTensorFill", ["outside"], ["conv1_w"], values=[1.0])] + ops[1:],
     "reads blob 'outside', which no earlier op of it makes"),
    (lambda ops: ops[1:], "does not make 'conv1_w', which the net reads"),
    (lambda ops: [op("GivenTensorFill", [], ["x"], values=[1.0])],
     "makes none of this net's parameters"),
    (lambda ops: [op("GivenTensorFill", [], ["conv1_w"], shape=[2], values=[1.0])] + ops[1:],
     "argument 'values' has 1 entries"),
])
def test_init_net_errors(tmp_path, edit, fragment):
    predict_path, init_path = _pair_with_init(tmp_path, edit)
    np.save(tmp_path / "x.npy", images())
    result = run("infer", predict_path, tmp_path / "x.npy", "--init", init_path, code=2)
    assert str(init_path) in result.output and "Traceback" not in result.output
    assert re.search(fragment, result.output.replace("\n", " ")), result.output


def test_weights_of_the_wrong_shape_fail_on_the_first_batch(tmp_path):
    # A predict net has no shapes to check the init net against before data arrives.
    predict_path, init_path = _pair_with_init(
        tmp_path, lambda ops: [ops[0].with_(args={**ops[0].args, "shape": [8, 27]})] + ops[1:])
    np.save(tmp_path / "x.npy", images())
    result = run("infer", predict_path, tmp_path / "x.npy", "--init", init_path, code=2)
    assert "['conv1']: W must be 4-D (NCHW) for a 2-D convolution, got 8×27" in result.output


# The command line ------------------------------------------------------------------------
@pytest.mark.parametrize("text", [False, True], ids=["pb", "pbtxt"])
def test_infer_a_zoo_pair_from_the_command_line(tmp_path, text):
    predict_path, init_path = write_pair(tmp_path, "squeezenet", text)
    x = images()
    np.save(tmp_path / "x.npy", x)
    flag = "--weights" if text else "--init"               # both take an init net
    out = json.loads(run("infer", predict_path, tmp_path / "x.npy", flag, init_path,
                         "--json", "-k", "3").stdout)
    want = run_netrun_net("squeezenet", x)
    assert out["count"] == BATCH
    for record, row in zip(out["predictions"], want):
        assert [c for c, _ in record["top_k"]] == list(np.argsort(-row, kind="stable")[:3])
        np.testing.assert_allclose([p for _, p in record["top_k"]], np.sort(row)[::-1][:3],
                                   rtol=1e-5)


def test_infer_errors(tmp_path):
    predict_path, init_path = write_pair(tmp_path, "squeezenet")
    np.save(tmp_path / "x.npy", images())
    x = tmp_path / "x.npy"
    out = run("infer", predict_path, x, code=2).output
    assert "give its init net with --init (e.g. init_net.pb)" in out
    out = run("infer", predict_path, x, "--init", init_path, "--weights", init_path, code=2).output
    assert "not both" in out
    out = run("infer", predict_path, x, "--init", tmp_path / "w.caffemodel", code=2).output
    assert "an init net is a Caffe2 NetDef" in out
    out = run("infer", tmp_path / "run.h5", x, "--init", init_path, code=2).output
    assert "--init goes with a Caffe2 predict net" in out
    damaged = tmp_path / "damaged.pb"
    damaged.write_bytes(predict_path.read_bytes()[:-7])
    out = run("infer", damaged, x, "--init", init_path, code=2).output
    assert f"{damaged}: not a readable Caffe2 NetDef" in out.replace("\n", "")
    assert "Traceback" not in out


def test_inspect_a_predict_net_without_shapes(tmp_path):
    predict_path, init_path = write_pair(tmp_path, "squeezenet")
    result = run("inspect", predict_path)
    assert "conv1 ?" in result.stdout and "softmaxout ?" in result.stdout
    assert "Concat" in result.stdout and "parameters of known shape: 0" in result.stdout
    # what to pass goes to stderr: a diagnostic, not data
    assert "--input data=D1,D2,..." in result.stderr and "--init INIT_NET" in result.stderr
    d = json.loads(run("inspect", predict_path, "--json").stdout)
    assert d["unknown_shapes"]["inputs"] == ["data"]
    assert len(d["unknown_shapes"]["params"]) == 10 and d["ops"][0]["flops"] is None
    assert d["inputs"] == [{"name": "data", "shape": None, "dtype": None, "param": False}]
    # with the init net: the weights' shapes, and only the data is unknown
    result = run("inspect", predict_path, "--init", init_path, "--json")
    d = json.loads(result.stdout)
    assert d["unknown_shapes"] == {"inputs": ["data"], "params": []}
    assert "--input data=D1" in result.stderr and "--init" not in result.stderr
    assert d["total_params"] == sum(a.size for a in squeezenet(True)[2].values())
    # and the data's shape: everything is known
    d = json.loads(run("inspect", predict_path, "--init", init_path, "--input",
                       "data=2x3x16x16", "--json").stdout)
    assert d["unknown_shapes"] == {"inputs": [], "params": []}
    assert d["outputs"][0]["shape"] == [2, 10, 1, 1] and d["total_flops"] > 0
    result = run("inspect", predict_path, "--init", init_path, "--input", "data=2,3,16,16")
    assert "?" not in result.output and "softmaxout 2×10×1×1" in result.stdout
    assert "parameters: " in result.stdout


def test_inspect_the_rewritten_zoo_net_with_its_init_net(tmp_path):
    predict_path, init_path = write_pair(tmp_path, "resnet")
    d = json.loads(run("inspect", predict_path, "--init", init_path, "--rewritten",
                       "--json").stdout)
    rules = [f["rule"] for f in d["rewrites"]]
    assert rules.count("fold_spatial_bn") == 4 and "SpatialBN" not in [o["type"] for o in d["ops"]]
    assert d["unknown_shapes"] == {"inputs": ["gpu_0/data"], "params": []}


def test_inspect_still_checks_arguments_of_ops_without_shapes(tmp_path):
    predict = squeezenet(caffe2=False)[0]
    predict.ops[0] = predict.ops[0].with_(args={**predict.ops[0].args, "kernal": 3})
    save_netdef(predict, tmp_path / "p.pb")
    out = run("inspect", tmp_path / "p.pb", code=2).output
    assert "unknown argument 'kernal', did you mean 'kernel'?" in out


def test_convert_reaches_pb_like_pbtxt(tmp_path):
    lenet = Path(__file__).resolve().parents[1] / "zoo" / "lenet.yaml"
    run("convert", lenet, tmp_path / "predict_net.pb")
    run("convert", lenet, tmp_path / "init_net.pb", "--net", "init")
    run("convert", tmp_path / "predict_net.pb", tmp_path / "predict_net.pbtxt")
    run("convert", lenet, tmp_path / "direct.pbtxt")
    assert (tmp_path / "predict_net.pbtxt").read_text() == (tmp_path / "direct.pbtxt").read_text()
    d = json.loads(run("inspect", tmp_path / "predict_net.pb", "--init",
                       tmp_path / "init_net.pb", "--input", "data=1,1,28,28", "--json").stdout)
    assert d["total_params"] == 431_080


def test_an_init_net_loads_into_a_model_with_its_own_init_net(tmp_path):
    lenet = netrun.load_model(Path(__file__).resolve().parents[1] / "zoo" / "lenet.yaml")
    ws = Workspace("cpu", seed=0)
    ws.run_net_once(lenet.init_net)
    init = lenet.init_net.copy()           # random fills are fill ops too
    w = np.full((20, 1, 5, 5), 0.5, np.float32)
    init.ops = [op("GivenTensorFill", [], ["conv1_w"], shape=[20, 1, 5, 5],
                   values=w.reshape(-1).tolist())] + [o for o in init.ops
                                                      if o.outputs != ("conv1_w",)]
    save_netdef(init, tmp_path / "init_net.pb")
    assert "loaded 8 parameters" in load_weights(ws, tmp_path / "init_net.pb", lenet)
    assert np.array_equal(ws.fetch_blob("conv1_w"), w)
    # all or nothing: one blob of the wrong shape and no blob changes
    loaded = {p: ws.fetch_blob(p) + 1 for p in lenet.param_names}
    for p, v in loaded.items():             # values no init net run would make
        ws.feed_blob(p, v)
    init.ops[0] = op("GivenTensorFill", [], ["conv1_w"], shape=[2], values=[1.0, 2.0])
    save_netdef(init, tmp_path / "bad.pbtxt")
    with pytest.raises(CheckpointError, match="'conv1_w': the init net makes 2, the net has "
                                              "20×1×5×5"):
        load_weights(ws, tmp_path / "bad.pbtxt", lenet)
    assert all(np.array_equal(ws.fetch_blob(p), v) for p, v in loaded.items())
