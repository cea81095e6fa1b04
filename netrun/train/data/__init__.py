"""Data for training: sources by name, transforms, and the batch loader.

```python
source = make_source({"source": "mnist", "split": "mnist-10k"}, data_dir=None)
source.train.data, source.train.label      # float32 N x 1 x 28 x 28 (0..255), int32 N
transform = make_transform({"scale": 1 / 256})
loader = BatchLoader(source.train, 64, seed=1, transform=transform)
data, label = next(loader)
```
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from netrun.errors import ConfigError, suggest
from netrun.train.data import (  # noqa: F401  (fill SOURCES)
    cifar,
    generated,
    hdf5,
    image_sources,
    mnist,
    npz,
)
from netrun.train.data.base import SOURCES, Arrays, DataSource, SourceRequest, register_source
from netrun.train.data.loader import BatchLoader, iterate_once
from netrun.train.data.paths import expand_path, resolve_data_dir
from netrun.train.data.transforms import Transform, make_transform

# Keys of a `data:` section that every source takes (the trainer reads the batch sizes, the
# transform, `shuffle` and `workers`; `dir` picks the folder), and those each source's
# factory reads besides.
COMMON_KEYS = ("source", "dir", "batch_size", "test_batch_size", "transform", "shuffle",
               "workers")
_MNIST = ("split", "download")
_FILES = ("train", "test", "data_key", "label_key", "label_dtype", "num_classes")
_DATABASE = ("train", "test", "color", "num_classes")
SOURCE_KEYS: dict[str, tuple[str, ...]] = {
    "mnist": _MNIST, "fashion-mnist": _MNIST, "mnist-10k": _MNIST,
    "cifar10": ("download",), "cifar-10": ("download",),
    "npz": ("path", *_FILES),
    "hdf5": (*_FILES, "lazy"), "h5": (*_FILES, "lazy"),
    "generated": ("seed", "train_count", "test_count", "cache"),
    "digits": ("seed", "train_count", "test_count", "cache"),
    "lmdb": _DATABASE, "leveldb": _DATABASE, "db": _DATABASE,
    "imagedata": ("train", "test", "root_folder", "new_height", "new_width", "is_color",
                  "num_classes"),
    "folder": ("train", "test", "resize", "color"),
}


def data_keys(source: str | None) -> tuple[str, ...] | None:
    """The keys a `data:` section for `source` may hold (no source: those of any source);
    None for a name that is not a registered source."""
    if source is None:
        extra = dict.fromkeys(k for keys in SOURCE_KEYS.values() for k in keys)
        return (*COMMON_KEYS, *extra)
    key = source.strip().lower()
    if key not in SOURCES:
        return None
    if key not in SOURCE_KEYS:   # registered elsewhere without a key list: it checks its own
        return (*COMMON_KEYS, *dict.fromkeys(k for ks in SOURCE_KEYS.values() for k in ks))
    return (*COMMON_KEYS, *SOURCE_KEYS[key])


def parse_spec(spec: str) -> tuple[dict, str | None]:
    """'mnist-10k:test' -> ({'source': 'mnist-10k'}, 'test'); the part is optional."""
    name, _, part = spec.partition(":")
    if not name:
        raise ConfigError(f"data spec '{spec}': expected SOURCE or SOURCE:PART")
    return {"source": name}, (part or None)


def make_source(cfg: dict | str, data_dir: str | os.PathLike | None = None, *,
                config_dir: str | os.PathLike | None = None) -> DataSource:
    """The data source a `data:` config (or a spec like 'mnist-10k:test') describes.

    The data folder is `data_dir` (e.g. --data-dir), else `cfg['dir']`, else
    `$NETRUN_DATA/<source>`, else `~/.cache/netrun/<source>`. Relative file names in the
    config resolve against that folder when one is given, else against `config_dir`.
    """
    if isinstance(cfg, str):
        cfg = parse_spec(cfg)[0]
    if not isinstance(cfg, dict):
        raise ConfigError(f"data: expected a mapping with 'source', got {cfg!r}")
    name = cfg.get("source")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"data: missing 'source' (one of {', '.join(sorted(SOURCES))})")
    key = name.strip().lower()
    if key not in SOURCES:
        raise ConfigError(f"data.source: unknown data source '{name}'"
                          f"{suggest(key, SOURCES) or ''} (known: {', '.join(sorted(SOURCES))})")
    known = data_keys(key) or COMMON_KEYS
    for k in cfg:
        if k not in known:
            raise ConfigError(f"data: unknown key '{k}' for source '{name}'{suggest(str(k), known)}"
                              f" (known: {', '.join(known)})")
    explicit = data_dir if data_dir is not None else cfg.get("dir")
    request = SourceRequest(key, cfg, None if explicit is None else str(explicit),
                            Path(config_dir) if config_dir is not None else Path.cwd())
    return SOURCES[key](request)


def data_workers(cfg: dict, data: Any) -> int:
    """Worker processes for the training batches: `workers:` when given, else 1 for data that
    decodes files when indexed (images, databases) and 0 (a prefetch thread) for arrays."""
    if cfg.get("workers") is not None:
        return int(cfg["workers"])
    return 1 if getattr(data, "decodes", False) else 0


__all__ = ["data_workers", "make_source", "parse_spec", "make_transform", "Transform",
           "BatchLoader", "iterate_once", "Arrays", "DataSource", "SourceRequest",
           "register_source", "SOURCES", "expand_path", "resolve_data_dir", "data_keys",
           "COMMON_KEYS", "SOURCE_KEYS"]
