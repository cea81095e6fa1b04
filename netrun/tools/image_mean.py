"""The mean image of a database, as Caffe's `compute_image_mean` computes and writes it.

```python
result = compute_mean("train_lmdb")
write_mean(result["mean"], "mean.binaryproto")     # BlobProto 1 x C x H x W, or .npy
result["channel_means"]                            # what Caffe logs as mean_value channel [c]
```
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from netrun.errors import ConfigError, DataError
from netrun.tools.db_records import Progress, record_images
from netrun.util.atomic import atomic_open

BLOBPROTO_SUFFIXES = (".binaryproto", ".blobproto", ".pb")


def compute_mean(path: str | Path, backend: str | None = None,
                 on_progress: Progress | None = None) -> dict:
    """The per-pixel mean over all records (float64 C x H x W) and its per-channel means."""
    total: np.ndarray | None = None
    first_key = ""
    count = 0
    for key, _datum, image, _size in record_images(path, backend, on_progress):
        if total is None:
            # float64: a float32 running sum of millions of 0..255 pixels loses the low digits.
            total, first_key = np.zeros(image.shape, np.float64), key
        elif image.shape != total.shape:
            raise DataError(f"{path}: record {key} is {_shape(image.shape)} but record "
                            f"{first_key} is {_shape(total.shape)}; a mean image needs records "
                            f"of one size (build the database with --resize HxW)")
        total += image
        count += 1
    if total is None:
        raise DataError(f"{path}: the database has no records, so it has no mean")
    mean = total / count
    return {"path": str(path), "records": count, "shape": list(mean.shape), "mean": mean,
            "channel_means": [float(m) for m in mean.reshape(mean.shape[0], -1).mean(axis=1)]}


def mean_format(path: str | Path) -> str:
    """"npy" or "binaryproto" from the file name; ConfigError for any other name."""
    suffix = Path(path).suffix.lower()
    if suffix == ".npy":
        return "npy"
    if suffix in BLOBPROTO_SUFFIXES:
        return "binaryproto"
    raise ConfigError(f"{path}: name the mean file .binaryproto (Caffe's BlobProto) or .npy")


def write_mean(mean: np.ndarray, path: str | Path) -> str:
    """Write a C x H x W mean as a Caffe BlobProto (1 x C x H x W) or a float32 .npy, atomically;
    returns the format written ("binaryproto" or "npy")."""
    from netrun.proto.blobproto import blob_bytes

    fmt = mean_format(path)
    mean = np.asarray(mean, np.float32)
    with atomic_open(path, "wb") as f:
        if fmt == "npy":
            np.save(f, mean)   # to the open file: np.save would add .npy to the temporary name
        else:
            f.write(blob_bytes(mean[np.newaxis]))
    return fmt


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)
