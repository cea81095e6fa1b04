"""The sources of users' own images (lmdb, leveldb, db, imagedata, folder) through
make_source: lazy uint8 examples, labels, the batch loader and Caffe's transforms on them,
pickling, and the errors for bad data."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from netrun.errors import ConfigError, DataError, NetrunError
from netrun.proto.blobproto import blob_bytes
from netrun.train.data import BatchLoader, Transform, iterate_once, make_source, make_transform
from netrun.train.data.databases import DatabaseWriter
from netrun.train.data.datum import datum_from_image, encode_datum
from netrun.train.data.image_lists import read_list_file, scan_folder
from netrun.train.data.images import encode_image

SHAPE = (3, 6, 7)


def examples(n=12, shape=SHAPE, seed=0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (n, *shape), dtype=np.uint8),
            (np.arange(n) % 3).astype(np.int32))


def write_db(path, images, labels, backend="lmdb", fmt=None):
    """A Caffe database as convert_imageset writes it: keys '%08d_name' in file order."""
    with DatabaseWriter(path, backend) as writer:
        for i, (image, label) in enumerate(zip(images, labels)):
            encoded = encode_image(image, fmt) if fmt else None
            writer.put(b"%08d_img%d.png" % (i, i),
                       encode_datum(datum_from_image(image, int(label), encoded)))
    return path


def write_images(folder, images, names) -> list:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for image, name in zip(images, names):
        (folder / name).write_bytes(encode_image(image))
        paths.append(folder / name)
    return paths


def same_batches(lazy_part, eager_data, labels, transform, batch=5, steps=4):
    """The loader over the lazy uint8 part gives exactly what it gives over float32 data."""
    lazy = BatchLoader(tuple(lazy_part), batch, shuffle=True, seed=3, transform=transform,
                       prefetch=False)
    eager = BatchLoader((eager_data.astype(np.float32), labels), batch, shuffle=True, seed=3,
                        transform=transform, prefetch=False)
    for _ in range(steps):
        (x, y), (ex, ey) = next(lazy), next(eager)
        assert x.dtype == np.float32
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)


# --------------------------------------------------------------------------- databases
@pytest.mark.parametrize("name, backend, fmt", [("lmdb", "lmdb", None),
                                                ("leveldb", "leveldb", "png"),
                                                ("db", "lmdb", "png"),
                                                ("lmdb", "leveldb", None)])  # files decide
def test_database_sources(tmp_path, name, backend, fmt):
    images, labels = examples()
    write_db(tmp_path / "train_db", images, labels, backend, fmt)
    write_db(tmp_path / "test_db", images[:4], labels[:4], backend, fmt)
    source = make_source({"source": name, "train": "train_db", "test": "test_db"},
                         config_dir=tmp_path)
    assert source.shuffle is False                        # Caffe's Data layer reads in order
    assert source.input_shape == SHAPE and source.num_classes == 3
    data, label = source.train
    assert (data.shape, data.dtype, data.ndim, len(data)) == ((12, *SHAPE), np.uint8, 4, 12)
    np.testing.assert_array_equal(label, labels)
    assert label.dtype == np.int32
    np.testing.assert_array_equal(data[[3, 0, 3]], images[[3, 0, 3]])
    np.testing.assert_array_equal(data[2:5], images[2:5])
    np.testing.assert_array_equal(data[-1], images[-1])
    assert len(source.test.data) == 4
    transform = Transform(crop_size=4, mirror=True, mean=[100, 110, 120], scale=0.5)
    same_batches(source.train, images, labels, transform)
    same_batches(source.train, images, labels, None)
    evaluated = list(iterate_once(tuple(source.test), 3, transform))
    np.testing.assert_array_equal(np.concatenate([b[0] for b in evaluated]),
                                  transform(images[:4].astype(np.float32), train=False))


def test_encoded_records_read_in_colour_or_grey(tmp_path):
    images, labels = examples(4)
    write_db(tmp_path / "jpegs", images, labels, fmt="jpg")
    grey = make_source({"source": "db", "train": str(tmp_path / "jpegs"), "color": False})
    assert grey.input_shape == (1, 6, 7) and grey.train.data[:2].shape == (2, 1, 6, 7)
    colour = make_source({"source": "db", "train": str(tmp_path / "jpegs")})
    close = colour.train.data[:].astype(int)
    assert close.shape == (4, *SHAPE) and np.abs(close - images).mean() < 20


def test_float_data_records(tmp_path):
    features = np.random.default_rng(1).normal(size=(6, 4, 1, 1)).astype(np.float32)
    with DatabaseWriter(tmp_path / "feats") as writer:
        for i, row in enumerate(features):
            writer.put(b"%08d" % i, encode_datum(datum_from_image(row, i % 2)))
    source = make_source({"source": "lmdb", "train": str(tmp_path / "feats"), "num_classes": 5})
    data = source.train.data
    assert data.dtype == np.float32 and data.shape == (6, 4, 1, 1) and source.num_classes == 5
    np.testing.assert_array_equal(data[:], features)


def test_lazy_arrays_pickle_without_handles(tmp_path):
    images, labels = examples(6)
    write_db(tmp_path / "db", images, labels)
    data = make_source({"source": "db", "train": str(tmp_path / "db")}).train.data
    data[:2]                                              # opens the handle here
    blob = pickle.dumps(data)
    assert b"Environment" not in blob and len(blob) < 2000
    np.testing.assert_array_equal(pickle.loads(blob)[[5, 1]], images[[5, 1]])
    files = write_images(tmp_path / "img", images, [f"{i}.png" for i in range(6)])
    listed = tmp_path / "list.txt"
    listed.write_text("".join(f"{p} {lbl}\n" for p, lbl in zip(files, labels)))
    part = make_source({"source": "imagedata", "train": str(listed)}).train.data
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(part))[4], images[4])


def test_lazy_arrays_index_like_arrays(tmp_path):
    images, labels = examples(7)
    write_db(tmp_path / "db", images, labels)
    data = make_source({"source": "db", "train": str(tmp_path / "db")}).train.data
    for index in (slice(None, None, -2), slice(5, 100), slice(3, 3), [-1, 0], np.int64(2),
                  np.array([[1, 2], [3, 4]]).ravel(), np.arange(7) % 2 == 0):
        np.testing.assert_array_equal(data[index], images[index])
    assert data[[]].shape == (0, *SHAPE)
    with pytest.raises(IndexError, match="out of range for 7 examples"):
        data[[7]]
    with pytest.raises(IndexError, match="by integers, not float64"):
        data[np.array([0.5])]


def test_database_errors(tmp_path):
    images, labels = examples(3)
    with DatabaseWriter(tmp_path / "mixed") as writer:
        for i, image in enumerate([images[0], images[1][:, :5], images[2]]):
            writer.put(b"%08d" % i, encode_datum(datum_from_image(image, 0)))
    data = make_source({"source": "db", "train": str(tmp_path / "mixed")}).train.data
    with pytest.raises(DataError, match=r"mixed record '00000001': the example is 3 x 5 x 7 "
                                        r"but the first one is 3 x 6 x 7"):
        data[[0, 1]]
    with pytest.raises(DataError, match=r"data.train: no such folder .*nowhere"):
        make_source({"source": "lmdb", "train": "nowhere"}, config_dir=tmp_path)
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match=r"plain: not an LMDB"):
        make_source({"source": "lmdb", "train": str(tmp_path / "plain")}).train
    with DatabaseWriter(tmp_path / "empty"):
        pass
    with pytest.raises(DataError, match=r"empty: the database has no records"):
        make_source({"source": "db", "train": str(tmp_path / "empty")}).input_shape
    with pytest.raises(ConfigError, match=r"needs 'train:' and/or 'test:'"):
        make_source({"source": "db"})
    with pytest.raises(ConfigError, match=r"data.color: expected true or false, got 'yes'"):
        make_source({"source": "db", "train": str(tmp_path / "mixed"), "color": "yes"})
    with pytest.raises(ConfigError, match=r"unknown key 'new_height' for source 'lmdb'"):
        make_source({"source": "lmdb", "train": str(tmp_path / "mixed"), "new_height": 3})


# --------------------------------------------------------------------------- image lists
def test_imagedata_source(tmp_path):
    images, labels = examples(8)
    names = [f"pic {i}.png" for i in range(8)]                   # paths with spaces
    write_images(tmp_path / "pics", images, names)
    (tmp_path / "train.txt").write_text(
        "".join(f"{n} {lbl}\n" for n, lbl in zip(names, labels)) + "\n")
    (tmp_path / "test.txt").write_text("pic 7.png 1\n")
    cfg = {"source": "imagedata", "train": "train.txt", "test": "test.txt",
           "root_folder": "pics", "shuffle": True}
    source = make_source(cfg, config_dir=tmp_path)
    assert source.shuffle is True and source.input_shape == SHAPE and source.num_classes == 3
    np.testing.assert_array_equal(source.train.label, labels)
    np.testing.assert_array_equal(source.train.data[:], images)
    np.testing.assert_array_equal(source.test.data[0], images[7])
    assert make_source({**cfg, "shuffle": None}, config_dir=tmp_path).shuffle is False
    mean = tmp_path / "mean.binaryproto"                         # a Caffe mean file
    mean.write_bytes(blob_bytes(np.full((1, *SHAPE), 50, np.float32)))
    transform = make_transform({"mean_file": "mean.binaryproto", "crop_size": 5,
                                "mirror": True}, tmp_path)
    same_batches(source.train, images, labels, transform)
    np.testing.assert_array_equal(transform.mean, np.full(SHAPE, 50, np.float32))
    with pytest.raises(ConfigError, match=r"m.txt is neither a .npy file nor a Caffe "
                                          r".binaryproto mean"):
        make_transform({"mean_file": "m.txt"}, tmp_path)
    (tmp_path / "bad.binaryproto").write_bytes(b"\x0a\x05ab")
    with pytest.raises(NetrunError, match=r"bad.binaryproto: not a readable BlobProto"):
        make_transform({"mean_file": "bad.binaryproto"}, tmp_path)
    grey = make_source({**cfg, "is_color": False, "new_height": 3, "new_width": 4},
                       config_dir=tmp_path)
    assert grey.input_shape == (1, 3, 4) and grey.train.data[:2].shape == (2, 1, 3, 4)


def test_imagedata_with_images_of_several_sizes(tmp_path):
    images, labels = examples(2)
    small = examples(1, (3, 4, 4), seed=5)[0]
    write_images(tmp_path, [images[0], small[0]], ["a.png", "b.png"])
    (tmp_path / "list.txt").write_text("a.png 0\nb.png 1\n")
    plain = make_source({"source": "imagedata", "train": str(tmp_path / "list.txt")})
    with pytest.raises(DataError, match=r"b.png: the example is 3 x 4 x 4 but the first one "
                                        r"is 3 x 6 x 7; give new_height and new_width"):
        plain.train.data[:]
    resized = make_source({"source": "imagedata", "train": str(tmp_path / "list.txt"),
                           "new_height": 5, "new_width": 5})
    assert resized.train.data[:].shape == (2, 3, 5, 5)
    with pytest.raises(ConfigError, match="give both new_height and new_width"):
        make_source({"source": "imagedata", "train": str(tmp_path / "list.txt"),
                     "new_height": 5})


def test_image_list_errors(tmp_path):
    write_images(tmp_path, examples(1)[0], ["a.png"])
    bad = tmp_path / "bad.txt"
    bad.write_text("a.png 0\n\njust_a_name\n")
    with pytest.raises(DataError, match=r"bad.txt:3: expected 'IMAGE_PATH LABEL'"):
        read_list_file(bad)
    bad.write_text("a.png zero\n")
    with pytest.raises(DataError, match=r"bad.txt:1: the label 'zero' is not a whole number"):
        read_list_file(bad)
    bad.write_text("a.png -1\n")
    with pytest.raises(DataError, match=r"bad.txt:1: negative label -1"):
        read_list_file(bad)
    bad.write_text("a.png 0\ngone.png 1\n")
    with pytest.raises(DataError, match=r"bad.txt: 1 of 2 images are missing: .*gone.png"):
        make_source({"source": "imagedata", "train": str(bad)}).train
    with pytest.raises(DataError, match=r"data.train: no such file .*absent.txt"):
        make_source({"source": "imagedata", "train": "absent.txt"}, config_dir=tmp_path)
    # The label follows the last space or tab; the rest of the line is the path.
    elsewhere = tmp_path / "images"
    bad.write_text(f"my pic.png\t4\r\n{elsewhere / 'x y.png'} 2\n")
    assert read_list_file(bad, tmp_path / "root") == [(tmp_path / "root" / "my pic.png", 4),
                                                      (elsewhere / "x y.png", 2)]
    assert read_list_file(bad)[0] == (tmp_path / "my pic.png", 4)   # beside the list


# --------------------------------------------------------------------------- folders
def test_folder_source(tmp_path):
    images, _ = examples(9)
    for k, cls in enumerate(["dog", "cat", "bird"]):
        write_images(tmp_path / "train" / cls, images[3 * k:3 * k + 3],
                     [f"{i}.PNG" for i in range(3)])
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    write_images(tmp_path / "train" / "bird" / "more", images[:1], ["x.png"])
    write_images(tmp_path / "test" / "dog", images[:1], ["q.png"])
    source = make_source({"source": "folder", "train": "train", "test": "test"},
                         config_dir=tmp_path)
    assert source.shuffle is True and source.num_classes == 3
    assert source.class_names == ["bird", "cat", "dog"]
    # bird (label 0): 0..2.PNG and more/x.png; cat (1); dog (2)
    np.testing.assert_array_equal(source.train.label, [0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(source.train.data[3], images[0])     # bird/more/x.png
    np.testing.assert_array_equal(source.train.data[4], images[3])     # cat/0.PNG
    np.testing.assert_array_equal(source.test.label, [2])
    entries, classes = scan_folder(tmp_path / "train")
    assert classes == ["bird", "cat", "dog"] and len(entries) == 10
    small = make_source({"source": "folder", "train": str(tmp_path / "train"), "resize": 4,
                         "color": False, "shuffle": False})
    assert small.shuffle is False and small.input_shape == (1, 4, 4)
    assert small.train.data[:].shape == (10, 1, 4, 4)
    wide = make_source({"source": "folder", "train": str(tmp_path / "train"), "resize": [2, 5]})
    assert wide.train.data[[0]].shape == (1, 3, 2, 5)
    transform = Transform(crop_size=5, mirror=True, mean=np.full(SHAPE, 9.0), scale=2.0)
    everything = source.train.data[:]
    same_batches(source.train, everything, source.train.label, transform)


def test_folder_errors(tmp_path):
    images, _ = examples(2)
    write_images(tmp_path / "train" / "a", images[:1], ["1.png"])
    write_images(tmp_path / "train" / "b", examples(1, (3, 4, 4))[0], ["2.png"])
    source = make_source({"source": "folder", "train": str(tmp_path / "train")})
    with pytest.raises(DataError, match=r"2.png: the example is 3 x 4 x 4 but the first one is "
                                        r"3 x 6 x 7; set resize: N \(or \[H, W\]\)"):
        source.train.data[:]
    write_images(tmp_path / "test" / "zebra", images[:1], ["z.png"])
    both = make_source({"source": "folder", "train": str(tmp_path / "train"),
                        "test": str(tmp_path / "test")})
    with pytest.raises(DataError, match=r"class folder\(s\) zebra are not among the training "
                                        r"classes \(a, b\)"):
        both.test
    (tmp_path / "flat").mkdir()
    write_images(tmp_path / "flat", images[:1], ["1.png"])
    with pytest.raises(DataError, match=r"flat: no class subfolders"):
        make_source({"source": "folder", "train": str(tmp_path / "flat")}).train
    with pytest.raises(ConfigError, match=r"data.resize: expected a size N"):
        make_source({"source": "folder", "train": str(tmp_path / "train"), "resize": [1, 2, 3]})
    (tmp_path / "train" / "a" / "1.png").write_bytes(b"garbage")
    with pytest.raises(DataError, match=r"1.png: not a readable image"):
        make_source({"source": "folder", "train": str(tmp_path / "train"), "resize": 3}
                    ).train.data[:]
    assert issubclass(DataError, NetrunError)
