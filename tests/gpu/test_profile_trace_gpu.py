"""`netrun profile --device gpu --trace`: the device stream gets a track of its own, with the
same iterations, phases and ops as the host's (which show when each op was queued)."""
from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from netrun.cli import cli
from netrun.profile.trace import MAIN_TID, STREAM_TID
from tests.test_profile_trace import _slices, _thread_names, check_iterations, check_well_formed

LENET = str(Path(__file__).resolve().parents[2] / "zoo" / "lenet.yaml")


def test_a_gpu_trace_has_the_device_stream(gpu, tmp_path):
    trace, report = tmp_path / "gpu.json", tmp_path / "gpu-profile.json"
    r = CliRunner().invoke(cli, ["profile", LENET, "--device", "gpu", "-b", "4", "--iters", "2",
                                 "--warmup", "1", "--trace", str(trace), "--json", str(report)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(trace.read_text())
    ops = json.loads(report.read_text())["ops"]
    check_well_formed(doc)
    check_iterations(doc, ops, 2, MAIN_TID)     # when the host queued each op
    check_iterations(doc, ops, 2, STREAM_TID)   # when the device ran it (CUDA events)
    names = _thread_names(doc["traceEvents"])
    assert names[STREAM_TID] == "gpu:0 stream"
    (process,) = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert process.startswith(f"netrun profile {LENET} (gpu:0")
    device_ops = _slices(doc["traceEvents"], STREAM_TID, "op")
    # the table's times are the device's: each op's median is one of its stream slices
    for o in ops:
        durations = [e["dur"] for e in device_ops if e["name"] == o["name"]]
        assert len(durations) == 2
        assert min(durations) - 0.25 <= o["median_ms"] * 1e3 <= max(durations) + 0.25
    assert not _slices(doc["traceEvents"], cat="chunk")     # no CPU chunks on a GPU
