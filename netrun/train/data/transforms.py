"""Per-batch preprocessing as Caffe's DataTransformer does it: out = (crop(x) - mean) * scale.

Cropping and mirroring only choose which input pixel lands where; the mean is gathered with
the same indices, so a mean image is cropped (and flipped) with its example, exactly as
Caffe subtracts `mean[c, h_off + h, w_off + w]` before writing the (mirrored) output pixel.
Training crops at a random offset and flips half the examples; testing crops the centre and
never flips. (Caffe also flips at test time when `mirror` is set; we follow the usual
practice of deterministic evaluation.)
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from netrun.errors import ConfigError, NetrunError, ShapeError, suggest
from netrun.proto.blobproto import read_blobproto
from netrun.train.data.paths import expand_path

KEYS = ("scale", "mean", "mean_value", "mean_file", "crop_size", "mirror")


class Transform:
    """Crop, mirror, subtract a mean (scalar, per channel or image), then scale."""

    def __init__(self, scale: float = 1.0, mean: float | Sequence[float] | np.ndarray | None = None,
                 crop_size: int = 0, mirror: bool = False):
        self.scale, self.crop_size, self.mirror = float(scale), int(crop_size), bool(mirror)
        self.mean = None if mean is None else np.asarray(mean, np.float32)
        if self.crop_size < 0:
            raise ConfigError(f"transform.crop_size must be >= 0, got {crop_size}")
        if self.mean is not None and self.mean.ndim > 3:
            raise ConfigError(f"transform.mean: expected a number, a list per channel or a "
                              f"C x H x W image, got shape {self.mean.shape}")

    @property
    def identity(self) -> bool:
        """True when the transform leaves data unchanged (apart from the float32 cast)."""
        return (self.scale == 1.0 and self.mean is None and not self.crop_size
                and not self.mirror)

    def output_shape(self, input_shape: Sequence[int]) -> tuple[int, ...]:
        """Per-example shape after the transform; checks crop and mean against the input."""
        shape = tuple(int(s) for s in input_shape)
        if (self.crop_size or self.mirror) and len(shape) != 3:
            raise ShapeError(f"transform: crop_size and mirror need C x H x W examples, "
                             f"the data has shape {shape}")
        if self.mean is not None:
            self._check_mean(shape)
        if not self.crop_size:
            return shape
        c, h, w = shape
        if self.crop_size > min(h, w):
            raise ShapeError(f"transform.crop_size {self.crop_size} is larger than the "
                             f"{h} x {w} images")
        return (c, self.crop_size, self.crop_size)

    def _check_mean(self, shape: tuple[int, ...]) -> None:
        m = self.mean
        if m.ndim == 1 and m.size not in (1, shape[0]):
            raise ShapeError(f"transform.mean has {m.size} values; give 1 or one per channel "
                             f"({shape[0]})")
        if m.ndim >= 2 and m.shape[-2:] != shape[-2:] or m.ndim == 3 and m.shape[0] != shape[0]:
            raise ShapeError(f"transform: the mean image is {' x '.join(map(str, m.shape))} "
                             f"but the data is {' x '.join(map(str, shape))} (uncropped)")

    def __call__(self, x: np.ndarray, rng: np.random.Generator | None = None,
                 train: bool = True, out: np.ndarray | None = None,
                 part: tuple[int, int] | None = None) -> np.ndarray:
        """Transform a batch (N, ...) into float32 `out` (allocated when None).

        `part` = (start, total): `x` is examples start..start+N of a batch of `total`, whose
        random crops and flips are drawn for the whole batch (a rank's share of a global
        batch gets exactly the crops the whole batch would give it in one process).
        """
        n = x.shape[0]
        out_shape = (n, *self.output_shape(x.shape[1:]))
        if out is None:
            out = np.empty(out_shape, np.float32)
        flip = train and self.mirror
        if not self.crop_size and not flip:
            out[...] = x
            mean = self._plain_mean(x.ndim)
        else:
            if rng is None and train:
                raise ValueError("a training-mode crop or mirror needs a random generator")
            rows, cols = self._indices(x.shape, rng, train, part)
            b = np.arange(n)[:, None, None, None]
            c = np.arange(x.shape[1])[None, :, None, None]
            r, w = rows[:, None, :, None], cols[:, None, None, :]
            np.copyto(out, x[b, c, r, w])                      # (N, C, crop, crop)
            mean = self._plain_mean(x.ndim)
            if self.mean is not None and self.mean.ndim >= 2:
                m = self.mean.reshape(-1, *self.mean.shape[-2:])   # (C or 1, H, W)
                mean = m[np.minimum(c, m.shape[0] - 1), r, w]
        if mean is not None:
            out -= mean
        if self.scale != 1.0:
            out *= np.float32(self.scale)
        return out

    def _plain_mean(self, ndim: int) -> np.ndarray | None:
        """The mean broadcast against an uncropped batch (N, C, ...)."""
        if self.mean is None:
            return None
        if self.mean.ndim == 1 and self.mean.size > 1:
            return self.mean.reshape(1, -1, *([1] * (ndim - 2)))  # (1, C, 1, 1)
        return self.mean.reshape(1, *self.mean.shape) if self.mean.ndim >= 2 else self.mean

    def _indices(self, shape: tuple, rng: np.random.Generator | None, train: bool,
                 part: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Source row and column of every output pixel: (N, crop_h), (N, crop_w)."""
        n, _, h, w = shape
        start, total = part or (0, n)

        def draw(high: int) -> np.ndarray:
            return rng.integers(0, high, total)[start:start + n]

        ch, cw = (self.crop_size, self.crop_size) if self.crop_size else (h, w)
        if train and self.crop_size:
            h_off = draw(h - ch + 1)
            w_off = draw(w - cw + 1)
        else:                                      # the centre, as Caffe's TEST phase
            h_off = np.full(n, (h - ch) // 2)
            w_off = np.full(n, (w - cw) // 2)
        ar_w = np.arange(cw)
        cols = np.broadcast_to(ar_w, (n, cw))
        if train and self.mirror:
            flip = draw(2).astype(bool)[:, None]
            cols = np.where(flip, cw - 1 - ar_w, ar_w)
        return h_off[:, None] + np.arange(ch), w_off[:, None] + cols

    def __repr__(self) -> str:
        mean = None if self.mean is None else self.mean.shape or float(self.mean)
        return (f"Transform(scale={self.scale}, mean={mean}, crop_size={self.crop_size}, "
                f"mirror={self.mirror})")


def make_transform(cfg: dict | None, base: str | os.PathLike | None = None) -> Transform:
    """A Transform from a config `transform:` mapping (Caffe's transform_param names work)."""
    cfg = dict(cfg or {})
    for key in cfg:
        if key not in KEYS:
            raise ConfigError(f"transform: unknown key '{key}'{suggest(key, KEYS)} "
                              f"(known: {', '.join(KEYS)})")
    given = [k for k in ("mean", "mean_value", "mean_file") if cfg.get(k) is not None]
    if len(given) > 1:
        # Caffe: "Cannot specify mean_file and mean_value at the same time".
        raise ConfigError(f"transform: give only one of {', '.join(given)}")
    mean: Any = cfg.get(given[0]) if given else None
    if given and (given[0] == "mean_file" or isinstance(mean, str)):
        mean = load_mean(mean, Path(base) if base is not None else Path.cwd())
    elif mean is not None:
        try:
            mean = np.asarray(mean, np.float32)
        except (TypeError, ValueError):
            raise ConfigError(f"transform.{given[0]}: expected a number or a list of numbers, "
                              f"got {mean!r}") from None
    try:
        return Transform(scale=float(cfg.get("scale", 1.0)), mean=mean,
                         crop_size=int(cfg.get("crop_size", 0)), mirror=bool(cfg.get("mirror")))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"transform: {e}") from None


def load_mean(path: str | os.PathLike, base: Path) -> np.ndarray:
    """A mean image from a `.npy` file or a Caffe `.binaryproto` (a BlobProto):
    C x H x W, H x W, or 1 x C x H x W."""
    path = Path(expand_path(str(path)))
    path = path if path.is_absolute() else base / path
    if path.suffix == ".binaryproto":
        mean = read_blobproto(path)
    elif path.suffix == ".npy":
        try:
            mean = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise NetrunError(f"{path}: cannot read the mean image ({e})") from None
    else:
        raise ConfigError(f"transform.mean: {path} is neither a .npy file nor a Caffe "
                          f".binaryproto mean")
    if mean.ndim == 4 and mean.shape[0] == 1:
        mean = mean[0]
    if mean.ndim not in (2, 3):
        raise NetrunError(f"{path}: a mean image must be C x H x W or H x W, got {mean.shape}")
    return mean.astype(np.float32)
