"""ModelBuilder: layers -> init/train/test/predict NetDefs (Caffe2's ModelHelper + brew).

Each layer method adds the fillers of its parameters to the init net and its op to the
forward nets, in training mode (train net) and in test mode (test and predict nets), and
returns its output blob. Parameter blobs are named `<layer>_<suffix>`: `_w`/`_b` for
weights and biases, and for SpatialBN `_s` (scale), `_b` (bias), `_rm` (running mean) and
`_riv` (running variance; the name is Caffe2 brew's). The builder tracks every blob's shape
for a batch of one, so a layer only needs `num_output`: its input sizes come from the
blobs it reads, and a shape mismatch fails at the layer that causes it.
"""
from __future__ import annotations

import inspect
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import infer_op
from netrun.errors import NetrunError, suggest
from netrun.model.model import Model, Param
from netrun.proto.defs import NetDef, OperatorDef
from netrun.proto.defs import op as make_op

# filler name -> (op type, the filler keys it passes on as op arguments)
FILLERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "xavier": ("XavierFill", ()),
    "msra": ("MSRAFill", ()),
    "gaussian": ("GaussianFill", ("mean", "std")),
    "uniform": ("UniformFill", ("min", "max")),
    "constant": ("ConstantFill", ("value",)),
}
Filler = str | Mapping[str, Any]
Mult = float | Sequence[float]   # one value for all of a layer's params, or one per param
ONE: Mapping[str, Any] = MappingProxyType({"type": "constant", "value": 1.0})
# The largest channel or output count a layer may ask for (Caffe's int32 blob dims); bigger
# values are typos, and their products would overflow before any memory check could run.
MAX_UNITS = 2**31 - 1


class OptionError(NetrunError):
    """A layer option with a bad value; `key` names the option so readers can point at it."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


def _units(layer: str, key: str, value: int) -> int:
    """A count of outputs or groups: an integer from 1 to MAX_UNITS."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_UNITS:
        raise OptionError(f"layer '{layer}': '{key}' must be an integer from 1 to "
                          f"{MAX_UNITS:,}, got {value!r}", key)
    return value


class ModelBuilder:
    """Owns the ops and params of a model under construction; `build()` returns the Model."""

    def __init__(self, name: str):
        self.name = name
        self.inputs: dict[str, TensorSpec] = {}      # per example
        self.labels: list[str] = []
        self.params: list[Param] = []
        self.init_ops: list[OperatorDef] = []
        self.train_ops: list[OperatorDef] = []       # forward ops, training mode
        self.test_ops: list[OperatorDef] = []        # the same ops in test mode
        self.head_ops: list[OperatorDef] = []        # loss and metrics (train and test nets)
        self.loss: str | None = None
        self.metrics: list[str] = []
        self.last: str | None = None                 # output of the latest layer
        self.specs: dict[str, TensorSpec] = {}       # every blob so far, batch of one
        self._typed_inputs: set[str] = set()
        self._names: set[str] = set()
        self._predict: tuple[str | None, bool] = (None, False)
        self._loss_input: str | None = None
        self._layers: set[str] = set()

    # Inputs and bookkeeping ------------------------------------------------------------
    def add_input(self, name: str, shape: Sequence[int], dtype: str | None = None) -> str:
        """Declare a data input by its per-example shape; dtype defaults to float32."""
        self._claim(name)
        self.inputs[name] = TensorSpec(tuple(int(d) for d in shape), dtype or "float32")
        if dtype is not None:
            self._typed_inputs.add(name)
        if self.last is None:  # the first layer reads the first input unless told otherwise
            self.last = name
        self.specs[name] = TensorSpec((1, *self.inputs[name].shape), self.inputs[name].dtype)
        return name

    def shape(self, blob: str) -> tuple[int, ...]:
        """Shape of a blob for a batch of one."""
        return self.specs[blob].shape

    def _claim(self, name: str) -> None:
        if name in self._names or name in self.specs:
            raise NetrunError(f"the name '{name}' is used twice; layer, input and loss names "
                              f"must be unique")
        self._names.add(name)

    def _input(self, layer: str, blob: str | None, ndim: int | None = None
               ) -> tuple[str, TensorSpec]:
        """The blob a layer reads (default: the previous layer's output) and its spec."""
        blob = blob or self.last
        if blob is None:
            raise NetrunError(f"layer '{layer}' has no input: give 'input', or declare inputs "
                              f"first")
        if blob not in self.specs:
            raise NetrunError(f"layer '{layer}': input blob '{blob}' does not exist"
                              f"{suggest(blob, self.specs)}")
        spec = self.specs[blob]
        if ndim is not None and len(spec.shape) != ndim:
            raise NetrunError(f"layer '{layer}' needs a {ndim}-d input (N, C, H, W), but "
                              f"'{blob}' is {spec}")
        return blob, spec

    def _add(self, train: OperatorDef, test: OperatorDef | None = None) -> str:
        """Add a forward op (and its test-mode twin); track its output shapes."""
        if train.name in self._layers:
            raise NetrunError(f"two layers are named '{train.name}'; layer names must be unique")
        self._layers.add(train.name)
        for out in train.outputs:
            if out in self.specs and out not in train.inputs:
                raise NetrunError(f"layer '{train.name}' writes blob '{out}', which exists "
                                  f"already; name the layer or its output differently")
        self._track(train)
        self.train_ops.append(train)
        self.test_ops.append(test or train)
        self.last = train.outputs[0]
        return self.last

    def _track(self, op: OperatorDef) -> None:
        """Validate the op against its schema and record its output specs (inputs exist)."""
        record = infer_op(op, [self.specs[b] for b in op.inputs])
        self.specs.update(zip(op.outputs, record.outputs))

    def _param(self, layer: str, suffix: str, shape: Sequence[int], filler: Filler,
               role: str, lr_mult: float = 1.0, decay_mult: float = 1.0,
               trainable: bool = True) -> str:
        name = f"{layer}_{suffix}"
        self._claim(name)
        shape = tuple(int(d) for d in shape)
        fill = filler_op(filler, name, shape, f"layer '{layer}'")
        self.init_ops.append(fill)
        self.params.append(Param(name, shape, layer, role, float(lr_mult), float(decay_mult),
                                 trainable))
        self.specs[name] = TensorSpec(shape)
        return name

    def _weight_bias(self, layer: str, w_shape, b_shape, bias: bool, weight_filler: Filler,
                     bias_filler: Filler, lr_mult: Mult, decay_mult: Mult) -> list[str]:
        w = self._param(layer, "w", w_shape, weight_filler, "weight", _mult(lr_mult, 0),
                        _mult(decay_mult, 0))
        if not bias:
            return [w]
        return [w, self._param(layer, "b", b_shape, bias_filler, "bias", _mult(lr_mult, 1),
                               _mult(decay_mult, 1))]

    # Layers with parameters -----------------------------------------------------------
    def conv(self, input: str | None, name: str, num_output: int, kernel: int | Sequence[int],
             stride: int | Sequence[int] = 1, pad: int | Sequence[int] = 0,
             dilation: int | Sequence[int] = 1, group: int = 1, bias: bool = True,
             weight_filler: Filler = "xavier", bias_filler: Filler = "constant",
             lr_mult: Mult = 1.0, decay_mult: Mult = 1.0, output: str | None = None) -> str:
        """2-D convolution (NCHW); W is num_output × C/group × kh × kw."""
        x, spec = self._input(name, input, ndim=4)
        _units(name, "num_output", num_output)
        _units(name, "group", group)
        channels = spec.shape[1]
        if channels % group or num_output % group:
            raise OptionError(f"layer '{name}': group {group} must divide the {channels} input "
                              f"channels and the {num_output} outputs", "group")
        kh, kw = _pair(kernel)
        params = self._weight_bias(name, (num_output, channels // group, kh, kw),
                                   (num_output,), bias, weight_filler, bias_filler,
                                   lr_mult, decay_mult)
        args = {**_spatial("kernel", "kernels", kernel), **_spatial("stride", "strides", stride, 1),
                **_pads(pad), **_spatial("dilation", "dilations", dilation, 1)}
        if group != 1:
            args["group"] = group
        if not bias:
            args["no_bias"] = 1
        return self._add(make_op("Conv", [x, *params], [output or name], name=name, **args))

    def fc(self, input: str | None, name: str, num_output: int, axis: int = 1,
           weight_filler: Filler = "xavier", bias_filler: Filler = "constant",
           lr_mult: Mult = 1.0, decay_mult: Mult = 1.0, output: str | None = None) -> str:
        """Fully connected: the input is flattened from `axis` on; W is num_output × K."""
        x, spec = self._input(name, input)
        _units(name, "num_output", num_output)
        k = 1
        for d in spec.shape[axis:]:
            k *= d
        params = self._weight_bias(name, (num_output, k), (num_output,), True, weight_filler,
                                   bias_filler, lr_mult, decay_mult)
        args = {"axis": axis} if axis != 1 else {}
        return self._add(make_op("FC", [x, *params], [output or name], name=name, **args))

    def spatial_bn(self, input: str | None, name: str, epsilon: float = 1e-5,
                   momentum: float = 0.9, scale_filler: Filler = ONE,
                   bias_filler: Filler = "constant", lr_mult: Mult = 1.0,
                   decay_mult: Mult = 1.0, output: str | None = None) -> str:
        """Batch normalization over N, H, W per channel; running stats are saved, not trained."""
        x, spec = self._input(name, input, ndim=4)
        c = (spec.shape[1],)
        s = self._param(name, "s", c, scale_filler, "scale", _mult(lr_mult, 0),
                        _mult(decay_mult, 0))
        b = self._param(name, "b", c, bias_filler, "bias", _mult(lr_mult, 1),
                        _mult(decay_mult, 1))
        rm = self._param(name, "rm", c, "constant", "running_mean", 0.0, 0.0, trainable=False)
        riv = self._param(name, "riv", c, ONE, "running_var", 0.0, 0.0, trainable=False)
        ins, y = [x, s, b, rm, riv], output or name
        # Training mode updates the running stats in place and keeps the batch statistics
        # (saved mean, saved 1/std) for the gradient.
        train = make_op("SpatialBN", ins, [y, rm, riv, f"{name}_sm", f"{name}_siv"], name=name,
                        is_test=0, epsilon=epsilon, momentum=momentum)
        test = make_op("SpatialBN", ins, [y], name=name, is_test=1, epsilon=epsilon,
                       momentum=momentum)
        return self._add(train, test)

    # Layers without parameters --------------------------------------------------------
    def _simple(self, type: str, input: str | None, name: str, output: str | None,
                **args) -> str:
        x, _ = self._input(name, input)
        return self._add(make_op(type, [x], [output or name], name=name, **args))

    def relu(self, input: str | None, name: str, output: str | None = None) -> str:
        """max(x, 0); give output = input to run in place, as Caffe's LeNet does."""
        return self._simple("Relu", input, name, output)

    def sigmoid(self, input: str | None, name: str, output: str | None = None) -> str:
        """1 / (1 + exp(-x))."""
        return self._simple("Sigmoid", input, name, output)

    def tanh(self, input: str | None, name: str, output: str | None = None) -> str:
        """tanh(x)."""
        return self._simple("Tanh", input, name, output)

    def softmax(self, input: str | None, name: str, axis: int = 1,
                output: str | None = None) -> str:
        """Softmax over `axis`."""
        return self._simple("Softmax", input, name, output, **({"axis": axis} if axis != 1 else {}))

    def _pool(self, type: str, input: str | None, name: str, kernel, stride, pad,
              global_pooling: bool, legacy_pad: int | None, output: str | None) -> str:
        x, _ = self._input(name, input, ndim=4)
        if kernel is None and not global_pooling:
            raise NetrunError(f"layer '{name}' needs 'kernel' (or global_pooling: true)")
        args = {**_spatial("kernel", "kernels", kernel), **_spatial("stride", "strides", stride, 1),
                **_pads(pad)}
        if global_pooling:
            args["global_pooling"] = 1
        if legacy_pad is not None:
            args["legacy_pad"] = legacy_pad
        return self._add(make_op(type, [x], [output or name], name=name, **args))

    def max_pool(self, input: str | None, name: str, kernel: int | Sequence[int] | None = None,
                 stride: int | Sequence[int] = 1, pad: int | Sequence[int] = 0,
                 global_pooling: bool = False, legacy_pad: int | None = None,
                 output: str | None = None) -> str:
        """Max pooling (NCHW)."""
        return self._pool("MaxPool", input, name, kernel, stride, pad, global_pooling,
                          legacy_pad, output)

    def average_pool(self, input: str | None, name: str,
                     kernel: int | Sequence[int] | None = None, stride: int | Sequence[int] = 1,
                     pad: int | Sequence[int] = 0, global_pooling: bool = False,
                     legacy_pad: int | None = None, output: str | None = None) -> str:
        """Average pooling (NCHW)."""
        return self._pool("AveragePool", input, name, kernel, stride, pad, global_pooling,
                          legacy_pad, output)

    def dropout(self, input: str | None, name: str, ratio: float = 0.5,
                output: str | None = None) -> str:
        """Dropout in training (with a mask output for the gradient); identity in test mode."""
        x, _ = self._input(name, input)
        y = output or name
        train = make_op("Dropout", [x], [y, f"{name}_mask"], name=name, ratio=ratio, is_test=0)
        test = make_op("Dropout", [x], [y], name=name, ratio=ratio, is_test=1)
        return self._add(train, test)

    def lrn(self, input: str | None, name: str, size: int = 5, alpha: float = 1e-4,
            beta: float = 0.75, bias: float = 1.0, output: str | None = None) -> str:
        """Local response normalization across channels; training keeps the scale for the
        gradient."""
        x, _ = self._input(name, input)
        args = {"size": size, "alpha": alpha, "beta": beta, "bias": bias}
        y = output or name
        return self._add(make_op("LRN", [x], [y, f"{name}_scale"], name=name, **args),
                         make_op("LRN", [x], [y], name=name, **args))

    def concat(self, input: Sequence[str], name: str, axis: int = 1,
               output: str | None = None) -> str:
        """Concatenate several blobs along `axis` (channels by default)."""
        ins = _blob_list(name, input, 1)
        for b in ins:
            self._input(name, b)
        return self._add(make_op("Concat", ins, [output or name, f"{name}_split_info"],
                                 name=name, axis=axis))

    def add(self, input: Sequence[str], name: str, output: str | None = None) -> str:
        """Elementwise sum of two blobs of the same shape (residual connections)."""
        ins = _blob_list(name, input, 2, 2)
        for b in ins:
            self._input(name, b)
        return self._add(make_op("Add", ins, [output or name], name=name))

    def flatten(self, input: str | None, name: str, output: str | None = None) -> str:
        """N × everything-else."""
        return self._simple("Flatten", input, name, output)

    def reshape(self, input: str | None, name: str, shape: Sequence[int],
                output: str | None = None) -> str:
        """Reshape; `shape` includes the batch dimension (0 copies a dim, -1 infers one)."""
        x, _ = self._input(name, input)
        return self._add(make_op("Reshape", [x], [output or name, f"{name}_old_shape"],
                                 name=name, shape=list(shape)))

    # Loss, metrics, prediction --------------------------------------------------------
    def _label(self, layer: str, label: str) -> str:
        if label not in self.inputs:
            raise NetrunError(f"'{layer}': label '{label}' is not a declared input"
                              f"{suggest(label, self.inputs)}")
        if label not in self.labels:
            self.labels.append(label)
        if label not in self._typed_inputs:  # class indices, unless declared otherwise
            self.inputs[label] = TensorSpec(self.inputs[label].shape, "int32")
            self.specs[label] = TensorSpec(self.specs[label].shape, "int32")
        return label

    def _head(self, op: OperatorDef) -> None:
        self._track(op)
        self.head_ops.append(op)

    def softmax_cross_entropy(self, input: str | None, label: str = "label",
                              name: str = "loss") -> str:
        """Softmax + cross-entropy averaged over the batch (SoftmaxWithLoss)."""
        if self.loss is not None:
            raise NetrunError(f"'{name}': the model has a loss already ('{self.loss}')")
        x, _ = self._input(name, input)
        self._claim(name)
        self._head(make_op("SoftmaxWithLoss", [x, self._label(name, label)],
                           [f"{name}_prob", name], name=name))
        self.loss = name
        self._loss_input = x
        return name

    def accuracy(self, input: str | None, label: str = "label", top_k: int = 1,
                 name: str | None = None) -> str:
        """Fraction of examples whose label is among the top_k scores."""
        name = name or ("accuracy" if top_k == 1 else f"accuracy_top{top_k}")
        x, _ = self._input(name, input)
        self._claim(name)
        self._head(make_op("Accuracy", [x, self._label(name, label)], [name],
                           name=name, top_k=top_k))
        self.metrics.append(name)
        return name

    def set_predict(self, output: str | None = None, softmax: bool = False) -> None:
        """What the predict net returns: `output` (default: the loss input, else the last
        layer), optionally through a Softmax into blob 'prob'."""
        if output is not None and output not in self.specs:
            raise NetrunError(f"predict output '{output}' does not exist"
                              f"{suggest(output, self.specs)}")
        self._predict = (output, softmax)

    def build(self, source_path: str | None = None) -> Model:
        """The Model: init, train, test and predict nets plus inputs, params and outputs."""
        data = [n for n in self.inputs if n not in self.labels]
        params = [p.name for p in self.params]
        out, softmax = self._predict
        out = out or self._loss_input or self.last
        predict_ops = list(self.test_ops)
        if softmax:
            if "prob" in self.specs:
                raise NetrunError("predict softmax writes blob 'prob', which exists already")
            predict_ops.append(make_op("Softmax", [out], ["prob"], name="prob"))
            out = "prob"
        heads = [self.loss] if self.loss else []
        heads += self.metrics
        ext_in = data + self.labels + params
        return Model(
            name=self.name,
            init_net=NetDef(f"{self.name}_init", list(self.init_ops), [], list(params)),
            train_net=NetDef(f"{self.name}_train", self.train_ops + self.head_ops, ext_in,
                             heads or [out]),
            test_net=NetDef(f"{self.name}_test", self.test_ops + self.head_ops, ext_in,
                            heads or [out]),
            predict_net=NetDef(f"{self.name}_predict", predict_ops, data + params, [out]),
            inputs=dict(self.inputs), params=list(self.params), outputs=[out],
            loss=self.loss, metrics=list(self.metrics), source_path=source_path,
            labels=list(self.labels))


# Layer, loss and metric types as model files name them -> builder method.
LAYERS: dict[str, Callable[..., str]] = {
    "conv": ModelBuilder.conv, "fc": ModelBuilder.fc, "max_pool": ModelBuilder.max_pool,
    "average_pool": ModelBuilder.average_pool, "relu": ModelBuilder.relu,
    "sigmoid": ModelBuilder.sigmoid, "tanh": ModelBuilder.tanh,
    "softmax": ModelBuilder.softmax, "dropout": ModelBuilder.dropout,
    "spatial_bn": ModelBuilder.spatial_bn, "lrn": ModelBuilder.lrn,
    "concat": ModelBuilder.concat, "add": ModelBuilder.add, "flatten": ModelBuilder.flatten,
    "reshape": ModelBuilder.reshape,
}
LOSSES: dict[str, Callable[..., str]] = {
    "softmax_cross_entropy": ModelBuilder.softmax_cross_entropy}
METRICS: dict[str, Callable[..., str]] = {"accuracy": ModelBuilder.accuracy}


def options(method: Callable[..., str]) -> tuple[list[str], list[str]]:
    """(required, optional) keyword names of a layer/loss/metric method, besides input/name."""
    required, optional = [], []
    for p in list(inspect.signature(method).parameters.values())[1:]:
        if p.name in ("input", "name"):
            continue
        (required if p.default is inspect.Parameter.empty else optional).append(p.name)
    return required, optional


def filler_op(filler: Filler, blob: str, shape: tuple[int, ...], where: str) -> OperatorDef:
    """The init op for one parameter from a filler given as a name or {type: ..., key: ...}."""
    if isinstance(filler, str):
        kind, extra = filler, {}
    elif isinstance(filler, Mapping) and isinstance(filler.get("type"), str):
        kind, extra = filler["type"], {k: v for k, v in filler.items() if k != "type"}
    else:
        raise NetrunError(f"{where}: a filler is a name ({', '.join(FILLERS)}) or a mapping "
                          f"with a 'type', got {filler!r}")
    if kind not in FILLERS:
        raise NetrunError(f"{where}: unknown filler '{kind}'{suggest(kind, FILLERS)} "
                          f"(known: {', '.join(FILLERS)})")
    op_type, keys = FILLERS[kind]
    for k in extra:
        if k not in keys:
            raise NetrunError(f"{where}: filler '{kind}' has no option '{k}'{suggest(k, keys)}"
                              f" (options: {', '.join(keys) or 'none'})")
        items = extra[k] if isinstance(extra[k], list) else [extra[k]]
        if not all(isinstance(v, (bool, int, float, str)) for v in items):
            raise NetrunError(f"{where}: filler '{kind}' option '{k}' must be a number, got "
                              f"{extra[k]!r}")
    return make_op(op_type, [], [blob], shape=list(shape), **extra)


def _mult(value: Mult, i: int) -> float:
    if isinstance(value, (list, tuple)):
        return float(value[min(i, len(value) - 1)])
    return float(value)


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise NetrunError(f"expected one size or [height, width], got {list(value)}")
        return int(value[0]), int(value[1])
    return int(value), int(value)


def _spatial(one: str, many: str, value, default: int | None = None) -> dict[str, Any]:
    """Caffe2's argument pair: `kernel: 5` for square, `kernels: [kh, kw]` otherwise."""
    if value is None or value == default:
        return {}
    if isinstance(value, (list, tuple)):
        h, w = _pair(value)
        return {one: h} if h == w else {many: [h, w]}
    return {one: int(value)}


def _pads(pad) -> dict[str, Any]:
    """pad: p, [ph, pw] or [top, left, bottom, right] -> Caffe2's pad / pads."""
    if isinstance(pad, (list, tuple)):
        if len(pad) == 2:
            pad = [pad[0], pad[1], pad[0], pad[1]]
        if len(pad) != 4:
            raise NetrunError(f"pad is p, [ph, pw] or [top, left, bottom, right], got {list(pad)}")
        return {} if not any(pad) else ({"pad": pad[0]} if len(set(pad)) == 1 else
                                         {"pads": [int(p) for p in pad]})
    return {"pad": int(pad)} if pad else {}


def _blob_list(layer: str, value, lo: int, hi: int | None = None) -> list[str]:
    items = [value] if isinstance(value, str) else list(value or [])
    if len(items) < lo or (hi is not None and len(items) > hi):
        count = f"{lo}" if hi == lo else f"at least {lo}"
        raise NetrunError(f"layer '{layer}' takes {count} inputs as a list, got {items}")
    return items
