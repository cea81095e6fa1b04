"""Synchronized BatchNorm (`sync_bn: true`, the ops' sync=1): every rank normalizes with the
statistics of the whole global batch, so 2 ranks match one process; without it each rank's
statistics are its shard's, and they do not. On one process sync changes no bit."""
from __future__ import annotations

import textwrap
import threading

import numpy as np
import pytest

import netrun
from netrun.core.comm import SingleProcess
from netrun.proto.defs import op
from tests.checks import checks_ops
from tests.dist.test_train_mpi import params, train_one_process, train_ranks
from tests.rewrite.test_training_and_cli import BN_MODEL

# conv -> spatial_bn -> relu (fused into SpatialBNRelu at bind) -> fc; no dropout (see
# test_train_mpi), a BN whose statistics differ clearly between the two halves of a batch.
MODEL = BN_MODEL.replace("[1, 28, 28]", "[1, 24, 24]")


def write_config(tmp_path, name: str, sync: bool) -> str:
    (tmp_path / "tiny_bn.yaml").write_text(MODEL)
    (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(f"""\
        model: tiny_bn.yaml
        sync_bn: {str(sync).lower()}
        data: {{source: generated, dir: {tmp_path / 'data'}, train_count: 480, test_count: 96,
                batch_size: 16, transform: {{scale: 0.00390625, crop_size: 24, mirror: true}}}}
        solver: {{type: sgd, base_lr: 0.05, momentum: 0.9, max_iter: 10, display: 0,
                  seed: 3, snapshot: 0, test_interval: 0}}
        output: {tmp_path / name}
        """))
    return str(tmp_path / f"{name}.yaml")


def max_difference(a: dict, b: dict) -> dict[str, float]:
    assert a.keys() == b.keys()
    return {k: float(np.max(np.abs(a[k] - b[k]) / (np.abs(b[k]) + 1e-3))) for k in a}


@checks_ops("SpatialBN", "SpatialBNRelu", kind="reference")
def test_two_synced_ranks_match_one_process_and_unsynced_ones_do_not(tmp_path):
    one = write_config(tmp_path, "one", sync=True)       # accepted, and a no-op on one process
    train_one_process(one)
    train_ranks(write_config(tmp_path, "synced", sync=True))
    train_ranks(write_config(tmp_path, "per_rank", sync=False))
    ref = params(tmp_path / "one" / "last.h5")
    synced = params(tmp_path / "synced" / "last.h5")
    per_rank = params(tmp_path / "per_rank" / "last.h5")
    assert {"bn1_rm", "bn1_riv"} <= ref.keys(), sorted(ref)   # running stats are compared too
    for name in ref:
        np.testing.assert_allclose(synced[name], ref[name], rtol=1e-5, atol=1e-6, err_msg=name)
    near, far = max_difference(synced, ref), max_difference(per_rank, ref)
    # Per-rank statistics move the running stats and every parameter far more than rounding.
    for name in ("bn1_rm", "bn1_riv", "bn1_s", "c1_w"):
        assert far[name] > 1e-3 and far[name] > 100 * near[name], (name, near[name], far[name])


def _bn_inputs(rng, n=6, c=3):
    x = (rng.standard_normal((n, c, 5, 4)) * 2 + 1).astype(np.float32)
    vec = lambda lo: (rng.random(c) + lo).astype(np.float32)
    return {"X": x, "s": vec(0.5), "b": vec(-0.5), "rm": vec(0), "rv": vec(0.5)}


def _forward_backward(ws, kind: str, sync: int, inputs: dict, dy: np.ndarray):
    """Run SpatialBN(Relu) (training) and its gradient ops on ws; return every result."""
    fwd = op(kind, ["X", "s", "b", "rm", "rv"], ["Y", "rm", "rv", "sm", "siv"], sync=sync)
    grad_ops, grad_of = netrun.gradient_ops(fwd)
    for name, value in inputs.items():
        ws.feed_blob(name, value)
    ws.run_operator_once(fwd)
    ws.feed_blob("Y_grad", dy)
    for g in grad_ops:
        assert g.args.get("sync", 0) == sync
        ws.run_operator_once(g)
    out = {n: ws.fetch_blob(n).copy() for n in ("Y", "rm", "rv", "sm", "siv")}
    out.update({f"d{k}": ws.fetch_blob(grad_of[k]).copy() for k in ("X", "s", "b")})
    return out


@pytest.mark.parametrize("kind", ["SpatialBN", "SpatialBNRelu"])
def test_sync_on_one_process_changes_no_bit(kind):
    rng = np.random.default_rng(0)
    inputs = _bn_inputs(rng)
    dy = rng.standard_normal(inputs["X"].shape).astype(np.float32)
    plain = _forward_backward(netrun.Workspace("cpu", comm=SingleProcess()), kind, 0, inputs, dy)
    synced = _forward_backward(netrun.Workspace("cpu", comm=SingleProcess()), kind, 1, inputs,
                               dy)
    for name in plain:
        np.testing.assert_array_equal(synced[name], plain[name], err_msg=name)


class _ThreadComm:
    """Ranks as threads of this process: allreduce_sum adds every rank's buffer in rank order."""

    def __init__(self, shared: dict, rank: int, size: int):
        self.shared, self.rank, self.size = shared, rank, size

    def allreduce_sum(self, buf: np.ndarray) -> None:
        barrier, slots = self.shared["barrier"], self.shared["slots"]
        slots[self.rank] = buf.copy()
        barrier.wait()
        total = slots[0].copy()
        for other in slots[1:]:
            total += other
        barrier.wait()                     # everyone has read the slots before they change
        buf[...] = total


@pytest.mark.parametrize("kind", ["SpatialBN", "SpatialBNRelu"])
def test_synced_ranks_compute_the_whole_batch(kind):
    """Two ranks (threads) holding halves of a batch get the whole batch's Y, running and
    saved statistics and dX; their dscale, dbias (before the gradient exchange) add up to it."""
    rng = np.random.default_rng(1)
    inputs = _bn_inputs(rng, n=8)
    dy = rng.standard_normal(inputs["X"].shape).astype(np.float32)
    whole = _forward_backward(netrun.Workspace("cpu"), kind, 0, inputs, dy)
    shared = {"barrier": threading.Barrier(2), "slots": [None, None]}
    results: list = [None, None]
    errors: list = []

    def rank(r: int) -> None:
        try:
            part = {**inputs, "X": inputs["X"][4 * r:4 * r + 4]}
            ws = netrun.Workspace("cpu", comm=_ThreadComm(shared, r, 2))
            results[r] = _forward_backward(ws, kind, 1, part, dy[4 * r:4 * r + 4])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            shared["barrier"].abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    tol = {"rtol": 2e-5, "atol": 2e-6}
    for name in ("rm", "rv", "sm", "siv"):
        for r in range(2):
            np.testing.assert_allclose(results[r][name], whole[name], **tol, err_msg=name)
        np.testing.assert_array_equal(results[0][name], results[1][name], err_msg=name)
    for name in ("Y", "dX"):
        np.testing.assert_allclose(np.concatenate([results[0][name], results[1][name]]),
                                   whole[name], **tol, err_msg=name)
    for name in ("ds", "db"):
        np.testing.assert_allclose(results[0][name] + results[1][name], whole[name], **tol,
                                   err_msg=name)
