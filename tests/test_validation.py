"""Bad input is refused before anything is allocated, with file:line:col and exit status 2:
YAML limits (one loader for every reader), config and lr-policy values, layer sizes, the
memory budget, caffemodel blob sizes, the algorithm cache and output folders."""
from __future__ import annotations

import textwrap
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

from netrun.caffe import load_caffe_model, wire
from netrun.cli import cli
from netrun.conv import cache as algo_cache
from netrun.core.budget import parse_size
from netrun.core.schema import TensorSpec
from netrun.core.workspace import Workspace
from netrun.errors import MemoryLimitError, NetrunError, ParseError
from netrun.model.yaml_model import model_from_yaml, model_from_yaml_file
from netrun.proto.defs import NetDef
from netrun.proto.defs import op as make_op
from netrun.proto.io import load_netdef
from netrun.train.config import load_config, with_overrides
from netrun.util import safe_yaml

MODEL = """\
name: M
inputs: {data: [1, 8, 8], label: []}
layers:
  - {type: conv, name: c1, input: data, num_output: 4, kernel: 3}
  - {type: fc, name: f1, num_output: 10}
loss: {type: softmax_cross_entropy, input: f1, label: label}
"""

CONFIG = """\
model: m.yaml
data:
  source: generated
  train_count: 32
  test_count: 16
  batch_size: 8
  transform: {scale: 0.5}
solver:
  type: sgd
  base_lr: 0.01
  momentum: 0.9
  max_iter: 2
  lr_policy: {type: step, gamma: 0.1, stepsize: 10}
  seed: 1
"""

NETDEF = "name: n\nops:\n- {type: Relu, inputs: [x], outputs: [y]}\n"


def _bomb(indent: str) -> str:
    """A billion-laughs document fragment: 9 levels of 9 aliases (about 4e8 values)."""
    lines = [f"{indent}a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"{indent}a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


# Hostile text appended to a valid file under a key every reader accepts (or composes first).
HOSTILE = {
    "control character": ("{key}: \"a\x01b\"\n", "unacceptable character U+0001"),
    "deep nesting": ("{key}: " + "[" * 3000 + "]" * 3000 + "\n", "nesting deeper than"),
    "alias bomb": ("{key}:\n" + _bomb("  "), "once its aliases"),
    "huge string": ("{key}: \"" + "x" * (safe_yaml.MAX_SCALAR_CHARS + 10) + "\"\n",
                    "characters (the limit is"),
    "huge folded string": ("{key}: >\n" + "  xxxxxxxx\n" * (safe_yaml.MAX_SCALAR_CHARS // 9 + 10),
                           "characters (the limit is"),
}
READERS = {   # reader, valid text, a key where the hostile value goes
    "config": (load_config, CONFIG, "notes"),
    "model": (model_from_yaml_file, MODEL, "description"),
    "netdef": (load_netdef, NETDEF, "name"),
}


def _write(tmp_path, name: str, text: str | bytes) -> str:
    (tmp_path / "m.yaml").write_text(MODEL)
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("case", HOSTILE)
def test_every_yaml_reader_refuses_hostile_yaml(tmp_path, reader, case):
    read, text, key = READERS[reader]
    if reader == "netdef":
        text = text.replace("name: n\n", "")   # the hostile value is the name
    hostile, fragment = HOSTILE[case]
    path = _write(tmp_path, "f.yaml", text + hostile.format(key=key))
    with pytest.raises(ParseError) as info:
        read(path)
    assert fragment in str(info.value)
    assert info.value.file == path and info.value.line is not None


@pytest.mark.parametrize("reader", READERS)
def test_every_yaml_reader_names_a_non_utf8_byte(tmp_path, reader):
    read, text, _ = READERS[reader]
    data = text.encode().replace(b"\n", b"\n# caf\xe9\n", 1)
    path = _write(tmp_path, "f.yaml", data)
    with pytest.raises(NetrunError) as info:
        read(path)
    message = str(info.value)
    offset = data.index(0xE9)
    assert "0xe9" in message and f"offset {offset}" in message


def test_depth_and_alias_limits_allow_ordinary_sharing():
    text = "base: &b {x: 1, y: [1, 2]}\n" + "".join(f"k{i}: *b\n" for i in range(100))
    assert safe_yaml.safe_load(text)["k99"] == {"x": 1, "y": [1, 2]}
    assert safe_yaml.safe_load("a: " + "[" * 50 + "]" * 50)["a"] is not None


# Config values ----------------------------------------------------------------------------
def _config(tmp_path, old: str, new: str) -> str:
    assert old in CONFIG
    return _write(tmp_path, "train.yaml", CONFIG.replace(old, new, 1))


BAD_VALUES = [   # (replace, with, fragment of the message, the key whose value is at fault)
    ("batch_size: 8", "batch_size: 0", "data.batch_size: must be >= 1", "batch_size"),
    ("batch_size: 8", "batch_size: 1.5", "expected a whole number, got 1.5", "batch_size"),
    ("batch_size: 8", "batch_size: 8\n  test_batch_size: 0", "data.test_batch_size",
     "test_batch_size"),
    ("batch_size: 8", "batch_size: -4", "must be >= 1", "batch_size"),
    ("seed: 1", "seed: -1", "solver.seed: must be between 0", "seed"),
    ("max_iter: 2", "max_iter: -1", "solver.max_iter: must be >= 0", "max_iter"),
    ("seed: 1", "seed: 1\n  test_iter: -3", "solver.test_iter: must be >= 0", "test_iter"),
    ("seed: 1", "seed: 1\n  iter_size: 0", "solver.iter_size: must be >= 1", "iter_size"),
    ("seed: 1", "seed: 1\n  display: -1", "solver.display: must be >= 0", "display"),
    ("seed: 1", "seed: 1\n  snapshot: -5", "solver.snapshot: must be >= 0", "snapshot"),
    ("seed: 1", "seed: 1\n  test_interval: -5", "solver.test_interval", "test_interval"),
    ("momentum: 0.9", "momentum: 2", "solver.momentum: must be in [0, 1)", "momentum"),
    ("momentum: 0.9", "momentum: -1", "solver.momentum: must be in [0, 1)", "momentum"),
    ("momentum: 0.9", "momentum: 1", "must be in [0, 1)", "momentum"),
    ("seed: 1", "seed: 1\n  momentum2: 1.5", "solver.momentum2", "momentum2"),
    ("seed: 1", "seed: 1\n  weight_decay: -0.1", "solver.weight_decay: must be >= 0",
     "weight_decay"),
    ("seed: 1", "seed: 1\n  delta: 0", "solver.delta: must be > 0", "delta"),
    ("base_lr: 0.01", "base_lr: -0.01", "solver.base_lr: must be >= 0", "base_lr"),
    ("base_lr: 0.01", "base_lr: .nan", "expected a finite number", "base_lr"),
    ("base_lr: 0.01", "base_lr: fast", "expected a finite number", "base_lr"),
    ("seed: 1", 'seed: 1\n  test_initialization: "false"', "expected true or false",
     "test_initialization"),
    ("seed: 1", "seed: 1\n  momentun: 0.5", "did you mean 'momentum'", "momentun"),
    ("batch_size: 8", "batch_size: 8\n  shufle: true", "unknown key 'data.shufle'", "shufle"),
    ("batch_size: 8", "batch_size: 8\n  train_cont: 5", "did you mean 'train_count'",
     "train_cont"),
    ("batch_size: 8", "batch_size: 8\n  split: x", "unknown key 'data.split'", "split"),
    ("transform: {scale: 0.5}", "transform: {scael: 0.5}", "did you mean 'scale'", "scael"),
    ("transform: {scale: 0.5}", "transform: {crop_size: -1}", "crop_size: must be >= 0",
     "crop_size"),
    ("transform: {scale: 0.5}", "transform: {mirror: 'yes'}", "expected true or false",
     "mirror"),
    ("model: m.yaml", "model: m.yaml\nouptut: x", "did you mean 'output'", "ouptut"),
    ("source: generated", "source: genrated", "did you mean 'generated'", "genrated"),
    ("type: sgd", "type: sgdd", "did you mean 'sgd'", "sgdd"),
]


@pytest.mark.parametrize("old, new, fragment, at", BAD_VALUES)
def test_bad_config_values_point_at_the_value(tmp_path, old, new, fragment, at):
    path = _config(tmp_path, old, new)
    with pytest.raises(ParseError) as info:
        load_config(path)
    err = info.value
    assert fragment in str(err)
    assert err.file == path
    assert at in err.source_line, f"points at {err.source_line!r}, not at '{at}'"


BAD_POLICIES = [   # (lr_policy, fragment, where the caret points)
    ("{type: step, gamma: null, stepsize: 5}", "has no value", "null"),
    ("{type: step, gamma: -0.5, stepsize: 5}", "gamma must be > 0", "-0.5"),
    ("{type: exp, gamma: -2}", "gamma must be > 0", "-2"),
    ("{type: inv, gamma: -1, power: 0.75}", "gamma must be >= 0", "-1"),
    ("{type: step, gamma: 0.1}", "needs 'stepsize'", "step"),
    ("{type: step, gamma: 0.1, stepsize: 0}", "stepsize must be > 0", "0}"),
    ("{type: step, gamma: abc, stepsize: 5}", "'gamma' must be a number", "abc"),
    ("{type: step, gamma: 0.1, stepsize: 2.5}", "'stepsize' must be an integer", "2.5"),
    ("{type: stpe}", "did you mean 'step'", "stpe"),
    ("{type: step, gama: 0.1, stepsize: 2}", "did you mean 'gamma'", "0.1"),
    ("7", "expected a policy name or a mapping", "7"),
]


@pytest.mark.parametrize("policy, fragment, at", BAD_POLICIES)
def test_bad_lr_policies_fail_at_config_time(tmp_path, policy, fragment, at):
    path = _config(tmp_path, "{type: step, gamma: 0.1, stepsize: 10}", policy)
    with pytest.raises(ParseError) as info:
        load_config(path)
    err = info.value
    assert fragment in str(err) and err.line == 13
    assert err.source_line[err.column - 1:].startswith(at), str(err)


def test_valid_config_loads_and_set_overrides_are_checked_too(tmp_path):
    path = _config(tmp_path, "max_iter: 2", "max_iter: 1e3")
    cfg = load_config(path)
    assert cfg.solver.max_iter == 1000 and isinstance(cfg.solver.max_iter, int)
    assert cfg.solver.lr_policy["stepsize"] == 10
    assert load_config(path, ["solver.base_lr=1e-3"]).solver.base_lr == 1e-3
    with pytest.raises(NetrunError, match="solver.momentum: must be in"):
        load_config(path, ["solver.momentum=3"])
    with pytest.raises(NetrunError, match="data.batch_size: must be >= 1"):
        with_overrides(cfg, ["data.batch_size=0"])


# The CLI: exit 2, one message, no internal error ----------------------------------------
CLI_CASES = [
    ("seed: 1", "seed: 1\x01", "unacceptable character"),
    ("seed: 1", "seed: -1", "solver.seed"),
    ("batch_size: 8", "batch_size: 8\n  test_batch_size: 0", "test_batch_size"),
    ("{type: step, gamma: 0.1, stepsize: 10}", "{type: step, gamma: null, stepsize: 1}",
     "has no value"),
    ("model: m.yaml", "model: m.yaml\nnotes: " + "[" * 5000 + "]" * 5000, "nesting deeper"),
]


@pytest.mark.parametrize("old, new, fragment", CLI_CASES)
def test_train_cli_exits_2_on_bad_configs(tmp_path, old, new, fragment):
    path = _config(tmp_path, old, new)
    r = CliRunner().invoke(cli, ["train", path, "-o", str(tmp_path / "run")],
                           catch_exceptions=False)
    assert r.exit_code == 2, r.output
    assert fragment in r.output and "internal error" not in r.output
    assert f"{path}:" in r.output
    assert not (tmp_path / "run").exists()


def test_non_utf8_config_exits_2_naming_the_byte(tmp_path):
    path = _write(tmp_path, "train.yaml", CONFIG.encode().replace(b"sgd", b"s\xffgd"))
    r = CliRunner().invoke(cli, ["train", path], catch_exceptions=False)
    assert r.exit_code == 2 and "byte 0xff at offset" in r.output, r.output


# Layers -----------------------------------------------------------------------------------
BAD_LAYERS = [   # (replace in MODEL, with, fragment, where the caret points)
    ("num_output: 4, kernel: 3", "num_output: 4, kernel: 3, group: 0", "'group' must be",
     "0}"),
    ("num_output: 4, kernel: 3", "num_output: 4, kernel: 3, group: 3", "group 3 must divide",
     "3}"),
    ("num_output: 10}", "num_output: 0}", "'num_output' must be an integer from 1", "0}"),
    ("num_output: 10}", "num_output: 100000000000000000000000000000}", "from 1 to", "1000"),
    ("num_output: 10}", "num_output: 100000000000}", "from 1 to", "1000"),
    ("num_output: 10}", "num_output: -10}", "from 1 to", "-10"),
    ("num_output: 10}", "num_output: 1e7}", "must be an integer", "1e7"),
    ("num_output: 4, kernel: 3", "num_output: 4, kernel: 0", "'kernel' must be at least 1",
     "{type"),
    ("num_output: 4, kernel: 3", "num_output: 4, kernel: 3, stride: 0", "'stride'", "{type"),
    ("num_output: 4, kernel: 3", "num_output: 4, kernel: 3, pad: -1", "'pad'", "{type"),
]


@pytest.mark.parametrize("old, new, fragment, at", BAD_LAYERS)
def test_bad_layer_sizes_are_parse_errors(old, new, fragment, at):
    with pytest.raises(ParseError) as info:
        model_from_yaml(MODEL.replace(old, new, 1), "m.yaml")
    err = info.value
    assert fragment in str(err)
    assert err.source_line[err.column - 1:].startswith(at), str(err)


def test_caffe_num_output_is_bounded(tmp_path):
    path = tmp_path / "n.prototxt"
    path.write_text(textwrap.dedent("""\
        name: "n"
        layer { name: "data" type: "Input" top: "data"
                input_param { shape { dim: 1 dim: 4 } } }
        layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
                inner_product_param { num_output: 100000000000000000000000000000 } }
        """))
    with pytest.raises(NetrunError, match="num_output from 1 to"):
        load_caffe_model(path)


def test_tensor_sizes_do_not_wrap():
    assert TensorSpec((2**32, 2**32)).size == 2**64
    assert TensorSpec((2**40, 2**40), "float64").nbytes == 2**83


# Memory budget ----------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [("16G", 16 << 30), ("512m", 512 << 20),
                                         ("1.5GiB", 3 << 29), ("1000", 1000), ("off", None)])
def test_memory_limit_sizes(text, value):
    assert parse_size(text) == value


def test_memory_limit_refuses_a_bad_setting(monkeypatch):
    monkeypatch.setenv("NETRUN_MEMORY_LIMIT", "lots")
    with pytest.raises(NetrunError, match="NETRUN_MEMORY_LIMIT='lots'"):
        Workspace("cpu").run_net_once(NetDef("init", [make_op("ConstantFill", [], ["w"],
                                                              shape=[4], value=1.0)]))


def test_init_net_over_the_budget_is_refused_before_allocating(monkeypatch):
    monkeypatch.setenv("NETRUN_MEMORY_LIMIT", "1M")
    ws = Workspace("cpu")
    small = make_op("ConstantFill", [], ["b"], shape=[16], value=0.0)
    huge = make_op("ConstantFill", [], ["w"], shape=[2**31 - 1, 2**31 - 1], value=0.0)
    with pytest.raises(MemoryLimitError) as info:
        ws.run_net_once(NetDef("init", [small, huge]))
    message = str(info.value)
    assert "NETRUN_MEMORY_LIMIT" in message and "EiB" in message
    assert not ws.has_blob("b") and not ws.has_blob("w")   # nothing ran
    monkeypatch.setenv("NETRUN_MEMORY_LIMIT", "off")
    ws.run_net_once(NetDef("init", [small]))
    assert ws.has_blob("b")


def test_bound_net_over_the_budget_is_refused_at_plan(monkeypatch):
    monkeypatch.setenv("NETRUN_MEMORY_LIMIT", "4M")
    ws = Workspace("cpu")
    ws.feed_blob("x", np.zeros((1, 1), np.float32))
    ws.feed_blob("w", np.zeros((4_000_000, 1), np.float32))   # fed: not planned
    ws.feed_blob("b", np.zeros((4_000_000,), np.float32))
    net = NetDef("fc", [make_op("FC", ["x", "w", "b"], ["y"]),
                        make_op("Relu", ["y"], ["z"])], ["x", "w", "b"], ["z"])
    with pytest.raises(MemoryLimitError, match="binding net 'fc'"):
        ws.create_net(net)


def test_a_model_too_big_for_memory_exits_2(tmp_path, monkeypatch):
    monkeypatch.setenv("NETRUN_MEMORY_LIMIT", "64M")
    (tmp_path / "m.yaml").write_text(MODEL.replace("num_output: 10}", "num_output: 100000}"))
    path = tmp_path / "train.yaml"
    path.write_text(CONFIG)
    r = CliRunner().invoke(cli, ["train", str(path), "-o", str(tmp_path / "run")],
                           catch_exceptions=False)
    assert r.exit_code == 2 and "NETRUN_MEMORY_LIMIT" in r.output, r.output


# Caffemodel blobs -------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([b])
        out += bytes([b | 0x80])


def _field(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


@pytest.mark.parametrize("dims, values, fragment", [
    ([2**32, 2**32], 0, "18,446,744,073,709,551,616 values"),     # wraps to 0 in int64
    ([2**62, 4], 0, "holds 0 values"),
    ([2, 3], 5, "holds 5 values"),
    ([2**64 - 1], 1, "negative dimension"),                          # int64 -1
])
def test_caffemodel_blob_sizes_are_checked(dims, values, fragment):
    packed = b"".join(_varint(d) for d in dims)
    blob = _field(7, _field(1, packed)) + _field(5, np.zeros(values, "<f4").tobytes())
    with pytest.raises(wire.WireError, match=fragment.replace("(", r"\(")):
        wire.parse_blob(memoryview(blob))


# Algorithm cache --------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b'{"format": "\xff\xfe"}', b"{not json", b"[" * 100000,
                                     (b'{"format": "netrun-algo-cache", "version": 1, '
                                      b'"entries": {"k": {"times_ms": {"a": 1e999999}}}}')])
def test_a_bad_cache_file_is_set_aside_and_rebuilt(tmp_path, content):
    path = algo_cache.cache_file(tmp_path, "cpu", "dev")
    path.write_bytes(content)
    cache = algo_cache.AlgoCache(path, "cpu", "dev")
    with pytest.warns(algo_cache.AlgoCacheWarning, match="rebuilt"):
        assert cache.get("k") is None
    cache.put("k", algo_cache.Entry({"direct": 1.0}))
    assert (tmp_path / (path.name + ".bad")).read_bytes() == content
    assert algo_cache.AlgoCache(path, "cpu", "dev").get("k").times_ms == {"direct": 1.0}


def test_an_unwritable_cache_folder_warns_and_keeps_entries_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = algo_cache.AlgoCache(algo_cache.cache_file(blocker, "cpu", "dev"), "cpu", "dev")
    with pytest.warns(algo_cache.AlgoCacheWarning, match="cannot write"):
        cache.put("k", algo_cache.Entry({"direct": 1.0}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # warned once only
        cache.put("k2", algo_cache.Entry({"direct": 2.0}))
    assert cache.get("k2").times_ms == {"direct": 2.0}


# Output folders ---------------------------------------------------------------------------
def test_save_into_an_impossible_folder_is_an_os_error_not_a_bug(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ws = Workspace("cpu")
    ws.feed_blob("w", np.ones(3, np.float32))
    with pytest.raises(OSError):
        ws.run_operator_once(make_op("Save", ["w"], [], db=str(blocker / "out.h5"),
                                     db_type="h5"))


def test_train_into_a_file_exits_2(tmp_path):
    path = _config(tmp_path, "max_iter: 2", "max_iter: 1")
    r = CliRunner().invoke(cli, ["train", path, "-o", path], catch_exceptions=False)
    assert r.exit_code == 2 and "internal error" not in r.output, r.output
