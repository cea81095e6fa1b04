"""Inputs and data layers: Input and DummyData, and Data, ImageData and HDF5Data, which become
data inputs of the model plus a DataLayer record (source, batch size, transform_param) that
netrun.caffe.data maps to a netrun data source for training.

When a Data layer's database or an ImageData layer's list file is there (looked for as Caffe's
example paths are, see paths.py), the example shape comes from its first record or image."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from netrun.caffe.context import LayerContext
from netrun.caffe.fields import Fields
from netrun.caffe.fillers import filler_op
from netrun.caffe.layers.registry import layer
from netrun.caffe.paths import candidates, find_file
from netrun.errors import NetrunError
from netrun.train.data.image_lists import read_list_file
from netrun.train.data.image_sources import first_example
from netrun.train.data.images import read_image


@dataclass
class DataLayer:
    """A Caffe data layer as the trainer needs it: where its data comes from, how batched
    and how transformed (Caffe's transform_param keys)."""

    name: str
    type: str
    phase: str
    tops: list[str]
    source: str | None = None
    batch_size: int | None = None
    transform: dict = field(default_factory=dict)
    shape: tuple[int, ...] | None = None          # per example
    where: str = ""                               # file:line of the layer
    params: dict = field(default_factory=dict)    # ImageData's list options; Data's color


# Per-example shapes of the datasets Caffe's examples train on, recognised in source paths.
KNOWN_SHAPES = (("mnist", (1, 28, 28)), ("cifar", (3, 32, 32)))
TRANSFORM_KEYS = ("scale", "mirror", "crop_size", "mean_file")


def _shapes(t: LayerContext, p: Fields) -> list[list[int]]:
    """One BlobShape per top (or one for all), as `shape { dim ... }` messages."""
    shapes = [s.get_all("dim", "int") for s in p.subs("shape")]
    if len(shapes) == 1:
        shapes *= t.ntop
    if len(shapes) != t.ntop or any(not s or min(s) < 1 for s in shapes):
        raise t.skip(f"needs one shape of positive dims per top ({t.ntop}), got {shapes}")
    return shapes


@layer("Input")
def input_(t: LayerContext) -> None:
    """Model inputs of the given shapes (the first dim is the batch)."""
    t.counts(0, (1, 99))
    for i, shape in enumerate(_shapes(t, t.f.sub("input_param"))):
        t.input(i, shape)


@layer("DummyData")
def dummy_data(t: LayerContext) -> None:
    """Fill ops in the net itself, one per top (Caffe refills all but constants each pass)."""
    t.counts(0, (1, 99))
    p = t.f.sub("dummy_data_param")
    if p.has("shape"):
        shapes = _shapes(t, p)
    else:  # legacy num/channels/height/width, one value each or one per top
        legacy = [p.get_all(k, "int") for k in ("num", "channels", "height", "width")]
        legacy = [v * t.ntop if len(v) == 1 else v for v in legacy]
        if any(len(v) != t.ntop for v in legacy):
            raise t.skip("needs shape { dim } (or num/channels/height/width) for each top",
                         "dummy_data_param")
        shapes = [list(dims) for dims in zip(*legacy)]
    fillers = p.subs("data_filler")
    if len(fillers) not in (0, 1, t.ntop):
        raise t.skip(f"has {len(fillers)} data_filler for {t.ntop} tops", "dummy_data_param")
    for i, shape in enumerate(shapes):
        filler = fillers[0 if len(fillers) == 1 else i] if fillers else None
        fill = filler_op(filler, t.top(i), shape)
        t.add(fill.type, [], fill.outputs, **fill.args)


def _transform(t: LayerContext) -> dict:
    """transform_param as the trainer's `transform:` mapping (Caffe's key names)."""
    p = t.f.sub("transform_param")
    out = {k: p.get(k, None, {"scale": "float", "mirror": "bool", "crop_size": "int",
                              "mean_file": "str"}[k])
           for k in TRANSFORM_KEYS if p.has(k)}
    means = p.get_all("mean_value", "float")
    if means:
        out["mean_value"] = means
    if "mean_file" in out and means:
        raise t.skip("give mean_file or mean_value, not both", "transform_param")
    return out


def find_folder(path: str, base: Path) -> Path | None:
    """The first existing folder among candidates(path, base): a database is a folder."""
    return next((c for c in candidates(path, base) if c.is_dir()), None)


def _model_dir(t: LayerContext) -> Path:
    return Path(t.net.model.file).parent if t.net.model.file else Path.cwd()


def _example_shape(t: LayerContext, source: str | None, transform: dict,
                   channels: int | None = None, size: tuple[int, int] | None = None,
                   stored: Callable[[], tuple[int, ...] | None] | None = None
                   ) -> tuple[int, ...]:
    """Per-example shape of top 0: given as input_shapes, else that of the data the source
    holds (`stored`, when it is there), else from the dataset the source names, image sizes
    and crop_size."""
    given = t.net.model.input_shapes.get(t.caffe_tops[0])
    if given:
        return given
    found = None
    if stored is not None:
        try:
            found = stored()
        except NetrunError as e:
            raise t.skip(f"cannot read the first example of source '{source}': {e}") from None
    guess = next((s for key, s in KNOWN_SHAPES if key in (source or "").lower()), None)
    if found:
        channels, size = found[0], size or found[1:]
    elif guess:
        channels, size = channels or guess[0], size or guess[1:]
    crop = transform.get("crop_size", 0)
    if crop and channels:
        return (channels, crop, crop)
    if channels and size:
        return (channels, *size)
    raise t.skip(f"cannot tell the shape of the examples from source '{source}'; pass "
                 f"input_shapes={{'{t.caffe_tops[0]}': (C, H, W)}}")


def _declare(t: LayerContext, source: str | None, batch: int | None, transform: dict,
             shapes: list[tuple[int, ...]], params: dict | None = None) -> None:
    if not batch or batch < 1:
        raise t.skip("needs batch_size >= 1")
    for i, shape in enumerate(shapes):
        t.input(i, (batch, *shape))
    where = t.net.model.problems.where(t.f.start)
    t.net.model.data_layers.append(DataLayer(t.name, t.type, t.phase, list(t.caffe_tops),
                                             source, batch, transform, shapes[0], where,
                                             dict(params or {})))


@layer("Data")
def data(t: LayerContext) -> None:
    """LMDB/LevelDB data: mapped to netrun's `db` source when the database is there (the
    backend is told from its files, never from the `backend` field), else to a guess."""
    t.counts(0, (1, 2))
    p = t.f.sub("data_param")
    p.ignore("backend", "prefetch", "rand_skip")
    source, transform = p.get("source", None, "str"), _transform(t)
    params = {"color": True} if p.get("force_encoded_color", False) else {}
    folder = find_folder(source, _model_dir(t)) if source else None
    stored = (lambda: first_example(folder, params.get("color")).shape) if folder else None
    shape = _example_shape(t, source, transform, stored=stored)
    _declare(t, source, p.get("batch_size", None, "int"), transform, [shape, ()][:t.ntop],
             params)


@layer("ImageData")
def image_data(t: LayerContext) -> None:
    """A list of image files with labels: mapped to netrun's `imagedata` source."""
    t.counts(0, (1, 2))
    p = t.f.sub("image_data_param")
    p.ignore("rand_skip")
    source, transform = p.get("source", None, "str"), _transform(t)
    h, w = p.get("new_height", 0), p.get("new_width", 0)
    color = p.get("is_color", True)
    params = {"root_folder": p.get("root_folder", "", "str"), "new_height": h,
              "new_width": w, "is_color": color, "shuffle": p.get("shuffle", False)}
    listing = find_file(source, _model_dir(t)) if source and not (h and w) else None
    root = params["root_folder"]
    stored = (lambda: _first_listed(listing, image_root(root, _model_dir(t)) if root else "",
                                    color).shape) if listing else None
    shape = _example_shape(t, source, transform, 3 if color else 1, (h, w) if h and w else None,
                           stored)
    _declare(t, source, p.get("batch_size", None, "int"), transform, [shape, ()][:t.ntop],
             params)


def _first_listed(listing: Path, root: Path | str, color: bool):
    """The first image of an ImageData list file."""
    return read_image(read_list_file(listing, root)[0][0], color)


def image_root(root: str, base: Path) -> Path:
    """ImageData's root_folder: the first existing folder among its candidates, else as
    given relative to `base`."""
    return find_folder(root, base) or base / root


@layer("HDF5Data")
def hdf5_data(t: LayerContext) -> None:
    """Datasets named like the tops, from the .h5 files the source lists (shapes are read
    from the first file when it can be found)."""
    t.counts(0, (1, 99))
    p = t.f.sub("hdf5_data_param")
    p.ignore("shuffle")
    source = p.get("source", None, "str")
    given = t.net.model.input_shapes
    shapes = _hdf5_shapes(t, source) if any(top not in given for top in t.caffe_tops) else {}
    try:
        per_top = [tuple(given.get(top) or shapes[top]) for top in t.caffe_tops]
    except KeyError as e:
        raise t.skip(f"cannot tell the shape of top {e} from source '{source}'; pass "
                     f"input_shapes") from None
    _declare(t, source, p.get("batch_size", None, "int"), {}, per_top)


def _hdf5_shapes(t: LayerContext, source: str | None) -> dict[str, tuple[int, ...]]:
    """Per-example dataset shapes in the first .h5 file of a Caffe HDF5 source list."""
    base = Path(t.net.model.file).parent if t.net.model.file else Path.cwd()
    listing = find_file(source, base) if source else None
    if listing is None:
        return {}
    try:
        import h5py  # lazy: a heavy import that only HDF5 paths need

        lines = [s.strip() for s in listing.read_text().splitlines() if s.strip()]
        first = find_file(lines[0], listing.parent) if lines else None
        if first is None:
            return {}
        with h5py.File(first, "r") as f:
            return {k: tuple(f[k].shape[1:]) for k in f if hasattr(f[k], "shape")}
    except (OSError, UnicodeDecodeError, ImportError):
        return {}
