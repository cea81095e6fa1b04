"""The layout plan of a training net (netrun.rewrite.layout, training=True): the forward
ops planned before the backward pass is built, so convolutions, batch normalization,
ReLU, the residual sum, global pooling and all their gradients run on channel-blocked
arrays. Every parameter gradient matches the same net run in NCHW with the same oneDNN
kernels; convolutions whose channels do not fill whole blocks stay NCHW (batch
normalization would make padding channels nonzero); ResNet-20's training step has no
reorder at all, ResNet-50's is not planned (its layers run faster on netrun's own kernels in
NCHW); the blocked batch-norm kernels compute the NCHW kernels' bits."""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest

from netrun.core.gradient import add_gradient_ops
from netrun.core.workspace import Workspace
from netrun.kernels import batch_norm, jit, onednn, parallel
from netrun.model import load_model
from netrun.proto.defs import NetDef, op
from netrun.rewrite import apply, rewrite, training_rewrite

pytestmark = pytest.mark.skipif(not onednn.available(), reason="oneDNN is not installed "
                                "(pip install 'netrun[onednn]'): there is no layout plan")


def _conv(x, w, y, **args):
    # both runs on oneDNN's kernels: the plan changes layouts, not the arithmetic
    return op("Conv", [x, w], [y], kernel=3, pad=1, no_bias=1, algo="onednn", **args)


def _bn(x, name, y):
    return op("SpatialBN", [x, f"{name}_s", f"{name}_b", f"{name}_rm", f"{name}_rv"],
              [y, f"{name}_rm", f"{name}_rv", f"{name}_sm", f"{name}_siv"], epsilon=1e-5)


def _bn_blobs(rng, channels: dict[str, int]) -> dict:
    """Scale, bias and running statistics of each batch norm `name` with its channels."""
    blobs = {}
    for name, c in channels.items():
        blobs.update({f"{name}_s": (1 + rng.random(c) / 2).astype(np.float32),
                      f"{name}_b": (rng.standard_normal(c) / 4).astype(np.float32),
                      f"{name}_rm": np.zeros(c, np.float32),
                      f"{name}_rv": np.ones(c, np.float32)})
    return blobs


def _residual_net(width: int) -> tuple[NetDef, dict]:
    """conv → BN → ReLU → conv → BN → + shortcut → ReLU → global pooling → FC → loss."""
    rng = np.random.default_rng(0)
    blobs = {"X": rng.standard_normal((4, 3, 8, 8)).astype(np.float32),
             "label": rng.integers(0, 5, size=(4,)).astype(np.int32),
             "W1": (rng.standard_normal((width, 3, 3, 3)) / 5).astype(np.float32),
             "W2": (rng.standard_normal((width, width, 3, 3)) / 12).astype(np.float32),
             "Wfc": (rng.standard_normal((5, width)) / 4).astype(np.float32),
             "bfc": np.zeros(5, np.float32)}
    blobs.update(_bn_blobs(rng, {"bn1": width, "bn2": width}))
    net = NetDef("train", [
        _conv("X", "W1", "c1"), _bn("c1", "bn1", "n1"), op("Relu", ["n1"], ["r1"]),
        _conv("r1", "W2", "c2"), _bn("c2", "bn2", "n2"), op("Add", ["n2", "r1"], ["s"]),
        op("Relu", ["s"], ["r2"]), op("AveragePool", ["r2"], ["p"], global_pooling=1),
        op("FC", ["p", "Wfc", "bfc"], ["logits"]),
        op("SoftmaxWithLoss", ["logits", "label"], ["prob", "loss"])],
        list(blobs), ["loss"])
    return net, blobs


PARAMS = ("W1", "W2", "Wfc", "bfc", "bn1_s", "bn1_b", "bn2_s", "bn2_b")


def _gradients(net: NetDef, blobs: dict, block: int, params=PARAMS):
    """Every parameter's gradient after one training pass of `net` planned for `block`."""
    def spec(name, what):
        return getattr(blobs[name], what) if name in blobs else None

    done = rewrite(net, "training", (), lambda n: spec(n, "shape"), True, block,
                   lambda n: None if n not in blobs else str(blobs[n].dtype))
    train = done.net.copy()
    grads = add_gradient_ops(train, ["loss"], params)
    ws = Workspace("cpu")
    for name, value in blobs.items():
        ws.feed_blob(name, value.copy())
    ws.create_net(train)
    ws.run_net(train.name)
    return {p: ws.fetch_blob(grads[p]) for p in params}, ws.fetch_blob("loss"), done, train


def _same_gradients(got: dict, want: dict, got_loss, want_loss) -> None:
    """The blocked run's loss and every gradient against the NCHW run's."""
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    for name, value in want.items():
        scale = np.abs(value).max()
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5 * scale,
                                   err_msg=name)


def test_a_residual_block_trains_blocked_with_the_same_gradients():
    block = apply.layout_block("cpu")
    net, blobs = _residual_net(16)
    want, loss, _, _ = _gradients(net, blobs, 0)
    got, blocked_loss, done, train = _gradients(net, blobs, block)
    assert done.counts().get("blocked_layout", 0) >= 6
    types = [o.type for o in train.ops]
    assert "BlockedToNCHW" not in types and "NCHWToBlocked" not in types
    # the gradient ops read and write blocked arrays too: conv, BN and pooling gradients
    assert all(o.args.get("blocked") == block for o in train.ops if o.type.startswith("Conv"))
    _same_gradients(got, want, blocked_loss, loss)


def _downsampling_net(width: int) -> tuple[NetDef, dict]:
    """conv → BN → ReLU → (3×3 stride-2 conv → BN) + (1×1 stride-2 projection → BN) → ReLU
    → global pooling → FC → loss: a residual net's downsampling block."""
    rng = np.random.default_rng(1)
    wide = 2 * width
    blobs = {"X": rng.standard_normal((4, 3, 8, 8)).astype(np.float32),
             "label": rng.integers(0, 5, size=(4,)).astype(np.int32),
             "W1": (rng.standard_normal((width, 3, 3, 3)) / 5).astype(np.float32),
             "W2": (rng.standard_normal((wide, width, 3, 3)) / 12).astype(np.float32),
             "Wp": (rng.standard_normal((wide, width, 1, 1)) / 4).astype(np.float32),
             "Wfc": (rng.standard_normal((5, wide)) / 4).astype(np.float32),
             "bfc": np.zeros(5, np.float32)}
    blobs.update(_bn_blobs(rng, {"bn1": width, "bn2": wide, "bnp": wide}))
    net = NetDef("train", [
        _conv("X", "W1", "c1"), _bn("c1", "bn1", "n1"), op("Relu", ["n1"], ["r1"]),
        _conv("r1", "W2", "c2", stride=2), _bn("c2", "bn2", "n2"),
        op("Conv", ["r1", "Wp"], ["cp"], kernel=1, stride=2, no_bias=1, algo="onednn"),
        _bn("cp", "bnp", "np"), op("Add", ["n2", "np"], ["s"]),
        op("Relu", ["s"], ["r2"]), op("AveragePool", ["r2"], ["p"], global_pooling=1),
        op("FC", ["p", "Wfc", "bfc"], ["logits"]),
        op("SoftmaxWithLoss", ["logits", "label"], ["prob", "loss"])],
        list(blobs), ["loss"])
    return net, blobs


def test_a_downsampling_block_trains_blocked_with_the_same_gradients():
    """Stride-2 layers' data gradients on blocked arrays run the blocked kernels, not
    oneDNN's NHWC ones behind reorders (netrun.kernels.onednn.conv), with the NCHW net's
    gradients."""
    params = ("W1", "W2", "Wp", "Wfc", "bfc", "bn1_s", "bn1_b", "bn2_s", "bn2_b", "bnp_s",
              "bnp_b")
    block = apply.layout_block("cpu")
    net, blobs = _downsampling_net(16)
    want, loss, _, _ = _gradients(net, blobs, 0, params)
    got, blocked_loss, done, train = _gradients(net, blobs, block, params)
    assert all(o.args.get("blocked") == block for o in train.ops if o.type.startswith("Conv"))
    _same_gradients(got, want, blocked_loss, loss)


def test_channels_that_do_not_fill_whole_blocks_stay_nchw():
    block = apply.layout_block("cpu")
    net, blobs = _residual_net(12)
    want, _, _, _ = _gradients(net, blobs, 0)
    got, _, done, train = _gradients(net, blobs, block)
    assert "blocked_layout" not in done.counts()
    assert not any(o.args.get("blocked") for o in train.ops)
    for name in PARAMS:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_resnet20_training_step_has_no_reorder(repo=None):
    from pathlib import Path

    model = load_model(str(Path(__file__).resolve().parents[2] / "zoo" / "resnet20.yaml"))
    done = training_rewrite(model, "cpu")
    types = [o.type for o in done.net.ops]
    assert "BlockedToNCHW" not in types and "NCHWToBlocked" not in types
    blocked = {label.split(" on blocks")[0] for label in
               (f.made for f in done.fired if f.rule == "blocked_layout")}
    assert sum(o.type == "Conv" for o in done.net.ops) == 21
    assert len(blocked) >= 21 + 21 + 9    # every conv, BN and residual ReLU
    # batch norm says so, so that its blocked kernels load at bind (not in the first step)
    assert all(o.args.get("blocked") for o in done.net.ops
               if o.type in ("SpatialBN", "SpatialBNRelu"))
    assert "blocked_layout" not in training_rewrite(model, "gpu").counts()


def test_a_net_of_mostly_winograd_and_1x1_layers_trains_in_nchw():
    """ResNet-50's work is in 1×1 layers (netrun's GEMM in NCHW) and 3×3 layers of 64+
    channels (Winograd): oneDNN's blocked kernels would replace faster ones, so its training
    net is not planned."""
    from pathlib import Path

    model = load_model(str(Path(__file__).resolve().parents[2] / "zoo" / "resnet50.yaml"))
    assert "blocked_layout" not in training_rewrite(model, "cpu").counts()


def _blocked(a: np.ndarray, block: int) -> np.ndarray:
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))


def _unblocked(a: np.ndarray) -> np.ndarray:
    n, blocks, h, w, block = a.shape
    return a.transpose(0, 1, 4, 2, 3).reshape(n, blocks * block, h, w)


@pytest.mark.parametrize("engine", ["compiled", "numpy"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_blocked_batch_norm_kernels_compute_the_nchw_kernels_values(engine, threads,
                                                                     monkeypatch):
    """Statistics, normalization (with ReLU) and both gradient passes on a blocked array:
    the compiled kernels give the NCHW kernels' bits on any thread count (the same sums in
    the same order per channel); NumPy's agree to rounding."""
    if engine == "compiled" and not jit.available():
        pytest.skip("the compiled engine is not installed (pip install 'netrun[fast]')")
    monkeypatch.setenv("NETRUN_THREADS", str(threads))
    rng = np.random.default_rng(3)
    shape, block = (20, 16, 9, 11), 8
    X = (rng.standard_normal(shape) + 2).astype(np.float32)
    dY, Y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    mean, k, bias = (rng.standard_normal(16).astype(np.float32) for _ in range(3))
    buffers: dict = {}

    def scratch(key, s, dtype="float32"):
        return buffers.setdefault((key, tuple(s), str(dtype)), np.empty(s, dtype))

    exact = engine == "compiled"
    def close(a, b):   # NumPy sums rows in float32 first: rounding of the sums' terms
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(b).max()))

    check = np.testing.assert_array_equal if exact else close
    with (nullcontext() if exact else jit.disabled()), parallel.steady_thread_count():
        Xb, dYb, Yb = (_blocked(a, block) for a in (X, dY, Y))
        want, got = (batch_norm.batch_stats(np, a, "NCHW", scratch) for a in (X, Xb))
        check(got.mean, want.mean)
        check(got.var, want.var)
        y, yb = np.empty_like(X), np.empty_like(Xb)
        batch_norm.normalize(np, X, "NCHW", mean, k, bias, y, True)
        batch_norm.normalize(np, Xb, "NCHW", mean, k, bias, yb, True)
        check(_unblocked(yb), y)
        for relu_y, relu_yb in ((None, None), (Y, Yb)):
            check(batch_norm.gradient_sums(np, Xb, mean, dYb, relu_yb, "NCHW", scratch),
                  batch_norm.gradient_sums(np, X, mean, dY, relu_y, "NCHW", scratch))
            dx, dxb = np.empty_like(X), np.empty_like(Xb)
            batch_norm.gradient_input(np, X, mean, dY, relu_y, "NCHW", k, bias, mean, False,
                                      dx, scratch)
            batch_norm.gradient_input(np, Xb, mean, dYb, relu_yb, "NCHW", k, bias, mean,
                                      False, dxb, scratch)
            check(_unblocked(dxb), dx)
