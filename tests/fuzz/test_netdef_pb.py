"""The binary NetDef reader (netdef_from_bytes) on many mutated and random inputs, in this
process: a case costs about a millisecond, so every test run tries far more than the 30 a
reader gets in the worker (test_fuzz.py, which also times and memory-limits each case).

Each case must end in a NetrunError or a net that goes round (.pb and .pbtxt) unchanged:
tests/fuzz/targets.py's read_netdef_pb. Case N is always the same input.
"""
from __future__ import annotations

import random
import traceback
from collections import Counter

from netrun.errors import NetrunError
from netrun.proto.wire import WireError
from tests.fuzz.corpus import netdef_pb_seed
from tests.fuzz.mutate import mutate
from tests.fuzz.targets import read_netdef_pb

CASES = 1500


def case_input(case: int, seed: bytes) -> bytes:
    """Case `case`: the seed NetDef with one to four byte or protobuf-field mutations."""
    return mutate(seed, random.Random(f"netdef-pb-inline:{case}"), proto=True, others=[seed])


def test_mutated_netdefs_read_or_are_refused():
    seed = netdef_pb_seed()
    outcomes, failures = Counter(), []
    for case in range(CASES):
        try:
            read_netdef_pb(case_input(case, seed), f"case{case}.pb")
            outcomes["ok"] += 1
        except WireError:
            outcomes["wire"] += 1
        except NetrunError:
            outcomes["refused"] += 1
        except Exception:   # noqa: BLE001 (anything else is what the fuzz is looking for)
            failures.append(f"case {case}:\n{traceback.format_exc()}")
    assert not failures, (f"{len(failures)} of {CASES} cases failed (reproduce with "
                          f"read_netdef_pb(case_input(N, netdef_pb_seed()))):\n" + failures[0])
    # the mutations get past the framing to the fields' meaning, and leave some nets whole
    assert min(outcomes["ok"], outcomes["wire"], outcomes["refused"]) > CASES // 20, outcomes
