"""Accuracy against a NumPy reference: top-1/top-k, ties, ignore_label, shapes and errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import netrun
from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import infer_op
from netrun.errors import SchemaError, ShapeError
from tests.opcheck import run_op
from tests.checks import checks_ops


def reference_accuracy(x: np.ndarray, labels: np.ndarray, k: int, ignore: int = -1) -> float:
    """Caffe's rule, one example at a time: a hit when fewer than k classes score higher;
    a row holding a NaN or infinite score is a miss."""
    hits = count = 0
    for row, label in zip(x.reshape(len(x), -1), labels):
        if ignore != -1 and label == ignore:
            continue
        count += 1
        hits += bool(np.isfinite(row).all()) and sum(s > row[label] for s in row) < k
    return hits / count if count else 0.0


# `device` is a plain string per parameter, safe to share across hypothesis examples.
@checks_ops("Accuracy", kind="reference")
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 12), d=st.integers(1, 8), k=st.integers(1, 8),
       seed=st.integers(0, 2**16), ties=st.booleans(), ignore=st.booleans(),
       bad=st.sampled_from([None, np.nan, np.inf, -np.inf]))
def test_accuracy_matches_reference(device, n, d, k, seed, ties, ignore, bad):
    k = min(k, d)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    if ties:
        x = np.round(x)  # many equal scores: ties count as hits
    if bad is not None:  # a few non-finite scores, anywhere (the label's included)
        x.flat[rng.integers(0, x.size, max(1, x.size // 5))] = bad
    labels = rng.integers(0, d, n).astype(np.int32)
    args = {"top_k": k}
    if ignore:
        args["ignore_label"] = int(labels[0])
    (acc,) = run_op(netrun.op("Accuracy", ["X", "L"], ["acc"], **args), {"X": x, "L": labels},
                    device)
    assert acc.shape == () and acc.dtype == np.float32
    assert acc == pytest.approx(reference_accuracy(x, labels, k, args.get("ignore_label", -1)),
                                abs=1e-7)


def test_non_finite_scores_are_misses(device):
    """A diverged net (NaN scores) scores 0, not 100%: NaN compares false both ways."""
    x = np.array([[np.nan] * 3, [0.1, np.nan, 0.2], [np.nan, 0.9, 0.0], [0.0, np.inf, 1.0],
                  [-np.inf, 0.5, 0.1], [0.2, 0.7, 0.1]], np.float32)
    labels = np.array([0, 2, 1, 1, 1, 1])
    for k in (1, 3):
        (acc,) = run_op(netrun.op("Accuracy", ["X", "L"], ["acc"], top_k=k), {"X": x, "L": labels},
                        device)
        assert acc == pytest.approx(1 / 6)          # only the finite last row is a hit
    ignored = netrun.op("Accuracy", ["X", "L"], ["acc"], ignore_label=0)
    assert run_op(ignored, {"X": x, "L": labels}, device)[0] == pytest.approx(1 / 5)


def test_accuracy_known_values():
    x = np.array([[0.1, 0.7, 0.2], [0.5, 0.5, 0.0], [0.3, 0.3, 0.4], [0.9, 0.05, 0.05]],
                 np.float32)
    labels = np.array([1, 1, 0, 2])
    op = lambda k: netrun.op("Accuracy", ["X", "L"], ["acc"], top_k=k)  # noqa: E731
    # top-1: row 0 hit, row 1 tie with the max (hit, as in Caffe), rows 2 and 3 miss.
    assert run_op(op(1), {"X": x, "L": labels})[0] == 0.5
    # top-2: row 2 (0.3 ties 0.3 behind 0.4) and row 3 (0.05 ties 0.05 behind 0.9) now hit.
    assert run_op(op(2), {"X": x, "L": labels})[0] == 1.0


def test_accuracy_ignore_label_leaves_examples_out():
    x = np.eye(4, dtype=np.float32)
    labels = np.array([0, 1, 255, 0])  # the ignored 255 is not a valid class
    op = netrun.op("Accuracy", ["X", "L"], ["acc"], ignore_label=255)
    assert run_op(op, {"X": x, "L": labels})[0] == pytest.approx(2 / 3)
    assert run_op(op, {"X": x, "L": np.full(4, 255)})[0] == 0.0


def test_accuracy_has_no_gradient_and_stops_the_backward_pass():
    op = netrun.op("Accuracy", ["X", "L"], ["acc"])
    assert netrun.get_schema("Accuracy").no_gradient
    assert netrun.gradient_ops(op) == ([], {"X": None, "L": None})


def test_accuracy_shape_inference_and_errors():
    op = netrun.op("Accuracy", ["X", "L"], ["acc"], top_k=3)
    spec = infer_op(op, [TensorSpec((8, 10)), TensorSpec((8,), "int32")]).outputs[0]
    assert spec == TensorSpec((), "float32")
    with pytest.raises(ShapeError, match="labels have 7 entries but X has 8 examples"):
        infer_op(op, [TensorSpec((8, 10)), TensorSpec((7,), "int32")])
    with pytest.raises(ShapeError, match="top_k is 3 but X has only 2 classes"):
        infer_op(op, [TensorSpec((8, 2)), TensorSpec((8,), "int32")])
    with pytest.raises(SchemaError, match="Accuracy.*'top_k' is 0"):
        netrun.get_schema("Accuracy").verify(netrun.op("Accuracy", ["X", "L"], ["a"], top_k=0))
