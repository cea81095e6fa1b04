"""What the tests check and against what: the records the operator-coverage audit reads
(`checks_ops`), and PyTorch as an optional reference (`torch`, `F`, `requires_torch`).

torch is not a dependency of netrun, so a missing torch must not hide the NumPy and
finite-difference checks that sit beside the PyTorch comparisons: tests that compare with
torch carry `requires_torch`, and tests that also check against NumPy call
`skip_unless_torch()` after those checks, right before their torch comparison. To run the
suite as if torch were absent, put a torch.py that raises
ModuleNotFoundError("...", name="torch") first on PYTHONPATH (a plain ImportError is a broken
install to pytest.importorskip and here, and fails instead of skipping).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

try:
    import torch
except ModuleNotFoundError as e:
    if e.name != "torch":   # torch is installed but broken: fail loudly rather than skip
        raise
    torch = None

F = None if torch is None else torch.nn.functional

_REASON = "PyTorch is the reference for this comparison and is not installed"
requires_torch = pytest.mark.skipif(torch is None, reason=_REASON)


def skip_unless_torch() -> None:
    """Skip the rest of the calling test without torch; the checks before the call have run."""
    if torch is None:
        pytest.skip(_REASON + " (the NumPy checks before it passed)")


# The audit (tests/ops/test_coverage.py) holds its tables to these records instead of searching
# test sources for op names: "module::function" (module relative to tests/, as the tables name
# it) -> kind -> op types.
CHECK_KINDS = {
    "finite_differences": "the registered gradient against float64 central differences",
    "torch": "the outputs against PyTorch in float32",
    "torch_gradient": "the outputs and the gradients against PyTorch in float32",
    "reference": "against another reference: NumPy, Caffe's formulas, statistics, round trips",
}
CHECKED: dict[str, dict[str, frozenset[str]]] = {}
_TESTS = Path(__file__).resolve().parent


def check_id(fn: Callable) -> str:
    """"ops.test_x::test_f", whichever name pytest or the audit imported the module under."""
    module = Path(sys.modules[fn.__module__].__file__).resolve().relative_to(_TESTS)
    return ".".join(module.with_suffix("").parts) + "::" + fn.__name__


def checks_ops(*types: str, kind: str) -> Callable[[Callable], Callable]:
    """Decorator: record that the test checks the operators `types` in the way `kind` names.

    Stack one per kind. The record is a claim that the audit holds its tables to, and the test
    body is what makes it true: keep the decorator on the test whose checks it describes.
    """
    if kind not in CHECK_KINDS:
        raise ValueError(f"checks_ops: kind '{kind}' is none of {sorted(CHECK_KINDS)}")
    if not types:
        raise ValueError("checks_ops: name at least one op type")

    def wrap(fn: Callable) -> Callable:
        kinds = CHECKED.setdefault(check_id(fn), {})
        kinds[kind] = kinds.get(kind, frozenset()) | frozenset(types)
        return fn

    return wrap
