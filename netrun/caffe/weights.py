"""Caffe weights into a workspace: binary `.caffemodel` (protobuf, read by wire.py) or the
HDF5 form Caffe writes with `snapshot_format: HDF5` (datasets `data/<layer>/<i>`).

Blobs are matched by layer name and index, as Caffe's CopyTrainedLayersFrom does: layers the
model lacks are ignored (and reported), model layers the file lacks keep their initial
values. Every shape mismatch is listed before anything is loaded. BatchNorm's three blobs
(mean and variance sums and their scale factor) load as they are: netrun's CaffeBatchNorm
divides by the factor itself.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from netrun.caffe.wire import read_caffemodel
from netrun.core.db import DAMAGE, check_h5_tree
from netrun.errors import CheckpointError


@dataclass
class WeightReport:
    """What load_caffe_weights did."""

    loaded: dict[str, list[str]] = field(default_factory=dict)   # layer -> param blobs
    ignored: list[str] = field(default_factory=list)    # file layers the model does not have
    missing: list[str] = field(default_factory=list)    # model layers the file does not have
    values: int = 0                                     # numbers loaded

    def summary(self) -> str:
        """One line for logs."""
        text = f"loaded {self.values:,} values into {len(self.loaded)} layers"
        if self.missing:
            text += f"; kept initial values for {', '.join(self.missing)}"
        if self.ignored:
            text += f"; ignored file layers {', '.join(self.ignored)}"
        return text


def read_caffe_weights(path: str | Path) -> dict[str, list[np.ndarray]]:
    """Layer name -> its blobs (float32), from a binary or HDF5 caffemodel."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no such weights file: {path}")
    with open(path, "rb") as f:
        hdf5 = f.read(8) == b"\x89HDF\r\n\x1a\n"
    if hdf5:
        return _read_hdf5(path)
    layers: dict[str, list[np.ndarray]] = {}
    for layer in read_caffemodel(path)[1]:
        if layer.blobs:
            layers[layer.name] = layer.blobs
    return layers


def _read_hdf5(path: Path) -> dict[str, list[np.ndarray]]:
    import h5py  # lazy: a heavy import that only HDF5 paths need

    try:
        with h5py.File(path, "r") as f:
            # Links, virtual or external data and oversized datasets are refused unread.
            entries = check_h5_tree(f, path, need_crc=False)
            if "data" not in entries or entries["data"] is not None:
                raise CheckpointError(f"{path}: an HDF5 caffemodel has a 'data' group")
            return {layer[len("data/"):] if layer != "data" else "":
                    [np.asarray(f[f"{layer}/{k}"][()], np.float32) for k in sorted(keys, key=int)]
                    for layer, keys in _layer_groups(entries).items()}
    except DAMAGE as e:
        raise CheckpointError(f"{path}: cannot read the HDF5 caffemodel ({e})") from None


def _layer_groups(entries: dict) -> dict[str, list[str]]:
    """Groups under data/ whose members are all datasets named 0, 1, ...: Caffe's layers."""
    children: dict[str, list[tuple[str, bool]]] = {}
    for key, entry in entries.items():
        parent, _, name = key.rpartition("/")
        if key == "data" or not (parent == "data" or parent.startswith("data/")):
            continue
        children.setdefault(parent, []).append((name, entry is not None))
    return {group: [n for n, _ in members] for group, members in children.items()
            if all(n.isdigit() and is_data for n, is_data in members)}


def layer_params(model) -> dict[str, list[str]]:
    """Caffe layer -> its parameter blobs in Caffe's blob order."""
    table = getattr(model, "layer_params", None)
    if table:
        return table
    out: dict[str, list[str]] = {}
    for p in model.params:   # models from YAML: params in creation order, per layer
        out.setdefault(p.layer or p.name, []).append(p.name)
    return out


def _fits(blob: np.ndarray, shape: tuple[int, ...]) -> bool:
    """Same shape, or Caffe's legacy 4-D form of it (1×1×N×K for an N×K weight)."""
    if blob.shape == shape:
        return True
    if blob.size != math.prod(shape):   # Python ints: no int64 overflow
        return False
    return _squeeze(blob.shape) == _squeeze(shape)


def _squeeze(shape) -> tuple[int, ...]:
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def load_caffe_weights(ws, path: str | Path, model, partial: bool = False) -> WeightReport:
    """Copy the weights of a caffemodel into the workspace's parameter blobs, by layer name.

    Raises CheckpointError listing every mismatch (blob count or shape) before loading any.
    A file that fills no layer is an error; so, unless `partial`, is one that leaves model
    layers at their initial values or holds layers the model lacks (fine-tuning with a
    renamed layer is the case for `partial`, `--weights-partial` on the command line).
    """
    blobs = read_caffe_weights(path)
    table = layer_params(model)
    shapes = {p.name: tuple(p.shape) if p.shape is not None else None for p in model.params}
    report = WeightReport()
    problems, plan = [], []
    for layer, arrays in blobs.items():
        names = table.get(layer)
        if not names:
            report.ignored.append(layer)
            continue
        if len(arrays) != len(names):
            problems.append(f"layer '{layer}': the file has {len(arrays)} blob(s), the model "
                            f"{len(names)} ({', '.join(names)})")
            continue
        for i, (name, array) in enumerate(zip(names, arrays)):
            want = shapes.get(name)
            if want is not None and not _fits(array, want):
                problems.append(f"layer '{layer}' blob {i} ('{name}'): the file has "
                                f"{_fmt(array.shape)}, the model {_fmt(want)}")
            plan.append((layer, name, array, want))
    if problems:
        raise CheckpointError(f"{path}: {len(problems)} blob(s) do not fit the model, nothing "
                              f"was loaded:\n  " + "\n  ".join(problems))
    report.missing = [layer for layer in table if layer not in blobs]
    if not plan:
        raise CheckpointError(f"{path}: no layer of the file matches a layer of the model, "
                              f"nothing to load (file layers: {', '.join(blobs) or 'none'}; "
                              f"model layers: {', '.join(table) or 'none'})")
    if not partial and (report.missing or report.ignored):
        raise CheckpointError(f"{path}: the weights do not cover the model exactly, nothing "
                              f"was loaded:{partial_hint(report.missing, report.ignored, 'layers')}")
    for layer, name, array, want in plan:
        ws.feed_blob(name, np.ascontiguousarray(array.reshape(want or array.shape),
                                                dtype=np.float32))
        report.loaded.setdefault(layer, []).append(name)
        report.values += array.size
    return report


def partial_hint(missing: list[str], extra: list[str], what: str) -> str:
    """The lines listing unloaded and unmatched names, and how to allow a partial load."""
    text = ""
    if missing:
        text += f"\n  model {what} the file lacks (would keep initial values): {', '.join(missing)}"
    if extra:
        text += f"\n  file {what} the model lacks: {', '.join(extra)}"
    return (text + "\n  If that is intended (fine-tuning with renamed or new layers), pass "
            "--weights-partial (partial=True in Python).")


def _fmt(shape) -> str:
    return "×".join(map(str, shape)) if len(shape) else "scalar"
