"""Resume checks: the settings that decide a run's trajectory must match its checkpoint's.

A checkpoint records the config it was trained with (meta["config"]). Resuming with another
batch size, optimizer setting, learning-rate policy, `iter_size`, seed or data source would
quietly continue a different run, so every difference is listed in one error unless the
caller allows changes. Settings that only schedule work (max_iter, display, snapshot,
test_interval, test_iter, test_initialization, average_loss) and where the data lives
(data.dir) or how it is tested (test_batch_size, the test part) may change freely.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from netrun.errors import CheckpointError, NetrunError
from netrun.train.config import config_from_dict

# Solver settings that change what is run when, not what a step computes.
FREE_SOLVER = frozenset({"max_iter", "display", "snapshot", "test_interval", "test_iter",
                         "test_initialization", "average_loss"})
# Data settings that do not change the training batches.
# (`workers`: any number of them makes the same batches.)
FREE_DATA = frozenset({"dir", "test_batch_size", "test", "test_count", "lazy", "workers"})
DEFAULT_BATCH_SIZE = 64          # as the trainer's default


def trajectory(raw: dict) -> dict[str, Any]:
    """The trajectory-deciding settings of a raw config, as {dotted key: value}."""
    out: dict[str, Any] = {}
    solver_raw = raw.get("solver") if isinstance(raw.get("solver"), dict) else {}
    try:   # defaults filled in and values coerced as the trainer sees them
        solver = asdict(config_from_dict({"model": "-", "solver": solver_raw}).solver)
    except NetrunError:
        solver = dict(solver_raw)          # a config an older netrun accepted: compare as is
    for key, value in solver.items():
        if key not in FREE_SOLVER:
            _flatten(out, f"solver.{key}", value)
    data = _plain(raw.get("data") if isinstance(raw.get("data"), dict) else {})
    data.setdefault("batch_size", DEFAULT_BATCH_SIZE)
    for key, value in data.items():
        if key not in FREE_DATA:
            _flatten(out, f"data.{key}", value)
    # BN statistics of the rank's shard or of the whole batch: another computation.
    out["sync_bn"] = bool(raw.get("sync_bn", False))
    return out


def differences(saved: dict, new: dict) -> list[str]:
    """One line per setting that differs between the saved and the new raw config."""
    a, b = trajectory(saved), trajectory(new)
    lines = []
    for key in sorted(a.keys() | b.keys()):
        if a.get(key, _UNSET) != b.get(key, _UNSET):
            lines.append(f"{key}: {_show(a.get(key, _UNSET))} in the checkpoint, "
                         f"{_show(b.get(key, _UNSET))} now")
    return lines


def check_resume(path: str, meta: dict, new_raw: dict, allow_changes: bool,
                 problems: list[str] = ()) -> list[str]:
    """Raise one CheckpointError listing the net's `problems` (shapes, optimizer; see
    checkpoint.compatibility_problems) and every config difference, unless there are no
    problems and allow_changes; returns the config differences."""
    saved = meta.get("config")
    # An old or foreign checkpoint may not record its config: only the net is checked then.
    changes = differences(saved, new_raw) if isinstance(saved, dict) else []
    if problems:      # the optimizer type is among them already
        changes = [c for c in changes if not c.startswith("solver.type:")]
    if problems or (changes and not allow_changes):
        lines = "\n  - ".join([*problems, *changes])
        advice = ("" if problems else "\nRestore these settings, or pass --allow-changes to "
                  "resume with the new ones (the run then differs from an uninterrupted one).")
        raise CheckpointError(f"checkpoint '{path}' does not fit this run; resuming would not "
                              f"continue the same run:\n  - {lines}{advice}")
    return changes


class _Unset:
    def __repr__(self) -> str:
        return "(not set)"


_UNSET = _Unset()


def _flatten(out: dict, key: str, value: Any) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(out, f"{key}.{k}", v)
    else:
        out[key] = _scalar(value)


def _scalar(value: Any) -> Any:
    """Numbers compare by value whatever their spelling (YAML reads `1e-3` as a string)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _plain(value: Any) -> Any:
    """JSON's view of a value (the checkpoint stores JSON): arrays become lists, tuples lists."""
    return json.loads(json.dumps(value, default=_default))


def _default(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)
    if tolist is not None:
        return tolist()
    return str(value)


def _show(value: Any) -> str:
    if value is _UNSET:
        return "(not set)"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return json.dumps(value) if not isinstance(value, str) else value
