"""Hostile checkpoints: a checkpoint is data, never code, and damage is a CheckpointError.

Each test crafts a file with h5py from a small real checkpoint: nets that would write or read
files, links to other files, virtual or CRC-less datasets, ill-typed metadata, flipped bytes,
missing groups. Through the API they raise CheckpointError; through the CLI they exit 2
without a traceback and write nothing.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from netrun.cli import cli
from netrun.errors import CheckpointError, NetrunError
from netrun.infer import Predictor
from netrun.profile.targets import prepare
from netrun.proto.defs import op
from netrun.proto.pbtxt import netdef_from_text, netdef_to_text
from netrun.train import checkpoint as ckpt
from netrun.train.config import load_config
from netrun.train.trainer import Trainer
from netrun.weights import load_weights

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def good(tiny_config, tmp_path) -> Path:
    """A real checkpoint of the tiny model after 3 iterations."""
    tr = Trainer(load_config(tiny_config), output=str(tmp_path / "run"))
    tr.start()
    tr.run(3)
    return tmp_path / "run" / "last.h5"


@pytest.fixture
def sample(tmp_path) -> Path:
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).uniform(0, 255, (4, 1, 28, 28)).astype(np.float32))
    return path


def copy(src: Path, name: str) -> Path:
    dst = src.parent.parent / name
    shutil.copyfile(src, dst)
    return dst


def put_json(f, key: str, value) -> None:
    """Replace meta/<key> the way H5Writer writes it (with a valid CRC)."""
    raw = json.dumps(value).encode()
    if key in f:
        del f[key]
    ds = f.create_dataset(key, data=np.frombuffer(raw, np.uint8))
    ds.attrs["crc32"] = zlib.crc32(raw) & 0xFFFFFFFF
    ds.attrs["text"] = 1


def with_net_op(path: Path, which: str, extra) -> None:
    """Append an operator to one of the nets stored in the checkpoint."""
    with h5py.File(path, "r+") as f:
        nets = json.loads(f["meta/nets"][()].tobytes())
        net = netdef_from_text(nets[which])
        net.ops.append(extra)
        nets[which] = netdef_to_text(net)
        put_json(f, "meta/nets", nets)


def cli_run(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "netrun.cli", *map(str, args)], cwd=cwd,
                          env=env, check=False, capture_output=True, text=True, timeout=300)


def assert_clean_exit_2(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr


# Nets ------------------------------------------------------------------------------------
def test_the_nets_netrun_writes_pass_the_check(good):
    info = ckpt.read_info(good)
    for which in ("init", "step", "update", "test", "predict"):
        assert ckpt.net_problems(info.net(which)) == []


@pytest.mark.parametrize("which", ["predict", "step"])
def test_a_net_that_saves_is_refused_and_writes_nothing(good, tmp_path, which):
    target = tmp_path / "pwned.h5"
    bad = copy(good, "save.h5")
    with_net_op(bad, which, op("Save", ["f2_w"], [], db=str(target), db_type="h5"))
    with pytest.raises(CheckpointError, match=r"'Save' \(db family.*is not a compute op"):
        ckpt.read_info(bad).net(which)
    with pytest.raises(CheckpointError):
        if which == "predict":
            Predictor.from_checkpoint(bad)
        else:
            prepare(str(bad), 4, "cpu", False)
    assert not target.exists()


def test_save_in_a_checkpoint_through_the_cli_exits_2_and_writes_nothing(good, tmp_path, sample):
    target = tmp_path / "pwned.h5"
    bad = copy(good, "save.h5")
    with_net_op(bad, "predict", op("Save", ["f2_w"], [], db=str(target), db_type="h5"))
    with_net_op(bad, "step", op("Save", ["f2_w"], [], db=str(target), db_type="h5"))
    for args in (["infer", bad, sample], ["infer", bad, sample, "--json"],
                 ["profile", bad, "--forward-only", "--iters", "1", "--warmup", "0"],
                 ["profile", bad, "--iters", "1", "--warmup", "0"]):
        r = cli_run(*args, cwd=tmp_path)
        assert_clean_exit_2(r, "is not a compute op", str(bad))
        assert not target.exists()


def test_a_net_that_loads_another_file_is_refused(good, tmp_path):
    bad = copy(good, "load.h5")
    with_net_op(bad, "predict", op("Load", [], ["f2_w"], db=str(good), db_type="h5",
                                   groups=["params"]))
    with pytest.raises(CheckpointError, match="'Load'"):
        Predictor.from_checkpoint(bad)


def test_unknown_ops_and_bad_arguments_are_all_listed(good):
    bad = copy(good, "unknown.h5")
    with_net_op(bad, "predict", op("Exec", ["f2"], ["y"], command="rm -rf /"))
    with_net_op(bad, "predict", op("Relu", ["f2"], ["z"], path="/etc/passwd"))
    with_net_op(bad, "predict", op("Relu", ["f2"], ["bad\nname"]))
    with pytest.raises(CheckpointError) as err:
        Predictor.from_checkpoint(bad)
    text = str(err.value)
    assert "unknown op type 'Exec'" in text
    assert "arguments path" in text
    assert "control characters" in text


def test_fillers_larger_than_any_stored_blob_are_refused(good):
    bad = copy(good, "fill.h5")
    with_net_op(bad, "predict", op("ConstantFill", [], ["big"], shape=[1 << 20, 1 << 20]))
    with_net_op(bad, "init", op("ConstantFill", ["f2_b"], ["big2"], input_as_shape=1))
    with pytest.raises(CheckpointError, match="fills 1,099,511,627,776 elements"):
        Predictor.from_checkpoint(bad)
    with pytest.raises(CheckpointError, match="input_as_shape"):
        prepare(str(bad), 4, "cpu", False)


def test_a_net_that_does_not_parse_is_a_checkpoint_error(good):
    bad = copy(good, "garbled.h5")
    with h5py.File(bad, "r+") as f:
        nets = json.loads(f["meta/nets"][()].tobytes())
        put_json(f, "meta/nets", {**nets, "predict": "op { type: "})
    with pytest.raises(CheckpointError, match="'predict' net does not parse"):
        Predictor.from_checkpoint(bad)


# HDF5 structure --------------------------------------------------------------------------
def _external_link(f, tmp_path):
    secret = tmp_path / "secret.h5"
    with h5py.File(secret, "w") as s:
        s.create_dataset("w", data=np.ones(3, np.float32))
    f["meta/evil"] = h5py.ExternalLink(str(secret), "w")


def _soft_link(f, tmp_path):
    del f["params/f2_b"]
    f["params/f2_b"] = h5py.SoftLink("/params/f1_b")


def _virtual(f, tmp_path):
    shape = f["params/f2_b"].shape
    layout = h5py.VirtualLayout(shape, np.float32)
    layout[:] = h5py.VirtualSource(str(tmp_path / "other.h5"), "x", shape)
    del f["params/f2_b"]
    f.create_virtual_dataset("params/f2_b", layout)


def _no_crc(f, tmp_path):
    del f["params/f2_b"].attrs["crc32"]


def _text_no_crc(f, tmp_path):
    del f["meta/nets"].attrs["crc32"]


def _object_dtype(f, tmp_path):
    del f["meta/iteration"]
    f.create_dataset("meta/iteration", data=["x"], dtype=h5py.string_dtype())
    f["meta/iteration"].attrs["crc32"] = 0


def _huge(f, tmp_path):
    del f["params/f2_b"]
    ds = f.create_dataset("params/f2_b", (1 << 40,), np.float32, chunks=(1 << 16,))
    ds.attrs["crc32"] = 0


def _deep(f, tmp_path):
    g = f
    for i in range(12):
        g = g.create_group(f"g{i}")


@pytest.mark.parametrize("craft, message", [
    (_external_link, "ExternalLink"), (_soft_link, "SoftLink"), (_virtual, "virtual"),
    (_no_crc, "no checksum"), (_text_no_crc, "no checksum"), (_object_dtype, "not a plain number"),
    (_huge, "chunked"), (_deep, "nested"),
], ids=lambda v: getattr(v, "__name__", "")[1:])
def test_hostile_hdf5_structures_are_refused(good, tmp_path, craft, message):
    bad = copy(good, "bad.h5")
    with h5py.File(bad, "r+") as f:
        craft(f, tmp_path)
    for attempt in (ckpt.read_info, Predictor.from_checkpoint):
        with pytest.raises(CheckpointError, match=message) as err:
            attempt(bad)
        assert str(bad) in str(err.value)


def test_datasets_larger_than_the_file_are_refused_before_reading(good):
    bad = copy(good, "big.h5")
    with h5py.File(bad, "r+") as f:       # contiguous but never written: reads as fill values
        del f["params/f2_b"]
        ds = f.create_dataset("params/f2_b", (1 << 36,), np.float32)
        ds.attrs["crc32"] = 0
    with pytest.raises(CheckpointError, match="more than the whole file"):
        ckpt.read_info(bad)


def test_missing_groups_and_entries(good, tmp_path):
    for key, message in (("params", "has no params"), ("state", "has no state"),
                         ("meta/shapes", "meta/shapes is missing"),
                         ("optimizer", "optimizer/c1_w_momentum is listed in meta but not stored"),
                         ("meta/nets", "holds no 'predict' net"), ("meta", "meta/params is missing")):
        bad = copy(good, "missing.h5")
        with h5py.File(bad, "r+") as f:
            del f[key]
        with pytest.raises(CheckpointError, match=message):
            Predictor.from_checkpoint(bad)


def test_a_folder_named_last_h5_is_a_checkpoint_error(tmp_path, sample):
    (tmp_path / "last.h5").mkdir()
    with pytest.raises(CheckpointError, match="not a file"):
        ckpt.read_info(tmp_path / "last.h5")
    r = cli_run("profile", tmp_path / "last.h5", cwd=tmp_path)
    assert_clean_exit_2(r, "not a file")


# Metadata --------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value, message", [
    ("iteration", "7", "meta/iteration must be an integer >= 0"),
    ("iteration", -1, "meta/iteration must be an integer >= 0"),
    ("nets", ["predict"], "meta/nets must be a mapping"),
    ("shapes", {"f2_b": [-10]}, "meta/shapes must be a mapping"),
    ("params", "f2_b", "meta/params must be a list"),
    ("model", {"inputs": {"data": [[1e30], "float32"]}}, "meta/model.inputs"),
    ("model", {"outputs": [3]}, "meta/model.outputs"),
    ("config", [], "meta/config must be a mapping"),
])
def test_ill_typed_metadata_is_refused(good, key, value, message):
    bad = copy(good, "meta.h5")
    with h5py.File(bad, "r+") as f:
        put_json(f, f"meta/{key}", value)
    with pytest.raises(CheckpointError, match=message):
        ckpt.read_info(bad)


def test_meta_shapes_must_match_the_stored_arrays(good):
    bad = copy(good, "shapes.h5")
    with h5py.File(bad, "r+") as f:
        shapes = json.loads(f["meta/shapes"][()].tobytes())
        put_json(f, "meta/shapes", {**shapes, "f2_b": [100000]})
    with pytest.raises(CheckpointError, match="params/f2_b is stored as 10, meta says 100000"):
        ckpt.read_info(bad)


def test_json_that_is_not_json_or_not_utf8(good):
    for raw in (b"{not json", b"\xff\xfe", b"[" * 100000):
        bad = copy(good, "json.h5")
        with h5py.File(bad, "r+") as f:
            del f["meta/lr"]
            ds = f.create_dataset("meta/lr", data=np.frombuffer(raw, np.uint8))
            ds.attrs["crc32"] = zlib.crc32(raw) & 0xFFFFFFFF
        with pytest.raises(CheckpointError, match="meta/lr"):
            ckpt.read_info(bad)


# Damage ----------------------------------------------------------------------------------
def test_flipped_bytes_are_a_checkpoint_error_or_harmless(good, tmp_path):
    data = good.read_bytes()
    x = np.random.default_rng(1).uniform(0, 255, (2, 1, 28, 28)).astype(np.float32)
    want = Predictor.from_checkpoint(good).predict(x)
    rng = np.random.default_rng(13)
    # The superblock and first object headers densely, then a seeded sample of the rest
    # (a few seconds; the fuzz suite's long run covers many more).
    offsets = list(range(0, min(len(data), 1024), 11)) + sorted(
        rng.choice(np.arange(1024, len(data)), size=min(60, len(data) - 1024), replace=False))
    outcomes = {"refused": 0, "same": 0}
    bad = tmp_path / "flipped.h5"
    for offset in offsets:
        flipped = bytearray(data)
        flipped[offset] ^= 1 << int(rng.integers(8))
        bad.write_bytes(bytes(flipped))
        try:
            got = Predictor.from_checkpoint(bad).predict(x)
        except CheckpointError:
            outcomes["refused"] += 1
            continue
        # Every byte of content carries a CRC, so what loads is what was written.
        np.testing.assert_array_equal(got, want, err_msg=f"byte {offset}")
        outcomes["same"] += 1
    assert outcomes["refused"] > 0 and outcomes["same"] > 0, outcomes


def test_same_bytes_read_as_another_type_fail_the_checksum(good):
    # A damaged datatype message can turn float32 into uint32 over the very same bytes.
    bad = copy(good, "retyped.h5")
    with h5py.File(bad, "r+") as f:
        ds = f["params/c1_w"]
        raw, attrs = ds[()], dict(ds.attrs)
        del f["params/c1_w"]
        f.create_dataset("params/c1_w", data=raw.view(np.uint32))
        f["params/c1_w"].attrs.update(attrs)
    with pytest.raises(CheckpointError, match="'params/c1_w' fails its checksum"):
        Predictor.from_checkpoint(bad)


def test_checkpoints_written_before_dtypes_were_recorded_still_load(good, sample):
    old = copy(good, "old.h5")
    with h5py.File(old, "r+") as f:
        f.visititems(lambda name, obj: obj.attrs.__delitem__("dtype")
                     if isinstance(obj, h5py.Dataset) else None)
    x = np.load(sample)
    np.testing.assert_array_equal(Predictor.from_checkpoint(old).predict(x),
                                  Predictor.from_checkpoint(good).predict(x))


def test_truncations_are_a_checkpoint_error(good, tmp_path):
    data = good.read_bytes()
    bad = tmp_path / "cut.h5"
    for size in (0, 7, 100, 2048, len(data) // 3, len(data) - 1):
        bad.write_bytes(data[:size])
        with pytest.raises(CheckpointError):
            Predictor.from_checkpoint(bad)


# Stored configs ---------------------------------------------------------------------------
def test_a_checkpoints_data_folder_is_never_written(good, tmp_path):
    # The same source as in training: the stored folder is read, never written (no cache,
    # no download into a folder the file names).
    elsewhere = tmp_path / "elsewhere"
    bad = copy(good, "dir.h5")
    with h5py.File(bad, "r+") as f:
        config = json.loads(f["meta/config"][()].tobytes())
        config["data"]["dir"] = str(elsewhere)
        put_json(f, "meta/config", config)
    r = CliRunner().invoke(cli, ["infer", str(bad), "generated:test", "--json"])
    assert r.exit_code == 0, r.output
    assert not elsewhere.exists()


def test_a_stored_batch_size_that_is_not_one_is_refused(good, tmp_path):
    bad = copy(good, "batch.h5")
    with h5py.File(bad, "r+") as f:
        config = json.loads(f["meta/config"][()].tobytes())
        config["data"]["batch_size"] = "lots"
        put_json(f, "meta/config", config)
    r = cli_run("profile", bad, "--iters", "1", "--warmup", "0", cwd=tmp_path)
    assert_clean_exit_2(r, "data.batch_size")
    assert cli_run("profile", bad, "--iters", "1", "--warmup", "0", "-b", "2",
                   cwd=tmp_path).returncode == 0


# JSON output -----------------------------------------------------------------------------
def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"bare {name} in JSON output")
    return json.loads(text, parse_constant=refuse)


def test_json_output_never_holds_bare_nan(good, tmp_path, sample):
    nan = copy(good, "nan.h5")
    with h5py.File(nan, "r+") as f:
        w = np.full(f["params/f2_b"].shape, np.nan, np.float32)
        del f["params/f2_b"]
        f.create_dataset("params/f2_b", data=w)
        f["params/f2_b"].attrs["crc32"] = zlib.crc32(w.tobytes()) & 0xFFFFFFFF
    r = CliRunner().invoke(cli, ["infer", str(nan), str(sample), "--json",
                                 "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    out = _strict(r.stdout)
    assert out["predictions"][0]["top_k"][0][1] is None
    _strict((tmp_path / "p.json").read_text())
    r = CliRunner().invoke(cli, ["profile", str(nan), "--iters", "1", "--warmup", "0",
                                 "--json", "-"])
    assert r.exit_code == 0, r.output
    _strict(r.stdout)


# --weights -------------------------------------------------------------------------------
def test_weights_must_cover_the_model_unless_partial(good, tmp_path):
    (tmp_path / "tiny.yaml").write_text((tmp_path / "tiny.yaml").read_text()
                                        .replace("name: f2", "name: f2_new")
                                        .replace("input: f2,", "input: f2_new,"))
    tr = Trainer(load_config(tmp_path / "train.yaml"), output=str(tmp_path / "ft"))
    tr.start()
    before = tr.ws.fetch_blob("c1_w").copy()
    with pytest.raises(CheckpointError) as err:
        load_weights(tr.ws, good, tr.model)
    text = str(err.value)
    assert "would keep initial values): f2_new_w, f2_new_b" in text
    assert "file parameters the model lacks: f2_w, f2_b" in text
    assert "--weights-partial" in text
    np.testing.assert_array_equal(tr.ws.fetch_blob("c1_w"), before)    # nothing loaded
    summary = load_weights(tr.ws, good, tr.model, partial=True)
    assert "kept initial values for f2_new_w, f2_new_b" in summary

    r = cli_run("train", tmp_path / "train.yaml", "--weights", good, "--max-iter", "1",
                "-o", tmp_path / "ft2", cwd=tmp_path)
    assert_clean_exit_2(r, "--weights-partial")
    r = cli_run("train", tmp_path / "train.yaml", "--weights", good, "--weights-partial",
                "--max-iter", "1", "-o", tmp_path / "ft3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_a_damaged_checkpoint_as_weights_names_the_damage(good, tmp_path):
    bad = copy(good, "w.h5")
    with h5py.File(bad, "r+") as f:
        del f["params/f2_b"].attrs["crc32"]
    tr = Trainer(load_config(tmp_path / "train.yaml"), output=str(tmp_path / "ft"))
    tr.start()
    with pytest.raises(CheckpointError, match="no checksum"):
        load_weights(tr.ws, bad, tr.model)


@pytest.mark.parametrize("key, value", [
    ("rng", {"host": {"bit_generator": "PCG64", "state": {"state": "x", "inc": 1}}}),
    ("rng", {"host": {"bit_generator": "Nope"}}),
    ("data", {"epoch": "x", "index": 0}),
])
def test_resume_from_damaged_rng_or_loader_state_is_a_checkpoint_error(good, tiny_config,
                                                                       tmp_path, key, value):
    bad = copy(good, f"{key}.h5")
    with h5py.File(bad, "r+") as f:
        put_json(f, f"meta/{key}", value)
    tr = Trainer(load_config(tiny_config), output=str(tmp_path / "other"))
    with pytest.raises(NetrunError):
        tr.start(str(bad))


def test_a_nan_best_accuracy_in_a_checkpoint_is_not_taken_as_best(good, tiny_config, tmp_path):
    bad = copy(good, "nanbest.h5")
    with h5py.File(bad, "r+") as f:
        put_json(f, "meta/best_accuracy", float("nan"))
    tr = Trainer(load_config(tiny_config), output=str(tmp_path / "other"))
    tr.start(str(bad))
    assert tr.best_accuracy == -1.0
