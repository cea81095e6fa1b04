"""Image files as C x H x W uint8 in Caffe's BGR order: decoding (JPEG through simplejpeg,
the rest through Pillow), encoding, and OpenCV-style bilinear resizing."""
from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from PIL import Image

from netrun.errors import DataError, NetrunError, ShapeError
from netrun.train.data.images import (
    IMAGE_SUFFIXES,
    decode_image,
    encode_image,
    read_image,
    resize_image,
)


def pillow_bytes(array: np.ndarray, fmt: str, mode: str | None = None, **options) -> bytes:
    """An image file written by Pillow alone (H x W x 3 RGB or H x W), not by netrun."""
    out = io.BytesIO()
    Image.fromarray(array, mode).save(out, format=fmt, **options)
    return out.getvalue()


def smooth_bgr(h=24, w=32) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 7, y * 9, (x + y) * 4]).clip(0, 255).astype(np.uint8)


# ------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "BMP", "TIFF", "WEBP", "PPM", "GIF"])
def test_a_red_pixel_comes_out_in_bgr_order(fmt):
    rgb = np.zeros((8, 8, 3), np.uint8)
    rgb[..., 0] = 255                                           # pure red, as Pillow writes it
    options = {"quality": 100} if fmt in ("JPEG", "WEBP") else {}
    if fmt == "WEBP":
        options["lossless"] = True
    image = decode_image(pillow_bytes(rgb, fmt, **options))
    assert image.shape == (3, 8, 8) and image.dtype == np.uint8
    blue, green, red = image[:, 4, 4].astype(int)
    assert red >= 250 and blue <= 5 and green <= 5


def test_png_round_trip_is_exact_in_colour_and_grey():
    bgr = smooth_bgr()
    np.testing.assert_array_equal(decode_image(encode_image(bgr)), bgr)
    grey = bgr[:1]
    np.testing.assert_array_equal(decode_image(encode_image(grey), color=False), grey)
    # color=None keeps what the file has; color=True repeats a grey plane three times.
    assert decode_image(encode_image(grey), color=None).shape == (1, 24, 32)
    assert decode_image(encode_image(bgr), color=None).shape == (3, 24, 32)
    np.testing.assert_array_equal(decode_image(encode_image(grey)), np.repeat(grey, 3, 0))
    # netrun's PNG is an ordinary PNG: Pillow reads it back as the RGB image.
    rgb = np.asarray(Image.open(io.BytesIO(encode_image(bgr))))
    np.testing.assert_array_equal(rgb, bgr.transpose(1, 2, 0)[..., ::-1])


def test_jpeg_round_trip_is_close_and_grey_jpegs_stay_grey():
    bgr = smooth_bgr()
    back = decode_image(encode_image(bgr, "jpg", quality=95))
    assert back.shape == bgr.shape
    assert np.abs(back.astype(int) - bgr).mean() < 2.5
    grey = bgr[1:2]
    data = encode_image(grey, "jpeg", quality=95)
    assert decode_image(data, color=None).shape == (1, 24, 32)
    assert np.abs(decode_image(data, color=False).astype(int) - grey).max() <= 6
    three = decode_image(data, color=True)
    assert three.shape == (3, 24, 32) and (three == three[:1]).all()


def test_colour_to_grey_uses_the_luma_weights():
    rgb = np.zeros((4, 4, 3), np.uint8)
    rgb[..., 0] = 200                                           # red 200 -> 0.299 * 200 = 60
    assert decode_image(pillow_bytes(rgb, "PNG"), color=False)[0, 0, 0] in (59, 60)
    jpeg = decode_image(pillow_bytes(rgb, "JPEG", quality=100), color=False)[0, 0, 0]
    assert abs(int(jpeg) - 60) <= 2


def test_alpha_palette_and_sixteen_bit_images():
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 2], rgba[..., 3] = 255, 0                          # blue, fully transparent
    np.testing.assert_array_equal(decode_image(pillow_bytes(rgba, "PNG"))[:, 0, 0], [255, 0, 0])
    palette = Image.new("P", (4, 4), 1)
    palette.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)         # index 1 is green
    out = io.BytesIO()
    palette.save(out, format="PNG", transparency=0)
    np.testing.assert_array_equal(decode_image(out.getvalue())[:, 2, 2], [0, 255, 0])
    deep = np.full((3, 5), 0x1234, np.uint16)
    out = io.BytesIO()
    Image.fromarray(deep).save(out, format="PNG")
    image = decode_image(out.getvalue(), color=None)
    assert image.shape == (1, 3, 5) and (image == 0x12).all()    # the high byte, as OpenCV


def test_suffixes_are_those_of_the_contract():
    assert IMAGE_SUFFIXES == (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff",
                              ".webp", ".ppm", ".pgm")


def test_read_image_from_a_file(tmp_path):
    bgr = smooth_bgr(5, 6)
    (tmp_path / "a.png").write_bytes(encode_image(bgr))
    np.testing.assert_array_equal(read_image(tmp_path / "a.png"), bgr)
    assert read_image(tmp_path / "a.png", color=False).shape == (1, 5, 6)


# ------------------------------------------------------------------------- errors
def test_bytes_that_are_not_an_image(tmp_path):
    with pytest.raises(DataError, match=r"cat.jpg: not a readable image"):
        decode_image(b"\xff\xd8\xff\xe0 this is no jpeg at all", where="cat.jpg")
    with pytest.raises(DataError, match=r"x.png: not a readable image"):
        decode_image(b"hello world", where="x.png")
    truncated = encode_image(smooth_bgr())[:60]
    with pytest.raises(DataError, match=r"record 7: not a readable image"):
        decode_image(truncated, where="record 7")
    with pytest.raises(DataError, match="empty image data"):
        decode_image(b"")
    with pytest.raises(DataError, match=r"missing.png: cannot read the image"):
        read_image(tmp_path / "missing.png")


def test_encode_refuses_what_is_not_an_image():
    with pytest.raises(ShapeError, match=r"uint8 C x H x W image with 1 or 3 channels, got "
                                         r"float32 3 x 4 x 4"):
        encode_image(np.zeros((3, 4, 4), np.float32))
    with pytest.raises(ShapeError, match="got uint8 2 x 4 x 4"):
        encode_image(np.zeros((2, 4, 4), np.uint8))
    with pytest.raises(DataError, match="unknown format 'gif'"):
        encode_image(np.zeros((3, 4, 4), np.uint8), "gif")


def test_a_missing_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "simplejpeg", None)         # makes the import fail
    with pytest.raises(NetrunError, match=r"install it with: pip install 'netrun\[images\]'"):
        decode_image(b"\xff\xd8\xff\xe0 a JPEG needs simplejpeg")


# ------------------------------------------------------------------------- resizing
def test_resize_up_matches_a_hand_computation():
    image = np.array([[[0, 100], [200, 40]]], np.uint8)          # 1 x 2 x 2
    # Along each axis, output pixels 0..3 sample source positions -0.25 (clamped to 0),
    # 0.25, 0.75 and 1.25 (past the end: the last pixel).
    weights = np.array([[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]])
    expected = weights @ image[0].astype(float) @ weights.T
    np.testing.assert_array_equal(resize_image(image, 4, 4)[0], np.floor(expected + 0.5))


def test_resize_down_and_by_a_fraction():
    image = np.arange(16, dtype=np.uint8).reshape(1, 4, 4) * 10
    # Halving: positions 0.5 and 2.5, the mean of each pair of pixels.
    halved = resize_image(image, 2, 2)[0]
    np.testing.assert_array_equal(halved, [[25, 45], [105, 125]])
    # 3 -> 2 columns: positions 0.25 and 1.75.
    row = np.array([[[0, 60, 120]]], np.uint8)
    np.testing.assert_array_equal(resize_image(row, 1, 2)[0, 0], [15, 105])
    three = np.repeat(image, 3, axis=0)
    assert resize_image(three, 3, 5).shape == (3, 3, 5)
    assert resize_image(three, 4, 4) is three                  # same size: untouched
    with pytest.raises(ShapeError, match="must be positive"):
        resize_image(three, 0, 4)
