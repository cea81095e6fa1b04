"""Checkpoints: layout, rejection of damaged or mismatched files, atomic writes under kill."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from netrun.errors import CheckpointError
from netrun.train import checkpoint as ckpt
from netrun.train.config import load_config
from netrun.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def trained(tiny_config, tmp_path):
    tr = Trainer(load_config(tiny_config), output=str(tmp_path / "run"))
    tr.start()
    tr.run(5)
    return tr, tmp_path / "run" / "last.h5"


def test_layout(trained):
    tr, path = trained
    with h5py.File(path, "r") as f:
        assert set(f.keys()) == {"meta", "optimizer", "params", "state"}
        assert set(f["params"].keys()) == set(tr.model.param_names)
        assert "c1_w_momentum" in f["optimizer"] and "iter" in f["state"]
        assert int(f["state/iter"][()]) == 5
    info = ckpt.read_info(path)
    assert info.iteration == 5 and info.meta["solver_type"] == "sgd"
    assert {"init", "step", "update", "test", "predict"} <= set(info.meta["nets"])
    assert info.net("predict").ops[0].type == "Conv"
    assert info.meta["rng"]["host"]["bit_generator"] == "PCG64"


def test_truncated_file_is_rejected(trained, tmp_path):
    _, path = trained
    bad = tmp_path / "bad.h5"
    bad.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        ckpt.read_info(bad)


def test_flipped_bytes_fail_the_checksum(trained, tmp_path):
    tr, path = trained
    bad = tmp_path / "bad.h5"
    data = bytearray(path.read_bytes())
    with h5py.File(path, "r") as f:
        offset = f["params/f1_w"].id.get_offset()
    data[offset + 40] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        ckpt.load_blobs(tr.ws, bad, ["f1_w"], "params")


def test_mismatches_are_listed_at_once(trained, tmp_path):
    tr, path = trained
    config = tmp_path / "train.yaml"
    (tmp_path / "tiny.yaml").write_text((tmp_path / "tiny.yaml").read_text()
                                        .replace("num_output: 16", "num_output: 12"))
    other = Trainer(load_config(config, ["solver.type=adam"]), output=str(tmp_path / "o"))
    other.start()
    with pytest.raises(CheckpointError) as err:
        other.restore(str(path))
    text = str(err.value)
    assert "'sgd'" in text and "'adam'" in text
    assert "f1_w" in text and "f2_w" in text and "16" in text and "12" in text


def _spawn_training(config, output, extra=(), ignore_sigint=False):
    """A training run in a child process; with ignore_sigint it starts as a shell's background
    job does (SIGINT ignored), which netrun train must override."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    pre = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    return subprocess.Popen([sys.executable, "-m", "netrun.cli", "train", config, "-o", str(output),
                             "--max-iter", "100000", "--set", "solver.snapshot=1", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            preexec_fn=pre)


def _wait_for(path: Path, proc, timeout=180.0):
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


@pytest.mark.slow
def test_kill_during_checkpoint_writes_leaves_a_loadable_checkpoint(tiny_config, tmp_path):
    """SIGKILL at arbitrary moments of a run that checkpoints every iteration."""
    out = tmp_path / "killed"
    rng = np.random.default_rng(0)
    for round_ in range(3):
        proc = _spawn_training(tiny_config, out, ["--resume", "auto"])
        try:
            _wait_for(out / "last.h5", proc)
            time.sleep(float(rng.uniform(0.2, 1.0)))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        info = ckpt.read_info(out / "last.h5")   # the last completed write is intact
        tr = Trainer(load_config(tiny_config), output=str(tmp_path / f"check{round_}"))
        tr.start(str(out / "last.h5"))
        assert tr.iteration == info.iteration > 0


def test_sigint_saves_and_exits_cleanly(tiny_config, tmp_path):
    out = tmp_path / "interrupted"
    proc = _spawn_training(tiny_config, out, ignore_sigint=True)
    try:
        _wait_for(out / "last.h5", proc)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()
    assert b"Traceback" not in err and b"interrupted at iteration" in err
    assert ckpt.read_info(out / "last.h5").iteration > 0


def test_an_interrupted_write_leaves_nothing_behind(trained, tmp_path, monkeypatch):
    """Ctrl-C inside a write: no temp file stays, the next write to the same name works."""
    import h5py as h5

    tr, path = trained
    original = h5.File

    def interrupted(*args, **kwargs):
        f = original(*args, **kwargs)
        if kwargs.get("mode", args[1] if len(args) > 1 else "r") == "w":
            f.close()
            raise KeyboardInterrupt
        return f

    monkeypatch.setattr(h5, "File", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tr.save(tmp_path / "x.h5")
    monkeypatch.setattr(h5, "File", original)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".x.h5.tmp")]
    tr.save(tmp_path / "x.h5")
    assert ckpt.read_info(tmp_path / "x.h5").iteration == 5
