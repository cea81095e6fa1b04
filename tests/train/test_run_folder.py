"""Run folders: a new run never overwrites another run's checkpoints, each start is marked,
leftover temporary files are removed, best.h5 is only ever a finite result."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from netrun.cli import cli
from netrun.train import checkpoint as ckpt
from netrun.train import run_folder
from netrun.train import trainer as training
from netrun.train.config import load_config
from netrun.train.trainer import Callbacks, Trainer


def run(*args):
    return CliRunner().invoke(cli, ["train", *map(str, args)], catch_exceptions=False)


def _records(folder: Path) -> list[dict]:
    def no_nan(name):
        raise AssertionError(f"bare {name} in metrics.jsonl")
    return [json.loads(line, parse_constant=no_nan)
            for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_new_run_refuses_a_folder_holding_another_runs_checkpoints(tiny_config, tmp_path):
    out = tmp_path / "run"
    assert run(tiny_config, "--max-iter", "3").exit_code == 0
    before = _snapshot(out)
    assert {"last.h5", "best.h5", "iter_3.h5", "metrics.jsonl"} <= before.keys()
    r = run(tiny_config, "--max-iter", "3")
    assert r.exit_code == 2, r.output
    message = " ".join(r.output.split())
    assert "--resume auto" in message and "--force" in message and "-o" in message
    assert "deletes its last.h5, best.h5 and iter_<N>.h5" in message
    assert "Traceback" not in r.output
    assert _snapshot(out) == before                 # nothing touched, not even metrics.jsonl


def test_resume_auto_continues_and_marks_the_start(tiny_config, tmp_path):
    out = tmp_path / "run"
    assert run(tiny_config, "--max-iter", "3").exit_code == 0
    r = run(tiny_config, "--max-iter", "5", "--resume", "auto")
    assert r.exit_code == 0, r.output
    starts = [x for x in _records(out) if x.get("event") == "start"]
    assert [s["iter"] for s in starts] == [0, 3]
    assert starts[0]["resumed_from"] is None and starts[1]["resumed_from"] == str(out / "last.h5")
    assert all(s["netrun_version"] and s["time"] for s in starts)
    assert ckpt.read_info(out / "last.h5").iteration == 5


def test_resume_auto_falls_back_to_the_newest_numbered_checkpoint(tiny_config, tmp_path):
    """A kill between writing iter_<N>.h5 and linking last.h5 leaves only the former."""
    out = tmp_path / "run"
    assert run(tiny_config, "--max-iter", "4", "--set", "solver.snapshot=2").exit_code == 0
    (out / "last.h5").unlink()
    r = run(tiny_config, "--max-iter", "5", "--resume", "auto")
    assert r.exit_code == 0, r.output
    assert "resumed from" in r.output and "iter_4.h5" in r.output


def test_resume_auto_with_only_a_best_checkpoint_says_so(tiny_config, tmp_path):
    out = tmp_path / "run"
    assert run(tiny_config, "--max-iter", "2").exit_code == 0
    for name in ("last.h5", "iter_2.h5"):
        (out / name).unlink()
    r = run(tiny_config, "--max-iter", "3", "--resume", "auto")
    assert r.exit_code == 2, r.output
    assert "no last.h5 or iter_<N>.h5 to resume from" in " ".join(r.output.split())
    assert (out / "best.h5").exists()


def test_force_starts_over_and_says_what_it_deleted(tiny_config, tmp_path):
    out = tmp_path / "run"
    assert run(tiny_config, "--max-iter", "4", "--set", "solver.snapshot=2").exit_code == 0
    assert (out / "iter_2.h5").exists()
    r = run(tiny_config, "--max-iter", "3", "--force")
    assert r.exit_code == 0, r.output
    assert "deleted 4 checkpoint(s)" in r.output     # iter_2, iter_4, last, best
    assert not (out / "iter_2.h5").exists() and not (out / "iter_4.h5").exists()
    assert ckpt.read_info(out / "last.h5").iteration == 3
    assert [x["iter"] for x in _records(out) if x.get("event") == "start"] == [0, 0]


def test_force_with_resume_and_resume_from_elsewhere_are_refused(tiny_config, tmp_path):
    out = tmp_path / "run"
    assert run(tiny_config, "--max-iter", "2").exit_code == 0
    r = run(tiny_config, "--force", "--resume", "auto")
    assert r.exit_code == 2 and "give only one of them" in r.output, r.output
    assert run(tiny_config, "--max-iter", "2", "-o", tmp_path / "other").exit_code == 0
    before = _snapshot(out)
    r = run(tiny_config, "--max-iter", "4", "--resume", tmp_path / "other" / "last.h5")
    assert r.exit_code == 2 and "would continue another run" in r.output, r.output
    assert _snapshot(out) == before


def test_leftover_temporary_files_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()                                     # its pid is free now
    names = {
        f".last.h5.tmp-{dead.pid}": False,                       # link_or_copy's, writer dead
        f".iter_7.h5.tmp-{dead.pid}-0123abcd": False,           # atomic writer's, writer dead
        f".best.h5.tmp-{os.getppid()}-0123abcd": True,          # a live writer's: kept
        f".notes.tmp-{dead.pid}-xyz": True,                     # not our pattern
        "last.h5": True,
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    # Our own pid on a file older than this process: an earlier process with the same pid.
    reused = tmp_path / f".iter_9.h5.tmp-{os.getpid()}-0123abcd"
    reused.write_bytes(b"x")
    os.utime(reused, (1_000_000, 1_000_000))
    removed = run_folder.remove_stale_temps(tmp_path)
    assert sorted(p.name for p in removed) == sorted([reused.name] + [
        n for n, keep in names.items() if not keep])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, k in names.items() if k)


def test_a_new_start_in_the_folder_removes_them(tiny_config, tmp_path):
    out = tmp_path / "run"
    assert run(tiny_config, "--max-iter", "2").exit_code == 0
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = out / f".iter_3.h5.tmp-{dead.pid}-deadbeef"
    leftover.write_bytes(b"half a checkpoint")
    assert run(tiny_config, "--max-iter", "3", "--resume", "auto").exit_code == 0
    assert not leftover.exists()


def test_best_is_written_only_for_a_finite_loss_and_accuracy(tiny_config, tmp_path):
    tr = Trainer(load_config(tiny_config), output=str(tmp_path / "run"))
    tr.start()
    results = iter([training.TestResult(0, math.nan, {"accuracy": 0.9}, 96),
                    training.TestResult(0, 0.5, {"accuracy": math.nan}, 96),
                    training.TestResult(0, math.inf, {"accuracy": 1.0}, 96),
                    training.TestResult(0, 0.7, {"accuracy": 0.25}, 96)])
    tr.test = lambda max_batches=0: next(results)
    with open(tmp_path / "log.jsonl", "w") as log:
        for _ in range(3):
            tr._test_and_log(log, Callbacks())
            assert not (tmp_path / "run" / "best.h5").exists() and tr.best_accuracy == -1.0
        tr._test_and_log(log, Callbacks())
    assert ckpt.read_info(tmp_path / "run" / "best.h5").meta["best_accuracy"] == 0.25
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["test_loss"] is None            # NaN logged as null
    assert all("NaN" not in x and "Infinity" not in x for x in lines)
    tr.loader.close()
