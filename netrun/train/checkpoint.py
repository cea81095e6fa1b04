"""Checkpoints: one HDF5 file written by a Save op, validated before a Load op reads it.

Layout (groups of the file):
    params/<name>      every parameter, running statistics included
    optimizer/<name>   optimizer state (momentum, Adam moments, Adagrad history, ...)
    state/iter         the iteration counter
    meta/*             JSON: netrun version, iteration, config, nets as NetDef text,
                       model inputs/outputs, solver type, parameter shapes, RNG states,
                       data-loader position, learning rate, best test accuracy
Nothing in the file is ever executed (no pickle): nets are text, metadata is JSON.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from netrun.core.db import open_db
from netrun.errors import CheckpointError
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
        """A net stored as text in the checkpoint (init, step, update, test, predict)."""
        nets = self.meta.get("nets", {})
        if which not in nets:
            raise CheckpointError(f"checkpoint '{self.path}' holds no '{which}' net "
                                  f"(it has: {', '.join(sorted(nets)) or 'none'})")
        return netdef_from_text(nets[which], f"{self.path}:{which}")


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
    """Open a checkpoint and read its metadata (validates format and integrity markers)."""
    with open_db(path, "r") as db:
        meta = {}
        for key in db.keys("meta"):
            meta[key] = db.get_json(f"meta/{key}")
        for group in ("params", "state"):
            if not db.keys(group):
                raise CheckpointError(f"checkpoint '{path}' has no {group} (not a netrun checkpoint?)")
    return CheckpointInfo(str(path), meta, list(meta.get("params", [])),
                          list(meta.get("optimizer_blobs", [])), meta.get("shapes", {}))


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
