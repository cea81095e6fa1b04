"""netrun operators -> Caffe layers, one converter per op type (used by prototxt_export).

A converter reads one op (with the specs shape inference gave it) and adds the Caffe layer or
layers that compute the same thing through the phase writer `cx`: blob names are netrun's
(the writer turns them into Caffe tops), parameters are `ParamRef`s, and the layer's own
fields are a text-format Message. What Caffe cannot say raises `Inexpressible`, which the
writer collects so that every such op is reported at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from netrun.caffe.layers.vision import caffe_pool_size
from netrun.core.shape_inference import OpShapes
from netrun.kernels.geometry import ConvGeometry
from netrun.proto.defs import OperatorDef
from netrun.proto.textformat import Enum, Message

if TYPE_CHECKING:
    from netrun.caffe.prototxt_export import PhaseWriter


class Inexpressible(Exception):
    """An op, or an argument of it, that no Caffe layer can say; the message says why."""


@dataclass(frozen=True)
class ParamRef:
    """One blob of a Caffe layer: a netrun parameter, or a constant netrun does not keep
    (BatchNorm's scale factor, 1 for netrun's own running statistics)."""

    blob: str | None
    constant: float | None = None
    statistic: bool = False        # saved, never trained: Caffe's lr_mult 0, decay_mult 0


@dataclass
class CaffeLayer:
    """A Caffe LayerParameter under construction: names are Caffe blob names."""

    name: str
    type: str
    bottoms: list[str]
    tops: list[str]
    body: Message                                  # the type's own fields (*_param)
    params: list[ParamRef] = field(default_factory=list)
    global_stats: bool | None = None               # BatchNorm's use_global_stats
    loss_weight: float | None = None               # None: Caffe's default for the type
    propagate_down: list[bool] | None = None
    phase: str | None = None                       # include { phase }; None: both phases
    in_place: tuple[bool, ...] = ()                # per top: it overwrites its bottom


Converter = Callable[["PhaseWriter", OperatorDef, OpShapes], None]
CONVERTERS: dict[str, Converter] = {}
# Caffe layer types whose first top is a loss (weight 1 unless loss_weight says otherwise).
LOSS_LAYERS = ("SoftmaxWithLoss",)


def converts(*types: str) -> Callable[[Converter], Converter]:
    """Register a converter for the netrun op types named."""
    def register(fn: Converter) -> Converter:
        for t in types:
            CONVERTERS[t] = fn
        return fn
    return register


# Shared helpers -------------------------------------------------------------------------
def _nchw(op: OperatorDef) -> None:
    if op.args.get("order", "NCHW") != "NCHW":
        raise Inexpressible("only NCHW storage order has a Caffe layer")


def _pair(msg: Message, base: str, single: str, hw: tuple[int, int],
          default: int | None) -> None:
    """Caffe's spelling of an (h, w) pair: `base` when square, else `single`_h/_w; nothing
    when both are the default."""
    h, w = hw
    if default is not None and (h, w) == (default, default):
        return
    if h == w:
        msg.add(base, int(h))
    else:
        msg.add(f"{single}_h", int(h)).add(f"{single}_w", int(w))


def _symmetric(g: ConvGeometry) -> ConvGeometry:
    if g.pt != g.pb or g.pl != g.pr:
        raise Inexpressible(f"pads [t, l, b, r] = {list(g.pads)} are not symmetric; Caffe pads "
                            f"both sides of an axis alike")
    return g


def _axis(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def _count(dims) -> int:
    return math.prod(int(d) for d in dims)


def _maybe(msg: Message, key: str, value, default) -> None:
    if value != default:
        msg.add(key, value)


# Convolution, pooling, inner product -----------------------------------------------------
@converts("Conv", "ConvTranspose")
def convolution(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Convolution / Deconvolution; a fused relu=1 becomes an in-place ReLU after it."""
    _nchw(op)
    x, w = s.inputs[0].shape, s.inputs[1].shape
    args = dict(op.args)
    if not any(k in args for k in ("kernel", "kernel_h", "kernels")):
        args["kernels"] = list(w[2:])        # Caffe2 may leave the kernel to W's shape
    g = ConvGeometry.from_args(args, op.label)
    deconv = op.type == "ConvTranspose"
    if deconv:
        if g.legacy_pad != "NOTSET" or any(args.get(k) for k in ("adj", "adj_h", "adj_w")) \
                or any(args.get("adjs") or []):
            raise Inexpressible("legacy_pad and adj have no Deconvolution field")
    else:
        g = g.resolve(x[2], x[3], f"op {op.label}'s input")
    _symmetric(g)
    group = int(args.get("group", 1))
    bias = len(op.inputs) > 2 and not args.get("no_bias", 0)
    p = Message().add("num_output", int(w[1] * group if deconv else w[0]))
    if not bias:
        p.add("bias_term", False)
    _pair(p, "pad", "pad", (g.pt, g.pl), 0)
    _pair(p, "kernel_size", "kernel", (g.kh, g.kw), None)
    _pair(p, "stride", "stride", (g.sh, g.sw), 1)
    if group != 1:
        p.add("group", group)
    if (g.dh, g.dw) != (1, 1):       # a repeated field: one value, or one per axis
        p.add("dilation", g.dh)
        if g.dw != g.dh:
            p.add("dilation", g.dw)
    params = [cx.param(op.inputs[1])] + ([cx.param(op.inputs[2])] if bias else [])
    cx.filler(p, "weight_filler", op.inputs[1])
    if bias:
        cx.filler(p, "bias_filler", op.inputs[2])
    layer = cx.add("Deconvolution" if deconv else "Convolution", op, [op.inputs[0]],
                   [op.outputs[0]], Message().add("convolution_param", p), params)
    if args.get("relu", 0):
        cx.add("ReLU", op, [op.outputs[0]], [op.outputs[0]], Message(),
               name=f"{layer.name}_relu")


@converts("MaxPool", "AveragePool")
def pooling(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Pooling; round_mode: FLOOR where netrun's output size is Caffe's rounded down."""
    _nchw(op)
    p = Message().add("pool", Enum("MAX" if op.type == "MaxPool" else "AVE"))
    if op.args.get("global_pooling", 0):
        cx.add("Pooling", op, [op.inputs[0]], [op.outputs[0]],
               Message().add("pooling_param", p.add("global_pooling", True)))
        return
    h, w = s.inputs[0].shape[2:]
    declared = ConvGeometry.from_args(op.args, op.label)
    g = declared if declared.legacy_pad in ("NOTSET", "CAFFE_LEGACY_POOLING") \
        else declared.resolve(h, w, f"op {op.label}'s input")
    _symmetric(g)
    if op.type == "AveragePool" and not op.args.get("count_include_pad", 1) and g.padded:
        raise Inexpressible("count_include_pad=0 with padding: Caffe's divisor counts the pads")
    _pair(p, "kernel_size", "kernel", (g.kh, g.kw), None)
    _pair(p, "stride", "stride", (g.sh, g.sw), 1)
    _pair(p, "pad", "pad", (g.pt, g.pl), 0)
    got = tuple(s.outputs[0].shape[2:])
    sizes = {ceil: tuple(caffe_pool_size(n, k, st, pd, ceil) for n, k, st, pd in
                         zip((h, w), (g.kh, g.kw), (g.sh, g.sw), (g.pt, g.pl)))
             for ceil in (True, False)}
    if got != sizes[True]:
        if got != sizes[False]:
            raise Inexpressible(f"netrun pools the {h}×{w} input to {got[0]}×{got[1]}, Caffe "
                                f"to {sizes[True][0]}×{sizes[True][1]} (CEIL) or "
                                f"{sizes[False][0]}×{sizes[False][1]} (FLOOR)")
        p.add("round_mode", Enum("FLOOR"))
    layer = cx.add("Pooling", op, [op.inputs[0]], [op.outputs[0]],
                   Message().add("pooling_param", p))
    if got != sizes[True]:
        cx.note_floor(layer.name, (h, w), got, sizes[True])


@converts("FC")
def inner_product(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """InnerProduct; a transposed weight (Caffe's transpose: true) and a zero bias that the
    net fills itself (bias_term: false) fold back into the layer."""
    if op.args.get("axis_w", 1) != 1:
        raise Inexpressible("axis_w other than 1 has no InnerProduct field")
    n = int(s.inputs[1].shape[0])
    p = Message().add("num_output", n)
    no_bias = op.inputs[2] in cx.zero_biases
    if no_bias:
        p.add("bias_term", False)
    weight = cx.transposed.get(op.inputs[1])
    if weight is not None:
        p.add("transpose", True)
    weight = weight or op.inputs[1]
    axis = int(op.args.get("axis", 1))
    if axis != 1:
        p.add("axis", axis)
    cx.filler(p, "weight_filler", weight)
    params = [cx.param(weight)]
    if not no_bias:
        cx.filler(p, "bias_filler", op.inputs[2])
        params.append(cx.param(op.inputs[2]))
    cx.add("InnerProduct", op, [op.inputs[0]], [op.outputs[0]],
           Message().add("inner_product_param", p), params)


# Normalization, scale and bias -----------------------------------------------------------
@converts("LRN")
def lrn(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """LRN (the scale output training keeps is netrun's own)."""
    _nchw(op)
    a = op.args
    p = Message().add("local_size", int(a.get("size", 5))).add("alpha", float(a.get("alpha", 1e-4)))
    p.add("beta", float(a.get("beta", 0.75)))
    bias = float(a.get("bias", 1.0))
    if a.get("norm_region", "ACROSS_CHANNELS") == "WITHIN_CHANNEL":
        if bias != 1.0:
            raise Inexpressible("Caffe's WITHIN_CHANNEL LRN has no k (bias); it must be 1")
        p.add("norm_region", Enum("WITHIN_CHANNEL"))
    else:
        _maybe(p, "k", bias, 1.0)
    cx.add("LRN", op, [op.inputs[0]], [op.outputs[0]], Message().add("lrn_param", p))


@converts("SpatialBN")
def spatial_bn(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """BatchNorm (the running mean and variance, factor 1) + Scale with bias (γ, β)."""
    _nchw(op)
    x, scale, bias, mean, var = op.inputs
    p = Message()
    _maybe(p, "moving_average_fraction", float(op.args.get("momentum", 0.9)), 0.999)
    _maybe(p, "eps", float(op.args.get("epsilon", 1e-5)), 1e-5)
    y = op.outputs[0]
    stats = [cx.param(mean, statistic=True), cx.param(var, statistic=True),
             ParamRef(None, 1.0, statistic=True)]
    layer = cx.add("BatchNorm", op, [x], [y], Message().add("batch_norm_param", p), stats,
                   global_stats=bool(op.args.get("is_test", 0)))
    cx.note_moving_average(layer.name)
    q = Message().add("bias_term", True)
    cx.filler(q, "filler", scale)
    cx.filler(q, "bias_filler", bias)
    cx.add("Scale", op, [y], [y], Message().add("scale_param", q),
           [cx.param(scale), cx.param(bias)], name=f"{layer.name}_scale")


@converts("CaffeBatchNorm")
def caffe_batch_norm(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """BatchNorm over Caffe's own three statistics blobs."""
    p = Message()
    _maybe(p, "moving_average_fraction", float(op.args.get("moving_average_fraction", 0.999)),
           0.999)
    _maybe(p, "eps", float(op.args.get("epsilon", 1e-5)), 1e-5)
    cx.add("BatchNorm", op, [op.inputs[0]], [op.outputs[0]],
           Message().add("batch_norm_param", p),
           [cx.param(b, statistic=True) for b in op.inputs[1:4]],
           global_stats=bool(op.args.get("is_test", 0)))


def _broadcast_axis(op: OperatorDef, s: OpShapes) -> int:
    """Where B's dims start in A (Caffe's Scale/Bias axis), for either broadcasting rule."""
    a, b = tuple(s.inputs[0].shape), tuple(s.inputs[1].shape)
    if tuple(s.outputs[0].shape) != a:
        raise Inexpressible("B broadcasts A to a bigger shape; Caffe's Scale/Bias keep A's")
    if op.args.get("broadcast", 0):
        axis = int(op.args.get("axis", -1))
        axis = len(a) - len(b) if axis == -1 else _axis(axis, len(a))
    else:   # NumPy's rule: leading 1s of B are no dims at all (the caffemodel drops them too)
        while b and b[0] == 1:
            b = b[1:]
        axis = len(a) - len(b)
    if a[axis:axis + len(b)] != b:
        raise Inexpressible(f"B of shape {list(b)} matches no run of A's dims {list(a)}")
    return axis


def _elementwise(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> bool:
    """Eltwise for two activations of one shape; False when the op broadcasts instead."""
    if s.inputs[0].shape != s.inputs[1].shape or any(cx.is_param(b) for b in op.inputs):
        return False
    kind = {"Add": None, "Mul": "PROD"}[op.type]
    body = Message()
    if kind:
        body.add("eltwise_param", Message().add("operation", Enum(kind)))
    cx.add("Eltwise", op, list(op.inputs), [op.outputs[0]], body)
    return True


def _broadcast_layer(cx: "PhaseWriter", op: OperatorDef, s: OpShapes,
                     verb: str) -> tuple[int, bool, Message]:
    """(axis, whether the second operand is learned, the Scale/Bias parameter message with
    its axes and filler) of a broadcast Mul or Add onto its first operand."""
    if cx.is_param(op.inputs[0]):
        raise Inexpressible(f"a learned first operand; Caffe's {verb} its first bottom")
    axis = _broadcast_axis(op, s)
    learned = cx.is_param(op.inputs[1])
    p = Message()
    _axes_fields(p, axis, s.inputs[1].shape, learned)
    if learned:
        cx.filler(p, "filler", op.inputs[1])
    return axis, learned, p


def _axes_fields(msg: Message, axis: int, shape, learned: bool) -> None:
    _maybe(msg, "axis", axis, 1)
    if learned:   # with a second bottom, its shape says how many axes
        _maybe(msg, "num_axes", len(shape), 1)


@converts("Mul")
def mul(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Eltwise PROD, or Scale (γ learned or a second bottom); an Add of a learned β right
    after, on the product alone, becomes the Scale's bias."""
    if _elementwise(cx, op, s):
        return
    axis, learned, p = _broadcast_layer(cx, op, s, "Scale scales")
    params = [cx.param(op.inputs[1])] if learned else []
    bottoms = [op.inputs[0]] + ([] if learned else [op.inputs[1]])
    top = op.outputs[0]
    add = cx.sole_reader(op, top)
    if add is not None and add[1].type == "Add" and add[1].inputs[0] == top \
            and cx.is_param(add[1].inputs[1]) and cx.untouched(add[1].outputs[0], add[0]):
        j, bias_op = add
        try:
            same = _broadcast_axis(bias_op, cx.shapes_of(j)) == axis and \
                cx.shapes_of(j).inputs[1].shape == s.inputs[1].shape
        except Inexpressible:
            same = False
        if same:
            cx.claim(j)
            p.add("bias_term", True)
            cx.filler(p, "bias_filler", bias_op.inputs[1])
            params.append(cx.param(bias_op.inputs[1]))
            top = bias_op.outputs[0]
    cx.add("Scale", op, bottoms, [top], Message().add("scale_param", p), params)


@converts("Add")
def add(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Eltwise SUM, or Bias (β learned or a second bottom)."""
    if _elementwise(cx, op, s):
        return
    _, learned, p = _broadcast_layer(cx, op, s, "Bias adds to")
    cx.add("Bias", op, [op.inputs[0]] + ([] if learned else [op.inputs[1]]), [op.outputs[0]],
           Message().add("bias_param", p), [cx.param(op.inputs[1])] if learned else [])


@converts("Sum", "Max")
def eltwise(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Eltwise SUM or MAX over two or more bottoms (one bottom: an identity Power)."""
    if len(op.inputs) == 1:
        cx.add("Power", op, [op.inputs[0]], [op.outputs[0]], Message())
        return
    p = Message()
    bottoms, coeffs = (list(op.inputs), None) if op.type == "Max" else cx.eltwise_terms(op)
    if op.type == "Max":
        p.add("operation", Enum("MAX"))
    for c in coeffs or []:
        p.add("coeff", c)
    cx.add("Eltwise", op, bottoms, [op.outputs[0]], Message().add("eltwise_param", p))


# Pointwise ------------------------------------------------------------------------------
_UNARY = {"Relu": "ReLU", "Sigmoid": "Sigmoid", "Tanh": "TanH", "Abs": "AbsVal",
          "Softplus": "BNLL", "Exp": "Exp", "Log": "Log"}


@converts(*_UNARY)
def unary(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Parameterless pointwise layers (in place where the net is)."""
    cx.add(_UNARY[op.type], op, [op.inputs[0]], [op.outputs[0]], Message())


@converts("LeakyRelu")
def leaky_relu(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """ReLU with negative_slope."""
    p = Message().add("negative_slope", float(op.args.get("alpha", 0.01)))
    cx.add("ReLU", op, [op.inputs[0]], [op.outputs[0]], Message().add("relu_param", p))


@converts("Elu")
def elu(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """ELU (alpha)."""
    p = Message()
    _maybe(p, "alpha", float(op.args.get("alpha", 1.0)), 1.0)
    cx.add("ELU", op, [op.inputs[0]], [op.outputs[0]], Message().add("elu_param", p) if p else
           Message())


@converts("PRelu")
def prelu(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """PReLU: one learned slope per channel, or one shared."""
    _nchw(op)
    p = Message()
    if _count(s.inputs[1].shape) == 1 and s.inputs[0].shape[1] != 1:
        p.add("channel_shared", True)
    cx.filler(p, "filler", op.inputs[1])
    cx.add("PReLU", op, [op.inputs[0]], [op.outputs[0]],
           Message().add("prelu_param", p) if p else Message(), [cx.param(op.inputs[1])])


@converts("Power", "Scale")
def power(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Power: (shift + scale·x)^power; netrun's Scale op is its power-1 case."""
    p = Message()
    _maybe(p, "power", float(op.args.get("power", 1.0)), 1.0)
    _maybe(p, "scale", float(op.args.get("scale", 1.0)), 1.0)
    _maybe(p, "shift", float(op.args.get("shift", 0.0)), 0.0)
    cx.add("Power", op, [op.inputs[0]], [op.outputs[0]],
           Message().add("power_param", p) if p else Message())


@converts("Dropout")
def dropout(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Dropout; Caffe's phase says whether it drops, so a test-mode dropout in the training
    net is left out (it is the identity there)."""
    test_mode = bool(op.args.get("is_test", 0))
    if cx.phase == "TRAIN" and test_mode:
        cx.alias(op.outputs[0], op.inputs[0])
        return
    if cx.phase == "TEST" and not test_mode:
        raise Inexpressible("a dropout that drops in testing; Caffe's drops only in TRAIN")
    p = Message().add("dropout_ratio", float(op.args.get("ratio", 0.5)))
    cx.add("Dropout", op, [op.inputs[0]], [op.outputs[0]], Message().add("dropout_param", p))


# Shapes ----------------------------------------------------------------------------------
@converts("Softmax")
def softmax(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Softmax over one axis (netrun's spans every dim from `axis` on: they must be 1)."""
    shape = s.inputs[0].shape
    axis = _axis(int(op.args.get("axis", 1)), len(shape))
    if _count(shape[axis + 1:]) != 1:
        raise Inexpressible(f"netrun normalizes over dims {axis}.. of {list(shape)} together, "
                            f"Caffe's Softmax over dim {axis} alone")
    p = Message()
    _maybe(p, "axis", axis, 1)
    cx.add("Softmax", op, [op.inputs[0]], [op.outputs[0]],
           Message().add("softmax_param", p) if p else Message())


@converts("Concat")
def concat(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Concat along `axis` (netrun's second output, the split sizes, is its own)."""
    if op.args.get("add_axis", 0):
        raise Inexpressible("add_axis=1 has no Concat field")
    p = Message()
    _maybe(p, "axis", int(op.args.get("axis", 1)), 1)
    cx.add("Concat", op, list(op.inputs), [op.outputs[0]],
           Message().add("concat_param", p) if p else Message())


@converts("Split")
def split(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Slice at the running sums of `split` along `axis` (equal parts without it)."""
    if len(op.inputs) != 1:
        raise Inexpressible("split sizes read from a blob")
    shape = s.inputs[0].shape
    axis = _axis(int(op.args.get("axis", 1)), len(shape))
    p = Message()
    _maybe(p, "axis", axis, 1)
    sizes = op.args.get("split") or []
    for k in range(1, len(sizes)):
        p.add("slice_point", int(sum(sizes[:k])))
    cx.add("Slice", op, [op.inputs[0]], list(op.outputs),
           Message().add("slice_param", p) if p else Message())


@converts("Flatten")
def flatten(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Flatten to N × the rest."""
    if int(op.args.get("axis", 1)) != 1:
        raise Inexpressible("netrun's Flatten at an axis other than 1 gives a 2-D blob, "
                            "Caffe's keeps the leading dims")
    cx.add("Flatten", op, [op.inputs[0]], [op.outputs[0]], Message())


@converts("Reshape")
def reshape(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Reshape (0 copies a dim, -1 infers one, in both)."""
    if len(op.inputs) != 1:
        raise Inexpressible("a shape read from a blob")
    dims = Message()
    for d in op.args.get("shape") or []:
        dims.add("dim", int(d))
    cx.add("Reshape", op, [op.inputs[0]], [op.outputs[0]],
           Message().add("reshape_param", Message().add("shape", dims)))


# Loss and accuracy -----------------------------------------------------------------------
@converts("SoftmaxWithLoss")
def softmax_with_loss(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """SoftmaxWithLoss (tops: the loss, then the probabilities if anything reads them)."""
    if len(op.inputs) > 2:
        raise Inexpressible("per-example weights (a third input)")
    prob, loss = op.outputs
    body = Message()
    axis = _axis(int(op.args.get("axis", 1)), len(s.inputs[0].shape))
    if axis != 1:
        body.add("softmax_param", Message().add("axis", axis))
    if "ignore_label" in op.args:
        body.add("loss_param", Message().add("ignore_label", int(op.args["ignore_label"])))
    tops = [loss] + ([prob] if cx.is_read(op, prob) else [])
    cx.add("SoftmaxWithLoss", op, list(op.inputs), tops, body,
           loss_scale=float(op.args.get("scale", 1.0)))


@converts("Accuracy")
def accuracy(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """Accuracy (top_k, ignore_label)."""
    p = Message()
    _maybe(p, "top_k", int(op.args.get("top_k", 1)), 1)
    if "ignore_label" in op.args:
        p.add("ignore_label", int(op.args["ignore_label"]))
    cx.add("Accuracy", op, list(op.inputs), [op.outputs[0]],
           Message().add("accuracy_param", p) if p else Message())


@converts("StopGradient")
def stop_gradient(cx: "PhaseWriter", op: OperatorDef, s: OpShapes) -> None:
    """No layer: the readers of its output read its input with propagate_down: false."""
    cx.alias(op.outputs[0], op.inputs[0], stop=True)


# Fillers --------------------------------------------------------------------------------
def filler_message(fill: OperatorDef) -> Message | None:
    """A Caffe FillerParameter for a netrun fill op, or None when Caffe has no such filler."""
    a = fill.args
    kind = {"ConstantFill": "constant", "GaussianFill": "gaussian", "UniformFill": "uniform",
            "XavierFill": "xavier", "MSRAFill": "msra", "SparseGaussianFill": "gaussian",
            "BilinearFill": "bilinear", "PositiveUnitballFill": "positive_unitball"
            }.get(fill.type)
    if kind is None or fill.inputs:
        return None
    msg = Message().add("type", kind)
    if fill.type == "ConstantFill":
        value = a.get("value", 0.0)
        if not isinstance(value, (int, float)):
            return None
        _maybe(msg, "value", float(value), 0.0)
    elif kind == "gaussian":
        _maybe(msg, "mean", float(a.get("mean", 0.0)), 0.0)
        msg.add("std", float(a.get("std", 1.0)))
        if fill.type == "SparseGaussianFill":
            msg.add("sparse", int(a.get("sparse", -1)))
    elif kind == "uniform":
        msg.add("min", float(a.get("min", 0.0))).add("max", float(a.get("max", 1.0)))
    elif kind in ("xavier", "msra") and a.get("variance_norm", "FAN_IN") != "FAN_IN":
        msg.add("variance_norm", Enum(str(a["variance_norm"])))
    return msg
