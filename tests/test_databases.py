"""Caffe's key-value databases: LMDB and LevelDB written and read back, the backend told from
the files, the atomic writer, readers that pickle into fresh processes."""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import sys

import pytest

from netrun.errors import ConfigError, DataError, NetrunError
from netrun.train.data import databases
from netrun.train.data.databases import (
    DatabaseReader,
    DatabaseWriter,
    detect_backend,
    open_database,
)

BACKENDS = ["lmdb", "leveldb"]


def records(n=30):
    # Written out of key order: both databases keep keys sorted.
    return {b"%08d_img%d.png" % (i, i): bytes([i]) * (i + 1) for i in reversed(range(n))}


def write(path, backend, items, **options):
    with DatabaseWriter(path, backend, **options) as writer:
        for key, value in items.items():
            writer.put(key, value)
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_written_records_read_back_in_key_order(tmp_path, backend):
    items = records()
    path = write(tmp_path / "db", backend, items)
    assert detect_backend(path) == backend
    with open_database(path) as reader:
        assert reader.backend == backend and reader.path == path
        assert len(reader) == 30
        assert reader.keys() == sorted(items)
        assert dict(reader.items()) == items
        assert list(reader.items())[0][0] == b"00000000_img0.png"
        assert reader.first() == (b"00000000_img0.png", b"\x00")
        assert reader.get(b"00000003_img3.png") == b"\x03" * 4
        assert reader.get_many([b"00000002_img2.png", b"00000001_img1.png"], len) == [3, 2]
        with pytest.raises(DataError, match=r"no record with key b'nope'"):
            reader.get(b"nope")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_empty_database(tmp_path, backend):
    path = write(tmp_path / "empty", backend, {})
    with open_database(path) as reader:
        assert len(reader) == 0 and reader.keys() == [] and reader.first() is None


def test_the_backend_comes_from_the_files(tmp_path):
    lmdb_path = write(tmp_path / "a", "lmdb", records(2))
    level_path = write(tmp_path / "b", "leveldb", records(2))
    assert sorted(os.listdir(lmdb_path)) == ["data.mdb", "lock.mdb"]
    assert (detect_backend(lmdb_path), detect_backend(level_path)) == ("lmdb", "leveldb")
    # A reader told the wrong backend says what the folder is.
    with pytest.raises(DataError, match=r"a is an LMDB database, not leveldb"):
        open_database(lmdb_path, "leveldb")
    with pytest.raises(ConfigError, match="unknown database backend 'rocksdb'"):
        open_database(lmdb_path, "rocksdb")
    with pytest.raises(DataError, match=r"missing: no such database folder"):
        detect_backend(tmp_path / "missing")
    (tmp_path / "file.mdb").write_bytes(b"x")
    with pytest.raises(DataError, match=r"file.mdb is a file, not a database folder"):
        detect_backend(tmp_path / "file.mdb")
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "cat.jpg").write_bytes(b"x")
    with pytest.raises(DataError, match=r"images: not an LMDB \(no data.mdb\) or LevelDB .* "
                                        r"the folder holds cat.jpg"):
        detect_backend(tmp_path / "images")
    (tmp_path / "void").mkdir()
    with pytest.raises(DataError, match="the folder holds nothing"):
        detect_backend(tmp_path / "void")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_write_leaves_no_database(tmp_path, backend):
    with pytest.raises(RuntimeError, match="stop"):
        with DatabaseWriter(tmp_path / "db", backend) as writer:
            for i in range(2500):                     # past one write batch
                writer.put(b"%08d" % i, b"v")
            raise RuntimeError("stop")
    assert os.listdir(tmp_path) == []                 # neither the target nor a temporary


def test_an_existing_target_is_refused_unless_overwritten(tmp_path):
    path = write(tmp_path / "db", "lmdb", {b"k": b"old"})
    with pytest.raises(DataError, match=r"db already exists; remove it, choose another name"):
        DatabaseWriter(path)
    write(path, "leveldb", {b"k": b"new"}, overwrite=True)
    with open_database(path) as reader:
        assert reader.backend == "leveldb" and reader.get(b"k") == b"new"
    assert sorted(os.listdir(tmp_path)) == ["db"]
    # overwrite never removes a folder that is not a database.
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "me.jpg").write_bytes(b"x")
    with pytest.raises(DataError, match="not an LMDB"):
        DatabaseWriter(tmp_path / "photos", overwrite=True)
    assert (tmp_path / "photos" / "me.jpg").exists()


def test_lmdb_map_grows_as_needed(tmp_path, monkeypatch):
    monkeypatch.setattr(databases, "_LMDB_MAP_START", 64 << 10)     # 64 KiB to start
    items = {b"%04d" % i: os.urandom(20_000) for i in range(60)}     # 1.2 MB
    with open_database(write(tmp_path / "db", "lmdb", items)) as reader:
        assert dict(reader.items()) == items


def test_readers_of_one_folder_share_a_handle(tmp_path):
    path = write(tmp_path / "db", "lmdb", records(3))
    first, second = open_database(path), open_database(path)
    assert first.get(b"00000001_img1.png") == second.get(b"00000001_img1.png") == b"\x01\x01"
    first.close()
    assert second.get(b"00000002_img2.png") == b"\x02" * 3    # still open for the other
    second.close()
    assert first.get(b"00000000_img0.png") == b"\x00"         # a closed reader reopens
    first.close()


def read_in_child(reader: DatabaseReader) -> tuple[str, int, bytes]:
    """Runs in a spawned process: the reader arrives pickled and opens there."""
    return reader.backend, len(reader), reader.get(b"00000004_img4.png")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pickled_reader_works_in_a_fresh_process(tmp_path, backend):
    path = write(tmp_path / "db", backend, records(6))
    reader = open_database(path)
    state = pickle.loads(pickle.dumps(reader))
    assert state.__getstate__() == {"path": str(path), "backend": backend}
    reader.close()                  # a LevelDB opens in one process at a time
    with mp.get_context("spawn").Pool(1) as pool:
        assert pool.apply(read_in_child, (reader,)) == (backend, 6, b"\x04" * 5)


def test_damaged_and_locked_databases(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "data.mdb").write_bytes(os.urandom(5000))
    with pytest.raises(DataError, match=r"bad: cannot open the LMDB"):
        open_database(tmp_path / "bad").keys()
    import plyvel

    path = write(tmp_path / "level", "leveldb", records(2))
    holder = plyvel.DB(str(path))                     # another user holds LevelDB's lock
    try:
        with pytest.raises(DataError, match=r"level: the LevelDB is open in another process "
                                            r".* data.workers: 0 or 1"):
            open_database(path).keys()
    finally:
        holder.close()


def test_a_missing_library_names_the_extra(tmp_path, monkeypatch):
    path = write(tmp_path / "level", "leveldb", records(1))
    monkeypatch.setitem(sys.modules, "plyvel", None)
    with pytest.raises(NetrunError, match=r"LevelDB databases needs the Python package "
                                          r"'plyvel'; install it with: pip install "
                                          r"'netrun\[leveldb\]'"):
        open_database(path).keys()
    monkeypatch.setitem(sys.modules, "lmdb", None)
    with pytest.raises(NetrunError, match=r"pip install 'netrun\[images\]'"):
        DatabaseWriter(tmp_path / "new").put(b"k", b"v")
    assert sorted(os.listdir(tmp_path)) == ["level"]            # no temporary folder left


def test_a_reader_opened_after_an_overwrite_sees_the_new_database(tmp_path):
    path = write(tmp_path / "db", "lmdb", {b"k": b"old"})
    old = open_database(path)
    assert old.get(b"k") == b"old"                             # holds the first database open
    write(path, "lmdb", {b"k": b"new"}, overwrite=True)
    with open_database(path) as new:
        assert new.get(b"k") == b"new"
    old.close()
