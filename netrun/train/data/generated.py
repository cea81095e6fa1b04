"""The `generated` source: procedurally rendered digits, so the quickstart works offline.

Each image is a stroke template (glyphs.py) bent by a smooth random warp, placed by a
random affine map (rotation, shear, scale, aspect, translation) and drawn with a random pen
width and ink level, plus an occasional stray stroke and pixel noise. Rendering is a sum
of Gaussian pen dabs along the stroke; a Gaussian is separable, so one image is a
(28, K) @ (K, 28) product of per-point row and column profiles, batched over images.

Images come out as uint8-valued float32 N x 1 x 28 x 28 (0..255, like MNIST) with int32
labels, deterministic from (seed, part): chunk c of part p draws from the generator seeded
with [VERSION, seed, p, c], so a longer dataset starts with the images of a shorter one.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from netrun.errors import ConfigError, NetrunError
from netrun.train.data.base import Arrays, DataSource, SourceRequest, register_source
from netrun.train.data.glyphs import build_templates
from netrun.train.data.numpy_files import NpzArchive
from netrun.train.data.paths import (
    cache_root,
    checkout_data_dir,
    expand_path,
    resolve_data_dir,
    writable_dir,
)
from netrun.util.progress import activity

VERSION = 1                  # bump when the rendering changes: it is part of the cache key
SIZE = 28
CHUNK = 1000                 # images per generator; a multiple of 10 keeps classes balanced
STRAY = 12                   # points of the optional stray stroke
PARTS = {"train": 0, "test": 1}

_TEMPLATES = build_templates()


def generate(count: int, seed: int, part: str = "train") -> Arrays:
    """Render `count` digits of `part` from `seed`: float32 (N, 1, 28, 28) and int32 (N,)."""
    images = np.empty((count, SIZE, SIZE), np.uint8)
    labels = np.empty(count, np.int32)
    for c, start in enumerate(range(0, count, CHUNK)):
        stop = min(start + CHUNK, count)
        rng = np.random.default_rng([VERSION, seed, PARTS[part], c])
        img, lab = _render_chunk(rng, CHUNK)
        images[start:stop], labels[start:stop] = img[:stop - start], lab[:stop - start]
    return Arrays(images.astype(np.float32)[:, None], labels)  # (N, 1, 28, 28)


def _render_chunk(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    points, digit = _TEMPLATES
    # Every run of ten images holds each digit once, so any prefix is balanced to +-1.
    labels = rng.permuted(np.tile(np.arange(10, dtype=np.int32), (n // 10, 1)), axis=1).ravel()
    # A variant of each image's digit, uniformly among that digit's templates.
    counts = np.bincount(digit, minlength=10)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    tid = first[labels] + (rng.random(n) * counts[labels]).astype(np.int64)

    pts = points[tid]                                          # (n, K, 2) in the unit box
    # Smooth warp: one sine wave per axis with random direction, frequency and phase.
    amp = rng.uniform(0.0, 0.07, (n, 1, 2))
    freq = rng.uniform(-1.6, 1.6, (n, 2, 2))
    phase = rng.uniform(0.0, 2 * np.pi, (n, 1, 2))
    pts = pts + amp * np.sin(2 * np.pi * (pts @ freq) + phase)

    # Affine placement: unit box -> 28x28 pixels, glyph about 20 px tall as in MNIST.
    height = 20.0 * rng.uniform(0.8, 1.1, n)
    width = height * rng.uniform(0.55, 0.85, n)
    theta = np.radians(rng.uniform(-18.0, 18.0, n))
    shear = rng.uniform(-0.35, 0.35, n)
    shift = rng.uniform(-2.5, 2.5, (n, 2)) + (SIZE - 1) / 2.0
    u = (pts[..., 0] - 0.5) * width[:, None]
    v = (pts[..., 1] - 0.5) * height[:, None]
    u = u + shear[:, None] * v
    cos, sin = np.cos(theta)[:, None], np.sin(theta)[:, None]
    x = cos * u - sin * v + shift[:, :1]
    y = sin * u + cos * v + shift[:, 1:]
    ink_per_point = _local_spacing(x, y)

    # A stray stroke on some images: a short segment anywhere, so that ink is not all digit.
    sx, sy, sw = _stray(rng, n)
    x = np.concatenate([x, sx], axis=1).astype(np.float32)
    y = np.concatenate([y, sy], axis=1).astype(np.float32)
    w = np.concatenate([ink_per_point, sw], axis=1).astype(np.float32)

    sigma = rng.uniform(0.75, 1.35, n).astype(np.float32)[:, None, None]
    gain = rng.uniform(1.6, 3.0, n).astype(np.float32)[:, None, None]
    level = rng.uniform(170.0, 255.0, n).astype(np.float32)[:, None, None]
    noise = rng.uniform(0.0, 18.0, n).astype(np.float32)[:, None, None]

    inv = -0.5 / (sigma * sigma)
    gx, gy = _profile(x, inv), _profile(y, inv)                 # (n, K, 28) each
    gx *= w[..., None]
    density = np.matmul(gy.transpose(0, 2, 1), gx)              # (n, 28 rows, 28 cols)
    # A straight stroke integrates to sigma*sqrt(2*pi) at its centre line: normalise to 1,
    # then saturate so the pen has a flat core and soft edges.
    density *= gain / (sigma * np.sqrt(2 * np.pi, dtype=np.float32))
    np.minimum(density, 1.0, out=density)
    density *= level
    img = rng.standard_normal((n, SIZE, SIZE), np.float32)
    img *= noise
    img += density
    np.clip(img, 0.0, 255.0, out=img)
    return np.rint(img).astype(np.uint8), labels


def _profile(coord: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """exp(inv * (pixel - coord)^2) for every point and pixel: (n, K) -> (n, K, 28)."""
    # In place: fresh temporaries of this size cost more in page faults than exp itself.
    d = np.arange(SIZE, dtype=np.float32) - coord[..., None]
    d *= d
    d *= inv
    return np.exp(d, out=d)


def _local_spacing(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Arc length each point stands for, in pixels, after the warp and the affine map."""
    step = np.hypot(np.diff(x, axis=1), np.diff(y, axis=1))   # (n, K-1)
    # The smaller of the two neighbour gaps: a gap across two strokes is a jump, not ink.
    return np.minimum(np.concatenate([step[:, :1], step], axis=1),
                      np.concatenate([step, step[:, -1:]], axis=1))


def _stray(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Points of a short random segment on ~20% of the images (zero ink on the others)."""
    start = rng.uniform(2.0, SIZE - 3.0, (n, 2))
    angle = rng.uniform(0.0, 2 * np.pi, n)
    length = rng.uniform(2.0, 6.0, n)
    on = rng.random(n) < 0.2
    t = np.linspace(0.0, 1.0, STRAY)
    sx = start[:, :1] + np.cos(angle)[:, None] * length[:, None] * t
    sy = start[:, 1:] + np.sin(angle)[:, None] * length[:, None] * t
    sw = np.where(on, length / STRAY, 0.0)[:, None] * np.ones(STRAY)
    return sx, sy, sw


def load_or_generate(count: int, seed: int, part: str, cache_dir: Path | None) -> Arrays:
    """Read the cached `.npz` for (VERSION, seed, part, count), else render and cache it."""
    path = None
    if cache_dir is not None:
        path = cache_dir / f"digits-v{VERSION}-{part}-seed{seed}-n{count}.npz"
        cached = read_cache(path, count)
        if cached is not None:
            return cached
    later = " (once: cached for later runs)" if path is not None else ""
    with activity(f"rendering {count:,} {part} digits{later}"):
        arrays = generate(count, seed, part)
    if path is not None:
        _save_quietly(path, arrays)
    return arrays


def read_cache(path: Path, count: int) -> Arrays | None:
    """The `count` images of a cache file, or None if it is missing, damaged or different."""
    if not path.is_file():
        return None
    try:
        with NpzArchive(path) as f:
            images, labels = f["images"], f["labels"]
    except (NetrunError, KeyError):
        return None                 # a damaged cache file is simply rendered again
    if images.shape == (count, SIZE, SIZE) and labels.shape == (count,) \
            and images.dtype == np.uint8 and np.issubdtype(labels.dtype, np.integer) \
            and (labels.size == 0 or 0 <= labels.min() <= labels.max() <= 9):
        return Arrays(images.astype(np.float32)[:, None], labels.astype(np.int32))
    return None


def _save_quietly(path: Path, arrays: Arrays) -> None:
    # The cache is an optimisation: a read-only data dir just means rendering every time.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, images=arrays.data[:, 0].astype(np.uint8), labels=arrays.label)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


class GeneratedDigits(DataSource):
    """Rendered digits 0-9 (source `generated`, alias `digits`), 60,000 train / 10,000 test."""

    name = "generated"
    input_shape = (1, SIZE, SIZE)
    num_classes = 10

    def __init__(self, seed: int = 1, train_count: int = 60000, test_count: int = 10000,
                 cache_dir: Path | None = None):
        super().__init__()
        self.seed, self.cache_dir = int(seed), cache_dir
        self.counts = {"train": int(train_count), "test": int(test_count)}

    def _load(self, part: str) -> Arrays:
        return load_or_generate(self.counts[part], self.seed, part, self.cache_dir)

    def describe(self) -> str:
        """One line for logs."""
        return (f"generated digits v{VERSION} (seed {self.seed}, {self.counts['train']} train, "
                f"{self.counts['test']} test)")


def cache_dir_for(request: SourceRequest) -> Path | None:
    """The first writable of: data dir, $NETRUN_DATA/generated, data/generated, ~/.cache."""
    candidates = []
    if request.data_dir:
        candidates.append(resolve_data_dir("generated", request.data_dir, request.config_dir)[0])
    if os.environ.get("NETRUN_DATA"):
        candidates.append(Path(expand_path(os.environ["NETRUN_DATA"])) / "generated")
    checkout = checkout_data_dir()
    if checkout is not None:
        candidates.append(checkout / "generated")
    candidates.append(cache_root() / "generated")
    return next((c for c in candidates if writable_dir(c)), None)


@register_source("generated", "digits")
def make_generated(request: SourceRequest) -> GeneratedDigits:
    """`source: generated` (alias `digits`): seed, train_count, test_count, cache."""
    cfg = request.cfg
    try:
        seed, train_count = int(cfg.get("seed", 1)), int(cfg.get("train_count", 60000))
        test_count = int(cfg.get("test_count", 10000))
    except (TypeError, ValueError):
        raise ConfigError("data: seed, train_count and test_count of the generated source "
                          "must be integers") from None
    if seed < 0 or train_count < 1 or test_count < 1:
        raise ConfigError("data: the generated source needs seed >= 0 and counts >= 1")
    cache = cache_dir_for(request) if cfg.get("cache", True) else None
    return GeneratedDigits(seed, train_count, test_count, cache)
