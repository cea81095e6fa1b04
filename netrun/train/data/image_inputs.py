"""Inputs for prediction given as images: a file, a glob, a folder, a Caffe list file or a
database, each example decoded and resized to the size the net was trained on.

`read_image_inputs` returns uint8 (N, C, H, W) pixels in Caffe's channel order with a name per
example (the file, or the database key) and labels where the input has them (list files and
databases); the caller applies the training transform (scale, mean, centre crop).
"""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from netrun.errors import DataError
from netrun.train.data.databases import DatabaseReader, detect_backend
from netrun.train.data.datum import datum_image, decode_datum
from netrun.train.data.image_lists import images_under, read_list_file
from netrun.train.data.images import IMAGE_SUFFIXES, read_image, resize_image

LIST_SUFFIXES = (".txt", ".list", ".lst")
GLOB_CHARS = "*?["


class ImageInputs(NamedTuple):
    """Decoded examples, what to call each one, and labels when the input has them."""

    data: np.ndarray                 # uint8 (N, C, H, W), or float32 for float Datums
    names: list[str]
    labels: np.ndarray | None


def is_image_input(spec: str) -> bool:
    """Whether INPUT names images: an image file, a glob, a folder, a list file or a database."""
    path = Path(spec)
    if any(c in spec for c in GLOB_CHARS) and not path.exists():
        return True
    if path.is_dir():
        return True
    return path.suffix.lower() in (*IMAGE_SUFFIXES, *LIST_SUFFIXES)


def read_image_inputs(spec: str, channels: int, size: tuple[int, int] | None) -> ImageInputs:
    """The examples INPUT names, with `channels` (1: gray, 3: BGR) and resized to `size`
    (H, W) when given and different; without `size` every image must have the first's size."""
    path = Path(spec)
    if path.is_dir() and _is_database(path):
        return _from_database(path, channels, size)
    if path.is_dir():
        files = images_under(path)
        if not files:
            raise DataError(f"{path}: no images ({', '.join(IMAGE_SUFFIXES)}) in this folder "
                            f"or below it")
        return _from_files(files, None, channels, size)
    if path.suffix.lower() in LIST_SUFFIXES:
        if not path.is_file():
            raise DataError(f"{path}: no such list file")
        items = read_list_file(path)
        return _from_files([p for p, _ in items], np.array([lbl for _, lbl in items], np.int32),
                           channels, size)
    if path.exists():
        return _from_files([path], None, channels, size)
    if any(c in spec for c in GLOB_CHARS):
        files = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True)
                       if Path(p).suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise DataError(f"'{spec}' matches no image files")
        return _from_files(files, None, channels, size)
    raise DataError(f"input '{spec}' does not exist")


def _is_database(path: Path) -> bool:
    try:
        detect_backend(path)
    except DataError:
        return False
    return True


def _fit(image: np.ndarray, size: tuple[int, int] | None, first: np.ndarray | None,
         where: str) -> np.ndarray:
    """`image` at `size`; without one, at the first image's size (or a clear error)."""
    if size is not None:
        if image.shape[1:] != tuple(size):
            image = resize_image(image, *size)
        return image
    if first is not None and image.shape != first.shape:
        raise DataError(f"{where}: {image.shape[1]} x {image.shape[2]}, but the first image is "
                        f"{first.shape[1]} x {first.shape[2]}; the net's input size is not "
                        f"known, so the images cannot be resized to it")
    return image


def _from_files(files: list[Path], labels: np.ndarray | None, channels: int,
                size: tuple[int, int] | None) -> ImageInputs:
    images: list[np.ndarray] = []
    for f in files:
        image = read_image(f, color=channels != 1)
        images.append(_fit(image, size, images[0] if images else None, str(f)))
    return ImageInputs(np.stack(images), [str(f) for f in files], labels)


def _from_database(path: Path, channels: int, size: tuple[int, int] | None) -> ImageInputs:
    images, names, labels = [], [], []
    with DatabaseReader(path) as reader:
        for key, value in reader.items():
            where = f"{path} record {bytes(key).decode('utf-8', 'replace')}"
            datum = decode_datum(value, where)
            image = datum_image(datum, color=(channels != 1) if datum.encoded else None,
                                where=where)
            if image.shape[0] != channels and image.dtype == np.uint8:
                raise DataError(f"{where}: {image.shape[0]} channels, the net takes {channels} "
                                f"(a raw record keeps the channels it was stored with: build the "
                                f"database {'with' if channels == 1 else 'without'} --gray)")
            images.append(_fit(image, size, images[0] if images else None, where))
            names.append(bytes(key).decode("utf-8", "replace"))
            labels.append(datum.label)
    if not images:
        raise DataError(f"{path}: the database has no records")
    return ImageInputs(np.stack(images), names, np.array(labels, np.int32))
