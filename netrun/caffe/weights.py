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

    layers: dict[str, list[np.ndarray]] = {}

    def walk(group, prefix: str) -> None:
        keys = list(group)
        if keys and all(k.isdigit() and isinstance(group[k], h5py.Dataset) for k in keys):
            layers[prefix] = [np.asarray(group[k][()], np.float32)
                              for k in sorted(keys, key=int)]
            return
        for k in keys:
            if isinstance(group[k], h5py.Group):
                walk(group[k], f"{prefix}/{k}" if prefix else k)

    try:
        with h5py.File(path, "r") as f:
            if "data" not in f:
                raise CheckpointError(f"{path}: an HDF5 caffemodel has a 'data' group")
            walk(f["data"], "")
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the HDF5 caffemodel ({e})") from None
    return layers


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


def load_caffe_weights(ws, path: str | Path, model) -> WeightReport:
    """Copy the weights of a caffemodel into the workspace's parameter blobs, by layer name.

    Raises CheckpointError listing every mismatch (blob count or shape) before loading any.
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
    for layer, name, array, want in plan:
        ws.feed_blob(name, np.ascontiguousarray(array.reshape(want or array.shape),
                                                dtype=np.float32))
        report.loaded.setdefault(layer, []).append(name)
        report.values += array.size
    report.missing = [layer for layer in table if layer not in blobs]
    return report


def _fmt(shape) -> str:
    return "×".join(map(str, shape)) if len(shape) else "scalar"
