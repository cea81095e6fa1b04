"""Learning-rate policies vs Caffe's formulas written out by hand, and config validation."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from netrun.errors import ConfigError
from netrun.ops.lr_policy import LRPolicy, lr_at


@pytest.mark.parametrize("cfg, expected", [
    ({"type": "fixed", "base_lr": 0.1}, {0: 0.1, 1: 0.1, 10**6: 0.1}),
    # step: base * gamma ^ floor(it / stepsize); changes exactly at multiples of stepsize
    ({"type": "step", "base_lr": 0.1, "gamma": 0.5, "stepsize": 100},
     {0: 0.1, 99: 0.1, 100: 0.05, 199: 0.05, 200: 0.025, 1000: 0.1 * 0.5**10}),
    # multistep: base * gamma ^ (number of stepvalues <= it); the boundary itself is stepped
    ({"type": "multistep", "base_lr": 0.01, "gamma": 0.1, "stepvalues": [5, 8]},
     {0: 0.01, 4: 0.01, 5: 0.001, 7: 0.001, 8: 1e-4, 100: 1e-4}),
    # exp: base * gamma ^ it
    ({"type": "exp", "base_lr": 0.2, "gamma": 0.99}, {0: 0.2, 1: 0.198, 10: 0.2 * 0.99**10}),
    # inv: base * (1 + gamma * it) ^ -power (LeNet's solver)
    ({"type": "inv", "base_lr": 0.01, "gamma": 1e-4, "power": 0.75},
     {0: 0.01, 100: 0.01 * 1.01**-0.75, 10000: 0.01 * 2.0**-0.75}),
    # poly: base * (1 - it / max_iter) ^ power; 0 at and past max_iter
    ({"type": "poly", "base_lr": 0.1, "power": 2.0, "max_iter": 100},
     {0: 0.1, 50: 0.025, 90: 0.1 * 0.1**2, 100: 0.0, 150: 0.0}),
    # sigmoid: base / (1 + exp(-gamma * (it - stepsize))); half the rate at it = stepsize
    ({"type": "sigmoid", "base_lr": 0.1, "gamma": -0.1, "stepsize": 50},
     {50: 0.05, 0: 0.1 / (1 + math.exp(-5.0)), 100: 0.1 / (1 + math.exp(5.0)),
      10**6: 0.0}),
])
def test_policy_matches_caffe_formula(cfg, expected):
    policy = LRPolicy.from_dict(cfg)
    for it, lr in expected.items():
        assert lr_at(policy, it) == pytest.approx(lr, rel=1e-12, abs=1e-300), f"iteration {it}"
        assert lr_at(cfg, it) == lr_at(policy, it)


def test_sigmoid_does_not_overflow_far_from_the_step():
    p = LRPolicy.from_dict({"type": "sigmoid", "base_lr": 1.0, "gamma": 1.0, "stepsize": 0})
    assert lr_at(p, 10**6) == 1.0
    p = LRPolicy.from_dict({"type": "sigmoid", "base_lr": 1.0, "gamma": -1.0, "stepsize": 0})
    assert lr_at(p, 10**6) == 0.0


def test_linear_warmup_multiplies_the_policy():
    cfg = {"type": "step", "base_lr": 0.1, "gamma": 0.5, "stepsize": 4, "warmup_iters": 4,
           "warmup_start": 0.2}
    # warm-up factor: 0.2 + 0.8 * it / 4 while it < 4, then 1
    expected = {0: 0.1 * 0.2, 1: 0.1 * 0.4, 2: 0.1 * 0.6, 3: 0.1 * 0.8, 4: 0.05, 8: 0.025}
    for it, lr in expected.items():
        assert lr_at(cfg, it) == pytest.approx(lr, rel=1e-12), f"iteration {it}"


@settings(max_examples=20, deadline=None)
@given(base=st.floats(1e-4, 1.0), gamma=st.floats(0.01, 1.0), stepsize=st.integers(1, 50),
       it=st.integers(0, 10**5))
def test_step_is_piecewise_constant(base, gamma, stepsize, it):
    p = LRPolicy.from_dict({"type": "step", "gamma": gamma, "stepsize": stepsize}, base_lr=base)
    k = it // stepsize
    assert lr_at(p, it) == lr_at(p, k * stepsize) == pytest.approx(base * gamma**k, rel=1e-9)


def test_defaults_fill_only_missing_keys():
    p = LRPolicy.from_dict({"type": "poly", "power": 1.0, "base_lr": 0.5},
                           base_lr=0.01, max_iter=10)
    assert (p.base_lr, p.max_iter) == (0.5, 10)
    assert LRPolicy.from_dict({"policy": "fixed"}, base_lr=0.3).base_lr == 0.3
    assert LRPolicy.from_dict({"type": "STEP", "gamma": 1, "stepsize": 2.0}).stepsize == 2


@pytest.mark.parametrize("cfg, match", [
    ({"type": "stpe", "gamma": 0.1, "stepsize": 10}, "unknown policy 'stpe', did you mean 'step'"),
    ({"type": "step", "gamma": 0.1}, "'step' needs 'stepsize'"),
    ({"type": "step", "stepsize": 10}, "'step' needs 'gamma'"),
    ({"type": "multistep", "gamma": 0.1}, "needs 'stepvalues'"),
    ({"type": "poly", "power": 1.0}, "needs 'max_iter'"),
    ({"type": "inv", "gamma": 0.1}, "needs 'power'"),
    ({"type": "fixed", "gama": 0.1}, "unknown key 'gama', did you mean 'gamma'"),
    ({"type": "step", "gamma": 0.1, "stepsize": 0}, "stepsize must be > 0"),
    ({"type": "step", "gamma": 0.1, "stepsize": 2.5}, "'stepsize' must be an integer"),
    ({"type": "exp", "gamma": "fast"}, "'gamma' must be a number"),
    ({"type": "multistep", "gamma": 0.1, "stepvalues": [8, 5]}, "must be increasing"),
    ({"type": "fixed", "base_lr": -0.1}, "base_lr must be >= 0"),
    ({"type": "fixed", "warmup_iters": 5, "warmup_start": 1.5}, "warmup_start"),
    ({"type": "fixed", "policy": "step"}, "not both"),
])
def test_bad_configs_raise_config_error(cfg, match):
    with pytest.raises(ConfigError, match=match):
        LRPolicy.from_dict(cfg)
