"""Shared set-up of the rewrite tests."""
from __future__ import annotations

import numpy as np


def feed_random_running_stats(model, ws, seed: int = 7) -> None:
    """Random running means and variances for every SpatialBN of a zoo model (its fresh ones
    are 0 and 1, under which a fold changes nothing measurable)."""
    stats = np.random.default_rng(seed)
    for p in model.params:
        if p.name.endswith(("_rm", "_riv")):
            c = p.shape[0]
            value = stats.uniform(0.5, 2, c) if p.name.endswith("_riv") else \
                stats.standard_normal(c) * 0.1
            ws.feed_blob(p.name, value.astype(np.float32))
