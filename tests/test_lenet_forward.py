"""LeNet end to end through the Python API: init net, then predict and train nets, against an
independent NumPy computation (float64) and PyTorch (float32) with the same weights."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import netrun

LENET = Path(__file__).resolve().parents[1] / "zoo" / "lenet.yaml"
BATCH = 5


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Valid, stride-1 convolution by windows: (N, C, H, W) * (M, C, k, k) -> (N, M, oH, oW)."""
    k = w.shape[-1]
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))  # N,C,oH,oW,k,k
    return np.einsum("nchwij,mcij->nmhw", windows, w) + b[None, :, None, None]


def _max_pool2(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def _numpy_lenet(x: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    p = {k: v.astype(np.float64) for k, v in p.items()}
    h = _max_pool2(_conv(x.astype(np.float64), p["conv1_w"], p["conv1_b"]))
    h = _max_pool2(_conv(h, p["conv2_w"], p["conv2_b"]))
    h = np.maximum(h.reshape(len(h), -1) @ p["ip1_w"].T + p["ip1_b"], 0)  # (N, 800) -> (N, 500)
    return h @ p["ip2_w"].T + p["ip2_b"]


@pytest.fixture
def lenet_run(device):
    """Run the init net, then the predict and train nets on one random batch."""
    model = netrun.load_model(LENET)
    ws = netrun.Workspace(device, seed=7)
    ws.run_net_once(model.init_net)
    rng = np.random.default_rng(0)
    x = rng.random((BATCH, 1, 28, 28), dtype=np.float32)
    label = rng.integers(0, 10, BATCH).astype(np.int32)
    ws.feed_blob("data", x)
    ws.run_net_once(model.predict_net)
    logits = ws.fetch_blob(model.outputs[0])
    params = {name: ws.fetch_blob(name) for name in model.param_names}
    ws.feed_blob("label", label)
    ws.run_net_once(model.train_net)
    return model, x, label, logits, params, ws


def test_init_net_creates_every_param_with_its_shape(lenet_run):
    model, _, _, _, params, _ = lenet_run
    for p in model.params:
        assert params[p.name].shape == p.shape and params[p.name].dtype == np.float32
    assert np.abs(params["conv1_w"]).max() > 0 and np.abs(params["ip1_w"]).max() > 0
    assert all(np.all(params[f"{layer}_b"] == 0) for layer in ("conv1", "conv2", "ip1", "ip2"))


def test_predict_logits_match_numpy(lenet_run):
    _, x, _, logits, params, _ = lenet_run
    ref = _numpy_lenet(x, params)
    assert logits.shape == (BATCH, 10) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


def test_predict_logits_match_torch(lenet_run):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    _, x, _, logits, params, _ = lenet_run
    t = {k: torch.from_numpy(v) for k, v in params.items()}
    with torch.no_grad():
        h = F.max_pool2d(F.conv2d(torch.from_numpy(x), t["conv1_w"], t["conv1_b"]), 2)
        h = F.max_pool2d(F.conv2d(h, t["conv2_w"], t["conv2_b"]), 2)
        h = F.relu(F.linear(h.flatten(1), t["ip1_w"], t["ip1_b"]))
        ref = F.linear(h, t["ip2_w"], t["ip2_b"]).numpy()
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


def test_train_net_loss_and_accuracy_match_numpy(lenet_run):
    _, x, label, logits, params, ws = lenet_run
    z = _numpy_lenet(x, params)
    log_p = z - z.max(1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
    loss = -log_p[np.arange(BATCH), label].mean()
    np.testing.assert_allclose(ws.fetch_blob("loss"), loss, rtol=1e-5)
    np.testing.assert_allclose(ws.fetch_blob("ip2"), logits, rtol=1e-6)  # same weights, same net
    assert ws.fetch_blob("accuracy") == pytest.approx(np.mean(z.argmax(1) == label))
