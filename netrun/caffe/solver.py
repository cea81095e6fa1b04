"""Caffe solver prototxt -> TrainConfig, so `netrun train lenet_solver.prototxt` runs as is.

The solver's `net:` is a Caffe source-tree path (examples/mnist/lenet_train_test.prototxt):
it is looked for relative to the solver's folder, then as given, then by its basename next to
the solver. Fields netrun cannot honour are errors (all listed at once, with file:line:col);
fields that do not apply here (solver_mode, device_id, ...) become notes in
`config.raw["notes"]`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from netrun.caffe.data import data_config
from netrun.caffe.fields import Fields, Problems, Skip
from netrun.caffe.paths import candidates, find_file
from netrun.errors import ConfigError, NetrunError
from netrun.model import load_model
from netrun.ops.lr_policy import LRPolicy
from netrun.proto.textformat import parse_file
from netrun.train.config import SolverConfig, TrainConfig, check_data, check_solver

# Caffe's solver type names -> netrun's; AdaDelta has no netrun update op.
TYPES = {"SGD": "sgd", "NESTEROV": "nesterov", "ADAGRAD": "adagrad", "RMSPROP": "rmsprop",
         "ADAM": "adam"}
POLICY_KEYS = {"step": ("gamma", "stepsize"), "exp": ("gamma",), "inv": ("gamma", "power"),
               "multistep": ("gamma", "stepvalue"), "poly": ("power",),
               "sigmoid": ("gamma", "stepsize"), "fixed": ()}
IGNORED = {"solver_mode": "runs on --device instead", "device_id": "runs on --device instead",
           "debug_info": "no effect", "snapshot_format": "netrun snapshots are HDF5 (.h5)",
           "snapshot_after_train": "netrun always snapshots at the end",
           "snapshot_diff": "no effect", "test_compute_loss": "the test loss is always computed",
           "layer_wise_reduce": "no effect", "weights": "pass the weights to netrun train"}
SOLVER_HINTS = ("base_lr", "lr_policy", "max_iter", "net", "train_net", "solver_mode")


def is_solver_file(path: str | Path) -> bool:
    """Whether a .prototxt is a Caffe solver (rather than a net)."""
    try:
        msg = parse_file(path)
    except NetrunError:
        return False
    return not (msg.has("layer") or msg.has("layers")) and any(msg.has(k) for k in SOLVER_HINTS)


def solver_to_config(path: str | Path, data_override: dict | None = None,
                     weights: str | None = None) -> TrainConfig:
    """A TrainConfig for a Caffe solver file; the net's data layers give the data config
    (see netrun.caffe.data.data_config; `data_override` picks the source, e.g.
    {"source": "mnist", "split": "mnist-10k"}). `weights` (a .caffemodel to start from) is
    recorded in raw["weights"] for the caller to load after the trainer starts."""
    path = Path(path)
    msg = parse_file(path)
    problems = Problems(msg.source)
    f = Fields(msg, "solver")
    notes: list[str] = []
    try:
        net = _net_path(f, path)
        solver = _solver(f, notes)
        output = _output(f, path)
        for key, problem in check_solver(solver):   # a YAML config's ranges (momentum < 1...)
            problems.add(f"solver: {'random_seed' if key == 'seed' else key}: {problem}",
                         f.position("random_seed" if key == "seed" else key))
    except Skip as e:
        problems.add(e.problem.message, e.problem.position)
        net = solver = output = None
    for key, why in IGNORED.items():
        if f.has(key):
            notes.append(f"{key}: {f.get(key)} is ignored ({why})")
            f.ignore(key)
    for dotted, field in f.unread():
        problems.add(f"solver field '{dotted}' is not supported", field.position)
    problems.raise_if_any(f"Caffe solver {path}")
    model = load_model(net)
    data = data_config(model, data_override, path.parent)
    check_data(data)   # batch sizes >= 1, known keys for the source (as a YAML config's)
    raw = {"model": str(net), "data": _json_safe(data), "solver": vars(solver).copy(),
           "device": "cpu", "output": output, "caffe_solver": str(path), "notes": notes}
    if weights:
        raw["weights"] = str(weights)
    return TrainConfig(model=str(net), data=data, solver=solver, device="cpu", output=output,
                       raw=raw, path=str(path), batch_per_rank=True)


def _net_path(f: Fields, solver: Path) -> Path:
    """The net file: `net`, or `train_net` (with `test_net` naming the same file)."""
    net, train = f.get("net", None, "str"), f.get("train_net", None, "str")
    tests = f.get_all("test_net", "str")
    for inline in ("net_param", "train_net_param", "test_net_param"):
        if f.has(inline):
            raise f.skip(f"'{inline}' (a net inside the solver) is not supported; put the net "
                         f"in its own file and name it with 'net'", f.position(inline))
    if net and train:
        raise f.skip("give 'net' or 'train_net', not both", f.position("train_net"))
    chosen = net or train
    if not chosen:
        raise f.skip("the solver names no net ('net: \"...prototxt\"')")
    found = find_file(chosen, solver.parent)
    if found is None:
        tried = ", ".join(str(c) for c in candidates(chosen, solver.parent))
        raise f.skip(f"net '{chosen}' not found (looked at {tried})", f.position("net" if net
                                                                             else "train_net"))
    for test in tests:
        other = find_file(test, solver.parent)
        if other is None or other.resolve() != found.resolve():
            raise f.skip(f"test_net '{test}' differs from the train net; netrun takes the "
                         f"TEST phase of one net file", f.position("test_net"))
    for key in ("train_state", "test_state"):
        state = f.sub(key)
        if state.get_all("stage", "str") or state.has("level"):
            raise f.skip(f"{key} with stages or a level is not supported (netrun trains the "
                         f"net's TRAIN and TEST phases without stages)", f.position(key))
        state.ignore("phase")
    return found


def _solver(f: Fields, notes: list[str]) -> SolverConfig:
    cfg = SolverConfig()
    kind = f.get("type", None, "str") if f.has("type") else None
    legacy = f.enum("solver_type", "SGD", TYPES) if f.has("solver_type") else None
    name = (kind or legacy or "SGD").upper()
    if name == "ADADELTA":
        raise f.skip("solver type AdaDelta is not supported by netrun's solver (SGD, Nesterov, "
                     "AdaGrad, RMSProp, Adam are)", f.position("type"))
    if name not in TYPES:
        raise f.skip(f"unknown solver type '{kind}' (known: SGD, Nesterov, AdaGrad, RMSProp, "
                     f"Adam)", f.position("type"))
    cfg.type = TYPES[name]
    if not f.has("base_lr"):
        raise f.skip("the solver needs base_lr")
    cfg.base_lr = f.get("base_lr", 0.01)
    cfg.max_iter = f.get("max_iter", 0)
    cfg.momentum = f.get("momentum", 0.0)
    cfg.momentum2 = f.get("momentum2", 0.999)
    cfg.delta = f.get("delta", 1e-8)
    cfg.rms_decay = f.get("rms_decay", 0.99)
    if cfg.type in ("rmsprop", "adagrad") and cfg.momentum:
        notes.append(f"momentum {cfg.momentum} is not used by Caffe's {name} and is dropped")
        cfg.momentum = 0.0
    cfg.weight_decay = f.get("weight_decay", 0.0)
    reg = f.get("regularization_type", "L2", "str")
    if reg.upper() != "L2":
        raise f.skip(f"regularization_type '{reg}' is not supported (netrun's solver does L2 "
                     f"weight decay only)", f.position("regularization_type"))
    cfg.clip_gradients = f.get("clip_gradients", -1.0)
    cfg.iter_size = f.get("iter_size", 1)
    tests = f.get_all("test_iter", "int")
    if len(tests) > 1:
        notes.append(f"test_iter has {len(tests)} values (one per test net); netrun uses "
                     f"the first")
    cfg.test_iter = tests[0] if tests else 0
    cfg.test_interval = f.get("test_interval", 0)
    cfg.test_initialization = f.get("test_initialization", True)   # Caffe's default
    cfg.display = f.get("display", 0)
    cfg.average_loss = f.get("average_loss", 1)
    cfg.snapshot = f.get("snapshot", 0)
    seed = f.get("random_seed", -1)
    if seed < 0:
        notes.append("random_seed not set (Caffe: a random seed); netrun uses seed 1")
    cfg.seed = seed if seed >= 0 else 1
    cfg.lr_policy = _policy(f, cfg.max_iter)
    return cfg


def _policy(f: Fields, max_iter: int) -> dict[str, Any]:
    """lr_policy and its keys as the config's lr_policy mapping, validated now."""
    name = f.get("lr_policy", "fixed", "str")
    if name not in POLICY_KEYS:
        raise f.skip(f"lr_policy '{name}' is not one of {', '.join(POLICY_KEYS)}",
                     f.position("lr_policy"))
    policy: dict[str, Any] = {"type": name}
    for key in POLICY_KEYS[name]:
        if key == "stepvalue":
            policy["stepvalues"] = f.get_all("stepvalue", "int")
        elif f.has(key):
            policy[key] = f.get(key, 0.0, "float") if key != "stepsize" else f.get(key, 0)
    f.ignore("gamma", "power", "stepsize", "stepvalue")  # Caffe ignores the policy's others
    try:
        LRPolicy.from_dict(policy, base_lr=f.get("base_lr", 0.01), max_iter=max_iter or None)
    except ConfigError as e:
        raise f.skip(str(e), f.position("lr_policy")) from None
    return policy


def _output(f: Fields, solver: Path) -> str:
    """snapshot_prefix -> the run folder: runs/<last part> (examples/mnist/lenet ->
    runs/lenet), or the prefix itself when it is absolute."""
    prefix = f.get("snapshot_prefix", "", "str")
    if not prefix:
        return f"runs/{solver.stem.removesuffix('_solver')}"
    p = Path(prefix)
    return str(p) if p.is_absolute() else f"runs/{p.name or solver.stem}"


def _json_safe(value: Any) -> Any:
    """The data config for raw (checkpoint metadata is JSON): arrays become 'array NxM'."""
    try:
        json.dumps(value)
        return value
    except TypeError:
        if isinstance(value, dict):
            return {k: _json_safe(v) for k, v in value.items()}
        shape = getattr(value, "shape", None)
        return f"array {'x'.join(map(str, shape))}" if shape is not None else str(value)
