"""Accuracy's GPU kernel treats a row with a NaN or infinite score as a miss, as the CPU does."""
from __future__ import annotations

import numpy as np

import netrun
from tests.opcheck import run_op


def test_non_finite_rows_are_misses_on_both_backends(gpu):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((12, 5)).astype(np.float32)
    x[0, :] = np.nan                        # a diverged row
    x[1, 3] = np.nan                        # one NaN beside the label's score
    x[2, 0] = np.inf
    x[3, 4] = -np.inf
    labels = np.arange(12, dtype=np.int32) % 5
    for dtype in (np.float32, np.float64):
        for args in ({}, {"top_k": 5}, {"ignore_label": 1}):
            op = netrun.op("Accuracy", ["X", "L"], ["acc"], **args)
            inputs = {"X": x.astype(dtype), "L": labels}
            cpu, gpu_ = run_op(op, inputs, "cpu")[0], run_op(op, inputs, "gpu")[0]
            assert cpu == gpu_, args
            finite = np.isfinite(x).all(axis=1)
            if args.get("top_k") == 5:      # every finite row is a hit, no other row is
                counted = labels != args.get("ignore_label", -1)
                assert cpu == np.float32(finite.sum() / counted.sum())
