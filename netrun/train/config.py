"""Training configs: load, override with --set, validate into typed sections."""
from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from netrun.errors import ConfigError, ParseError, suggest

_ENV = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def expand(text: str) -> str:
    """Expand ${VAR} and ${VAR:-default}, then ~."""
    def sub(m):
        return os.environ.get(m.group(1)) or (m.group(2) or "")
    return os.path.expanduser(_ENV.sub(sub, text))


@dataclass
class SolverConfig:
    """The solver section: optimizer, learning-rate policy, schedule of tests and snapshots."""

    type: str = "sgd"                # sgd | nesterov | adam | adagrad | rmsprop
    base_lr: float = 0.01
    momentum: float = 0.9            # also Adam's beta1
    momentum2: float = 0.999         # Adam's beta2
    delta: float = 1e-8              # epsilon of Adam/Adagrad/RMSProp
    rms_decay: float = 0.99
    weight_decay: float = 0.0
    regularization_type: str = "L2"
    lr_policy: dict = field(default_factory=lambda: {"type": "fixed"})
    max_iter: int = 1000
    test_interval: int = 0           # 0: test only at the end
    test_iter: int = 0               # 0: the whole test set
    test_initialization: bool = False
    display: int = 20
    snapshot: int = 0
    iter_size: int = 1
    clip_gradients: float = -1.0
    seed: int = 1
    average_loss: int = 1

    TYPES = ("sgd", "nesterov", "adam", "adagrad", "rmsprop")


@dataclass
class TrainConfig:
    """A whole train config, with paths resolved against the config file's folder."""

    model: str
    data: dict
    solver: SolverConfig
    device: str = "cpu"
    output: str = "runs/run"
    algo_search: str = "heuristic"
    raw: dict = field(default_factory=dict)
    path: str | None = None


_TOP_KEYS = {"model", "data", "solver", "device", "output", "algo_search", "name", "weights"}
# Keys a config made from a Caffe solver carries for the record.
_RECORD_KEYS = {"caffe_solver", "notes"}


def set_path(cfg: dict, dotted: str, value: Any) -> None:
    """Apply one --set override: 'solver.base_lr=0.1' style, value parsed as YAML."""
    keys = dotted.split(".")
    node = cfg
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: '{k}' is not a section")
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=3' -> ('a.b', 3); the value is parsed as YAML so numbers and lists work."""
    if "=" not in text:
        raise ConfigError(f"--set '{text}': expected KEY.PATH=VALUE")
    key, value = text.split("=", 1)
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        return key.strip(), value


def load_config(path: str | os.PathLike, overrides: list[str] = ()) -> TrainConfig:
    """Read a train config YAML, apply overrides, and validate it."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config '{path}': {e.strerror}") from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        lines = text.splitlines()
        raise ParseError(str(e.problem), str(path), mark.line + 1, mark.column + 1,
                         lines[mark.line] if mark.line < len(lines) else None) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a train config is a mapping with model, data and solver")
    raw = copy.deepcopy(raw)
    for item in overrides:
        set_path(raw, *parse_override(item))
    return config_from_dict(raw, path)


def with_overrides(cfg: TrainConfig, overrides: list[str], data: dict | None = None) -> TrainConfig:
    """The config with --set overrides and a data-source override applied."""
    if not overrides and not data:
        return cfg
    raw = copy.deepcopy(cfg.raw)
    raw["model"] = cfg.model                # already resolved: keep it as it is
    raw["output"] = cfg.output
    # The live data section, not raw's record of it (a Caffe mean image is an array here).
    raw["data"] = copy.deepcopy(cfg.data)
    if data:
        raw["data"] = {**{k: v for k, v in (raw.get("data") or {}).items()
                          if k not in ("source", "split", "dir")}, **data}
    for item in overrides:
        set_path(raw, *parse_override(item))
    out = config_from_dict(raw, None)
    out.path = cfg.path
    return out


def config_from_dict(raw: dict, path: Path | None = None) -> TrainConfig:
    """Validate a config mapping; relative paths resolve against the config's folder."""
    where = f"{path}: " if path else ""
    for key in raw:
        if key not in _TOP_KEYS | _RECORD_KEYS:
            raise ConfigError(f"{where}unknown key '{key}'{suggest(key, _TOP_KEYS)}")
    if "model" not in raw:
        raise ConfigError(f"{where}missing 'model' (path to a .yaml, .pbtxt or .prototxt model)")
    base = path.parent if path else Path.cwd()
    model = Path(expand(str(raw["model"])))
    model = Path(os.path.normpath(model if model.is_absolute() else base / model))
    solver = _solver(raw.get("solver") or {}, where)
    data = dict(raw.get("data") or {})
    if "dir" in data and isinstance(data["dir"], str):
        data["dir"] = expand(data["dir"])
    # Like the model path, a relative output folder is relative to the config file.
    output = Path(expand(str(raw.get("output", f"runs/{model.stem}"))))
    output = os.path.normpath(output if output.is_absolute() or path is None else base / output)
    return TrainConfig(model=str(model), data=data, solver=solver,
                       device=str(raw.get("device", "cpu")), output=output,
                       algo_search=str(raw.get("algo_search", "heuristic")), raw=raw,
                       path=str(path) if path else None)


def _solver(section: dict, where: str) -> SolverConfig:
    known = {f.name: f for f in fields(SolverConfig)}
    values = {}
    for key, value in section.items():
        if key not in known:
            raise ConfigError(f"{where}solver: unknown key '{key}'{suggest(key, known)}")
        f = known[key]
        default = f.default if f.default is not f.default_factory else None  # type: ignore[misc]
        values[key] = _coerce(f"solver.{key}", value, f.type, default)
    cfg = SolverConfig(**values)
    cfg.type = cfg.type.lower()
    if cfg.type not in SolverConfig.TYPES:
        raise ConfigError(f"{where}solver.type '{cfg.type}' is not one of "
                          f"{', '.join(SolverConfig.TYPES)}{suggest(cfg.type, SolverConfig.TYPES)}")
    if isinstance(cfg.lr_policy, str):
        cfg.lr_policy = {"type": cfg.lr_policy}
    if cfg.iter_size < 1 or cfg.max_iter < 0:
        raise ConfigError(f"{where}solver: iter_size must be >= 1 and max_iter >= 0")
    return cfg


def _coerce(key: str, value: Any, type_name: str, default: Any) -> Any:
    try:
        if type_name == "float":
            return float(value)
        if type_name == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if type_name == "bool":
            return bool(value)
        if type_name == "str":
            return str(value)
        if type_name == "dict":
            if isinstance(value, (dict, str)):
                return value
            raise ValueError
    except (TypeError, ValueError):
        pass
    else:
        return value
    raise ConfigError(f"{key}: expected {type_name}, got {value!r}")
