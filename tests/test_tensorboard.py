"""TensorBoard scalars of `netrun train --tensorboard` (and `tensorboard:` in a config), read
back from the event files by hand: TFRecord framing, CRCs, and tensorboardX's Event proto."""
from __future__ import annotations

import json
import struct
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from netrun.cli import cli
from tests.test_cli_newuser import TINY_MODEL  # the same tiny net, no dropout

pytest.importorskip("tensorboardX")


def write_config(tmp_path: Path, extra: str = "") -> str:
    """A config that trains a tiny net for 20 steps, logging every 5 and testing every 10."""
    (tmp_path / "tiny.yaml").write_text(TINY_MODEL)
    (tmp_path / "train.yaml").write_text(textwrap.dedent(f"""\
        model: tiny.yaml
        data: {{source: generated, dir: {tmp_path / 'data'}, train_count: 320, test_count: 64,
               batch_size: 16, transform: {{scale: 0.00390625}}}}
        solver: {{type: sgd, base_lr: 0.05, momentum: 0.9, max_iter: 20, display: 5,
                 test_interval: 10, seed: 3}}
        output: run
        """) + extra)
    return str(tmp_path / "train.yaml")


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def read_records(path: Path) -> list[bytes]:
    """The payloads of a TFRecord file, every length and payload CRC checked."""
    from tensorboardX.record_writer import masked_crc32c

    data, records, at = path.read_bytes(), [], 0
    while at < len(data):
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        assert header_crc == masked_crc32c(header), f"bad length CRC at byte {at} of {path}"
        payload = data[at + 12:at + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        assert len(payload) == length and payload_crc == masked_crc32c(payload)
        records.append(payload)
        at += 16 + length
    return records


def read_events(folder: Path) -> list:
    """Every Event of every event file in `folder`, files in name order (TensorBoard's)."""
    from tensorboardX.proto.event_pb2 import Event

    files = sorted(folder.glob("events.out.tfevents.*"))
    assert files, f"no event file in {folder}"
    events = []
    for path in files:
        for record in read_records(path):
            event = Event()
            event.ParseFromString(record)
            events.append(event)
    return events


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value), ...] of the scalar summaries in `folder`."""
    out: dict[str, list[tuple[int, float]]] = {}
    for event in read_events(folder):
        for value in event.summary.value:
            out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_scalars_match_metrics_jsonl(tmp_path):
    config = write_config(tmp_path)
    r = run("train", config, "--tensorboard", "--json")
    assert r.exit_code == 0, r.output
    got = scalars(tmp_path / "run" / "tensorboard")
    logged = metrics(tmp_path / "run")
    steps = [x for x in logged if "loss" in x]
    tests = [x for x in logged if "test_loss" in x]
    assert [s for s, _ in got["train/loss"]] == [x["iter"] for x in steps] == [1, 5, 10, 15, 20]
    # Event files keep float32: equal to the logged float64 after that rounding.
    for (_, v), x in zip(got["train/loss"], steps):
        assert v == pytest.approx(x["loss"], rel=1e-6)
    for (_, v), x in zip(got["train/lr"], steps):
        assert v == pytest.approx(x["lr"], rel=1e-6)
    assert [s for s, _ in got["train/examples_per_second"]] == [1, 5, 10, 15, 20]
    assert all(v > 0 for _, v in got["train/examples_per_second"])
    assert [s for s, _ in got["test/accuracy"]] == [x["iter"] for x in tests] == [10, 20]
    for (_, v), x in zip(got["test/accuracy"], tests):
        assert v == pytest.approx(x["test_accuracy"], rel=1e-6)
    for (_, v), x in zip(got["test/loss"], tests):
        assert v == pytest.approx(x["test_loss"], rel=1e-6)
    summary = json.loads(r.stdout)
    assert summary["test_metrics"]["accuracy"] == pytest.approx(got["test/accuracy"][-1][1])


def test_config_folder_and_resume_continue_the_curves(tmp_path):
    config = write_config(tmp_path, "tensorboard: tb\n")     # relative to the config's folder
    r = run("train", config, "--max-iter", "10")
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "run" / "tensorboard").exists()
    r = run("train", config, "--resume", "auto")
    assert r.exit_code == 0, r.output
    events = read_events(tmp_path / "tb")
    # The resumed run's file starts by purging what a stopped run wrote after iteration 10.
    starts = [e.step for e in events if e.HasField("session_log")]
    assert starts == [1, 11]
    got = scalars(tmp_path / "tb")
    assert [s for s, _ in got["train/loss"]] == [1, 5, 10, 15, 20]
    assert [s for s, _ in got["test/accuracy"]] == [10, 20]


def test_cli_folder_overrides_the_config(tmp_path):
    config = write_config(tmp_path, "tensorboard: false\n")
    r = run("train", config, "--max-iter", "5", "--tensorboard", str(tmp_path / "elsewhere"))
    assert r.exit_code == 0, r.output
    assert [s for s, _ in scalars(tmp_path / "elsewhere")["train/loss"]] == [1, 5]


def test_bad_config_value(tmp_path):
    config = write_config(tmp_path, "tensorboard: 3\n")
    r = run("train", config)
    assert r.exit_code == 2 and "tensorboard: expected true, false or a folder" in r.output


def test_missing_tensorboardx_fails_before_training(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)     # import raises ImportError
    config = write_config(tmp_path)
    r = run("train", config, "--tensorboard")
    assert r.exit_code == 2, r.output
    assert "pip install 'netrun[tensorboard]'" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


def test_only_rank_0_writes(tmp_path, monkeypatch):
    from netrun.core.comm import SingleProcess
    from netrun.train.config import load_config
    from netrun.train.trainer import Trainer

    class Rank1(SingleProcess):       # the second of two CPU ranks (nothing is exchanged here)
        rank, size = 1, 2

    monkeypatch.setitem(sys.modules, "tensorboardX", None)     # rank 1 never needs it
    cfg = load_config(write_config(tmp_path, "tensorboard: true\n"))
    assert Trainer(cfg, comm=Rank1()).tensorboard_dir is None
    root = Trainer(cfg, tensorboard=False)
    assert root.tensorboard_dir is None
