"""Image files as C x H x W uint8 arrays, in Caffe's conventions.

Colour images come out in BGR channel order, as OpenCV (and so Caffe) reads them: a Caffe
model's mean_value list and its first convolution's filters expect blue first. JPEG goes
through libjpeg-turbo (simplejpeg) with the accurate DCT and smooth upsampling, the settings
OpenCV's decoder uses; every other format through Pillow. Alpha is dropped, as OpenCV's
colour and grey reads drop it. Resizing is bilinear with OpenCV's INTER_LINEAR sampling
(pixel centres aligned, edges clamped), so resized images match Caffe's within one level.
"""
from __future__ import annotations

import io
import math
import os
import struct

import numpy as np

from netrun.errors import DataError, ShapeError
from netrun.train.data.extras import optional_module, pillow_image

IMAGE_SUFFIXES: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff",
                                   ".webp", ".ppm", ".pgm")

_JPEG_MAGIC = b"\xff\xd8\xff"
# Pillow modes holding one grey channel (wider than 8 bits for I, I;16* and F).
_GREY_MODES = ("1", "L", "LA", "La", "I", "F", "I;16", "I;16L", "I;16B", "I;16N")


def decode_image(data: bytes, color: bool | None = True, where: str = "image") -> np.ndarray:
    """Decode image file bytes to uint8 C x H x W: 3 channels BGR when `color`, 1 when not,
    and when None as stored (1 for grey images, else 3). DataError naming `where` if the
    bytes are not an image."""
    if not data:
        raise DataError(f"{where}: empty image data")
    if bytes(data[:3]) == _JPEG_MAGIC:
        image = _decode_jpeg(data, color)
        if image is not None:
            return image
    return _decode_with_pillow(data, color, where)


def _decode_jpeg(data: bytes, color: bool | None) -> np.ndarray | None:
    """A JPEG through simplejpeg; None when it refuses the file (CMYK, damage), so that
    Pillow gets a try and gives the error."""
    simplejpeg = optional_module("simplejpeg")
    try:
        if color is None:
            color = simplejpeg.decode_jpeg_header(data, strict=False)[2] != "Gray"
        # strict=False: decode what is there despite recoverable damage (extra bytes after
        # the image, a premature end), as OpenCV does.
        hwc = simplejpeg.decode_jpeg(data, colorspace="BGR" if color else "GRAY",
                                     strict=False)
    except ValueError:
        return None
    return np.ascontiguousarray(hwc.transpose(2, 0, 1))


def _decode_with_pillow(data: bytes, color: bool | None, where: str) -> np.ndarray:
    image_module = pillow_image()
    # What Pillow raises for bytes it cannot decode, besides its own errors (all OSError).
    damage = (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error,
              image_module.DecompressionBombError)
    try:
        with image_module.open(io.BytesIO(data)) as img:
            img.load()
            grey = img.mode in _GREY_MODES
            keep_color = (not grey) if color is None else color
            if grey:
                plane = _eight_bit(np.asarray(img), img.mode)
                return np.stack([plane] * 3) if keep_color else plane[None].copy()
            if not keep_color:
                return np.asarray(_rgb(img).convert("L"))[None].copy()
            rgb = np.asarray(_rgb(img))
    except damage as e:
        raise DataError(f"{where}: not a readable image ({_reason(e)})") from None
    return np.ascontiguousarray(rgb.transpose(2, 0, 1)[::-1])   # RGB -> BGR


def _rgb(img):
    """A Pillow image as RGB, through RGBA when a palette has a transparent entry (Pillow
    warns when such an image goes to RGB directly)."""
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    return img.convert("RGB")


def _eight_bit(plane: np.ndarray, mode: str) -> np.ndarray:
    """A grey plane as uint8: 1-bit as 0/255, 16-bit scaled down by 256 (as OpenCV does for
    8-bit reads), floats rounded and clipped."""
    if mode == "1":
        return plane.astype(np.uint8) * np.uint8(255)
    if mode.startswith("I"):
        return np.clip(plane.astype(np.int64) >> 8, 0, 255).astype(np.uint8)
    if mode == "F":
        return np.clip(np.rint(plane), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(plane[..., 0] if plane.ndim == 3 else plane, dtype=np.uint8)


def _reason(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text[:200]


def read_image(path: str | os.PathLike, color: bool | None = True) -> np.ndarray:
    """Read an image file as uint8 C x H x W (see decode_image)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot read the image ({e.strerror or e})") from None
    return decode_image(data, color, str(path))


def resize_image(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of uint8 C x H x W to C x height x width (OpenCV's INTER_LINEAR)."""
    image = _check_image(image)
    if height < 1 or width < 1:
        raise ShapeError(f"resize_image: the new size must be positive, got {height} x {width}")
    _, h, w = image.shape
    if (h, w) == (height, width):
        return image
    top, bottom, wy = _taps(h, height)
    left, right, wx = _taps(w, width)
    pixels = image.astype(np.float32)
    rows = pixels[:, top] + (pixels[:, bottom] - pixels[:, top]) * wy[:, None]
    out = rows[:, :, left] + (rows[:, :, right] - rows[:, :, left]) * wx
    return np.floor(out + 0.5).clip(0, 255).astype(np.uint8)


def _taps(size: int, new_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output position along one axis: the two source indices and the weight of
    the second. Output pixel centres map onto input ones; OpenCV clamps a position before
    the first pixel to it (weight 0) and repeats the last pixel past the end."""
    scale = size / new_size
    pos = (np.arange(new_size, dtype=np.float64) + 0.5) * scale - 0.5
    first = np.floor(pos).astype(np.int64)
    weight = (pos - first).astype(np.float32)
    weight[first < 0] = 0.0
    first = np.maximum(first, 0)
    return np.minimum(first, size - 1), np.minimum(first + 1, size - 1), weight


def encode_image(image: np.ndarray, fmt: str = "png", quality: int = 90) -> bytes:
    """File bytes of a uint8 C x H x W image (BGR, or 1 channel): fmt "png" or "jpg"."""
    image = _check_image(image)
    fmt = fmt.lower().lstrip(".")
    hwc = np.ascontiguousarray(image.transpose(1, 2, 0))
    if fmt in ("jpg", "jpeg"):
        if not 1 <= int(quality) <= 100:
            raise DataError(f"encode_image: JPEG quality must be 1..100, got {quality}")
        simplejpeg = optional_module("simplejpeg")
        if image.shape[0] == 1:
            return simplejpeg.encode_jpeg(hwc, int(quality), colorspace="GRAY",
                                          colorsubsampling="Gray")
        return simplejpeg.encode_jpeg(hwc, int(quality), colorspace="BGR")
    if fmt == "png":
        image_module = pillow_image()
        picture = (image_module.fromarray(hwc[..., 0], "L") if image.shape[0] == 1
                   else image_module.fromarray(np.ascontiguousarray(hwc[..., ::-1]), "RGB"))
        out = io.BytesIO()
        picture.save(out, format="PNG")
        return out.getvalue()
    raise DataError(f"encode_image: unknown format '{fmt}' (png or jpg)")


def _check_image(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[0] not in (1, 3) or \
            math.prod(image.shape[1:]) == 0:
        raise ShapeError(f"expected a uint8 C x H x W image with 1 or 3 channels, got "
                         f"{image.dtype} {' x '.join(map(str, image.shape))}")
    return image
