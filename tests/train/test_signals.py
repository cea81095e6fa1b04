"""Signals and pipes against real `netrun train` processes.

SIGINT, SIGTERM and SIGHUP finish the step and write one consistent checkpoint; a second
signal a few milliseconds later may skip it, but whatever is on disk is consistent
(parameters, optimizer, RNGs and loader position of one iteration, equal to an uninterrupted
run's at that iteration) and no message claims a save that did not happen. A closed stdout
stops the printing, not the training.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from netrun.train import checkpoint as ckpt
from netrun.train.config import load_config
from netrun.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]

# (first signal, second signal or None, milliseconds between them, solver.snapshot): with
# periodic snapshots a second signal finds a last.h5 that must stay consistent.
TRIES = [(signal.SIGINT, signal.SIGINT, 2, 20), (signal.SIGINT, signal.SIGINT, 15, 0),
         (signal.SIGHUP, signal.SIGTERM, 5, 20), (signal.SIGTERM, None, 0, 0),
         (signal.SIGHUP, None, 0, 0)]


def _spawn(config, output, *extra, **popen):
    return subprocess.Popen([sys.executable, "-m", "netrun.cli", "train", config, "-o", str(output),
                             *extra], env={**os.environ, "PYTHONPATH": str(REPO)},
                            **popen)


def _arrays_and_state(path) -> tuple[dict, dict]:
    """Everything a resume restores: the blobs, and iteration, RNGs, loader position, lr."""
    with h5py.File(path, "r") as f:
        arrays = {f"{g}/{n}": f[g][n][()] for g in ("params", "optimizer", "state") for n in f[g]}
    meta = ckpt.read_info(path).meta
    return arrays, {k: meta.get(k) for k in ("iteration", "rng", "data", "lr")}


def _assert_same_state(path, reference) -> None:
    arrays, state = _arrays_and_state(path)
    ref_arrays, ref_state = _arrays_and_state(reference)
    assert state == ref_state, (f"{path}: loader at {state['data']}, an uninterrupted run's "
                                f"at {ref_state['data']}")
    assert arrays.keys() == ref_arrays.keys()
    for name in arrays:
        np.testing.assert_array_equal(arrays[name], ref_arrays[name], err_msg=f"{path}: {name}")


def _claims(err: str) -> list[tuple[Path, int]]:
    """Every (file, iteration) a message says was written."""
    found = [(Path(p), int(i)) for p, i in
             re.findall(r"checkpoint saved: (\S+) \(iteration (\d+)\)", err)]
    found += [(Path(p), int(i)) for i, p in
              re.findall(r"after iteration (\d+), whose checkpoint had been written: (\S+)", err)]
    found += [(Path(p), int(i)) for p, i in
              re.findall(r"the newest checkpoint this run wrote is (\S+) \(iteration (\d+)\)", err)]
    return found


def test_signals_leave_one_consistent_checkpoint_and_tell_the_truth(tiny_config, tmp_path):
    rng = np.random.default_rng(13)
    # All tries run at once (a short test); each is signalled at a random moment of its run.
    procs = [_spawn(tiny_config, tmp_path / f"run{k}", "--max-iter", "100000",
                    "--set", "solver.display=50", "--set", f"solver.snapshot={snapshot}",
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for k, (_, _, _, snapshot) in enumerate(TRIES)]
    results, heads = [], []
    try:
        for proc in procs:              # wait until each is training (display lines)
            heads.append([proc.stderr.readline()])
            while heads[-1][-1] and not heads[-1][-1].startswith(b"iter"):
                heads[-1].append(proc.stderr.readline())
            assert heads[-1][-1], b"".join(heads[-1])      # b"": it ended before training
        for proc, (first, second, gap_ms, _) in zip(procs, TRIES):
            time.sleep(float(rng.uniform(0.0, 0.1)))
            proc.send_signal(first)
            if second is not None:
                time.sleep(gap_ms / 1000)
                proc.send_signal(second)
        for k, (proc, head, (first, second, _, _)) in enumerate(zip(procs, heads, TRIES)):
            err = b"".join([*head, proc.communicate(timeout=120)[1]]).decode()
            results.append((first, second, proc.returncode, err, tmp_path / f"run{k}"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    # The reference: one uninterrupted run, checkpointed at each iteration a try stopped at.
    stops = {}
    for first, second, status, err, out in results:
        assert "Traceback" not in err, err
        # A quick first stop may finish (and exit 128 + first) before the second signal
        # lands; then it must have written its checkpoint like a single signal.
        # A second signal landing in the interpreter's own shutdown, after the first stop
        # finished, meets the default action (Python resets handlers there): status -N.
        assert status in {128 + first, 128 + (second or first), -(second or first)}, err
        if second is not None and second != first and status in (128 + first, -second):
            second = None
        for path, iteration in _claims(err):          # never a save that did not happen
            assert path.exists(), err
            assert ckpt.read_info(path).iteration == iteration, err
        if second is None:                            # one signal: always a checkpoint
            assert _claims(err), err
            assert "checkpoint saved" in err
        if (out / "last.h5").exists():
            stops.setdefault(ckpt.read_info(out / "last.h5").iteration, []).append(out / "last.h5")
        # what a killed write left behind is only hidden temporary files
        assert all(p.name.startswith(".") or p.name in ("metrics.jsonl", "last.h5", "best.h5")
                   or re.fullmatch(r"iter_\d+\.h5", p.name) for p in out.iterdir())
    assert stops, "no try left a checkpoint"
    ref = Trainer(load_config(tiny_config), output=str(tmp_path / "ref"))
    ref.start()
    for iteration in sorted(stops):
        while ref.iteration < iteration:
            ref.step()
        ref.save(tmp_path / "ref.h5")
        for path in stops[iteration]:
            _assert_same_state(path, tmp_path / "ref.h5")
    ref.loader.close()


def test_a_closed_stdout_stops_the_printing_not_the_training(tiny_config, tmp_path):
    """`netrun train cfg 2>&1 | head -1`: the reader goes, the run finishes and checkpoints."""
    out = tmp_path / "piped"
    proc = _spawn(tiny_config, out, "--max-iter", "300", "--set", "solver.display=1",
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout.readline()
        proc.stdout.close()                      # as `head -1` does after its line
        status = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert status == 0
    assert ckpt.read_info(out / "last.h5").iteration == 300
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["iter"] == 300 and "test_loss" in lines[-1]
