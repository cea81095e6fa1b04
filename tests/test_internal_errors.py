"""A bug is a bug: only bad input (NetrunError) exits 2; a kernel's unexpected exception on
inputs its schema accepts is an internal error (exit 1, "please report")."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import netrun
from netrun.cli import cli
from netrun.core import registry
from netrun.errors import InternalError, NetrunError, ShapeError

LENET = str(Path(__file__).resolve().parents[1] / "zoo" / "lenet.yaml")


def _broken(exc: Exception):
    def kernel(ctx, *inputs):
        raise exc
    return kernel


def test_kernel_failure_on_fitting_inputs_is_an_internal_error(monkeypatch):
    monkeypatch.setitem(registry._KERNELS, ("Relu", "any"), _broken(IndexError("index 9")))
    ws = netrun.Workspace()
    ws.feed_blob("X", np.ones((2, 3), np.float32))
    with pytest.raises(InternalError, match=r"op .*Relu.* kernel .*IndexError: index 9") as e:
        ws.run_operator_once(netrun.op("Relu", ["X"], ["Y"]))
    assert not isinstance(e.value, NetrunError)


def test_kernel_failure_on_inputs_the_schema_rejects_is_the_users_shape_error(monkeypatch):
    monkeypatch.setitem(registry._KERNELS, ("Add", "any"), _broken(ValueError("broadcast")))
    ws = netrun.Workspace()
    ws.feed_blob("A", np.ones((2, 3), np.float32))
    ws.feed_blob("B", np.ones((4, 5), np.float32))
    with pytest.raises(ShapeError, match=r"inputs A 2×3, B 4×5 do not fit"):
        ws.run_operator_once(netrun.op("Add", ["A", "B"], ["C"]))


def test_cli_reports_a_bug_with_exit_1_and_asks_for_a_report(monkeypatch):
    monkeypatch.setitem(registry._KERNELS, ("Relu", "any"), _broken(ValueError("oops")))
    args = ["profile", LENET, "--batch", "2", "--forward-only", "--iters", "1"]
    result = CliRunner().invoke(cli, args, prog_name="netrun")
    assert result.exit_code == 1, result.output
    assert "internal error" in result.output and "please report" in result.output
    assert "Traceback" not in result.output
    debug = CliRunner().invoke(cli, ["--debug", *args], prog_name="netrun")
    assert debug.exit_code == 1 and "Traceback" in debug.output


def test_cli_bad_input_still_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ninputs: {data: [3]}\nlayers:\n  - {type: convv, name: c}\n")
    result = CliRunner().invoke(cli, ["inspect", str(bad)], prog_name="netrun")
    assert result.exit_code == 2, result.output
    assert "internal error" not in result.output
