"""Inference rewrites: each rule's net computes what the net as written computes (float64
to rounding, float32 tightly), and no rule fires where the value it would remove is fetched,
is an external output or has another reader."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from netrun.core.workspace import Workspace
from netrun.model import load_model
from netrun.proto.defs import NetDef, op
from netrun.rewrite import bind_rewrite, rewrite
from tests.rewrite.stats import feed_random_running_stats

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_layout_plan(monkeypatch):
    """These tests check the fusion rules' nets op by op; the layout plan that follows them
    on a CPU with oneDNN has its own tests (test_layouts.py)."""
    monkeypatch.setenv("NETRUN_LAYOUTS", "off")


def _bn_params(rng, prefix: str, c: int, dtype) -> dict[str, np.ndarray]:
    return {f"{prefix}_s": rng.uniform(0.5, 1.5, c).astype(dtype),
            f"{prefix}_b": rng.standard_normal(c).astype(dtype),
            f"{prefix}_m": rng.standard_normal(c).astype(dtype),
            f"{prefix}_v": rng.uniform(0.2, 2.0, c).astype(dtype)}


def _bn(prefix: str, x: str, y: str, **args):
    return op("SpatialBN", [x, *(f"{prefix}_{k}" for k in "sbmv")], [y], name=prefix, is_test=1,
              epsilon=1e-3, **args)


def _block(extra_ops=(), outputs=("out",)) -> NetDef:
    """conv-BN-ReLU, conv(+bias)-BN, residual Add, ReLU: every inference rule once."""
    ops = [op("Conv", ["X", "W1"], ["c1"], name="conv1", kernel=3, pad=1, no_bias=1),
           _bn("bn1", "c1", "n1"),
           op("Relu", ["n1"], ["r1"], name="relu1"),
           op("Conv", ["r1", "W2", "B2"], ["c2"], name="conv2", kernel=3, pad=1),
           _bn("bn2", "c2", "n2"),
           op("Add", ["n2", "r1"], ["s"], name="sum"),
           op("Relu", ["s"], ["out"], name="relu"),
           *extra_ops]
    return NetDef("block", ops, ["X", "W1", "W2", "B2"], list(outputs))


def _block_blobs(dtype, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    blobs = {"X": rng.standard_normal((2, 4, 6, 6)).astype(dtype),
             "W1": (0.3 * rng.standard_normal((4, 4, 3, 3))).astype(dtype),
             "W2": (0.3 * rng.standard_normal((4, 4, 3, 3))).astype(dtype),
             "B2": rng.standard_normal(4).astype(dtype)}
    blobs.update(_bn_params(rng, "bn1", 4, dtype))
    blobs.update(_bn_params(rng, "bn2", 4, dtype))
    return blobs


def _run(net: NetDef, blobs, fetch, fuse=True, keep=()):
    """Bind (rewritten unless fuse=False), run once; the fetched blobs and the Rewritten."""
    ws = Workspace("cpu")
    for name, value in blobs.items():
        ws.feed_blob(name, value)
    done = bind_rewrite(net, ws, "inference", keep=keep, enabled=fuse)
    ws.create_net(done.net)
    ws.run_net(done.net.name)
    return {n: ws.fetch_blob(n) for n in fetch}, done


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_block_rewritten_equals_written(dtype, tol):
    blobs = _block_blobs(dtype)
    want, _ = _run(_block(), blobs, ["out"], fuse=False)
    got, done = _run(_block(), blobs, ["out"])
    assert done.counts() == {"fold_spatial_bn": 2, "conv_relu": 1, "add_relu": 1,
                             "conv_add_relu": 1}
    assert [o.type for o in done.net.ops] == ["Conv", "Conv"]
    assert done.net.ops[0].args["relu"] == 1 and "no_bias" not in done.net.ops[0].args
    # the second conv sums the shortcut r1 itself, then applies the ReLU
    assert done.net.ops[1].inputs[3] == "r1" and done.net.ops[1].args["relu"] == 1
    assert (want["out"] > 0).any() and (want["out"] == 0).any()
    np.testing.assert_allclose(got["out"], want["out"], rtol=tol, atol=tol)


def test_fetched_blob_is_not_fused_away():
    blobs = _block_blobs(np.float64)
    want, _ = _run(_block(), blobs, ["out", "c1", "n2", "s"], fuse=False)
    got, done = _run(_block(), blobs, ["out", "c1", "n2", "s"], keep=["c1", "n2", "s"])
    # c1 kept: conv1 and bn1 stay apart (and relu1 reads BN's output, no conv's); conv2+bn2
    # folds (its fused op writes the kept n2); s kept: no AddRelu.
    assert done.counts() == {"fold_spatial_bn": 1}
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12)


def test_external_output_and_second_reader_block_fusion():
    blobs = _block_blobs(np.float64)
    # c1 is an external output; n1 has a second reader (Copy) besides relu1.
    net = _block([op("Copy", ["n1"], ["n1_copy"])], outputs=("out", "c1", "n1_copy"))
    want, _ = _run(net, blobs, ["out", "c1", "n1_copy"], fuse=False)
    got, done = _run(net, blobs, ["out", "c1", "n1_copy"])
    assert "conv1+bn1" not in [o.name for o in done.net.ops]
    assert not any(f.made.startswith("'conv1") for f in done.fired)
    assert done.counts()["fold_spatial_bn"] == 1
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12)


def test_no_fuse_returns_the_net_as_written():
    net = _block()
    done = rewrite(net, "inference", shape_of=lambda n: (4,), enabled=False)
    assert done.net.ops == net.ops and not done.fired and not done.folds


def test_unknown_parameters_do_not_fold():
    """Without parameter shapes (a blob not in the workspace) the folds do not fire."""
    done = rewrite(_block(), "inference")
    assert "fold_spatial_bn" not in done.counts()
    assert done.counts() == {"add_relu": 1}


def test_nhwc_conv_and_bn_fold():
    rng = np.random.default_rng(3)
    blobs = {"X": rng.standard_normal((2, 5, 5, 3)), "W": rng.standard_normal((4, 3, 3, 3)),
             **_bn_params(rng, "bn", 4, np.float64)}
    net = NetDef("n", [op("Conv", ["X", "W"], ["c"], kernel=3, no_bias=1, order="NHWC"),
                       _bn("bn", "c", "y", order="NHWC")], ["X", "W"], ["y"])
    want, _ = _run(net, blobs, ["y"], fuse=False)
    got, done = _run(net, blobs, ["y"])
    assert done.counts() == {"fold_spatial_bn": 1}
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-12, atol=1e-12)


def _caffe_net(bias_term: bool, conv_bias: bool) -> NetDef:
    """As netrun.caffe translates Conv + in-place BatchNorm + Scale + in-place ReLU."""
    ops = [op("Conv", ["data", "W", "B"] if conv_bias else ["data", "W"], ["conv1"], kernel=3,
              **({} if conv_bias else {"no_bias": 1})),
           op("CaffeBatchNorm", ["conv1", "mean", "var", "factor"], ["conv1"], is_test=1,
              epsilon=1e-5)]
    if bias_term:
        ops += [op("Mul", ["conv1", "gamma"], ["conv1_scaled"], broadcast=1, axis=1),
                op("Add", ["conv1_scaled", "beta"], ["conv1"], broadcast=1, axis=1)]
    else:   # Mul may not run in place: the Scale layer's top is another blob
        ops += [op("Mul", ["conv1", "gamma"], ["scale1"], broadcast=1, axis=1)]
    top = "conv1" if bias_term else "scale1"
    ops += [op("Relu", [top], [top])]
    return NetDef("caffe", ops, ["data", "W", "B", "mean", "var", "factor", "gamma", "beta"],
                  [top])


@pytest.mark.parametrize("bias_term", [True, False])
@pytest.mark.parametrize("conv_bias", [True, False])
@pytest.mark.parametrize("factor", [2.5, 0.0])
def test_caffe_batch_norm_and_scale_fold(bias_term, conv_bias, factor):
    rng = np.random.default_rng(4)
    blobs = {"data": rng.standard_normal((2, 3, 7, 7)), "W": rng.standard_normal((5, 3, 3, 3)),
             "B": rng.standard_normal(5), "mean": rng.standard_normal(5) * factor,
             "var": rng.uniform(0.5, 2, 5) * factor, "factor": np.array([factor]),
             "gamma": rng.uniform(0.5, 1.5, 5), "beta": rng.standard_normal(5)}
    net = _caffe_net(bias_term, conv_bias)
    top = net.external_outputs
    want, _ = _run(net, blobs, top, fuse=False)
    got, done = _run(net, blobs, top)
    assert done.counts() == {"fold_caffe_bn": 1, "conv_relu": 1}
    assert [o.type for o in done.net.ops] == ["Conv"]
    assert (want[top[0]] == 0).any() and (want[top[0]] > 0).any()
    np.testing.assert_allclose(got[top[0]], want[top[0]], rtol=1e-12, atol=1e-12)


def test_caffe_scale_fetched_between_does_not_fold_it():
    rng = np.random.default_rng(5)
    blobs = {"data": rng.standard_normal((2, 3, 7, 7)), "W": rng.standard_normal((5, 3, 3, 3)),
             "B": np.zeros(5), "mean": rng.standard_normal(5), "var": rng.uniform(0.5, 2, 5),
             "factor": np.array([1.0]), "gamma": rng.uniform(0.5, 1.5, 5),
             "beta": rng.standard_normal(5)}
    net = _caffe_net(True, False)
    want, _ = _run(net, blobs, ["conv1", "conv1_scaled"], fuse=False)
    got, done = _run(net, blobs, ["conv1", "conv1_scaled"], keep=["conv1_scaled"])
    # The BatchNorm still folds; Scale's Mul result is kept, so the Add stays apart.
    assert done.counts() == {"fold_caffe_bn": 1}
    assert [o.type for o in done.net.ops] == ["Conv", "Add", "Relu"]
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12)


def test_resnet20_predict_net(monkeypatch):
    """The zoo's ResNet-20 with random running statistics, batch 3, both ways."""
    model = load_model(REPO / "zoo" / "resnet20.yaml")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 3, 32, 32)).astype(np.float32)
    outs = {}
    for fuse in (False, True):
        ws = Workspace("cpu", seed=0)
        ws.run_net_once(model.init_net)
        feed_random_running_stats(model, ws)
        ws.feed_blob("data", x)
        done = bind_rewrite(model.predict_net, ws, "inference", keep=model.outputs, enabled=fuse)
        ws.create_net(done.net)
        ws.run_net(done.net.name)
        outs[fuse] = ws.fetch_blob(model.outputs[0])
        if fuse:
            assert done.counts() == {"fold_spatial_bn": 21, "conv_relu": 10, "add_relu": 9,
                                     "conv_add_relu": 9}
    scale = np.abs(outs[False]).max()
    np.testing.assert_allclose(outs[True], outs[False], rtol=1e-4, atol=1e-4 * scale)
