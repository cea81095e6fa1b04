"""Run fuzz cases: in a forked worker (memory-limited, watched by a timer), or through the CLI.

The worker is forked once from a process that has built the corpus, so the readers, the
Caffe model and the predictor are already imported and built; it reads case paths from a
pipe and answers one JSON line per case. A case that runs past the time limit, or a worker
that dies (out of memory under RLIMIT_AS, a signal), is recorded and a fresh worker forked.

Outcomes: "ok" (the reader returned), "error" (NetrunError or OSError: exit status 2 in the
CLI), "crash" (any other exception, or the worker died), "timeout", "memory" (MemoryError).
"""
from __future__ import annotations

import json
import os
import random
import resource
import select
import shutil
import signal
import subprocess
import sys
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzz.corpus import REPO, Corpus
from tests.fuzz.mutate import mutate
from tests.fuzz.targets import PROBES, TARGETS, Target

MEMORY_BUDGET = 2 << 30          # bytes of address space a case may add to the worker's
FAILURES = ("crash", "timeout", "memory")
STARTUP = 300.0                  # seconds a new worker may take to import and get ready


@dataclass
class Outcome:
    """How one case ended."""

    status: str
    detail: str = ""          # exception type and message (first line)
    trace: str = ""           # traceback of a crash


@dataclass
class Tally:
    """Counts of one target's outcomes, and the failing cases."""

    counts: Counter = field(default_factory=Counter)
    failures: list[tuple[int, Outcome, Path | None]] = field(default_factory=list)

    def add(self, case: int, outcome: Outcome, saved: Path | None = None) -> None:
        self.counts[outcome.status] += 1
        if outcome.status in FAILURES:
            self.failures.append((case, outcome, saved))


def case_input(target: Target, corpus: Corpus, case: int) -> tuple[str, bytes]:
    """(file name, bytes) of case number `case` of `target`: a mutated seed, reproducible."""
    rng = random.Random(f"{target.name}:{case}")
    seeds = corpus.seeds[target.name]
    seed = rng.choice(seeds)
    others = [p.read_bytes() for p in seeds]
    return seed.name, mutate(seed.read_bytes(), rng, text=target.text, proto=target.proto,
                             others=others)


# The worker ---------------------------------------------------------------------------------
def _address_space() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def classify(target: Target, path: Path, corpus: Corpus) -> Outcome:
    """Read `path` with `target` here and say how it ended."""
    from netrun.errors import NetrunError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target.read(path, corpus)
        return Outcome("ok")
    except (NetrunError, OSError) as e:
        return Outcome("error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    except MemoryError as e:
        return Outcome("memory", f"MemoryError: {e}", traceback.format_exc())
    except Exception as e:   # a crash: the CLI would call it an internal error
        return Outcome("crash", f"{type(e).__name__}: {str(e)[:300]}", traceback.format_exc())


def serve(folder: Path, memory: int) -> None:
    """The worker's loop: read 'target<TAB>path' lines on stdin, answer one JSON line each.

    Replies go to the original stdout; the readers' own output goes to /dev/null. The memory
    limit is set after the imports, so it bounds what a case adds."""
    replies = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    corpus = Corpus(folder)
    corpus.caffe_model, corpus.predictor      # built before the limit, like the imports
    soft = _address_space() + memory
    resource.setrlimit(resource.RLIMIT_AS, (soft, resource.getrlimit(resource.RLIMIT_AS)[1]))
    os.write(replies, b"ready\n")
    for line in sys.stdin:
        name, _, path = line.rstrip("\n").partition("\t")
        outcome = classify({**TARGETS, **PROBES}[name], Path(path), corpus)
        os.write(replies, (json.dumps(vars(outcome)) + "\n").encode())
        if outcome.status == "memory":
            return          # a MemoryError may leave the heap in any state: start afresh


class Worker:
    """A reader process (`python -m tests.fuzz.worker`) with a memory limit; `run` enforces
    the time limit. A fresh interpreter, not a fork: a fork of a process whose thread pools
    have run would deadlock on their locks."""

    def __init__(self, corpus: Corpus, memory: int = MEMORY_BUDGET):
        self.corpus, self.memory = corpus, memory
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.worker", str(self.corpus.folder),
             str(self.memory)], cwd=REPO, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        ready = self._reply(STARTUP)
        if ready != b"ready\n":
            self.stop()
            raise RuntimeError(f"the fuzz worker did not start (it said {ready!r})")

    def _reply(self, timeout: float) -> bytes | None:
        """One line from the worker; None if none came within `timeout`, b"" if it died."""
        fd = self.proc.stdout.fileno()
        reply = b""
        while not reply.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b""
            reply += chunk
        return reply

    def run(self, target: Target, path: Path, timeout: float) -> Outcome:
        """Read `path` with `target` in the worker; a timeout or death is an Outcome too."""
        if self.proc is None:
            self._start()
        try:
            self.proc.stdin.write(f"{target.name}\t{path}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._died()
        reply = self._reply(timeout)
        if reply is None:
            self.stop()
            return Outcome("timeout", f"no answer within {timeout:g} s")
        if not reply:
            return self._died()
        outcome = Outcome(**json.loads(reply))
        if outcome.status == "memory":
            self.stop()
        return outcome

    def _died(self) -> Outcome:
        code = self.proc.wait()
        self.proc = None
        how = (f"killed by signal {signal.Signals(-code).name}" if code < 0
               else f"exited with status {code}")
        return Outcome("crash", f"the reader process {how} (out of memory under RLIMIT_AS?)")

    def stop(self) -> None:
        """End the worker (the next case starts a new one)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
            self.proc = None


def fuzz(target: Target, corpus: Corpus, cases: range, work: Path, worker: Worker,
         timeout: float = 10.0, save: Path | None = None) -> Tally:
    """Run `cases` of `target`; failing inputs are copied to `save`/<target>/ if given."""
    tally = Tally()
    folder = work / target.name
    for case in cases:
        name, data = case_input(target, corpus, case)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        path = folder / name
        path.write_bytes(data)
        outcome = worker.run(target, path, timeout)
        kept = None
        if outcome.status in FAILURES and save is not None:
            kept = save / target.name / f"case{case}-{name}"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_bytes(data)
        tally.add(case, outcome, kept)
    shutil.rmtree(folder, ignore_errors=True)
    return tally


# Through the CLI ----------------------------------------------------------------------------
@dataclass
class CliResult:
    """One `python -m netrun` run on a mutated file."""

    argv: list[str]
    code: int
    stderr: str
    written_outside: list[str]


def _listing(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")} if root.exists() else set()


def run_cli(target: Target, corpus: Corpus, case: int, work: Path,
            timeout: float = 120.0) -> CliResult:
    """Run the target's CLI command on case `case` in a sandbox folder under `work`."""
    box = work / f"cli-{target.name}-{case}"
    shutil.rmtree(box, ignore_errors=True)
    inputs, out, home = box / "in", box / "out", box / "home"
    for d in (inputs, out, home):
        d.mkdir(parents=True)
    name, data = case_input(target, corpus, case)
    path = inputs / name
    path.write_bytes(data)
    argv = target.cli(path, corpus, out)
    watched = {"corpus": corpus.folder, "inputs": inputs, "home": home}
    before = {k: _listing(v) for k, v in watched.items()}
    repo_before = _listing(REPO / "runs") | _listing(REPO / "data")
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
           "NETRUN_CACHE_DIR": str(out / "algos"), "NETRUN_DATA": str(out / "data"),
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "NO_COLOR": "1"}
    env.pop("NETRUN_DEBUG", None)
    limit = 4 << 30          # address space of the CLI process: far more than a case needs
    proc = subprocess.run([sys.executable, "-m", "netrun.cli", *argv], cwd=out, env=env,
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS,
                                                                (limit, limit)))
    written = []
    for key, root in watched.items():
        written += sorted(_listing(root) - before[key])
    written += sorted((_listing(REPO / "runs") | _listing(REPO / "data")) - repo_before)
    return CliResult(argv, proc.returncode, proc.stderr, written)
