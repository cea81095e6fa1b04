"""The seed corpus: small valid files of every format netrun reads, made here, never checked in.

Model and config seeds come from the project's own zoo/ and configs/; nets, checkpoints,
caffemodels and algorithm caches are what netrun itself writes (or, for Caffe's binary
formats, what a small encoder in the tests writes). `build(folder)` writes every seed and
returns the companions the readers need (the Caffe model the weights fit, a predictor).
"""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[2]
ZOO = ("lenet", "mlp", "cifar10_quick")

# A Caffe net in the current form, every layer kind the translator knows well enough to fuzz.
CAFFE_NET = """\
name: "FuzzNet"
layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.00390625 mirror: false }
        data_param { source: "mnist_train_lmdb" batch_size: 8 backend: LMDB } }
layer { name: "mnist" type: "Data" top: "data" top: "label" include { phase: TEST }
        transform_param { scale: 0.00390625 }
        data_param { source: "mnist_test_lmdb" batch_size: 4 backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        param { lr_mult: 1 } param { lr_mult: 2 }
        convolution_param { num_output: 4 kernel_size: 5 stride: 2
          weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1"
        scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "norm1" type: "LRN" bottom: "pool1" top: "norm1"
        lrn_param { local_size: 3 alpha: 0.0001 beta: 0.75 } }
layer { name: "ip1" type: "InnerProduct" bottom: "norm1" top: "ip1"
        inner_product_param { num_output: 16 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "drop1" type: "Dropout" bottom: "ip1" top: "ip1" dropout_param { dropout_ratio: 0.5 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 10 } }
layer { name: "accuracy" type: "Accuracy" bottom: "ip2" bottom: "label" top: "accuracy"
        include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

# A deploy net with an Input layer and branches (Concat, Eltwise, Slice).
CAFFE_DEPLOY = """\
name: "FuzzDeploy"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "a" type: "Convolution" bottom: "data" top: "a"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 group: 1 } }
layer { name: "b" type: "Convolution" bottom: "data" top: "b"
        convolution_param { num_output: 4 kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0 } }
layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "sum"
        eltwise_param { operation: SUM coeff: 1 coeff: -1 } }
layer { name: "cat" type: "Concat" bottom: "a" bottom: "sum" top: "cat" concat_param { axis: 1 } }
layer { name: "sig" type: "Sigmoid" bottom: "cat" top: "cat" }
layer { name: "pool" type: "Pooling" bottom: "cat" top: "pool"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc"
        inner_product_param { num_output: 3 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""

# The legacy V1 form of a small net.
CAFFE_V1 = """\
name: "FuzzV1"
input: "data"
input_dim: 1 input_dim: 1 input_dim: 12 input_dim: 12
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
         blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
         convolution_param { num_output: 2 kernel_size: 3 } }
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
layers { name: "pool" type: POOLING bottom: "conv" top: "pool"
         pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layers { name: "ip" type: INNER_PRODUCT bottom: "pool" top: "ip"
         inner_product_param { num_output: 5 } }
layers { name: "prob" type: SOFTMAX bottom: "ip" top: "prob" }
"""

SOLVER = """\
net: "{net}"
test_iter: 2
test_interval: 50
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: 10
max_iter: 100
snapshot: 50
snapshot_prefix: "snap/fuzz"
solver_mode: CPU
"""

SOLVER_ADAM = """\
net: "{net}"
type: "Adam"
base_lr: 0.001
momentum: 0.9
momentum2: 0.999
delta: 1e-8
lr_policy: "step"
stepsize: 20
gamma: 0.5
max_iter: 40
iter_size: 2
random_seed: 7
"""

# The tiny model the checkpoint seeds are trained from (dropout, so RNG state is stored).
TINY_MODEL = """\
name: Tiny
inputs: {data: [1, 28, 28], label: []}
layers:
  - {type: conv, name: c1, input: data, num_output: 2, kernel: 5, stride: 3}
  - {type: relu, name: r1}
  - {type: fc, name: f1, num_output: 8}
  - {type: dropout, name: d1, ratio: 0.3}
  - {type: fc, name: f2, num_output: 10}
loss: {type: softmax_cross_entropy, input: f2, label: label}
metrics: [{type: accuracy, input: f2, label: label}]
"""

TINY_CONFIG = """\
model: {model}
data:
  source: generated
  dir: {data}
  train_count: 32
  test_count: 16
  batch_size: 8
  transform: {{scale: 0.00390625}}
solver:
  type: {solver}
  base_lr: 0.05
  momentum: 0.9
  weight_decay: 0.0005
  lr_policy: {{type: step, stepsize: 2, gamma: 0.5}}
  max_iter: 3
  test_interval: 2
  display: 0
  seed: 3
output: {output}
"""


def netdef_pb_seed() -> bytes:
    """A binary Caffe2 NetDef with every argument kind, every device form, empty and
    non-ASCII values and a run of unpacked floats (the binary reader's fast path)."""
    import netrun
    from netrun.proto.defs import NetDef
    from netrun.proto.netdef_binary import netdef_to_bytes

    values = np.random.default_rng(2).standard_normal(70).astype(np.float32)
    values[:3] = [np.nan, np.inf, -0.0]
    return netdef_to_bytes(NetDef("every-field", [
        netrun.op("GivenTensorFill", [], ["w"], shape=[70], values=values.tolist()),
        netrun.op("Conv", ["data", "w"], ["conv1"], name="conv1", kernel=3, pads=[1, 0, -1, 2],
                  epsilon=1e-5, order="NCHW", engine="CUDNN", device="gpu:1"),
        netrun.op("Relu", "conv1", "conv1", device="cpu"),
        netrun.op("Custom", ["conv1"], ["out", "aux"], names=["a", "é", ""], empty=[],
                  big=-(1 << 63), text="ünïcode", scale=0.1, device="gpu"),
    ], ["data"], ["out"]))


class Corpus:
    """Seed files by target name (sorted, so case numbers mean the same inputs everywhere),
    plus the objects readers need beside the mutated file, built on first use."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.seeds: dict[str, list[Path]] = {
            d.name: sorted(d.iterdir()) for d in sorted(self.folder.iterdir())
            if d.is_dir() and d.name != "aux"} if self.folder.is_dir() else {}
        self._extra: dict[str, object] = {}

    @property
    def aux(self) -> Path:
        """Companion files: the nets configs point at, the training run's checkpoint."""
        return self.folder / "aux"

    @property
    def checkpoint(self) -> Path:
        """The checkpoint the training run wrote (input readers predict with it)."""
        return self.aux / "run" / "last.h5"

    @property
    def deploy_input(self) -> Path:
        """An input batch for the Caffe deploy net (the caffemodel seeds' net)."""
        return self.aux / "deploy-input.npy"

    @property
    def caffe_model(self):
        """The Caffe deploy net the caffemodel seeds hold weights for."""
        if "caffe_model" not in self._extra:
            from netrun.caffe import load_caffe_model

            self._extra["caffe_model"] = load_caffe_model(self.aux / "deploy.prototxt")
        return self._extra["caffe_model"]

    @property
    def predictor(self):
        """A predictor from the training run's checkpoint."""
        if "predictor" not in self._extra:
            from netrun.infer import Predictor

            self._extra["predictor"] = Predictor.from_checkpoint(self.checkpoint)
        return self._extra["predictor"]


def _add(folder: Path, target: str, name: str, data: bytes | str) -> Path:
    """Write one seed of `target`."""
    path = folder / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    return path


def build(folder: Path) -> Corpus:
    """Write the seeds of every target under `folder`."""
    from netrun.caffe import caffe_to_yaml
    from netrun.model import load_model
    from netrun.proto.io import save_netdef
    from netrun.proto.netdef_binary import netdef_to_bytes

    aux = folder / "aux"
    aux.mkdir(parents=True, exist_ok=True)
    for name in ZOO:
        text = (REPO / "zoo" / f"{name}.yaml").read_text()
        _add(folder, "model-yaml", f"{name}.yaml", text)
        (aux / f"{name}.yaml").write_text(text)
        model = load_model(REPO / "zoo" / f"{name}.yaml")
        for which in ("predict", "train"):
            save_netdef(model.net(which), aux / f"{name}-{which}.pbtxt")
            _add(folder, "netdef-pbtxt", f"{name}-{which}.pbtxt",
                       (aux / f"{name}-{which}.pbtxt").read_bytes())
            save_netdef(model.net(which), aux / f"{name}-{which}.yaml")
            _add(folder, "netdef-yaml", f"{name}-{which}.yaml",
                       (aux / f"{name}-{which}.yaml").read_bytes())
        _add(folder, "netdef-pb", f"{name}-predict.pb", netdef_to_bytes(model.net("predict")))
    _add(folder, "netdef-pb", "every-field.pb", netdef_pb_seed())
    _caffe(folder, aux, caffe_to_yaml)
    _configs(folder, aux)
    _checkpoints(folder, aux)
    _arrays(folder)
    _algo_cache(folder, aux)
    return Corpus(folder)


def _caffe(folder: Path, aux: Path, caffe_to_yaml) -> None:
    from netrun.caffe import load_caffe_model
    from netrun.caffe.weights import layer_params

    for name, text in (("net", CAFFE_NET), ("deploy", CAFFE_DEPLOY), ("v1", CAFFE_V1)):
        path = _add(folder, "caffe-prototxt", f"{name}.prototxt", text)
        _add(folder, "ops-yaml", f"{name}.yaml", caffe_to_yaml(load_caffe_model(path)))
    net = aux / "net.prototxt"
    net.write_text(CAFFE_NET)
    _add(folder, "caffe-solver", "solver.prototxt", SOLVER.format(net=net))
    _add(folder, "caffe-solver", "adam_solver.prototxt", SOLVER_ADAM.format(net=net))
    # Weights for the deploy net: binary caffemodel (current and V1 layers) and HDF5.
    deploy = aux / "deploy.prototxt"
    deploy.write_text(CAFFE_DEPLOY)
    model = load_caffe_model(deploy)
    shapes = {p.name: tuple(p.shape) for p in model.params}
    rng = np.random.default_rng(0)
    blobs = {layer: [rng.standard_normal(shapes[n]).astype(np.float32) for n in names]
             for layer, names in layer_params(model).items()}
    from tests.caffe.test_weights import blob_proto, layer_proto, net_proto

    layers = [layer_proto(layer, "Convolution", [blob_proto(a) for a in arrays])
              for layer, arrays in blobs.items()]
    _add(folder, "caffemodel", "deploy.caffemodel", net_proto("FuzzDeploy", layers))
    legacy = [layer_proto(layer, "4", [blob_proto(a, legacy=True, packed=False)
                                       for a in arrays], v1=True)
              for layer, arrays in blobs.items()]
    _add(folder, "caffemodel", "deploy_v1.caffemodel", net_proto("FuzzDeploy", legacy, v1=True))
    path = folder / "caffemodel-h5" / "deploy.caffemodel.h5"
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for layer, arrays in blobs.items():
            for i, a in enumerate(arrays):
                f.create_dataset(f"data/{layer}/{i}", data=a)
    np.save(aux / "deploy-input.npy", rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    mean = rng.uniform(0, 255, (1, 3, 8, 8)).astype(np.float32)
    _add(folder, "binaryproto", "mean.binaryproto", blob_proto(mean, legacy=True))
    _add(folder, "binaryproto", "mean_packed.binaryproto", blob_proto(mean[0]))


def _configs(folder: Path, aux: Path) -> None:
    for path in sorted((REPO / "configs").glob("*.yaml")):
        text = path.read_text()
        # the model path is relative to the config: point it at the copy in aux/
        lines = [f"model: {aux / Path(line.split(':', 1)[1].strip()).name}"
                 if line.startswith("model:") else line for line in text.splitlines()]
        _add(folder, "train-config", path.name, "\n".join(lines) + "\n")
    for name in ("resnet20",):
        (aux / f"{name}.yaml").write_text((REPO / "zoo" / f"{name}.yaml").read_text())
    (aux / "tiny.yaml").write_text(TINY_MODEL)
    _add(folder, "train-config", "tiny.yaml", TINY_CONFIG.format(
        model=aux / "tiny.yaml", data=aux / "data", solver="adam", output=aux / "run-adam"))


def _checkpoints(folder: Path, aux: Path) -> None:
    """Checkpoints a real (three-step) training run writes."""
    from netrun.train.config import load_config
    from netrun.train.trainer import Trainer

    config = aux / "train.yaml"
    config.write_text(TINY_CONFIG.format(model=aux / "tiny.yaml", data=aux / "data",
                                         solver="sgd", output=aux / "run"))
    trainer = Trainer(load_config(config), output=str(aux / "run"))
    trainer.start()
    trainer.run(3)
    for name in ("last.h5", "best.h5"):
        if (aux / "run" / name).is_file():
            _add(folder, "checkpoint", name, (aux / "run" / name).read_bytes())


def _arrays(folder: Path) -> None:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (6, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, 6).astype(np.uint8)
    data = images[:, None].astype(np.float32)
    _add(folder, "npy-input", "images.npy", _npy(data))
    _add(folder, "npy-input", "images_u8.npy", _npy(images))
    _add(folder, "npz-input", "inputs.npz", _npz(data=data, label=labels))
    _add(folder, "npz-input", "xy.npz", _npz(compressed=True, x=images, y=labels))
    for target in ("h5-input", "hdf5-source"):
        for name, kw in (("small.h5", {}), ("chunked.h5", {"chunks": True,
                                                          "compression": "gzip"})):
            path = folder / target / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with h5py.File(path, "w") as f:
                f.create_dataset("data", data=data, **kw)
                f.create_dataset("label", data=labels.astype(np.float32), **kw)
    _add(folder, "npz-source", "parts.npz", _npz(data=images, label=labels))
    _add(folder, "npz-source", "keras.npz", _npz(compressed=True, x_train=images, y_train=labels,
                                               x_test=images[:2], y_test=labels[:2]))
    from netrun.train.data.idx import write_idx

    for name, array in (("images", images), ("labels", labels)):
        path = folder / "idx" / f"{name}-idx.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_idx(path, array)
        write_idx(folder / "idx" / f"{name}-idx", array)
    records = np.concatenate([labels[:4, None], rng.integers(0, 256, (4, 3072))], axis=1)
    _add(folder, "cifar-bin", "batch.bin", records.astype(np.uint8).tobytes())
    from netrun.train.data.generated import generate

    arrays = generate(20, 1, "train")
    _add(folder, "generated-cache", "digits-v1-train-seed1-n20.npz", _npz(
        compressed=True, images=arrays.data[:, 0].astype(np.uint8), labels=arrays.label))


def _algo_cache(folder: Path, aux: Path) -> None:
    from netrun.conv import cache

    store = cache.AlgoCache(aux / "algos" / "cpu-fuzz.json", "cpu", "fuzz")
    for i, direction in enumerate(("forward", "backward_data", "backward_filter")):
        key = f"{direction}|float32|NCHW|n8|c{3 + i}|h32|w32|k16|kernel3x3|stride1x1"
        store.put(key, cache.Entry({"im2col": 1.5 + i, "winograd": 0.25, "direct": 3.0},
                                   ["fft"], 1 << 20, 1700000000.0))
    _add(folder, "algo-cache", "cpu-fuzz.json", store.path.read_bytes())


def _npy(array: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _npz(compressed: bool = False, **arrays) -> bytes:
    import io

    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()
