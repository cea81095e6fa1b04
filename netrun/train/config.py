"""Training configs: load, override with --set, validate into typed sections."""
from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from netrun.core.dag import EXECUTORS
from netrun.errors import ConfigError, NetrunError, suggest
from netrun.ops.lr_policy import LRPolicy
from netrun.proto.yaml_marks import MarkedDict, load_yaml, load_yaml_file, mark_of
from netrun.train.data import data_keys
from netrun.train.data.transforms import KEYS as TRANSFORM_KEYS

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
    tf32: bool = False               # GPU float32 convolutions may use TF32 tensor cores
    fuse: bool = True                # bind-time fusions (netrun.rewrite); false: nets as written
    memory_plan: bool = True         # activations share memory by lifetime (netrun.core.lifetimes)
    executor: str = "simple"         # how nets run: in order, or as a graph (netrun.core.dag)
    # data.batch_size is the whole batch of a step, split over the ranks of a data-parallel
    # job; a Caffe solver keeps Caffe's meaning instead: each rank's (GPU's) batch.
    batch_per_rank: bool = False
    # BatchNorm statistics of the whole global batch (summed over the ranks) rather than each
    # rank's shard; nothing changes on one process.
    sync_bn: bool = False
    # TensorBoard scalars (netrun.train.tensorboard): False none, True in the run folder's
    # tensorboard/, else this folder (relative to the config file, as `output` is).
    tensorboard: bool | str = False
    raw: dict = field(default_factory=dict)
    path: str | None = None


_TOP_KEYS = ("model", "data", "solver", "device", "output", "algo_search", "tf32", "fuse",
             "name", "weights", "memory_plan", "executor", "sync_bn", "tensorboard")
# Keys a config made from a Caffe solver carries for the record.
_RECORD_KEYS = ("caffe_solver", "notes")
SEED_MAX = 2**63 - 1


def set_path(cfg: dict, dotted: str, value: Any) -> None:
    """Apply one --set override: 'solver.base_lr=0.1' style, value parsed as YAML."""
    keys = dotted.split(".")
    node = cfg
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: '{k}' is not a section")
    node[keys[-1]] = value
    if isinstance(node, MarkedDict):   # the value is no longer the file's: errors name --set
        node.value_marks.pop(keys[-1], None)
        node.key_marks.pop(keys[-1], None)


def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=3' -> ('a.b', 3); the value is parsed as YAML so numbers and lists work."""
    if "=" not in text:
        raise ConfigError(f"--set '{text}': expected KEY.PATH=VALUE")
    key, value = text.split("=", 1)
    try:
        # The config reader's YAML (limits; `1e-3` is a number, as in the file).
        return key.strip(), load_yaml(value, f"--set {key.strip()}")
    except NetrunError:
        return key.strip(), value


def load_config(path: str | os.PathLike, overrides: list[str] = ()) -> TrainConfig:
    """Read a train config YAML, apply overrides, and validate it; every error names the
    file, line and column of the value at fault (or the --set that gave it)."""
    path = Path(path)
    raw = load_yaml_file(path)      # UTF-8, size, depth and alias limits: netrun.util.safe_yaml
    if raw is None:
        raw = MarkedDict()
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a train config is a mapping with model, data and solver")
    raw = copy.deepcopy(raw)
    for item in overrides:
        set_path(raw, *parse_override(item))
    return config_from_dict(raw, path)


def is_train_config(path: str | os.PathLike) -> bool:
    """Whether `path` is a train config (YAML naming a model and its data or solver), not a
    model: for commands that take a model and may be handed a config by mistake."""
    if Path(path).suffix.lower() not in (".yaml", ".yml") or not Path(path).is_file():
        return False
    try:
        raw = load_yaml_file(path)
    except NetrunError:
        return False                      # the model reader says what is wrong with it
    return (isinstance(raw, dict) and "model" in raw and not ({"layers", "ops"} & set(raw))
            and bool({"solver", "data"} & set(raw)))


def with_overrides(cfg: TrainConfig, overrides: list[str], data: dict | None = None) -> TrainConfig:
    """The config with --set overrides and a data-source override applied."""
    if not overrides and not data:
        return cfg
    raw = copy.deepcopy(cfg.raw)
    raw["model"] = cfg.model                # already resolved: keep it as it is
    raw["output"] = cfg.output
    if isinstance(cfg.tensorboard, str):    # resolved against the config's folder, as output
        raw["tensorboard"] = cfg.tensorboard
    # The live data section, not raw's record of it (a Caffe mean image is an array here).
    live = copy.deepcopy(cfg.data)
    if data:
        live = {**{k: v for k, v in (live or {}).items()
                   if k not in ("source", "split", "dir")}, **data}
    raw["data"] = live
    for item in overrides:
        set_path(raw, *parse_override(item))
    out = config_from_dict(raw, None)
    out.path = cfg.path
    return out


_MINIMAL_CONFIG = """\
    model: {model}
    data: {{source: generated, batch_size: 64, transform: {{scale: 0.00390625}}}}
    solver: {{type: sgd, base_lr: 0.01, momentum: 0.9, max_iter: 500}}
"""


def config_from_dict(raw: dict, path: Path | None = None) -> TrainConfig:
    """Validate a config mapping; relative paths resolve against the config's folder."""
    check = _Checker(f"{path}: " if path else "")
    if "model" not in raw and ("layers" in raw or "ops" in raw):
        # A model file given where a train config goes: say so, and show what one looks like.
        example = _MINIMAL_CONFIG.format(model=Path(path).name if path else "model.yaml")
        raise ConfigError(f"{path or 'this file'} is a model, not a train config. A train "
                          f"config names the model, the data and the solver, e.g.:\n"
                          f"{example}(configs/ has complete examples)")
    check.keys(raw, (*_TOP_KEYS, *_RECORD_KEYS), "", "the config", shown=_TOP_KEYS)
    if "model" not in raw:
        raise check.fail(raw, None, "", "missing 'model' (path to a .yaml, .pbtxt, .prototxt "
                                         "or .onnx model)")
    for key in ("model", "device", "output", "algo_search"):
        if key in raw and not isinstance(raw[key], (str, os.PathLike)):
            raise check.fail(raw, key, key, f"expected a string, got {raw[key]!r}")
    for key in ("fuse", "memory_plan", "tf32", "sync_bn"):
        if key in raw and not isinstance(raw[key], bool):
            raise check.fail(raw, key, key, f"expected true or false, got {raw[key]!r}")
    tensorboard = raw.get("tensorboard", False)
    if not isinstance(tensorboard, (bool, str)) or tensorboard == "":
        raise check.fail(raw, "tensorboard", "tensorboard",
                         f"expected true, false or a folder, got {tensorboard!r}")
    if "executor" in raw and raw["executor"] not in EXECUTORS:
        raise check.fail(raw, "executor", "executor", f"expected one of {', '.join(EXECUTORS)}, "
                                                      f"got {raw['executor']!r}")
    base = path.parent if path else Path.cwd()
    model = Path(expand(str(raw["model"])))
    model = Path(os.path.normpath(model if model.is_absolute() else base / model))
    solver_node = raw.get("solver")
    if solver_node is None:
        solver_node = {}
    if not isinstance(solver_node, dict):
        raise check.fail(raw, "solver", "solver", "expected a mapping of solver settings")
    solver = _solver(solver_node, check)
    data_node = raw.get("data")
    if data_node is None:
        data_node = {}
    if not isinstance(data_node, dict):
        raise check.fail(raw, "data", "data", "expected a mapping with 'source'")
    check_data(data_node, check)
    data = dict(data_node)
    if "dir" in data and isinstance(data["dir"], str):
        data["dir"] = expand(data["dir"])
    # Like the model path, a relative output folder is relative to the config file.
    output = Path(expand(str(raw.get("output", f"runs/{model.stem}"))))
    output = os.path.normpath(output if output.is_absolute() or path is None else base / output)
    if isinstance(tensorboard, str):
        folder = Path(expand(tensorboard))
        tensorboard = os.path.normpath(folder if folder.is_absolute() or path is None
                                       else base / folder)
    return TrainConfig(model=str(model), data=data, solver=solver,
                       device=str(raw.get("device", "cpu")), output=output,
                       algo_search=str(raw.get("algo_search", "heuristic")),
                       tf32=raw.get("tf32", False),
                       fuse=raw.get("fuse", True), memory_plan=raw.get("memory_plan", True),
                       executor=raw.get("executor", "simple"),
                       sync_bn=raw.get("sync_bn", False), tensorboard=tensorboard,
                       raw=raw,
                       path=str(path) if path else None)


# Value checks ---------------------------------------------------------------------------------
class _Checker:
    """Builds errors at a value's file:line:col (from yaml_marks), else naming its dotted key."""

    def __init__(self, where: str = ""):
        self.where = where

    def fail(self, node: Any, key: Any, dotted: str, message: str) -> NetrunError:
        """The error for node[key] (key None: the node itself)."""
        label = f"{dotted}: " if dotted else ""
        mark = mark_of(node, key, value=True) if key is not None else mark_of(node)
        if key is not None and isinstance(node, MarkedDict) and key not in node.value_marks:
            mark = None   # given by --set or by code: the container's line would mislead
        if mark is None:
            return ConfigError(f"{self.where}{label}{message}")
        return mark.error(f"{label}{message}")

    def keys(self, node: dict, known: tuple[str, ...] | list[str], prefix: str, what: str,
             shown: tuple[str, ...] | list[str] | None = None) -> None:
        """Refuse the first key of `node` not in `known`, with a did-you-mean hint."""
        for key in node:
            if key not in known:
                hint = suggest(str(key), known)
                listed = ", ".join(shown if shown is not None else known)
                mark = mark_of(node, key)
                if isinstance(node, MarkedDict) and key not in node.key_marks:
                    mark = None
                message = f"unknown key '{prefix}{key}' in {what}{hint} (known: {listed})"
                if mark is None:
                    raise ConfigError(f"{self.where}{message}")
                raise mark.error(message)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# Value kinds: name -> (test, what it must be, normalise)
def _int_value(v: Any) -> int | None:
    """v as an int if it is a whole number (1e4 is YAML's float 10000.0), else None."""
    if _is_int(v):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def _range(lo: float | None = None, hi: float | None = None, lo_open: bool = False,
           hi_open: bool = False) -> tuple[Callable[[float], bool], str]:
    def ok(x: float) -> bool:
        return ((lo is None or (x > lo if lo_open else x >= lo))
                and (hi is None or (x < hi if hi_open else x <= hi)))
    if lo is not None and hi is not None:
        text = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    elif lo is not None:
        text = f"{'>' if lo_open else '>='} {lo:g}"
    else:
        text = f"{'<' if hi_open else '<='} {hi:g}"
    return ok, text


# Solver key -> (kind, range or None, hint shown after a range error)
_SOLVER_RULES: dict[str, tuple[str, Any, str]] = {
    "base_lr": ("float", _range(0), "a learning rate"),
    "momentum": ("float", _range(0, 1, hi_open=True), "the share of the last update kept"),
    "momentum2": ("float", _range(0, 1, hi_open=True), "Adam's beta2"),
    "delta": ("float", _range(0, lo_open=True), "the epsilon that keeps a division finite"),
    "rms_decay": ("float", _range(0, 1, hi_open=True), "RMSProp's decay"),
    "weight_decay": ("float", _range(0), "an L2 penalty"),
    "clip_gradients": ("float", None, "a negative value turns clipping off"),
    "max_iter": ("int", _range(0), "iterations"),
    "test_interval": ("int", _range(0), "0 tests only at the end"),
    "test_iter": ("int", _range(0), "0 tests the whole test set"),
    "display": ("int", _range(0), "0 prints nothing between tests"),
    "snapshot": ("int", _range(0), "0 snapshots only at the end"),
    "iter_size": ("int", _range(1), "passes accumulated per update"),
    "average_loss": ("int", _range(1), "iterations the printed loss averages"),
    "seed": ("int", (lambda x: 0 <= x <= SEED_MAX, "between 0 and 2**63 - 1"),
             ("runs are reproducible, so pick any seed; Caffe's -1, a random seed, is not "
              "supported")),
    "test_initialization": ("bool", None, ""),
    "type": ("str", None, ""),
    "regularization_type": ("str", None, ""),
    "lr_policy": ("policy", None, ""),
}


def _value(node: dict, key: str, dotted: str, kind: str, rule: Any, hint: str,
           check: _Checker) -> Any:
    """node[key] checked against its kind and range, normalised (1e4 -> 10000)."""
    value = node[key]
    if kind == "int":
        out = _int_value(value)
        if out is None:
            raise check.fail(node, key, dotted, f"expected a whole number, got {value!r}")
    elif kind == "float":
        if not _is_num(value) or not math.isfinite(value):
            raise check.fail(node, key, dotted, f"expected a finite number, got {value!r}")
        out = float(value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise check.fail(node, key, dotted, f"expected true or false, got {value!r}")
        out = value
    elif kind == "str":
        if not isinstance(value, str):
            raise check.fail(node, key, dotted, f"expected a string, got {value!r}")
        out = value
    else:
        out = value
    if rule is not None:
        ok, text = rule
        if not ok(out):
            why = f" ({hint})" if hint else ""
            raise check.fail(node, key, dotted, f"must be {text}, got {value!r}{why}")
    return out


def _solver(section: dict, check: _Checker) -> SolverConfig:
    check.keys(section, tuple(_SOLVER_RULES), "", "solver")
    values = {key: _value(section, key, f"solver.{key}", *_SOLVER_RULES[key], check)
              for key in section}
    cfg = SolverConfig(**values)
    cfg.type = cfg.type.lower()
    if cfg.type not in SolverConfig.TYPES:
        raise check.fail(section, "type", "solver.type",
                         f"'{cfg.type}' is not one of {', '.join(SolverConfig.TYPES)}"
                         f"{suggest(cfg.type, SolverConfig.TYPES)}")
    cfg.lr_policy = _policy(section, cfg, check)
    return cfg


def _policy(section: dict, cfg: SolverConfig, check: _Checker) -> dict:
    """The lr_policy mapping, checked now (not at the first step) with LRPolicy's rules."""
    node = section.get("lr_policy", cfg.lr_policy)
    if isinstance(node, str):
        node = {"type": node}
    if not isinstance(node, dict):
        raise check.fail(section, "lr_policy", "solver.lr_policy",
                         f"expected a policy name or a mapping {{type: ..., ...}}, got {node!r}")
    for key, value in node.items():
        if value is None:   # PyYAML's `gamma:` or `gamma: null`
            raise check.fail(node, key, f"solver.lr_policy.{key}",
                             "has no value; give one or leave the key out")
    try:
        LRPolicy.from_dict(node, base_lr=cfg.base_lr, max_iter=cfg.max_iter or None)
    except ConfigError as e:
        key = getattr(e, "key", None)
        at = node if key in node else section
        message = str(e).removeprefix("lr_policy: ").replace("lr_policy '", "policy '", 1)
        raise check.fail(at, key if key in node else "lr_policy", "solver.lr_policy",
                         message) from None
    return node


def check_solver(cfg: SolverConfig) -> list[tuple[str, str]]:
    """(key, problem) for every solver value out of range; for configs not read from YAML
    (a Caffe solver) whose caller places the errors itself."""
    problems = []
    for key, (kind, rule, hint) in _SOLVER_RULES.items():
        if kind in ("policy", "str"):
            continue
        try:
            _value({key: getattr(cfg, key)}, key, key, kind, rule, hint, _Checker())
        except NetrunError as e:
            problems.append((key, str(e).removeprefix(f"{key}: ")))
    return problems


# Key -> (kind, range, hint) of the data section's numbers and flags (other keys: the source).
_DATA_RULES: dict[str, tuple[str, Any, str]] = {
    "batch_size": ("int", _range(1), "examples per step"),
    "test_batch_size": ("int", _range(1), "examples per test batch"),
    "train_count": ("int", _range(1), ""),
    "test_count": ("int", _range(1), ""),
    "num_classes": ("int", _range(1), ""),
    "seed": ("int", (lambda x: 0 <= x <= SEED_MAX, "between 0 and 2**63 - 1"), ""),
    "download": ("bool", None, ""),
    "cache": ("bool", None, ""),
    "lazy": ("bool", None, ""),
    "shuffle": ("bool", None, ""),
    "workers": ("int", _range(0), "0: read in the training process"),
    "color": ("bool", None, ""),
    "is_color": ("bool", None, ""),
    "new_height": ("int", _range(0), ""),
    "new_width": ("int", _range(0), ""),
}
_TRANSFORM_RULES: dict[str, tuple[str, Any, str]] = {
    "scale": ("float", None, ""),
    "crop_size": ("int", _range(0), "0: no crop"),
    "mirror": ("bool", None, ""),
}


def check_data(node: dict, check: _Checker | None = None) -> None:
    """Refuse unknown keys (for the source named) and bad sizes in a `data:` section."""
    check = check or _Checker()
    source = node.get("source")
    known = data_keys(source if isinstance(source, str) else None)
    if known is None:
        from netrun.train.data import SOURCES
        raise check.fail(node, "source", "data.source",
                         f"unknown data source '{source}'{suggest(str(source).lower(), SOURCES)}"
                         f" (known: {', '.join(sorted(SOURCES))})")
    what = f"data (source '{source}')" if isinstance(source, str) else "data"
    check.keys(node, known, "data.", what)
    for key in node:
        if key in _DATA_RULES and node[key] is not None:
            _value(node, key, f"data.{key}", *_DATA_RULES[key], check)
    transform = node.get("transform")
    if transform is None:
        return
    if not isinstance(transform, dict):
        raise check.fail(node, "transform", "data.transform",
                         f"expected a mapping ({', '.join(TRANSFORM_KEYS)}), got {transform!r}")
    check.keys(transform, TRANSFORM_KEYS, "data.transform.", "data.transform")
    for key in transform:
        if key in _TRANSFORM_RULES:
            _value(transform, key, f"data.transform.{key}", *_TRANSFORM_RULES[key], check)
