"""Caffe data layers -> the trainer's `data:` config.

A Data layer whose database folder is there (looked for as Caffe's example paths are, see
paths.py) reads it through netrun's `db` source, LMDB or LevelDB as its files say (Caffe's
`backend` field is not trusted: it defaults to LEVELDB while convert_imageset writes LMDB);
an ImageData layer whose list file is there reads it through `imagedata`. Otherwise the
source is the one `data_override` names (`{"source": "mnist", "split": "mnist-10k"}`, from
`--data mnist-10k`), else one guessed from the source path ("mnist" -> mnist). Batch sizes
come from the TRAIN and TEST layers, the transform from transform_param (a .binaryproto mean
file is decoded here). HDF5Data sources are HDF5 file lists, which netrun reads as they are.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from netrun.caffe.layers.data import DataLayer, find_folder, image_root
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
    own = _own_data(train, test, base)
    if own is not None:
        return own
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


def _own_data(train: DataLayer, test: DataLayer | None, base: Path) -> dict[str, Any] | None:
    """The `db` or `imagedata` config for the database or image list the layers read, when
    the TRAIN layer's is there; None when it is not (a guess is made instead)."""
    if train.type not in ("Data", "ImageData") or not train.source:
        return None
    find = find_folder if train.type == "Data" else find_file
    found = find(train.source, base)
    if found is None:
        return None
    what = "database folder" if train.type == "Data" else "image list"
    out: dict[str, Any] = {"source": "db" if train.type == "Data" else "imagedata",
                           "train": str(found)}
    other = found if test is None else find(test.source, base) if test.source else None
    if other is None:
        raise ConfigError(f"{test.where}: {test.type} layer '{test.name}' reads the {what} "
                          f"'{test.source}', which is not at {_tried(test.source or '', base)} "
                          f"(the TRAIN layer's is at {found})")
    out["test"] = str(other)
    if train.type == "Data":
        if train.params.get("color"):
            out["color"] = True
        return out
    return {**out, **_image_list_options(train, test, base)}


def _image_list_options(train: DataLayer, test: DataLayer | None, base: Path) -> dict:
    """ImageData's options as `imagedata` keys (one setting for both parts)."""
    p = train.params
    if test is not None:
        differ = [k for k in ("root_folder", "new_height", "new_width", "is_color")
                  if test.params.get(k) != p.get(k)]
        if differ:
            raise ConfigError(f"{test.where}: the TRAIN and TEST ImageData layers differ in "
                              f"{', '.join(differ)}; netrun reads both parts with one setting")
    out: dict[str, Any] = {"is_color": bool(p.get("is_color", True)),
                           "shuffle": bool(p.get("shuffle", False))}
    if p.get("root_folder"):
        out["root_folder"] = str(image_root(p["root_folder"], base))
    if p.get("new_height") and p.get("new_width"):
        out["new_height"], out["new_width"] = int(p["new_height"]), int(p["new_width"])
    return out


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
