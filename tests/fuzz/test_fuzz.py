"""Every reader survives seeded mutations of valid files: success or a clear error (exit 2),
never a crash, a hang or unbounded memory. See tests/fuzz/README.md for the long run.

NETRUN_FUZZ_CASES (default 30) sets the cases per reader; NETRUN_FUZZ_CLI_CASES (default 0:
a fixed sample of three) runs that many cases of every reader through `python -m netrun`.
"""
from __future__ import annotations

import os

import pytest

from tests.fuzz.corpus import build
from tests.fuzz.runner import Worker, classify, fuzz, run_cli
from tests.fuzz.targets import PROBES, TARGETS

CASES = int(os.environ.get("NETRUN_FUZZ_CASES", "30"))
CLI_CASES = int(os.environ.get("NETRUN_FUZZ_CLI_CASES", "0"))
TIMEOUT = float(os.environ.get("NETRUN_FUZZ_TIMEOUT", "10"))   # seconds per case


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build(tmp_path_factory.mktemp("fuzz-corpus"))


@pytest.fixture(scope="module")
def worker(corpus):
    w = Worker(corpus)
    yield w
    w.stop()


def test_every_seed_reads(corpus):
    """The mutations start from valid files: every seed reads without error."""
    assert set(corpus.seeds) == set(TARGETS)
    for name, target in TARGETS.items():
        for path in corpus.seeds[name]:
            outcome = classify(target, path, corpus)
            assert outcome.status == "ok", f"{name} seed {path.name}: {outcome.detail}"


def test_runner_catches_each_failure(corpus):
    """The oracle can fail: a bug, a hang, a huge allocation and a dead worker are caught,
    and the next case gets a fresh worker."""
    worker = Worker(corpus)
    path = corpus.seeds["idx"][0]
    try:
        for probe, status in (("probe-crash", "crash"), ("probe-hang", "timeout"),
                              ("probe-memory", "memory"), ("probe-exit", "crash")):
            assert worker.run(PROBES[probe], path, timeout=2).status == status, probe
            assert worker.run(TARGETS["idx"], path, timeout=30).status == "ok", probe
    finally:
        worker.stop()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_reader_survives_mutations(name, corpus, worker, tmp_path):
    tally = fuzz(TARGETS[name], corpus, range(CASES), tmp_path / "work", worker, TIMEOUT,
                 save=tmp_path / "failures")
    assert sum(tally.counts.values()) == CASES
    problems = [f"case {case}: {o.status}: {o.detail}\n{o.trace}" for case, o, _ in
                tally.failures]
    assert not problems, (f"{len(problems)} of {CASES} mutated {name} inputs failed (reproduce "
                          f"with `python -m tests.fuzz --only {name} --case N`):\n"
                          + "\n".join(problems[:3]))


_CLI_SAMPLE = [("model-yaml", 1), ("checkpoint", 0), ("npz-input", 1)]
_CLI = ([(n, c) for n in sorted(TARGETS) if TARGETS[n].cli for c in range(CLI_CASES)]
        if CLI_CASES else _CLI_SAMPLE)


@pytest.mark.parametrize("name, case", _CLI)
def test_cli_exits_0_or_2(name, case, corpus, tmp_path):
    """Through the real CLI: exit 0 or 2, no traceback, nothing written outside its folder."""
    result = run_cli(TARGETS[name], corpus, case, tmp_path)
    assert result.code in (0, 2), f"netrun {' '.join(result.argv)}: exit {result.code}\n" \
                                  f"{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    assert not result.written_outside, result.written_outside
