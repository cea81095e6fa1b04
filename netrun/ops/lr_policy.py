"""Learning-rate policies: Caffe's formulas as pure host math on the iteration number.

`LRPolicy` is a validated description (built from a config dict); `lr_at(policy, it)` is the
positive learning rate at iteration `it`. The `LearningRate` operator calls it and stores the
negated value, Caffe2's convention, so that update ops add lr * grad.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from netrun.errors import ConfigError, suggest

POLICIES = ("fixed", "step", "multistep", "exp", "inv", "poly", "sigmoid")

# The keys each policy cannot do without (Caffe reads them unchecked, we say what is missing).
_NEEDS: dict[str, tuple[str, ...]] = {
    "fixed": (),
    "step": ("gamma", "stepsize"),
    "multistep": ("gamma", "stepvalues"),
    "exp": ("gamma",),
    "inv": ("gamma", "power"),
    "poly": ("power", "max_iter"),
    "sigmoid": ("gamma", "stepsize"),
}


@dataclass(frozen=True)
class LRPolicy:
    """A learning-rate schedule: base_lr times a policy multiplier times a linear warm-up."""

    type: str = "fixed"
    base_lr: float = 0.01
    gamma: float | None = None
    stepsize: int | None = None
    stepvalues: tuple[int, ...] = ()
    power: float | None = None
    max_iter: int | None = None
    warmup_iters: int = 0
    # The warm-up multiplier at iteration 0; it rises linearly to 1 at warmup_iters.
    warmup_start: float = 0.0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                object.__setattr__(self, f.name, _coerce(f.name, value))
        _validate(self)

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any], **defaults: Any) -> "LRPolicy":
        """Build from a config mapping; `defaults` fill keys it lacks (base_lr, max_iter).

        The policy name is read from `type` (train configs) or `policy` (LearningRate args).
        """
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in cfg.items():
            name = "type" if key == "policy" else key
            if name not in known:
                raise _error(f"lr_policy: unknown key '{key}'{suggest(key, known)} "
                             f"(known: {', '.join(sorted(known))})", key)
            if name in values:
                raise _error("lr_policy: give the policy as 'type' or 'policy', not both", key)
            if value is not None:   # (a config's `gamma: null` is refused by its reader)
                values[name] = value
        for key, value in defaults.items():
            if key not in known:
                raise ConfigError(f"lr_policy: unknown default '{key}'{suggest(key, known)}")
            if value is not None:
                values.setdefault(key, value)
        return cls(**values)

    def multiplier(self, it: int) -> float:
        """The factor base_lr is multiplied by at iteration `it` (warm-up included)."""
        return _policy_factor(self, it) * _warmup_factor(self, it)


def lr_at(policy: LRPolicy | Mapping[str, Any], it: int) -> float:
    """The (positive) learning rate at iteration `it`, as Caffe's solver computes it."""
    if not isinstance(policy, LRPolicy):
        policy = LRPolicy.from_dict(policy)
    return policy.base_lr * policy.multiplier(int(it))


def _policy_factor(p: LRPolicy, it: int) -> float:
    t = p.type
    if t == "fixed":
        return 1.0
    if t == "step":
        # base * gamma ^ floor(it / stepsize)
        return p.gamma ** (it // p.stepsize)
    if t == "multistep":
        # base * gamma ^ (number of stepvalues <= it): the step applies at the boundary itself
        return p.gamma ** sum(1 for s in p.stepvalues if s <= it)
    if t == "exp":
        # base * gamma ^ it
        return p.gamma ** it
    if t == "inv":
        # base * (1 + gamma * it) ^ (-power)
        return (1.0 + p.gamma * it) ** (-p.power)
    if t == "poly":
        # base * (1 - it / max_iter) ^ power; clamped at 0 past max_iter, where Caffe's
        # formula would raise a negative number to a fractional power (Caffe stops there).
        return max(0.0, 1.0 - it / p.max_iter) ** p.power
    if t == "sigmoid":
        # base * 1 / (1 + exp(-gamma * (it - stepsize))), written so exp never overflows
        z = -p.gamma * (it - p.stepsize)
        if z > 0:
            e = math.exp(-z)
            return e / (1.0 + e)
        return 1.0 / (1.0 + math.exp(z))
    raise AssertionError(t)  # _validate rejects every other name


def _warmup_factor(p: LRPolicy, it: int) -> float:
    # Caffe2's linearWarmup: start + (1 - start) * it / warmup_iters, then 1.
    if it >= p.warmup_iters:
        return 1.0
    return p.warmup_start + (1.0 - p.warmup_start) * it / p.warmup_iters


_INT_KEYS = ("stepsize", "max_iter", "warmup_iters")
_FLOAT_KEYS = ("base_lr", "gamma", "power", "warmup_start")


def _error(message: str, key: str | None = None) -> ConfigError:
    """A ConfigError that remembers the key at fault, so a config reader can point at it."""
    error = ConfigError(message)
    error.key = key   # type: ignore[attr-defined]
    return error


def _coerce(key: str, value: Any) -> Any:
    bad = _error(f"lr_policy: '{key}' must be {_KIND.get(key, 'a string')}, got {value!r}",
                 key)
    if key == "type":
        if not isinstance(value, str):
            raise bad
        return value.lower()
    if key == "stepvalues":
        items = value if isinstance(value, (list, tuple)) else [value]
        return tuple(_as_int(v, bad) for v in items)
    if key in _INT_KEYS:
        return _as_int(value, bad)
    if isinstance(value, str):
        # PyYAML (YAML 1.1) reads `1e-3` as a string; the solver section accepts it too.
        try:
            value = float(value)
        except ValueError:
            raise bad from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad
    return float(value)


_KIND = {**{k: "an integer" for k in _INT_KEYS}, **{k: "a number" for k in _FLOAT_KEYS},
         "stepvalues": "a list of integers"}


def _as_int(value: Any, bad: ConfigError) -> int:
    if isinstance(value, bool):
        raise bad
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise bad


def _validate(p: LRPolicy) -> None:
    if p.type not in POLICIES:
        raise _error(f"lr_policy: unknown policy '{p.type}'{suggest(p.type, POLICIES)} "
                     f"(known: {', '.join(POLICIES)})", "type")
    for key in _NEEDS[p.type]:
        if getattr(p, key) in (None, ()):
            raise _error(f"lr_policy '{p.type}' needs '{key}'", "type")
    if p.base_lr < 0:
        raise _error(f"lr_policy: base_lr must be >= 0, got {p.base_lr} (netrun negates "
                     f"it for the update ops; do not pass Caffe2's negative rate)", "base_lr")
    # A negative gamma flips the rate's sign (step, exp) or takes a negative number to a
    # fractional power (inv); only sigmoid uses its sign (a falling curve).
    if p.type in ("step", "multistep", "exp") and p.gamma <= 0:
        raise _error(f"lr_policy '{p.type}': gamma must be > 0, got {p.gamma}", "gamma")
    if p.type == "inv" and p.gamma < 0:
        raise _error(f"lr_policy 'inv': gamma must be >= 0, got {p.gamma}", "gamma")
    if p.type == "poly" and p.power < 0:
        raise _error(f"lr_policy 'poly': power must be >= 0, got {p.power}", "power")
    if p.type == "step" and p.stepsize <= 0:
        raise _error(f"lr_policy 'step': stepsize must be > 0, got {p.stepsize}", "stepsize")
    if p.type == "poly" and p.max_iter <= 0:
        raise _error(f"lr_policy 'poly': max_iter must be > 0, got {p.max_iter}", "max_iter")
    if p.type == "multistep" and list(p.stepvalues) != sorted(p.stepvalues):
        raise _error(f"lr_policy 'multistep': stepvalues must be increasing, "
                     f"got {list(p.stepvalues)}", "stepvalues")
    if p.warmup_iters < 0:
        raise _error(f"lr_policy: warmup_iters must be >= 0, got {p.warmup_iters}",
                     "warmup_iters")
    if not 0.0 <= p.warmup_start <= 1.0:
        raise _error(f"lr_policy: warmup_start must be in [0, 1], got {p.warmup_start}",
                     "warmup_start")
