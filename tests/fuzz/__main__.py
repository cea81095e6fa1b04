"""The long fuzz run: `python -m tests.fuzz [--cases N] [--minutes M] [--only NAME ...]`.

Prints, per reader, the cases run and how they ended (ok, clean errors, crashes, timeouts,
out of memory) with the case numbers of the failures, and copies every failing input to
--save (default fuzz-failures/) for reproduction: `python -m tests.fuzz --only READER
--case N` runs that one case again and prints its traceback. Exit status 1 if any failed.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from tests.fuzz.corpus import build
from tests.fuzz.runner import FAILURES, Worker, fuzz, run_cli
from tests.fuzz.targets import TARGETS


def main(argv: list[str] | None = None) -> int:
    """Run the long fuzz and print the counts; 1 if any case crashed, hung or ran out."""
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=1000, help="cases per reader (default 1000)")
    ap.add_argument("--first", type=int, default=0, help="first case number (default 0)")
    ap.add_argument("--case", type=int, help="run only this case number (reproduce one)")
    ap.add_argument("--minutes", type=float, help="stop starting new cases after this long, "
                    "sharing the time evenly between readers")
    ap.add_argument("--only", nargs="+", choices=sorted(TARGETS), help="readers to fuzz")
    ap.add_argument("--cli", type=int, default=0,
                    help="also run this many cases per reader through `python -m netrun`")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds per case (default 5)")
    ap.add_argument("--save", type=Path, default=Path("fuzz-failures"),
                    help="folder for failing inputs (default fuzz-failures/)")
    args = ap.parse_args(argv)
    names = args.only or sorted(TARGETS)
    cases = (range(args.case, args.case + 1) if args.case is not None
             else range(args.first, args.first + args.cases))
    with tempfile.TemporaryDirectory(prefix="netrun-fuzz-") as tmp:
        work = Path(tmp)
        corpus = build(work / "corpus")
        worker = Worker(corpus)
        totals, failed = {}, 0
        started = time.monotonic()
        print(f"{'reader':16} {'cases':>6} {'ok':>6} {'errors':>6} {'crash':>6} "
              f"{'timeout':>7} {'memory':>6}  seconds")
        for i, name in enumerate(names):
            target = TARGETS[name]
            begin = time.monotonic()
            share = None
            if args.minutes is not None:   # the time left, shared by the readers left
                share = (args.minutes * 60 - (begin - started)) / (len(names) - i)
            tally = _run(target, corpus, cases, work, worker, args, share)
            c = tally.counts
            totals[name] = c
            print(f"{name:16} {sum(c.values()):6} {c['ok']:6} {c['error']:6} {c['crash']:6} "
                  f"{c['timeout']:7} {c['memory']:6}  {time.monotonic() - begin:7.1f}",
                  flush=True)
            failed += len(tally.failures)
            _report(tally, args.case is not None)
            for case in list(cases)[: args.cli] if target.cli else ():
                result = run_cli(target, corpus, case, work)
                bad = (result.code not in (0, 2) or "Traceback" in result.stderr
                       or result.written_outside)
                failed += bool(bad)
                print(f"    cli case {case}: exit {result.code}"
                      + (f" FAILED: {result.stderr.strip()[-500:]} "
                         f"{result.written_outside}" if bad else ""))
        worker.stop()
        total = sum(sum(c.values()) for c in totals.values())
        print(f"{'total':16} {total:6} "
              + " ".join(f"{k} {sum(c[k] for c in totals.values())}"
                         for k in ("ok", "error", *FAILURES))
              + f"  in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


def _report(tally, traces: bool) -> None:
    """The failures grouped by cause: each cause once, with its case numbers and inputs."""
    groups: dict[str, list] = {}
    for case, outcome, saved in tally.failures:
        # numbers (offsets, sizes, bytes) differ from case to case; the cause does not
        cause = re.sub(r"0x[0-9a-f]+|\d+", "N", f"{outcome.status}: {outcome.detail}")[:160]
        groups.setdefault(cause, []).append((case, outcome, saved))
    for cause, items in groups.items():
        cases = ", ".join(str(c) for c, _, _ in items[:8]) + (" ..." if len(items) > 8 else "")
        print(f"    {len(items)} x {cause}\n        cases {cases}; input {items[0][2]}")
        if traces and items[0][1].trace:
            print(items[0][1].trace)


def _run(target, corpus, cases: range, work: Path, worker: Worker, args, share: float | None):
    if share is None:
        return fuzz(target, corpus, cases, work, worker, args.timeout, args.save)
    # Time-boxed: run in slices of 50 cases until this reader's share of the time is used.
    deadline = time.monotonic() + share
    tally = None
    for start in range(cases.start, cases.stop, 50):
        part = fuzz(target, corpus, range(start, min(start + 50, cases.stop)), work, worker,
                    args.timeout, args.save)
        if tally is None:
            tally = part
        else:
            tally.counts.update(part.counts)
            tally.failures += part.failures
        if time.monotonic() > deadline:
            break
    return tally


if __name__ == "__main__":
    sys.exit(main())
