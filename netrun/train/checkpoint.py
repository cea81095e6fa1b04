"""Checkpoints: one HDF5 file written by a Save op, validated before a Load op reads it.

Layout (groups of the file):
    params/<name>      every parameter, running statistics included
    optimizer/<name>   optimizer state (momentum, Adam moments, Adagrad history, ...)
    state/iter         the iteration counter
    meta/*             JSON: netrun version, iteration, config, nets as NetDef text,
                       model inputs/outputs, solver type, parameter shapes, RNG states,
                       data-loader position, learning rate, best test accuracy
Nothing in the file is ever executed (no pickle): nets are text, metadata is JSON.

A checkpoint is data, never code. A file may come from anyone, so reading one trusts nothing:
- the HDF5 reader (core/db.py) refuses links, virtual and external datasets, missing CRCs,
  non-numeric dtypes and datasets larger than the file before reading any data;
- read_info checks the type of every meta entry it knows and that each listed blob is stored
  with the shape meta gives it, so later code never meets a hostile value it did not expect;
- a stored net (CheckpointInfo.net) is checked against an allow-list before anyone runs it:
  every op must have a schema of a pure-compute family (_COMPUTE_FAMILIES; the 'db' family of
  Save and Load, or any family added later, is refused until added here on purpose), take
  no argument that names a file, and pass its schema's checks; blob names must be short
  printable strings. We check rather than rebuild the nets from the stored config because
  the model file a config names is often gone (or moved) when a checkpoint is used.
Whatever fails is one CheckpointError naming the file and listing every problem.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import netrun.ops  # noqa: F401  the op schemas that stored nets are checked against
from netrun.core.db import open_db
from netrun.core.schema import TensorSpec, get_schema
from netrun.errors import CheckpointError, NetrunError
from netrun.model.model import Model, Param
from netrun.proto.defs import NetDef, op
from netrun.proto.pbtxt import netdef_from_text
from netrun.util.atomic import discard, publish, temp_path_beside
from netrun.version import __version__


@dataclass
class CheckpointInfo:
    """What a checkpoint says about itself (meta/*), without the arrays."""

    path: str
    meta: dict[str, Any]
    params: list[str]
    optimizer: list[str]
    shapes: dict[str, list[int]]

    @property
    def iteration(self) -> int:
        return int(self.meta.get("iteration", 0))

    def net(self, which: str) -> NetDef:
        """A net stored in the checkpoint (init, step, update, test, predict), checked safe
        to run."""
        nets = self.meta.get("nets", {})
        if which not in nets:
            raise CheckpointError(f"checkpoint '{self.path}' holds no '{which}' net "
                                  f"(it has: {', '.join(sorted(nets)) or 'none'})")
        try:
            net = netdef_from_text(nets[which], f"{self.path}:{which}")
        except NetrunError as e:
            raise CheckpointError(f"checkpoint '{self.path}': its '{which}' net does not "
                                  f"parse: {e}") from None
        problems = net_problems(net) or self._fill_problems(net)
        if problems:
            raise CheckpointError(f"checkpoint '{self.path}': its '{which}' net is refused "
                                  f"(a checkpoint's nets may only compute):\n  - "
                                  + "\n  - ".join(problems))
        return net

    def _fill_problems(self, net: NetDef) -> list[str]:
        # Fillers allocate what their arguments say; in a netrun net each fills a blob that
        # the checkpoint stores, so none may be larger than the largest of those.
        largest = max((_size(s) for s in self.shapes.values()), default=1)
        problems = []
        for o in net.ops:
            if not o.type.endswith("Fill"):
                continue
            if o.args.get("input_as_shape"):
                problems.append(f"op {o.label}: input_as_shape (netrun never writes it)")
            elif _size(o.args.get("shape") or []) > max(largest, 1):
                problems.append(f"op {o.label}: fills {_size(o.args['shape']):,} elements, "
                                f"more than any blob the checkpoint stores")
        return problems


def _size(shape) -> int:
    n = 1      # Python ints: no overflow however large the dimensions
    for d in shape if isinstance(shape, list) else [shape]:
        n *= abs(d) if isinstance(d, int) else 1
    return n


# Operator families a stored net may use: computation on blobs in memory, nothing else.
_COMPUTE_FAMILIES = frozenset({
    "activation", "caffe_ops", "conv", "dropout", "elementwise", "fc", "fill", "loss",
    "metrics", "movement", "norm", "optimizers", "pool", "reduce", "reshape", "softmax",
    "solver_ops", "unary"})
# A second guard for an I/O op that lands in a compute family by mistake.
_FILE_ARGS = frozenset({"db", "db_type", "path", "file", "filename", "files", "dir", "folder",
                        "directory", "url", "source", "output", "attrs"})
_MAX_NAME = 1024


def net_problems(net: NetDef) -> list[str]:
    """Why a stored net may not run: unknown or file-touching ops, bad args, odd blob names."""
    problems: list[str] = []
    names = [*net.external_inputs, *net.external_outputs]
    for o in net.ops:
        names += [*o.inputs, *o.outputs]
        try:
            schema = get_schema(o.type)
        except NetrunError:
            problems.append(f"op {o.label}: unknown op type '{o.type}'")
            continue
        files = sorted(set(o.args) & _FILE_ARGS | {a.name for a in schema.args} & _FILE_ARGS)
        if schema.family not in _COMPUTE_FAMILIES or files:
            problems.append(f"op {o.label}: '{o.type}' ({schema.family or 'no'} family"
                            f"{', arguments ' + ', '.join(files) if files else ''}) is not "
                            f"a compute op")
            continue
        try:
            schema.verify(o)
        except NetrunError as e:
            problems.append(str(e))
    bad = sorted({n for n in names if not _sane_name(n)})
    if net.name and not _sane_name(net.name):
        problems.append("the net's name is too long or holds control characters")
    if bad:
        problems.append(f"blob names that are empty, too long or hold control characters: "
                        f"{', '.join(repr(n[:40]) for n in bad[:10])}")
    return problems


def _sane_name(name) -> bool:
    return (isinstance(name, str) and 0 < len(name) <= _MAX_NAME and name.isprintable())


def write_checkpoint(ws, path: str | os.PathLike, params: list[str], optimizer: list[str],
                     state: list[str], meta: dict[str, Any]) -> None:
    """Save blobs and metadata atomically (a crash leaves the previous file intact)."""
    blobs = params + optimizer + state
    groups = ["params"] * len(params) + ["optimizer"] * len(optimizer) + ["state"] * len(state)
    shapes = {b: list(ws.get_blob(b).shape) for b in blobs}
    meta = {**meta, "netrun_version": __version__, "shapes": shapes,
            "params": params, "optimizer_blobs": optimizer, "state_blobs": state}
    ws.run_operator_once(op("Save", blobs, [], db=str(path), db_type="h5", groups=groups,
                            attrs=json.dumps(meta, default=_json_default)))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def read_info(path: str | os.PathLike) -> CheckpointInfo:
    """Open a checkpoint and read its metadata (validates format, integrity and meta types)."""
    with open_db(path, "r") as db:
        meta = {}
        for key in db.keys("meta"):
            meta[key] = db.get_json(f"meta/{key}")
        for group in ("params", "state"):
            if not db.keys(group):
                raise CheckpointError(f"checkpoint '{path}' has no {group} (not a netrun "
                                      f"checkpoint?)")
        problems = meta_problems(meta)
        if not problems:
            problems = _stored_shape_problems(db, meta)
    if problems:
        raise CheckpointError(f"checkpoint '{path}' has invalid metadata (corrupt or not "
                              f"written by netrun):\n  - " + "\n  - ".join(problems))
    return CheckpointInfo(str(path), meta, list(meta.get("params", [])),
                          list(meta.get("optimizer_blobs", [])), meta.get("shapes", {}))


def _is_int(value, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_strs(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_dims(value) -> bool:
    return isinstance(value, list) and len(value) <= 32 and all(_is_int(d) for d in value)


def _is_input(value) -> bool:
    # None (shape unknown) or [example dims, dtype name].
    return value is None or (isinstance(value, list) and len(value) == 2 and _is_dims(value[0])
                             and isinstance(value[1], str) and value[1] in _DTYPES)


_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
# meta key -> (test, what it must be); keys a netrun version never wrote are kept unchecked.
_META = {
    "iteration": (_is_int, "an integer >= 0"),
    "nets": (lambda v: isinstance(v, dict) and all(isinstance(t, str) for t in v.values()),
             "a mapping of net names to NetDef text"),
    "shapes": (lambda v: isinstance(v, dict) and all(_is_dims(d) for d in v.values()),
               "a mapping of blob names to lists of sizes >= 0"),
    "params": (_is_strs, "a list of blob names"),
    "optimizer_blobs": (_is_strs, "a list of blob names"),
    "state_blobs": (_is_strs, "a list of blob names"),
    "solver_type": (lambda v: v is None or isinstance(v, str), "a string"),
    "config": (lambda v: v is None or isinstance(v, dict), "a mapping"),
    "model": (lambda v: isinstance(v, dict), "a mapping"),
    "rng": (lambda v: isinstance(v, dict), "a mapping"),
    "lr": (lambda v: v is None or _is_number(v), "a number"),
    "best_accuracy": (_is_number, "a number"),
    "device": (lambda v: isinstance(v, str), "a string"),
    "netrun_version": (lambda v: isinstance(v, str), "a string"),
    "classes": (lambda v: v is None or _is_strs(v), "a list of class names"),
}
_MODEL = {
    "name": (lambda v: isinstance(v, str), "a string"),
    "inputs": (lambda v: isinstance(v, dict) and all(_is_input(i) for i in v.values()),
               "a mapping of input names to [dims, dtype] or null"),
    "labels": (_is_strs, "a list of blob names"),
    "outputs": (_is_strs, "a list of blob names"),
    "loss": (lambda v: v is None or isinstance(v, str), "a blob name"),
    "metrics": (_is_strs, "a list of blob names"),
}


def meta_problems(meta: dict[str, Any]) -> list[str]:
    """What is wrong with the types of a checkpoint's meta entries (empty when nothing)."""
    problems = [f"meta/{key} must be {what}" for key, (ok, what) in _META.items()
                if key in meta and not ok(meta[key])]
    for key in ("params", "shapes"):
        if key not in meta:
            problems.append(f"meta/{key} is missing")
    model = meta.get("model")
    if isinstance(model, dict):
        problems += [f"meta/model.{key} must be {what}" for key, (ok, what) in _MODEL.items()
                     if key in model and not ok(model[key])]
    if not problems:
        shapes = meta["shapes"]
        listed = [*meta["params"], *meta.get("optimizer_blobs", []), *meta.get("state_blobs", [])]
        unshaped = [n for n in listed if n not in shapes]
        if unshaped:
            problems.append(f"meta/shapes lacks {', '.join(unshaped[:10])}")
    return problems


def _stored_shape_problems(db, meta: dict[str, Any]) -> list[str]:
    """Blobs that meta lists but the file lacks, or stores with another shape."""
    problems = []
    for group, key in (("params", "params"), ("optimizer", "optimizer_blobs"),
                       ("state", "state_blobs")):
        for name in meta.get(key, []):
            stored = db.shape(f"{group}/{name}")
            want = tuple(meta["shapes"][name])
            if stored is None:
                problems.append(f"{group}/{name} is listed in meta but not stored")
            elif stored != want:
                problems.append(f"{group}/{name} is stored as {_dims(stored)}, meta says "
                                f"{_dims(want)}")
    return problems


def check_compatible(info: CheckpointInfo, ws, params: list[str], optimizer: list[str],
                     solver_type: str | None) -> None:
    """List every mismatch between the checkpoint and the nets at once, or return."""
    problems = compatibility_problems(info, ws, params, optimizer, solver_type)
    if problems:
        raise CheckpointError(f"checkpoint '{info.path}' does not fit this net:\n  - "
                              + "\n  - ".join(problems))


def compatibility_problems(info: CheckpointInfo, ws, params: list[str], optimizer: list[str],
                           solver_type: str | None) -> list[str]:
    """Every mismatch of optimizer type, blob names and shapes, one line each."""
    problems = []
    saved_type = info.meta.get("solver_type")
    if solver_type is not None and saved_type is not None and saved_type != solver_type:
        problems.append(f"optimizer: checkpoint was trained with '{saved_type}', the config "
                        f"uses '{solver_type}'")
    for name in params + optimizer:
        if name not in info.shapes:
            problems.append(f"'{name}' is missing from the checkpoint")
            continue
        want = list(ws.get_blob(name).shape) if ws.has_blob(name) else None
        if want is not None and list(info.shapes[name]) != want:
            problems.append(f"'{name}': checkpoint has {_dims(info.shapes[name])}, the net has "
                            f"{_dims(want)}")
    extra = [n for n in info.params if n not in params]
    if extra:
        problems.append(f"the checkpoint has parameters the net lacks: {', '.join(extra)}")
    return problems


def model_from_checkpoint(path: str | os.PathLike) -> Model:
    """The model a checkpoint stores: its nets (checked safe), inputs and parameter shapes.

    A checkpoint keeps the training step (forward and backward), not the forward training
    net, so the model's train net is the test net: forward in test mode, loss and metrics.
    """
    if not Path(path).is_file():
        raise CheckpointError(f"no such checkpoint: {path}")
    info = read_info(path)
    meta = info.meta.get("model", {})
    inputs = {n: None if v is None else TensorSpec(tuple(v[0]), v[1])
              for n, v in (meta.get("inputs") or {}).items()}
    params = [Param(n, tuple(info.shapes[n]) if n in info.shapes else None)
              for n in info.params]
    test = info.net("test")
    return Model(name=meta.get("name", Path(path).stem), init_net=info.net("init"),
                 train_net=test, test_net=test, predict_net=info.net("predict"),
                 inputs=inputs, params=params, outputs=list(meta.get("outputs", [])),
                 loss=meta.get("loss"), metrics=list(meta.get("metrics", [])),
                 source_path=str(path), labels=list(meta.get("labels", [])))


def load_blobs(ws, path: str | os.PathLike, names: list[str], group: str) -> None:
    """Load the named blobs of one group onto the workspace's device."""
    if names:
        ws.run_operator_once(op("Load", [], names, db=str(path), db_type="h5",
                                groups=[group] * len(names)))


def link_or_copy(src: Path, dst: Path) -> None:
    """Make dst a second name for src, atomically (hard link, else copy), replacing dst."""
    # The atomic writer's temporary names, so that a kill's leftover is recognised and
    # removed by the next run in the folder (netrun.train.run_folder).
    tmp = temp_path_beside(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        publish(tmp, dst)
    except BaseException:
        discard(tmp)
        raise


def _dims(shape) -> str:
    return "×".join(map(str, shape)) if shape else "scalar"
