"""`netrun data build|mean|describe` and their API in netrun.tools: databases of tiny images
built in tmp_path, read back record by record and compared with the image files' pixels."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from netrun.cli import cli

PIL = pytest.importorskip("PIL.Image")
pytest.importorskip("lmdb")


def run(*args: str, code: int = 0):
    """Invoke `netrun ARGS`; assert the exit code, showing the output when it differs."""
    result = CliRunner().invoke(cli, [str(a) for a in args], prog_name="netrun")
    assert result.exit_code == code, result.output + repr(result.exception)
    return result


# Images on disk ----------------------------------------------------------------------------
def noise(seed: int, height: int = 8, width: int = 8) -> np.ndarray:
    """H x W x 3 RGB noise: any resampling or channel mix-up changes it."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def smooth(seed: int, height: int = 16, width: int = 16) -> np.ndarray:
    """H x W x 3 RGB gradients: JPEG keeps them within a few levels."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.array([40, 120, 200]) + 10 * seed
    rgb = base + 4 * y[..., None] + 3 * x[..., None] * np.array([1, -1, 0.5])
    return np.clip(rgb, 0, 255).astype(np.uint8)


def save(path: Path, rgb: np.ndarray, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    PIL.fromarray(rgb).save(path, **kwargs)
    return path


def chw_bgr(rgb: np.ndarray) -> np.ndarray:
    """What a colour record holds for an RGB picture: C x H x W in Caffe's BGR order."""
    return np.ascontiguousarray(rgb[..., ::-1].transpose(2, 0, 1))


def pillow_pixels(path: Path) -> np.ndarray:
    with PIL.open(path) as im:
        return chw_bgr(np.asarray(im.convert("RGB")))


@pytest.fixture
def class_folder(tmp_path) -> Path:
    """cat/: three 8x8 PNGs; dog/: two 8x8 PNGs and one 10x12 PNG (names not in file order)."""
    root = tmp_path / "photos"
    for i, name in enumerate(["b.png", "a.png", "c.PNG"]):
        save(root / "cat" / name, noise(i))
    for i, name in enumerate(["x.png", "y.png"]):
        save(root / "dog" / name, noise(10 + i))
    save(root / "dog" / "z.png", noise(20, 10, 12))
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


def records(db: Path) -> list[tuple[str, object, np.ndarray]]:
    """(key, Datum, image) for each record, in key order, read with the data API."""
    from netrun.train.data.databases import open_database
    from netrun.train.data.datum import datum_image, decode_datum

    reader = open_database(db)
    try:
        out = []
        for key, value in reader.items():
            datum = decode_datum(value)
            out.append((key.decode(), datum, datum_image(datum)))
        return out
    finally:
        reader.close()


# build -------------------------------------------------------------------------------------
def test_build_from_a_class_folder_stores_exact_bgr_pixels(class_folder, tmp_path):
    out = tmp_path / "db"
    summary = json.loads(run("data", "build", class_folder, out, "--json").stdout)
    got = records(out)
    assert [k for k, _, _ in got] == ["00000000_cat/a.png", "00000001_cat/b.png",
                                      "00000002_cat/c.PNG", "00000003_dog/x.png",
                                      "00000004_dog/y.png", "00000005_dog/z.png"]
    assert [d.label for _, d, _ in got] == [0, 0, 0, 1, 1, 1]
    for key, datum, image in got:
        assert not datum.encoded and image.dtype == np.uint8
        np.testing.assert_array_equal(image, pillow_pixels(class_folder / key[9:]))
    assert got[5][2].shape == (3, 10, 12)
    assert (out / "classes.txt").read_text() == "cat\ndog\n"
    assert summary["records"] == 6 and summary["skipped"] == [] and summary["seed"] is None
    assert summary["classes"] == ["cat", "dog"] and summary["backend"] == "lmdb"
    assert sorted((tuple(s["shape"]), s["count"]) for s in summary["shapes"]) == [
        ((3, 8, 8), 5), ((3, 10, 12), 1)]
    assert summary["labels"] == [{"label": 0, "count": 3}, {"label": 1, "count": 3}]


def test_build_summary_goes_to_stderr(class_folder, tmp_path):
    result = run("data", "build", class_folder, tmp_path / "db")
    assert result.stdout == ""
    assert "wrote 6 raw records" in result.stderr and "2 classes" in result.stderr


def test_build_from_a_list_file_keeps_its_labels_and_paths(class_folder, tmp_path):
    listing = tmp_path / "train.txt"
    listing.write_text("dog/x.png 7\ncat/a.png 3\n\ncat/b.png 0\n")
    out = tmp_path / "db"
    summary = json.loads(run("data", "build", listing, out, "--root", f"{class_folder}/",
                             "--json").stdout)
    got = records(out)
    assert [(k, d.label) for k, d, _ in got] == [("00000000_dog/x.png", 7),
                                                 ("00000001_cat/a.png", 3),
                                                 ("00000002_cat/b.png", 0)]
    np.testing.assert_array_equal(got[0][2], chw_bgr(noise(10)))
    assert summary["classes"] is None and not (out / "classes.txt").exists()


def test_jpeg_files_decode_within_a_few_levels(tmp_path):
    root = tmp_path / "photos"
    save(root / "a" / "one.jpg", smooth(0), quality=95)
    save(root / "b" / "two.jpeg", smooth(1), quality=95)
    run("data", "build", root, tmp_path / "db")
    got = records(tmp_path / "db")
    for (key, _, image), seed in zip(got, (0, 1)):
        assert image.shape == (3, 16, 16)
        assert np.abs(image.astype(int) - chw_bgr(smooth(seed)).astype(int)).max() <= 6
        # The same file through Pillow: two JPEG decoders agree to a level or two.
        assert np.abs(image.astype(int) - pillow_pixels(root / key[9:]).astype(int)).max() <= 2


def test_resize_and_gray(class_folder, tmp_path):
    from netrun.train.data.images import read_image, resize_image

    run("data", "build", class_folder, tmp_path / "small", "--resize", "4x6", "--check-size")
    got = records(tmp_path / "small")
    assert {image.shape for _, _, image in got} == {(3, 4, 6)}
    expected = resize_image(read_image(class_folder / "dog" / "z.png"), 4, 6)
    np.testing.assert_array_equal(got[5][2], expected)

    run("data", "build", class_folder, tmp_path / "gray", "--gray",
        "--resize-height", "5", "--resize-width", "5")
    gray = records(tmp_path / "gray")
    assert {image.shape for _, _, image in gray} == {(1, 5, 5)}
    expected = resize_image(read_image(class_folder / "cat" / "a.png", color=False), 5, 5)
    np.testing.assert_array_equal(gray[0][2], expected)


def test_shuffle_is_deterministic_for_a_seed(tmp_path):
    root = tmp_path / "photos"
    for i in range(12):
        save(root / f"c{i % 3}" / f"{i:02d}.png", noise(i, 2, 2))

    def order(name: str, *args: str) -> list[str]:
        run("data", "build", root, tmp_path / name, *args)
        return [k.split("_", 1)[1] for k, _, _ in records(tmp_path / name)]

    plain = order("plain")
    first, again = order("s1", "--shuffle", "--seed", "5"), order("s1b", "--shuffle", "--seed", "5")
    other = order("s2", "--shuffle", "--seed", "6")
    assert first == again and sorted(first) == sorted(plain) == plain
    assert first != plain and other != first
    summary = json.loads(run("data", "build", root, tmp_path / "s3", "--shuffle",
                             "--json").stdout)
    assert isinstance(summary["seed"], int)   # a drawn seed is reported, to repeat the order
    assert order("s4", "--shuffle", "--seed", str(summary["seed"])) == [
        k.split("_", 1)[1] for k, _, _ in records(tmp_path / "s3")]


def test_encoded_records_keep_the_files_or_reencode(class_folder, tmp_path):
    run("data", "build", class_folder, tmp_path / "png", "--encoded")
    for key, datum, image in records(tmp_path / "png"):
        path = class_folder / key[9:]
        assert datum.encoded and datum.data == path.read_bytes()   # the file, as is
        np.testing.assert_array_equal(image, pillow_pixels(path))

    run("data", "build", class_folder, tmp_path / "resized", "--encoded", "--resize", "4x4")
    from netrun.train.data.images import read_image, resize_image
    for key, datum, image in records(tmp_path / "resized"):
        assert datum.encoded and datum.data.startswith(b"\x89PNG")   # lossless re-encoding
        np.testing.assert_array_equal(image, resize_image(read_image(class_folder / key[9:]),
                                                          4, 4))

    run("data", "build", class_folder, tmp_path / "jpg", "--encode-type", "jpg")
    for key, datum, image in records(tmp_path / "jpg"):
        assert datum.encoded and datum.data.startswith(b"\xff\xd8\xff")
        assert image.shape == pillow_pixels(class_folder / key[9:]).shape


def test_jpeg_files_are_stored_as_is_when_asked_for_jpeg(tmp_path):
    root = tmp_path / "photos"
    save(root / "a" / "one.jpg", smooth(0), quality=80)
    save(root / "a" / "two.png", smooth(1))
    run("data", "build", root, tmp_path / "db", "--encode-type", "jpeg")
    (_, kept, _), (_, converted, image) = records(tmp_path / "db")
    assert kept.data == (root / "a" / "one.jpg").read_bytes()
    assert converted.data.startswith(b"\xff\xd8\xff")
    assert np.abs(image.astype(int) - chw_bgr(smooth(1)).astype(int)).max() <= 8


def test_leveldb_backend_with_classes_file(class_folder, tmp_path):
    pytest.importorskip("plyvel")
    from netrun.train.data.databases import detect_backend

    out = tmp_path / "db"
    run("data", "build", class_folder, out, "--backend", "leveldb")
    assert (out / "classes.txt").is_file() and detect_backend(out) == "leveldb"
    got = records(out)
    assert len(got) == 6 and got[3][0] == "00000003_dog/x.png"
    np.testing.assert_array_equal(got[3][2], chw_bgr(noise(10)))
    info = json.loads(run("data", "describe", out, "--json").stdout)
    assert info["backend"] == "leveldb" and info["records"] == 6


def test_existing_output_needs_overwrite(class_folder, tmp_path):
    out = tmp_path / "db"
    run("data", "build", class_folder, out)
    result = run("data", "build", class_folder, out, "--resize", "2x2", code=2)
    assert "already exists" in result.stderr and "--overwrite" in result.stderr
    assert records(out)[0][2].shape == (3, 8, 8)   # untouched
    run("data", "build", class_folder, out, "--resize", "2x2", "--overwrite")
    assert records(out)[0][2].shape == (3, 2, 2)


def test_unreadable_images_are_skipped_with_a_warning(class_folder, tmp_path):
    (class_folder / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    result = run("data", "build", class_folder, tmp_path / "db", "--json")
    summary = json.loads(result.stdout)
    assert summary["records"] == 6 and len(summary["skipped"]) == 1
    assert summary["skipped"][0]["path"].endswith("broken.png")
    assert "skipped" in result.stderr and "broken.png" in result.stderr
    # Caffe's keys count the list, so the skipped image leaves its index unused.
    assert [k[:8] for k, _, _ in records(tmp_path / "db")] == [
        "00000000", "00000001", "00000003", "00000004", "00000005", "00000006"]


def test_a_missing_list_entry_is_skipped_too(class_folder, tmp_path):
    listing = tmp_path / "train.txt"
    listing.write_text("cat/a.png 0\ncat/missing.png 1\n")
    result = run("data", "build", listing, tmp_path / "db", "--root", class_folder)
    assert "missing.png" in result.stderr and len(records(tmp_path / "db")) == 1


def test_nothing_readable_is_an_error_and_writes_nothing(tmp_path):
    root = tmp_path / "photos"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.png").write_bytes(b"garbage")
    (root / "a" / "y.jpg").write_bytes(b"\xff\xd8\xff garbage")
    result = run("data", "build", root, tmp_path / "db", code=2)
    assert "none of the 2 images" in result.stderr
    assert not (tmp_path / "db").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["photos"]   # no temporary left behind


@pytest.mark.parametrize("args, message", [
    (["missing", "db"], "does not exist"),
    (["photos", "db", "--resize", "32"], "HEIGHTxWIDTH"),
    (["photos", "db", "--resize-height", "8"], "go together"),
    (["photos", "db", "--resize", "8x8", "--resize-width", "4"], "not both"),
    (["photos", "db", "--seed", "3"], "--shuffle"),
    (["photos", "db", "--root", "elsewhere"], "--root is for a list file"),
    (["empty", "db"], "no class subfolders"),
])
def test_build_option_and_input_errors(class_folder, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    result = run("data", "build", *args, code=2)
    assert message in result.stderr, result.stderr
    assert not (tmp_path / "db").exists()


def test_bad_list_lines_are_errors(class_folder, tmp_path):
    listing = tmp_path / "train.txt"
    listing.write_text("cat/a.png 0\ncat/b.png cat\n")
    result = run("data", "build", listing, tmp_path / "db", "--root", class_folder, code=2)
    assert "train.txt:2" in result.stderr and "'cat'" in result.stderr


def test_check_size_refuses_mixed_sizes(class_folder, tmp_path):
    result = run("data", "build", class_folder, tmp_path / "db", "--check-size", code=2)
    assert "z.png" in result.stderr and "3x10x12" in result.stderr and "3x8x8" in result.stderr
    assert not (tmp_path / "db").exists()


# mean --------------------------------------------------------------------------------------
@pytest.fixture
def square_db(class_folder, tmp_path) -> Path:
    (class_folder / "dog" / "z.png").unlink()   # all 8x8
    out = tmp_path / "square"
    run("data", "build", class_folder, out)
    return out


def test_mean_matches_numpy_and_round_trips(square_db, tmp_path):
    from netrun.proto.blobproto import read_blobproto

    images = np.stack([image for _, _, image in records(square_db)]).astype(np.float64)
    expected = images.mean(axis=0)
    result = run("data", "mean", square_db, "-o", tmp_path / "mean.binaryproto")
    blob = read_blobproto(tmp_path / "mean.binaryproto")
    assert blob.shape == (1, 3, 8, 8) and blob.dtype == np.float32
    np.testing.assert_allclose(blob[0], expected, rtol=1e-6)
    lines = result.stdout.splitlines()
    assert lines[0] == "Number of channels: 3"
    for c in range(3):
        value = float(lines[1 + c].split(":")[1])
        assert lines[1 + c].startswith(f"mean_value channel [{c}]:")
        assert value == pytest.approx(expected[c].mean(), rel=1e-5)

    data = json.loads(run("data", "mean", square_db, "-o", tmp_path / "mean.npy",
                          "--json").stdout)
    saved = np.load(tmp_path / "mean.npy")
    assert saved.shape == (3, 8, 8) and saved.dtype == np.float32
    np.testing.assert_allclose(saved, expected, rtol=1e-6)
    assert data["records"] == 5 and data["shape"] == [3, 8, 8] and data["format"] == "npy"
    np.testing.assert_allclose(data["channel_means"], expected.mean(axis=(1, 2)), rtol=1e-9)


def test_mean_api_accumulates_in_float64(square_db):
    from netrun.tools.image_mean import compute_mean

    result = compute_mean(square_db)
    images = np.stack([image for _, _, image in records(square_db)])
    assert result["mean"].dtype == np.float64 and result["records"] == 5
    np.testing.assert_array_equal(result["mean"], images.astype(np.float64).mean(axis=0))


def test_mean_errors(class_folder, tmp_path):
    run("data", "build", class_folder, tmp_path / "mixed")
    (class_folder / "dog" / "z.png").unlink()
    square_db = tmp_path / "square"
    run("data", "build", class_folder, square_db)
    result = run("data", "mean", tmp_path / "mixed", "-o", tmp_path / "m.npy", code=2)
    assert "3x10x12" in result.stderr and "--resize" in result.stderr
    assert not (tmp_path / "m.npy").exists()
    assert "binaryproto" in run("data", "mean", square_db, "-o", tmp_path / "m.txt",
                                code=2).stderr
    result = run("data", "mean", class_folder, code=2)
    assert "not an LMDB" in result.stderr and "netrun data build" in result.stderr
    assert "no such database" in run("data", "mean", tmp_path / "nope", code=2).stderr


def test_float_records_mean_and_describe(tmp_path):
    from netrun.tools.db_describe import describe_database
    from netrun.tools.image_mean import compute_mean
    from netrun.train.data.databases import DatabaseWriter
    from netrun.train.data.datum import Datum, encode_datum

    values = np.random.default_rng(0).normal(size=(4, 2, 3, 5)).astype(np.float32)
    with DatabaseWriter(tmp_path / "floats") as writer:
        for i, v in enumerate(values):
            datum = Datum(channels=2, height=3, width=5, float_data=v.reshape(-1), label=i % 2)
            writer.put(f"{i:08d}".encode(), encode_datum(datum))
    np.testing.assert_allclose(compute_mean(tmp_path / "floats")["mean"],
                               values.astype(np.float64).mean(axis=0), rtol=1e-12)
    info = describe_database(tmp_path / "floats", samples=2)
    assert info["kinds"] == {"raw": 0, "encoded": 0, "float": 4}
    assert info["shapes"] == [{"shape": [2, 3, 5], "count": 4}]
    assert len(info["samples"]) == 2 and info["samples"][0].dtype == np.float32


# describe ----------------------------------------------------------------------------------
def test_describe_json_counts_shapes_and_labels(class_folder, tmp_path):
    run("data", "build", class_folder, tmp_path / "db", "--encoded")
    info = json.loads(run("data", "describe", tmp_path / "db", "--json").stdout)
    assert info["backend"] == "lmdb" and info["records"] == 6
    assert info["kinds"] == {"raw": 0, "encoded": 6, "float": 0}
    assert info["formats"] == {"png": 6}
    assert info["shapes"] == [{"shape": [3, 8, 8], "count": 5}, {"shape": [3, 10, 12], "count": 1}]
    assert info["labels"] == [{"label": 0, "count": 3, "name": "cat"},
                              {"label": 1, "count": 3, "name": "dog"}]
    assert info["classes"] == ["cat", "dog"] and "samples" not in info and "grid" not in info
    text = run("data", "describe", tmp_path / "db").stdout
    assert "6 records" in text and "3x10x12" in text and "cat" in text and "50.0%" in text


def test_describe_grid_png(class_folder, tmp_path):
    run("data", "build", class_folder, tmp_path / "db")
    grid = tmp_path / "samples.png"
    info = json.loads(run("data", "describe", tmp_path / "db", "--grid", grid, "--samples", "5",
                          "--json").stdout)
    # 5 samples: rows of ceil(sqrt(5)) = 3 cells, 2 rows, of 8x8 (z.png, 10x12, is sixth).
    with PIL.open(grid) as im:
        assert im.mode == "RGB" and im.size == (3 * 8, 2 * 8)
        pixels = np.asarray(im)
    assert info["grid"] == {"path": str(grid), "samples": 5, "width": 24, "height": 16}
    np.testing.assert_array_equal(pixels[:8, :8], noise(1))            # cat/a.png, as RGB
    np.testing.assert_array_equal(pixels[:8, 8:16], noise(0))          # cat/b.png
    np.testing.assert_array_equal(pixels[8:, 16:], 0)                  # the sixth cell: empty

    from netrun.train.data.images import read_image

    run("data", "build", class_folder, tmp_path / "gray", "--gray")
    run("data", "describe", tmp_path / "gray", "--grid", tmp_path / "gray.png")
    with PIL.open(tmp_path / "gray.png") as im:   # all 6: 3 a row, cells of the largest, 10x12
        assert im.mode == "L" and im.size == (36, 20)
        pixels = np.asarray(im)
    np.testing.assert_array_equal(pixels[:8, :8],
                                  read_image(class_folder / "cat" / "a.png", color=False)[0])
    np.testing.assert_array_equal(pixels[8:10, :12], 0)                # padding below 8x8
    np.testing.assert_array_equal(pixels[:8, 8:12], 0)                 # and beside it


def test_image_grid_mixes_gray_colour_and_floats():
    from netrun.tools.db_describe import image_grid

    colour = np.full((3, 2, 2), 200, np.uint8)
    gray = np.full((1, 3, 1), 50, np.uint8)
    floats = np.array([[[-1.0, 1.0]]], np.float32)   # 1 x 1 x 2, stretched to 0..255
    grid = image_grid([colour, gray, floats])
    assert grid.shape == (3, 2 * 3, 2 * 2) and grid.dtype == np.uint8
    np.testing.assert_array_equal(grid[:, :2, :2], 200)
    np.testing.assert_array_equal(grid[:, :3, 2], 50)
    np.testing.assert_array_equal(grid[:, 3, :2], [[0, 255]] * 3)
    assert image_grid([gray]).shape == (1, 3, 1)
    assert math.isclose(image_grid([np.full((1, 1, 1), 7.0)])[0, 0, 0], 0)


def test_describe_errors(tmp_path, square_db):
    assert "no such database" in run("data", "describe", tmp_path / "nope", code=2).stderr
    (tmp_path / "plain").mkdir()
    run("data", "describe", tmp_path / "plain", code=2)
    result = run("data", "describe", square_db, "--grid", tmp_path / "g.gif", code=2)
    assert ".png" in result.stderr


def test_help_has_examples_and_describes_every_option():
    for command in ("build", "mean", "describe"):
        text = run("data", command, "--help").stdout
        assert "Example" in text and "netrun data " + command in text
    assert "LMDB or LevelDB" in run("data", "mean", "--help").stdout
    assert all(c in run("data", "--help").stdout for c in ("build", "mean", "describe"))


def test_build_api_returns_a_summary(class_folder, tmp_path):
    from netrun.tools.imageset import build_database

    seen, skipped = [], []
    (class_folder / "dog" / "bad.png").write_bytes(b"nope")
    summary = build_database(class_folder, tmp_path / "db", resize=(4, 4),
                             on_progress=lambda done, total: seen.append((done, total)),
                             on_skip=lambda path, reason: skipped.append(path))
    assert summary["records"] == 6 and summary["shapes"] == [{"shape": [3, 4, 4], "count": 6}]
    assert seen[-1] == (7, 7) and len(seen) == 7
    assert len(skipped) == 1 and skipped[0].endswith("bad.png")
    assert summary["disk_bytes"] > summary["record_bytes"] > 6 * 48


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "rocksdb"}, "unknown database backend 'rocksdb'"),
    ({"resize": (4, 0)}, "give both a height and a width"),
    ({"encode_type": "gif"}, "use png or jpg"),
    ({"quality": 0}, "use 1 to 100"),
    ({"shuffle": True, "seed": -1}, "0 or more"),
])
def test_build_api_option_errors(class_folder, tmp_path, kwargs, message):
    from netrun.errors import NetrunError
    from netrun.tools.imageset import build_database

    with pytest.raises(NetrunError, match=message):
        build_database(class_folder, tmp_path / "db", **kwargs)
    assert not (tmp_path / "db").exists()


def test_an_empty_database_has_no_mean_and_no_grid(tmp_path):
    from netrun.train.data.databases import DatabaseWriter

    with DatabaseWriter(tmp_path / "empty"):
        pass
    assert "no records" in run("data", "mean", tmp_path / "empty", code=2).stderr
    info = json.loads(run("data", "describe", tmp_path / "empty", "--json").stdout)
    assert info["records"] == 0 and info["labels"] == [] and info["shapes"] == []
    result = run("data", "describe", tmp_path / "empty", "--grid", tmp_path / "g.png", code=2)
    assert "no records" in result.stderr and not (tmp_path / "g.png").exists()
