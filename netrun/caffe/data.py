"""Caffe data layers -> the trainer's `data:` config.

netrun does not read LMDB/LevelDB. A Data layer's source is mapped to a netrun data source:
the one `data_override` names (`{"source": "mnist", "split": "mnist-10k"}`, from
`--data mnist-10k`), else one guessed from the source path ("mnist" -> mnist). Batch sizes
come from the TRAIN and TEST layers, the transform from transform_param (a .binaryproto mean
file is decoded here). HDF5Data sources are HDF5 file lists, which netrun reads as they are.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from netrun.caffe.layers.data import DataLayer
from netrun.caffe.paths import candidates, find_file
from netrun.caffe.wire import read_blobproto
from netrun.errors import ConfigError
from netrun.train.data import SOURCES

# Substring of a Data layer's source path -> netrun data source.
GUESSES = (("fashion", "fashion-mnist"), ("mnist", "mnist"), ("cifar", "cifar10"))
DATA_TYPES = ("Data", "ImageData", "HDF5Data")


def data_sources_of(model) -> list[DataLayer]:
    """The model's data layers (Data, ImageData, HDF5Data; one record per phase)."""
    return [d for d in getattr(model, "data_layers", []) if d.type in DATA_TYPES]


def _by_phase(layers: list[DataLayer], phase: str) -> DataLayer | None:
    return next((d for d in layers if d.phase == phase), None)


def data_config(model, override: dict | None = None, base: str | Path | None = None
                ) -> dict[str, Any]:
    """The `data:` mapping for training `model`; `base` is where relative Caffe paths are
    looked for (the solver's folder). Keys of `override` win (source, split, dir, transform,
    batch_size, ...)."""
    override = dict(override or {})
    layers = data_sources_of(model)
    train, test = _by_phase(layers, "TRAIN"), _by_phase(layers, "TEST")
    if train is None:
        if "source" in override and "batch_size" in override:
            return override
        raise ConfigError(f"{model.source_path}: the net has no TRAIN-phase Data, ImageData "
                          f"or HDF5Data layer to train from; give the data source and "
                          f"batch_size explicitly")
    base = Path(base) if base is not None else Path(model.source_path or ".").parent
    cfg: dict[str, Any] = {}
    if "source" not in override:
        cfg.update(_guess_source(train, test, base))
    cfg["batch_size"] = train.batch_size
    cfg["test_batch_size"] = (test or train).batch_size
    transform = _transform(train, base)
    if transform:
        cfg["transform"] = transform
    cfg.update(override)
    return cfg


def _guess_source(train: DataLayer, test: DataLayer | None, base: Path) -> dict[str, Any]:
    if train.type == "HDF5Data":
        parts = {"train": train, "test": test or train}
        out: dict[str, Any] = {"source": "hdf5", "data_key": train.tops[0]}
        if len(train.tops) > 1:
            out["label_key"] = train.tops[1]
        for part, layer in parts.items():
            found = find_file(layer.source or "", base)
            if found is None:
                raise ConfigError(f"{layer.where}: HDF5Data layer '{layer.name}' lists its "
                                  f"files in '{layer.source}', which is not at "
                                  f"{_tried(layer.source or '', base)}")
            out[part] = str(found)
        return out
    source = (train.source or "").lower()
    for key, name in GUESSES:
        if key in source:
            if name not in SOURCES:
                raise ConfigError(f"{train.where}: data layer '{train.name}' reads "
                                  f"'{train.source}' ({name}), which netrun has no data source "
                                  f"for here; choose one with --data SOURCE[:SPLIT]")
            return {"source": name}
    raise ConfigError(f"{train.where}: {train.type} layer '{train.name}' reads "
                      f"'{train.source}', which netrun cannot read (LMDB/LevelDB/image "
                      f"lists); choose a netrun data source with --data SOURCE[:SPLIT], "
                      f"e.g. --data mnist-10k")


def _transform(layer: DataLayer, base: Path) -> dict[str, Any]:
    """transform_param as netrun's transform; a .binaryproto mean file becomes an array."""
    out = dict(layer.transform)
    mean_file = out.get("mean_file")
    if mean_file:
        found = find_file(mean_file, base)
        if found is None:
            raise ConfigError(f"{layer.where}: mean_file '{mean_file}' of layer '{layer.name}' "
                              f"is not at {_tried(mean_file, base)}; put it there, or give "
                              f"the transform in the data override (e.g. mean_value)")
        if found.suffix == ".binaryproto":
            mean = read_blobproto(found)
            del out["mean_file"]
            out["mean"] = mean[0] if mean.ndim == 4 else mean     # 1×C×H×W -> C×H×W
        else:
            out["mean_file"] = str(found)
    return out


def _tried(path: str, base: Path) -> str:
    return ", ".join(str(c) for c in candidates(path, base))
