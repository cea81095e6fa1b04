"""Inference from a checkpoint: load the predict net and parameters, run batches, score."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from netrun.caffe import data_config
from netrun.core.workspace import Workspace
from netrun.errors import NetrunError, ShapeError
from netrun.model import load_model
from netrun.rewrite import bind_rewrite
from netrun.train import checkpoint as ckpt
from netrun.train.config import expand
from netrun.train.data import data_keys, make_source, make_transform, parse_spec
from netrun.train.data.base import as_labels, check_lengths
from netrun.train.data.hdf5 import h5_read
from netrun.train.data.image_inputs import is_image_input, read_image_inputs
from netrun.train.data.numpy_files import NpzArchive, load_npy
from netrun.weights import load_weights


@dataclass
class Inputs:
    """Examples to predict on, with labels when the source has them."""

    data: np.ndarray
    labels: np.ndarray | None
    description: str
    names: list[str] | None = None                # per example: its file or database key
    warnings: list[str] = field(default_factory=list)


class Predictor:
    """A predict net bound to a workspace with its parameters loaded.

    `net` is the net as stored; what is bound is its rewrite (`rewritten.net`, inference
    fusions with folded parameters computed now) unless fuse=False. The blob it predicts
    from is kept out of every fusion.
    """

    def __init__(self, net, ws: Workspace, inputs: dict, labels: list[str], outputs: list[str],
                 config: dict | None = None, fuse: bool = True):
        self.net = net
        self.net.name = "predict"
        self.ws = ws
        self.config = config or {}
        self.input_name = next((n for n in inputs if n not in labels), None) or next(
            iter(net.external_inputs), None)
        if self.input_name is None or not net.ops or not (outputs or net.ops[-1].outputs):
            raise NetrunError(f"the predict net '{net.name}' has no input or no output to "
                              f"predict with")
        spec = inputs.get(self.input_name)
        self.example_shape = tuple(spec[0]) if spec else None
        self.output_name = (outputs or [net.ops[-1].outputs[0]])[0]
        self.outputs_probabilities = bool(net.ops) and net.ops[-1].type == "Softmax"
        # Class names the training data gave (a folder's subfolders), label = index.
        self.classes: list[str] | None = None
        self.rewritten = bind_rewrite(net, ws, "inference", keep=[self.output_name], enabled=fuse)
        ws.create_net(self.rewritten.net, keep=[self.output_name])

    @classmethod
    def from_checkpoint(cls, checkpoint: str | os.PathLike, device: str = "cpu",
                        fuse: bool = True, memory_plan: bool = True,
                        executor: str = "simple") -> "Predictor":
        """The predict net and parameters a netrun checkpoint holds."""
        info = ckpt.read_info(checkpoint)      # checks meta types; info.net checks the net
        model = info.meta.get("model", {})
        config = info.meta.get("config")
        ws = Workspace(device, memory_plan=memory_plan, executor=executor)
        ckpt.load_blobs(ws, checkpoint, info.params, "params")
        predictor = cls(info.net("predict"), ws, model.get("inputs", {}),
                        model.get("labels", []), model.get("outputs", []),
                        config if isinstance(config, dict) else None, fuse)
        predictor.classes = info.meta.get("classes")       # checked by read_info
        return predictor

    def class_name(self, index: int, count: int) -> str | None:
        """The name of class `index` when the names fit the `count` outputs, else None."""
        if self.classes is None or len(self.classes) != count:
            return None
        return self.classes[index]

    @classmethod
    def from_model(cls, path: str | os.PathLike, weights: str | os.PathLike | None,
                   device: str = "cpu", fuse: bool = True,
                   memory_plan: bool = True, executor: str = "simple") -> "Predictor":
        """A model file (.prototxt, .yaml, .pbtxt, .pb, .onnx) with weights from a caffemodel,
        a checkpoint or a Caffe2 init net (.pb, .pbtxt); None: the model's own (an ONNX
        file's initializers). A model that gives no input shape (a Caffe2 predict net) takes
        its shape from each batch fed to it."""
        model = load_model(path)
        ws = Workspace(device, seed=0, memory_plan=memory_plan, executor=executor)
        ws.run_net_once(model.init_net)
        if weights is not None:
            load_weights(ws, weights, model)
        inputs = {n: (None if s is None else [list(s.shape), s.dtype]) for n, s in model.inputs.items()}
        config = None
        if hasattr(model, "data_layers"):      # a Caffe net: its TEST data layer's transform
            try:
                config = {"data": data_config(model)}
            except Exception:
                config = None
        return cls(model.predict_net.copy(), ws, inputs, list(model.labels), list(model.outputs),
                   config, fuse)

    def transform(self):
        """The test-time transform of the training config (scale, mean, crop)."""
        cfg = self.config.get("data", {}) or {}
        tcfg = cfg.get("transform") if isinstance(cfg, dict) else None
        try:
            return make_transform(tcfg if isinstance(tcfg, dict) else None)
        except (TypeError, ValueError) as e:    # a stored config is data: it may be anything
            raise NetrunError(f"the training config's data.transform is invalid ({e}); "
                              f"pass --raw to feed the input as is") from None

    def predict(self, data: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """Class probabilities for every example (softmax applied if the net ends in logits)."""
        data = self._fit_shape(np.asarray(data, dtype=np.float32))
        outs = []
        for start in range(0, len(data), batch_size):
            self.ws.refill_blob(self.input_name, data[start:start + batch_size])
            self.ws.run_net("predict")
            outs.append(self.ws.fetch_blob(self.output_name))
        scores = np.concatenate(outs).reshape(len(data), -1)
        if self.outputs_probabilities:
            return scores
        scores = scores - scores.max(axis=1, keepdims=True)
        e = np.exp(scores)
        return e / e.sum(axis=1, keepdims=True)

    def fit_for_transform(self, data: np.ndarray, tf) -> np.ndarray:
        """`data` as a batch that `tf` turns into the model's input: a crop makes the
        examples smaller than the input, so they are checked after the transform."""
        want = self.example_shape
        if want is None:
            return data
        candidates = [data]
        if data.ndim == len(want):              # one example, or N x H x W for a 1-channel net
            candidates += [data[None]] + ([data[:, None]] if want[0] == 1 else [])
        for batch in candidates:
            try:
                if tuple(tf.output_shape(batch.shape[1:])) == tuple(want):
                    return batch
            except ShapeError:
                continue
        raise NetrunError(f"input has examples of shape {'×'.join(map(str, data.shape[1:]))}, "
                          f"which the training transform ({tf}) does not turn into the "
                          f"model's '{self.input_name}' input {'×'.join(map(str, want))}")

    def _fit_shape(self, data: np.ndarray) -> np.ndarray:
        want = self.example_shape
        if want is None or tuple(data.shape[1:]) == want:
            return data
        if tuple(data.shape) == want:                  # one example: a batch of one
            return data[None]
        # N×H×W images for a 1×H×W model: add the channel axis.
        if len(want) == data.ndim and want[0] == 1 and tuple(data.shape[1:]) == want[1:]:
            return data[:, None]
        raise NetrunError(f"input has examples of shape {'×'.join(map(str, data.shape[1:]))} "
                          f"but the model's '{self.input_name}' expects {'×'.join(map(str, want))}")


def load_inputs(spec: str, predictor: Predictor, data_dir: str | None = None,
                transform: bool = True) -> Inputs:
    """Read INPUT: a .npy/.npz/.h5 file, images (a file, a glob, a folder, a Caffe list file,
    an LMDB/LevelDB), or a data spec SOURCE:PART such as mnist-10k:test."""
    path = Path(spec)
    tf = predictor.transform() if transform else None
    if path.suffix not in ARRAY_SUFFIXES and is_image_input(spec):
        return _image_inputs(spec, predictor, tf)
    if path.suffix in ARRAY_SUFFIXES and path.exists():
        data, labels = _read_file(path)
        data = _numbers(data, f"{path}: data")
        if labels is not None:
            labels = as_labels(labels, f"{path}: labels")
            check_lengths(data, labels, str(path))
    elif path.suffix in ARRAY_SUFFIXES:
        raise NetrunError(f"input file '{spec}' does not exist")
    else:
        data, labels = _read_spec(spec, predictor, data_dir)
    warnings = _range_warnings(data, tf, spec) if path.suffix in ARRAY_SUFFIXES else []
    if tf is not None:
        data = _apply(tf, predictor.fit_for_transform(np.asarray(data, np.float32), tf))
    return Inputs(np.asarray(data, dtype=np.float32), labels, spec, None, warnings)


ARRAY_SUFFIXES = (".npy", ".npz", ".h5", ".hdf5")


def _image_inputs(spec: str, predictor: Predictor, tf) -> Inputs:
    """Images decoded, resized to the size the net was trained on, then transformed."""
    shape = predictor.example_shape
    channels = shape[0] if shape and len(shape) == 3 else 3
    size = _trained_size(predictor.config.get("data"), shape)
    found = read_image_inputs(spec, channels, size)
    data = found.data
    data = _apply(tf, data) if tf is not None else data.astype(np.float32)
    return Inputs(np.asarray(data, np.float32), found.labels, spec, found.names)


def _trained_size(data_cfg: Any, shape: tuple[int, ...] | None) -> tuple[int, int] | None:
    """The (H, W) images had before the training transform: the source's resize when the
    config names one, else the net's input size (a centre crop of it is then the whole)."""
    cfg = data_cfg if isinstance(data_cfg, dict) else {}
    resize = cfg.get("resize")
    try:
        if isinstance(resize, int) and resize > 0:
            return resize, resize
        if isinstance(resize, (list, tuple)) and len(resize) == 2:
            return int(resize[0]), int(resize[1])
        if cfg.get("new_height") and cfg.get("new_width"):
            return int(cfg["new_height"]), int(cfg["new_width"])
    except (TypeError, ValueError):      # a stored config is data: ignore what does not fit
        pass
    return (int(shape[1]), int(shape[2])) if shape and len(shape) == 3 else None


def _range_warnings(data: np.ndarray, tf, spec: str) -> list[str]:
    """A warning when the values look already scaled but the transform scales them again."""
    if tf is None or tf.scale >= 0.5 or not np.size(data):
        return []
    lo, hi = float(np.min(data)), float(np.max(data))
    if hi <= 1.0 and lo >= -1.0:
        return [f"{spec}: the values lie in [{lo:.3g}, {hi:.3g}], but the training transform "
                f"multiplies by {tf.scale:.6g} (it expects raw pixels, 0..255); if the input "
                f"is already scaled, pass --raw"]
    return []


def _numbers(data: np.ndarray, where: str) -> np.ndarray:
    """Examples as numbers, one per row: refuse scalars, strings and records."""
    data = np.asarray(data)
    if data.ndim < 1:
        raise NetrunError(f"{where}: a single value, not a batch of examples")
    if not (np.issubdtype(data.dtype, np.number) or data.dtype == np.bool_):
        raise NetrunError(f"{where}: dtype {data.dtype}; expected numbers")
    return data


def _apply(tf, data: np.ndarray) -> np.ndarray:
    return tf(data, None, train=False)


def _read_file(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    if path.suffix == ".npy":
        return load_npy(path), None
    if path.suffix == ".npz":
        with NpzArchive(path) as f:
            key = next((k for k in ("data", "x", "images") if k in f), None)
            if key is None:
                raise NetrunError(f"'{path}' has no 'data' (or 'x') array; it has: "
                                  f"{', '.join(f.files) or 'nothing'}")
            label = next((f[k] for k in ("label", "labels", "y") if k in f), None)
            return f[key], label
    arrays = h5_read(path, ("data",), optional=("label",))
    label = arrays.get("label")
    return arrays["data"], (None if label is None else label.reshape(-1))


def _read_spec(spec: str, predictor: Predictor, data_dir: str | None):
    cfg, part = parse_spec(spec)
    if cfg["source"].endswith("-10k"):                 # mnist-10k:test is mnist, split mnist-10k
        cfg = {"source": cfg["source"][: -len("-10k")], "split": "mnist-10k"}
    trained = predictor.config.get("data") if isinstance(predictor.config, dict) else None
    trained = dict(trained) if isinstance(trained, dict) else {}
    if trained.get("source") == cfg["source"]:
        # The same source as in training: keep its settings (folder, counts, seed, split).
        for key in ("batch_size", "test_batch_size", "transform"):
            trained.pop(key, None)
        if "dir" in trained:
            trained["dir"] = expand(str(trained["dir"]))
            if data_dir is None:
                # A folder named by the checkpoint (data, not the user's word) is only read:
                # no download into it and no cache written there.
                accepted = data_keys(cfg["source"]) or ()
                trained.update({k: False for k in ("download", "cache") if k in accepted})
        cfg = {**trained, **cfg}
    source = make_source(cfg, data_dir)
    arrays = source.part(part or "test")
    return np.asarray(arrays.data), np.asarray(arrays.label)


def score(probs: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """Accuracy and mean cross-entropy of predicted probabilities against labels."""
    labels = labels.astype(np.int64).reshape(-1)
    if labels.size and labels.max() >= probs.shape[1]:
        raise NetrunError(f"label {int(labels.max())} is not a class of this model (it has "
                          f"{probs.shape[1]} classes: 0 to {probs.shape[1] - 1})")
    picked = probs[np.arange(len(labels)), labels]
    return {"accuracy": float(np.mean(probs.argmax(axis=1) == labels)),
            "loss": float(-np.mean(np.log(np.maximum(picked, 1e-12)))), "examples": int(len(labels))}
