"""The readers under fuzz: for each, how to read one file in-process, and which CLI runs it.

A reader call must end in success or a NetrunError (or OSError, which the CLI also turns
into exit status 2); anything else is a crash.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from tests.fuzz.corpus import Corpus


@dataclass(frozen=True)
class Target:
    """One reader: `read(path, corpus)` in-process; `cli(path, corpus, out)` gives argv."""

    name: str
    read: Callable[[Path, Corpus], object]
    text: bool = False
    cli: Callable[[Path, Corpus, Path], list[str]] | None = None
    proto: bool = False        # a protobuf: field-level mutations too (mutate.PROTO_OPS)


def _load_model(path: Path, corpus: Corpus):
    import netrun.caffe  # noqa: F401  (registers the .prototxt format)
    from netrun.model import load_model

    return load_model(path)


def _netdef_pb(path: Path, corpus: Corpus):
    return read_netdef_pb(path.read_bytes(), str(path))


def read_netdef_pb(data: bytes, where: str = "<fuzz>"):
    """netdef_from_bytes, held to more than not crashing: a NetrunError is a clean refusal
    (raised on), any other error a crash; a net it returns must write back to bytes that
    read as the same net, and read the same from its text form (an AssertionError if not)."""
    from netrun.errors import NetrunError
    from netrun.proto.netdef_binary import netdef_from_bytes, netdef_to_bytes
    from netrun.proto.pbtxt import netdef_from_text, netdef_to_text
    from tests.netdefs import canonical

    try:
        net = netdef_from_bytes(data, where)
    except NetrunError:
        raise
    except OSError as e:     # the runner counts OSError as clean; from bytes it is a bug
        raise AssertionError(f"netdef_from_bytes raised {type(e).__name__}: {e}") from e
    try:
        again = netdef_from_bytes(netdef_to_bytes(net))
        text = netdef_from_text(netdef_to_text(net))
    except NetrunError as e:  # what the reader accepted, the writers and readers must take
        raise AssertionError(f"a net read from .pb does not go round: {e}") from e
    assert canonical(again) == canonical(net), "written back to .pb, the net reads otherwise"
    assert canonical(text) == canonical(net), "written as .pbtxt, the net reads otherwise"
    return net


def _solver(path: Path, corpus: Corpus):
    from netrun.caffe import solver_to_config

    return solver_to_config(path)


def _config(path: Path, corpus: Corpus):
    from netrun.train.config import load_config

    return load_config(path)


def _checkpoint(path: Path, corpus: Corpus):
    from netrun.infer import Predictor

    predictor = Predictor.from_checkpoint(path)
    shape = predictor.example_shape or (1, 28, 28)
    if int(np.prod(shape)) <= 1 << 16:
        predictor.predict(np.zeros((2, *shape), np.float32))
    return predictor


def _caffe_weights(path: Path, corpus: Corpus):
    from netrun.caffe import load_caffe_weights
    from netrun.core.workspace import Workspace

    model = corpus.caffe_model
    ws = Workspace("cpu", seed=0)
    ws.run_net_once(model.init_net)
    return load_caffe_weights(ws, path, model)


def _blobproto(path: Path, corpus: Corpus):
    from netrun.caffe.wire import read_blobproto

    return read_blobproto(path)


def _infer_input(path: Path, corpus: Corpus):
    from netrun.infer import load_inputs, score

    predictor = corpus.predictor
    inputs = load_inputs(str(path), predictor)
    probs = predictor.predict(inputs.data[:16])
    if inputs.labels is not None:
        score(probs, inputs.labels[:16])
    return inputs


def _npz_source(path: Path, corpus: Corpus):
    from netrun.train.data import make_source

    key = "path" if path.name.startswith("keras") else "train"
    source = make_source({"source": "npz", key: str(path)})
    return source.train, source.input_shape, source.num_classes


def _hdf5_source(path: Path, corpus: Corpus):
    from netrun.train.data import make_source

    eager = make_source({"source": "hdf5", "train": str(path)})
    lazy = make_source({"source": "hdf5", "train": str(path), "lazy": True})
    arrays = lazy.train
    rows = arrays.data[np.arange(min(len(arrays.label), 3))]
    arrays.data.close()
    return eager.train, eager.input_shape, rows


def _idx(path: Path, corpus: Corpus):
    from netrun.train.data.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx

    magic = IMAGES_MAGIC if path.name.startswith("images") else LABELS_MAGIC
    return read_idx(path), read_idx(path, magic)


def _cifar(path: Path, corpus: Corpus):
    from netrun.train.data.cifar import read_batches

    return read_batches([path])


def _generated_cache(path: Path, corpus: Corpus):
    from netrun.train.data.generated import read_cache

    # the cache file is named after what it holds: 20 images; a bad one reads as None
    return read_cache(path, 20)


def _algo_cache(path: Path, corpus: Corpus):
    from netrun.conv import cache

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a bad cache is reported and rebuilt: not an error
        header, entries = cache.read_file(path)
        store = cache.AlgoCache(path, "cpu", "fuzz")
        store.load()
        store.put("fuzz-new-key", cache.Entry({"direct": 1.0}))
    return header, entries


# CLI invocations ------------------------------------------------------------------------------
def _inspect(path: Path, corpus: Corpus, out: Path) -> list[str]:
    return ["inspect", str(path), "--json"]


def _convert(path: Path, corpus: Corpus, out: Path) -> list[str]:
    return ["convert", str(path), str(out / "converted.pbtxt")]


def _train(path: Path, corpus: Corpus, out: Path) -> list[str]:
    return ["train", str(path), "-o", str(out / "run"), "--max-iter", "2",
            "--data-dir", str(out / "data")]


def _infer_checkpoint(path: Path, corpus: Corpus, out: Path) -> list[str]:
    return ["infer", str(path), str(corpus.seeds["npy-input"][0]), "-o", str(out / "p.json")]


def _infer_file(path: Path, corpus: Corpus, out: Path) -> list[str]:
    return ["infer", str(corpus.checkpoint), str(path), "--json"]


def _infer_caffe(path: Path, corpus: Corpus, out: Path) -> list[str]:
    return ["infer", str(corpus.aux / "deploy.prototxt"), str(corpus.deploy_input),
            "--weights", str(path),
            "--raw", "--json"]


def _algos_list(path: Path, corpus: Corpus, out: Path) -> list[str]:
    return ["algos", "list", "--cache-dir", str(path.parent), "--json"]


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("model-yaml", _load_model, True, _inspect),
    Target("netdef-yaml", _load_model, True, _convert),
    Target("ops-yaml", _load_model, True, _inspect),
    Target("netdef-pbtxt", _load_model, True, _inspect),
    Target("netdef-pb", _netdef_pb, False, _inspect, proto=True),
    Target("caffe-prototxt", _load_model, True, _convert),
    Target("caffe-solver", _solver, True),
    Target("train-config", _config, True, _train),
    Target("checkpoint", _checkpoint, False, _infer_checkpoint),
    Target("caffemodel", _caffe_weights, False, _infer_caffe),
    Target("caffemodel-h5", _caffe_weights, False, _infer_caffe),
    Target("binaryproto", _blobproto),
    Target("npy-input", _infer_input, False, _infer_file),
    Target("npz-input", _infer_input, False, _infer_file),
    Target("h5-input", _infer_input, False, _infer_file),
    Target("npz-source", _npz_source),
    Target("hdf5-source", _hdf5_source),
    Target("idx", _idx),
    Target("cifar-bin", _cifar),
    Target("generated-cache", _generated_cache),
    Target("algo-cache", _algo_cache, True, _algos_list),
)}



# Probes of the runner itself: each must come out as the failure it is named after.
def _probe_crash(path: Path, corpus: Corpus):
    raise ValueError("a bug")


def _probe_hang(path: Path, corpus: Corpus):
    import time

    time.sleep(3600)


def _probe_memory(path: Path, corpus: Corpus):
    return bytearray(64 << 30)


def _probe_exit(path: Path, corpus: Corpus):
    import os

    os._exit(3)


PROBES: dict[str, Target] = {t.name: t for t in (
    Target("probe-crash", _probe_crash), Target("probe-hang", _probe_hang),
    Target("probe-memory", _probe_memory), Target("probe-exit", _probe_exit))}
