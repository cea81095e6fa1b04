"""The layout plan (netrun.rewrite.layout): activations kept channel-blocked between
oneDNN's convolutions, reorders at the boundaries. Each net computes what it computes with
no plan (float32 rounding: oneDNN sums in its own order); kept values and net outputs stay
NCHW; in-place names, mixed layouts, padding channels and float64 nets are handled; without
oneDNN there is no plan."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from netrun.core.workspace import Workspace
from netrun.kernels import onednn
from netrun.model import load_model
from netrun.proto.defs import NetDef, op
from netrun.rewrite import apply, bind_rewrite, rewrite
from tests.rewrite.stats import feed_random_running_stats

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "models" / "caffe"
pytestmark = pytest.mark.skipif(not onednn.available(), reason="oneDNN is not installed "
                                "(pip install 'netrun[onednn]'): there is no layout plan")


def _bind(net: NetDef, blobs: dict, fetch, layouts: bool, monkeypatch, keep=()):
    monkeypatch.setenv("NETRUN_LAYOUTS", "on" if layouts else "off")
    ws = Workspace("cpu")
    for name, value in blobs.items():
        ws.feed_blob(name, value)
    done = bind_rewrite(net, ws, "inference", keep=keep)
    ws.create_net(done.net)
    ws.run_net(done.net.name)
    return {n: ws.fetch_blob(n) for n in fetch}, done


def _both(net, blobs, fetch, monkeypatch, keep=()):
    want, _ = _bind(net, blobs, fetch, False, monkeypatch, keep)
    got, done = _bind(net, blobs, fetch, True, monkeypatch, keep)
    for name in fetch:
        assert got[name].shape == want[name].shape, name
        scale = max(np.abs(want[name]).max(), 1.0)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5 * scale)
    return done


def _conv(x, w, y, **args):
    return op("Conv", [x, w], [y], kernel=3, pad=1, no_bias=1, **args)


def _weights(rng, shapes: dict) -> dict:
    return {k: (rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32)
            for k, s in shapes.items()}


def test_a_chain_stays_blocked_and_reorders_once(monkeypatch):
    """conv → relu → conv → (add of both) → relu → an op that knows only NCHW: the convs and
    the elementwise ops between them blocked, one reorder before the pooling (of the sum,
    not of each summand); 12 channels fill a block and a half, so the padding channels
    travel along."""
    rng = np.random.default_rng(0)
    blobs = {"X": rng.standard_normal((2, 5, 9, 9)).astype(np.float32),
             **_weights(rng, {"W1": (12, 5, 3, 3), "W2": (12, 12, 3, 3)})}
    net = NetDef("chain", [_conv("X", "W1", "a"), op("Relu", ["a"], ["r"]),
                           _conv("r", "W2", "b"), op("Add", ["b", "r"], ["s"]),
                           op("Relu", ["s"], ["t"]),
                           op("MaxPool", ["t"], ["out"], kernel=2, stride=2)],
                 ["X", "W1", "W2"], ["out"])
    done = _both(net, blobs, ["out"], monkeypatch)
    types = [o.type for o in done.net.ops]
    assert types.count("BlockedToNCHW") == 1 and "NCHWToBlocked" not in types
    assert types.index("BlockedToNCHW") == types.index("MaxPool") - 1
    assert all(o.args.get("blocked") == done.net.ops[0].args["blocked"] > 0
               for o in done.net.ops if o.type == "Conv")
    assert done.counts()["blocked_layout"] >= 3 and done.counts()["reorder"] == 1


def test_kept_values_and_outputs_stay_nchw(monkeypatch):
    rng = np.random.default_rng(1)
    blobs = {"X": rng.standard_normal((1, 8, 6, 6)).astype(np.float32),
             **_weights(rng, {"W1": (8, 8, 3, 3), "W2": (8, 8, 3, 3), "W3": (8, 8, 3, 3)})}
    net = NetDef("kept", [_conv("X", "W1", "a"), _conv("a", "W2", "b"), _conv("b", "W3", "c")],
                 ["X", "W1", "W2", "W3"], ["c"])
    done = _both(net, blobs, ["b", "c"], monkeypatch, keep=["b"])
    by_output = {o.outputs[0]: o for o in done.net.ops}
    assert by_output["a"].args.get("blocked")              # read by conv b only
    assert not by_output["b"].args.get("blocked")          # kept
    assert not by_output["c"].args.get("blocked")          # the net's output


def test_mixed_layouts_in_an_add_and_in_place_names(monkeypatch):
    """An Add of a blocked conv output and an NCHW pooling output; a name written twice (an
    in-place Scale) is never blocked."""
    rng = np.random.default_rng(2)
    blobs = {"X": rng.standard_normal((2, 8, 8, 8)).astype(np.float32),
             **_weights(rng, {"W1": (8, 8, 3, 3), "W2": (8, 8, 3, 3), "W3": (8, 8, 3, 3)})}
    net = NetDef("mixed", [_conv("X", "W1", "a"),
                           op("MaxPool", ["X"], ["p"], kernel=3, stride=1, pad=1),
                           op("Add", ["a", "p"], ["s"]),
                           _conv("s", "W2", "c"), op("Scale", ["c"], ["c"], scale=0.5),
                           _conv("c", "W3", "out")],
                 ["X", "W1", "W2", "W3"], ["out"])
    done = _both(net, blobs, ["out"], monkeypatch)
    by_output = {o.outputs[0]: o for o in done.net.ops if o.type == "Conv"}
    assert not by_output["c"].args.get("blocked")


def test_residual_sum_in_the_blocked_layout(monkeypatch):
    """A conv with a residual input S (the fused block end) summing a blocked shortcut."""
    rng = np.random.default_rng(3)
    blobs = {"X": rng.standard_normal((3, 16, 7, 7)).astype(np.float32),
             **_weights(rng, {"W1": (16, 16, 3, 3), "W2": (16, 16, 3, 3), "W3": (16, 16, 3, 3)}),
             "B2": rng.standard_normal(16).astype(np.float32)}
    net = NetDef("res", [op("Conv", ["X", "W1"], ["a"], kernel=3, pad=1, no_bias=1, relu=1),
                         op("Conv", ["a", "W2", "B2", "X"], ["b"], kernel=3, pad=1, relu=1),
                         op("Conv", ["b", "W3", "B2", "a"], ["c"], kernel=3, pad=1, relu=1),
                         op("Relu", ["c"], ["out"])],
                 ["X", "W1", "W2", "B2", "W3"], ["out"])
    done = _both(net, blobs, ["out"], monkeypatch)
    b = next(o for o in done.net.ops if o.outputs == ("b",) or list(o.outputs) == ["b"])
    assert b.args.get("blocked") and b.inputs[3] != "X"   # X reordered in for the sum


def test_an_nchw_value_two_convs_read_is_reordered_once(monkeypatch):
    """ResNet-50's stem: a pooling output read by a block's first conv and its projection."""
    rng = np.random.default_rng(5)
    blobs = {"X": rng.standard_normal((2, 16, 8, 8)).astype(np.float32),
             **_weights(rng, {"W1": (16, 16, 3, 3), "W2": (16, 16, 3, 3), "W3": (16, 16, 3, 3)}),
             "B": rng.standard_normal(16).astype(np.float32)}
    net = NetDef("stem", [op("MaxPool", ["X"], ["p"], kernel=2, stride=2),
                          _conv("p", "W1", "a", relu=1), _conv("a", "W2", "b"),
                          op("Conv", ["p", "W3", "B"], ["c"], kernel=3, pad=1),
                          op("Add", ["b", "c"], ["s"]), op("Relu", ["s"], ["out"])],
                 ["X", "W1", "W2", "W3", "B"], ["out"])
    done = _both(net, blobs, ["out"], monkeypatch)
    to_blocked = [o for o in done.net.ops if o.type == "NCHWToBlocked"]
    assert len(to_blocked) == 1 and to_blocked[0].inputs[0] == "p"
    readers = [o for o in done.net.ops if to_blocked[0].outputs[0] in o.inputs]
    assert [o.type for o in readers] == ["Conv", "Conv"]


def test_float64_nets_are_not_planned(monkeypatch):
    rng = np.random.default_rng(4)
    blobs = {"X": rng.standard_normal((1, 8, 6, 6)), "W1": rng.standard_normal((8, 8, 3, 3)),
             "W2": rng.standard_normal((8, 8, 3, 3))}
    net = NetDef("f64", [_conv("X", "W1", "a"), _conv("a", "W2", "out")], ["X", "W1", "W2"],
                 ["out"])
    _, done = _bind(net, blobs, ["out"], True, monkeypatch)
    assert "blocked_layout" not in done.counts()


def test_no_plan_without_onednn_or_when_switched_off(monkeypatch):
    monkeypatch.setenv("NETRUN_LAYOUTS", "off")
    assert apply.layout_block("cpu") == 0
    monkeypatch.setenv("NETRUN_LAYOUTS", "on")
    assert apply.layout_block("cpu") in (8, 16)
    assert apply.layout_block("gpu") == 0
    monkeypatch.setattr(onednn, "available", lambda: False)
    assert apply.layout_block("cpu") == 0


def test_rewrite_without_parameter_types_plans_nothing():
    net = NetDef("n", [_conv("X", "W1", "a"), _conv("a", "W2", "out")], ["X", "W1", "W2"],
                 ["out"])
    done = rewrite(net, "inference", shape_of=lambda n: (8, 8, 3, 3), block=8)
    assert "blocked_layout" not in done.counts()
    typed = rewrite(net, "inference", shape_of=lambda n: (8, 8, 3, 3), block=8,
                    dtype_of=lambda n: "float32")
    assert typed.counts() == {"blocked_layout": 1}


def _blocks_of(done) -> dict:
    return {o.outputs[0]: o.args.get("blocked") for o in done.net.ops if o.type == "Conv"}


def test_a_region_of_wide_3x3_convs_is_held_channels_last(monkeypatch):
    """ResNet-20's stage 3 in small: a 3×3 stride-2 conv to 64 channels, a 3×3 conv, a 1×1
    stride-2 projection that sums the 3×3's output (the fused block end), a 3×3 conv that
    sums the projection, a global pooling and an FC. With AVX2's blocks of 8, the 64-channel
    convs hold their outputs as one block of 64 (NHWC), the 16-channel conv before them in
    blocks of 8; the result equals the unplanned net's."""
    monkeypatch.setattr(apply, "layout_block", lambda backend="cpu": 8)
    rng = np.random.default_rng(21)
    blobs = {"X": rng.standard_normal((2, 8, 8, 8)).astype(np.float32),
             **_weights(rng, {"W0": (16, 8, 3, 3), "W1": (64, 16, 3, 3), "W2": (64, 64, 3, 3),
                              "Wp": (64, 16, 1, 1), "W3": (64, 64, 3, 3), "Wf": (5, 64)}),
             "B": rng.standard_normal(64).astype(np.float32),
             "bf": rng.standard_normal(5).astype(np.float32)}
    net = NetDef("stage", [
        _conv("X", "W0", "a", relu=1),
        op("Conv", ["a", "W1", "B"], ["b"], kernel=3, pad=1, stride=2, relu=1),
        op("Conv", ["b", "W2", "B"], ["c"], kernel=3, pad=1),
        op("Conv", ["a", "Wp", "B", "c"], ["d"], kernel=1, stride=2, relu=1),
        op("Conv", ["d", "W3", "B", "d"], ["e"], kernel=3, pad=1, relu=1),
        op("AveragePool", ["e"], ["p"], global_pooling=1),
        op("FC", ["p", "Wf", "bf"], ["y"])], list(blobs), ["y"])
    done = _both(net, blobs, ["y"], monkeypatch)
    assert _blocks_of(done) == {"a": 8, "b": 64, "c": 64, "d": 64, "e": 64}
    assert "reorder" not in done.counts()   # the FC reads the pooled block of 64 as it is


def test_a_wide_conv_summing_a_net_input_stays_in_blocks(monkeypatch):
    """A residual S that no op of the net makes (an input, NCHW) is reordered into blocks of
    8, so the conv that sums it keeps its output in blocks of 8 too."""
    monkeypatch.setattr(apply, "layout_block", lambda backend="cpu": 8)
    rng = np.random.default_rng(23)
    blobs = {"X": rng.standard_normal((2, 64, 6, 6)).astype(np.float32),
             **_weights(rng, {"W1": (64, 64, 3, 3), "W2": (64, 64, 3, 3)})}
    net = NetDef("res", [_conv("X", "W1", "a", relu=1),
                         op("Conv", ["a", "W2", "B", "X"], ["b"], kernel=3, pad=1, relu=1),
                         op("AveragePool", ["b"], ["y"], global_pooling=1)],
                 ["X", "W1", "W2", "B"], ["y"])
    blobs["B"] = rng.standard_normal(64).astype(np.float32)
    done = _both(net, blobs, ["y"], monkeypatch)
    assert _blocks_of(done) == {"a": 8, "b": 8}


@pytest.mark.parametrize("reader", ["1x1", "concat"])
def test_a_reader_outside_the_region_keeps_the_convs_in_blocks(monkeypatch, reader):
    """ResNet-50's bottleneck: a 64-channel 3×3 conv read by a 1×1 stride-1 conv (faster in
    blocks of 8), or by an op that only knows NCHW: no conv is held channels-last."""
    monkeypatch.setattr(apply, "layout_block", lambda backend="cpu": 8)
    rng = np.random.default_rng(22)
    blobs = {"X": rng.standard_normal((1, 16, 6, 6)).astype(np.float32),
             **_weights(rng, {"W1": (64, 16, 3, 3), "W2": (64, 64, 3, 3), "W3": (32, 64, 1, 1)})}
    ops = [_conv("X", "W1", "a", relu=1), _conv("a", "W2", "b", relu=1)]
    if reader == "1x1":
        ops.append(op("Conv", ["b", "W3"], ["y"], kernel=1, no_bias=1))
    else:
        ops.append(op("Concat", ["b", "a"], ["y", "split"], axis=1))
    net = NetDef("bottleneck", ops, list(blobs), ["y"])
    done = _both(net, blobs, ["y"], monkeypatch)
    assert set(_blocks_of(done).values()) <= {8, None}


def test_no_channels_last_with_blocks_of_16():
    """Channels-last was measured to win on AVX2 only (blocks of 8)."""
    ops = [_conv("X", "W1", "a", relu=1), _conv("a", "W2", "b", relu=1),
           op("AveragePool", ["b"], ["y"], global_pooling=1)]
    net = NetDef("n", ops, ["X", "W1", "W2"], ["y"])
    shapes = {"X": (1, 64, 8, 8), "W1": (64, 64, 3, 3), "W2": (64, 64, 3, 3)}
    for block, want in ((8, 64), (16, 16)):
        done = rewrite(net, "inference", shape_of=shapes.get, block=block,
                       dtype_of=lambda n: "float32")
        assert _blocks_of(done) == {"a": want, "b": want}


@pytest.mark.parametrize("batch", [1, 3])
def test_resnet20_predict_net(monkeypatch, batch):
    """The zoo's ResNet-20 (fused, then planned): blocked up to the pooled features, the
    output equal."""
    model = load_model(REPO / "zoo" / "resnet20.yaml")
    x = np.random.default_rng(6).standard_normal((batch, 3, 32, 32)).astype(np.float32)
    outs = {}
    for layouts in (False, True):
        monkeypatch.setenv("NETRUN_LAYOUTS", "on" if layouts else "off")
        ws = Workspace("cpu", seed=0)
        ws.run_net_once(model.init_net)
        feed_random_running_stats(model, ws)
        ws.feed_blob("data", x)
        done = bind_rewrite(model.predict_net, ws, "inference", keep=model.outputs)
        ws.create_net(done.net)
        ws.run_net(done.net.name)
        outs[layouts] = ws.fetch_blob(model.outputs[0])
        if layouts:
            # every conv and the global pooling; no reorder: the FC reads the pooled
            # features blocked (one pixel, 64 channels in whole blocks)
            assert done.counts()["blocked_layout"] == 22
            assert "reorder" not in done.counts()
            pool = next(o for o in done.net.ops if o.type == "AveragePool")
            fc = next(o for o in done.net.ops if o.type == "FC")
            assert fc.inputs[0] == pool.outputs[0]
            if apply.layout_block("cpu") == 8:   # stage 3 (64 channels) channels-last
                blocks = _blocks_of(done)
                assert {n: b for n, b in blocks.items() if n.startswith("s3")} == {
                    n: 64 for n in blocks if n.startswith("s3")}
                assert {b for n, b in blocks.items() if not n.startswith("s3")} == {8}
    scale = np.abs(outs[False]).max()
    np.testing.assert_allclose(outs[True], outs[False], rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("channels, pool, reorders, flatten", [
    (16, "AveragePool", 0, False), (16, "MaxPool", 0, False),
    (16, "AveragePool", 0, True),   # ONNX's GlobalAveragePool → Flatten → Gemm
    (12, "AveragePool", 1, False),  # a block and a half: the padding would reach the FC
    (12, "AveragePool", 1, True),
    (16, None, 0, False)])          # a conv's 3×3 pixels: left NCHW, no reader takes it blocked
def test_an_fc_reads_global_pooling_blocked_only_where_the_order_is_nchws(
        monkeypatch, channels, pool, reorders, flatten):
    rng = np.random.default_rng(9)
    blobs = {"X": rng.standard_normal((2, 3, 3, 3)).astype(np.float32),
             **_weights(rng, {"W1": (channels, 3, 3, 3), "Wf": (4, channels * (1 if pool else 9))}),
             "bf": rng.standard_normal(4).astype(np.float32)}
    ops = [_conv("X", "W1", "a")]
    if pool:
        ops.append(op(pool, ["a"], ["p"], global_pooling=1))
    if flatten:
        ops.append(op("Flatten", ["p"], ["f"]))
    ops.append(op("FC", ["f" if flatten else "p" if pool else "a", "Wf", "bf"], ["y"]))
    net = NetDef("head", ops, ["X", "W1", "Wf", "bf"], ["y"])
    done = _both(net, blobs, ["y"], monkeypatch)
    assert [o.type for o in done.net.ops].count("BlockedToNCHW") == reorders


@pytest.mark.parametrize("name", ["lenet.prototxt", "cifar10_quick.prototxt"])
def test_caffe_nets(monkeypatch, name):
    """Caffe's nets as they are (pooling between the convs: reorders around it)."""
    path = SHARED / name.split(".")[0] / name
    if not path.exists():
        pytest.skip(f"{path} is not beside the checkout")
    model = load_model(path)
    data = next(iter(model.inputs))
    shape = model.input_specs(2)[data].shape
    x = np.random.default_rng(8).standard_normal(shape).astype(np.float32)
    outs = {}
    for layouts in (False, True):
        monkeypatch.setenv("NETRUN_LAYOUTS", "on" if layouts else "off")
        ws = Workspace("cpu", seed=0)
        ws.run_net_once(model.init_net)
        ws.feed_blob(data, x)
        done = bind_rewrite(model.predict_net, ws, "inference", keep=model.outputs)
        ws.create_net(done.net)
        ws.run_net(done.net.name)
        outs[layouts] = ws.fetch_blob(done.net.external_outputs[0])
    np.testing.assert_allclose(outs[True], outs[False], rtol=1e-4, atol=1e-5)
