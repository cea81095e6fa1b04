"""Per-node converters from ONNX operators to netrun operators (the inverse of
netrun.export.onnx_ops).

Each converter reads its inputs through the Graph (activations, or load-time values that
become parameters), checks every attribute it is given, and emits netrun ops; whatever netrun
cannot honour raises Unsupported with the reason. Ops whose gradient needs more than their
inference form (Dropout's mask, LRN's scale, Concat's sizes, BatchNorm's batch statistics)
get a training-mode twin in the train net, as the layer builder makes them.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from netrun.model.onnx_fold import squeeze_axes
from netrun.model.onnx_graph import Graph, Node, Unsupported

# Ops of one input and no attributes, called the same in ONNX and in netrun.
_PLAIN = ("Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Softplus")


def _layer(node: Node) -> str:
    return node.name or f"{node.op_type}_{node.index}"


def _two(node: Node, key: str, value, what: str) -> list[int]:
    values = list(value)
    if len(values) != 2:
        raise Unsupported(f"{what} has {len(values)} spatial dims in '{key}'; netrun's "
                          f"convolution and pooling are 2-D")
    return [int(v) for v in values]


def _spatial_input(cx: Graph, name: str, what: str) -> tuple[str, tuple[int, ...], list[int]]:
    """(blob, N×C×H×W shape as the node sees it, pads a folded zero Pad adds [t, l, b, r])."""
    if name in cx.folded_pads:
        blob, extra = cx.folded_pads[name]
        n, c, h, w = cx.shape(blob)
        return blob, (n, c, h + extra[0] + extra[2], w + extra[1] + extra[3]), list(extra)
    blob = cx.data(name)
    shape = cx.shape(blob)
    if len(shape) != 4:
        raise Unsupported(f"input is {len(shape)}-D; netrun's {what} is 2-D (N×C×H×W)")
    return blob, shape, [0, 0, 0, 0]


def _pads(node: Node, hw: tuple[int, int], kernel: list[int], strides: list[int],
          dilations: list[int]) -> list[int]:
    """Explicit pads [t, l, b, r] from `pads` or `auto_pad` (ONNX's order for 2-D is the same:
    begin of H, begin of W, end of H, end of W)."""
    auto = node.attr("auto_pad", "NOTSET")
    pads = node.attr("pads")
    if auto in ("NOTSET", ""):
        pads = [0, 0, 0, 0] if pads is None else [int(p) for p in pads]
        if len(pads) != 4:
            raise Unsupported(f"'pads' has {len(pads)} values; netrun's windows are 2-D")
        if min(pads) < 0:
            raise Unsupported(f"negative pads {pads} (cropping) are not supported")
        return pads
    if auto == "VALID":
        return [0, 0, 0, 0]
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad '{auto}' is not an ONNX padding mode")
    head, tail = [], []
    for size, k, s, d in zip(hw, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        head.append(small if auto == "SAME_UPPER" else big)
        tail.append(big if auto == "SAME_UPPER" else small)
    return [head[0], head[1], tail[0], tail[1]]


def _weight(cx: Graph, name: str, role: str, layer: str) -> str:
    """A weight or bias: a parameter when the file holds it, else a computed tensor."""
    return cx.param(name, role, layer) if cx.const(name) is not None else cx.data(name)


# Convolution --------------------------------------------------------------------------------
def conv(cx: Graph, node: Node) -> None:
    """Conv: 2-D, any group, dilation, strides, pads or auto_pad (a zero Pad folded in)."""
    x, shape, extra = _spatial_input(cx, node.inputs[0], "Conv")
    w_shape = cx.value_shape(node.inputs[1])
    kernel = _two(node, "kernel_shape", node.attr("kernel_shape", w_shape[2:]), "Conv")
    strides = _two(node, "strides", node.attr("strides", [1, 1]), "Conv")
    dilations = _two(node, "dilations", node.attr("dilations", [1, 1]), "Conv")
    if list(w_shape[2:]) != kernel:
        raise Unsupported(f"kernel_shape {kernel} differs from the weight's {list(w_shape[2:])}")
    pads = [p + e for p, e in zip(_pads(node, shape[2:], kernel, strides, dilations), extra)]
    layer = _layer(node)
    ins = [x, _weight(cx, node.inputs[1], "weight", layer)]
    if node.input(2):
        ins.append(_weight(cx, node.inputs[2], "bias", layer))
    cx.emit(node, "Conv", ins, [cx.out(node)], kernels=kernel, strides=strides, pads=pads,
            dilations=dilations, group=int(node.attr("group", 1)))


def conv_transpose(cx: Graph, node: Node) -> None:
    """ConvTranspose: 2-D, with output_padding; output_shape/SAME when the padding is even."""
    x, shape, extra = _spatial_input(cx, node.inputs[0], "ConvTranspose")
    if any(extra):
        raise Unsupported("a Pad before a ConvTranspose does not fold into it")
    w_shape = cx.value_shape(node.inputs[1])
    kernel = _two(node, "kernel_shape", node.attr("kernel_shape", w_shape[2:]), "ConvTranspose")
    strides = _two(node, "strides", node.attr("strides", [1, 1]), "ConvTranspose")
    dilations = _two(node, "dilations", node.attr("dilations", [1, 1]), "ConvTranspose")
    adj = _two(node, "output_padding", node.attr("output_padding", [0, 0]), "ConvTranspose")
    auto = node.attr("auto_pad", "NOTSET")
    wanted = node.attr("output_shape")
    if wanted is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if wanted is None:
            wanted = [size * s for size, s in zip(shape[2:], strides)]
        wanted = list(wanted)[-2:]
        pads_h, pads_w = [], []
        for size, k, s, d, a, out, side in zip(shape[2:], kernel, strides, dilations, adj,
                                                 wanted, (pads_h, pads_w)):
            total = s * (size - 1) + a + (k - 1) * d + 1 - out
            if total < 0 or total % 2:
                # ONNX and ONNX Runtime put an odd padding's extra row on different sides
                raise Unsupported(f"output_shape/auto_pad needs a total padding of {total} "
                                  f"per axis; netrun takes only even, non-negative ones")
            side.append(total // 2)
        pads = [pads_h[0], pads_w[0], pads_h[0], pads_w[0]]
        node.attr("pads")
    else:
        pads = _pads(node, shape[2:], kernel, strides, dilations)
    layer = _layer(node)
    ins = [x, _weight(cx, node.inputs[1], "weight", layer)]
    if node.input(2):
        ins.append(_weight(cx, node.inputs[2], "bias", layer))
    cx.emit(node, "ConvTranspose", ins, [cx.out(node)], kernels=kernel, strides=strides,
            pads=pads, dilations=dilations, adjs=adj, group=int(node.attr("group", 1)))


# Pooling ------------------------------------------------------------------------------------
def _ceil_out(size: int, k: int, s: int, head: int, tail: int) -> int:
    """ONNX Runtime's ceil-mode output size: the last window must start inside the input or
    its head padding (Caffe's and PyTorch's rule too)."""
    out = -(-(size + head + tail - k) // s) + 1
    if (out - 1) * s >= size + head:
        out -= 1
    return out


def _pool(kind: str):
    def convert(cx: Graph, node: Node) -> None:
        """Convert one node."""
        if kind == "Max" and cx.used(node, 1):
            raise Unsupported("the Indices output is not supported")
        if node.attr("storage_order", 0):
            raise Unsupported("storage_order=1 (column-major indices) is not supported")
        x, shape, extra = _spatial_input(cx, node.inputs[0], f"{kind}Pool")
        what = f"{kind}Pool"
        kernel = _two(node, "kernel_shape", node.attr("kernel_shape", []), what)
        strides = _two(node, "strides", node.attr("strides", [1, 1]), what)
        dilations = _two(node, "dilations", node.attr("dilations", [1, 1]), what)
        if dilations != [1, 1]:
            raise Unsupported(f"dilated pooling (dilations {dilations}) is not supported")
        pads = [p + e for p, e in zip(_pads(node, shape[2:], kernel, strides, dilations), extra)]
        counted = int(node.attr("count_include_pad", 0)) if kind == "Average" else 0
        args: dict = {"kernels": kernel, "strides": strides}
        if node.attr("ceil_mode", 0):
            h, w = shape[2] - extra[0] - extra[2], shape[3] - extra[1] - extra[3]
            grow = []
            for size, k, s, head, tail in ((h, kernel[0], strides[0], pads[0], pads[2]),
                                           (w, kernel[1], strides[1], pads[1], pads[3])):
                # the least tail padding that makes room for the ceil-mode windows
                out = _ceil_out(size, k, s, head, tail)
                grow.append(max(0, (out - 1) * s + k - size - head - tail))
            if any(grow):
                if pads[:2] == pads[2:]:
                    # ONNX's ceil mode with symmetric pads is Caffe's ceil-mode pooling, the
                    # divisor of count_include_pad=1 included (the overhang never counts).
                    args["legacy_pad"] = "CAFFE_LEGACY_POOLING"
                elif counted:
                    raise Unsupported("ceil_mode=1 with asymmetric pads and count_include_pad=1 "
                                      "is not supported")
                else:
                    pads = [pads[0], pads[1], pads[2] + grow[0], pads[3] + grow[1]]
        args["pads"] = pads
        if kind == "Average":
            args["count_include_pad"] = counted
        cx.emit(node, f"{kind}Pool", [x], [cx.out(node)], **args)
    return convert


def _global_pool(kind: str):
    def convert(cx: Graph, node: Node) -> None:
        """Convert one node."""
        x, _, extra = _spatial_input(cx, node.inputs[0], f"Global{kind}Pool")
        if any(extra):
            raise Unsupported("a Pad before a global pooling does not fold into it")
        cx.emit(node, f"{kind}Pool", [x], [cx.out(node)], global_pooling=1)
    return convert


def pad(cx: Graph, node: Node) -> None:
    """Zero padding of H and W folds into the convolutions and pooling that read it (their
    pads count as zeros); anything else runs as a Pad op."""
    mode = node.attr("mode", "constant")
    if mode != "constant":
        raise Unsupported(f"mode '{mode}' is not supported (constant only)")
    x = cx.data(node.inputs[0])
    rank = len(cx.shape(x))
    if cx.opset < 11:
        pads, value = list(node.attr("pads")), float(node.attr("value", 0.0))
    else:
        pads = cx.const_array(node.input(1), "the pads").astype(np.int64).tolist()
        value = float(cx.const_array(node.input(2), "the pad value").reshape(-1)[0]) \
            if node.input(2) else 0.0
        if node.input(3):
            axes = [a + rank if a < 0 else a for a in
                    cx.const_array(node.input(3), "the axes").tolist()]
            full = [0] * (2 * rank)
            for k, a in enumerate(axes):
                full[a], full[rank + a] = pads[k], pads[len(axes) + k]
            pads = full
    if len(pads) != 2 * rank:
        raise Unsupported(f"has {len(pads)} pads for a {rank}-D input")
    if min(pads) < 0:
        raise Unsupported(f"negative pads {pads} (cropping) are not supported")
    if not any(pads):
        cx.alias(node, x)
        return
    spatial_only = rank == 4 and not any(pads[i] for i in (0, 1, 4, 5))
    if value == 0.0 and spatial_only and _folds(cx, node):
        cx.folded_pads[node.outputs[0]] = (x, (pads[2], pads[3], pads[6], pads[7]))
        return
    cx.emit(node, "Pad", [x], [cx.out(node)], pads=pads, value=value)


def _folds(cx: Graph, node: Node) -> bool:
    """Whether every reader of the Pad's output counts the padding as zeros in its window."""
    out = node.outputs[0]
    if out in cx.graph_outputs:
        return False
    for reader in cx.consumers.get(out, []):
        if reader.inputs[0] != out or out in reader.inputs[1:]:
            return False
        if reader.op_type == "Conv":
            continue
        if reader.op_type == "AveragePool" and reader.attrs.get("count_include_pad", 0) \
                and not reader.attrs.get("ceil_mode", 0):
            continue
        return False
    return True


# Normalization ------------------------------------------------------------------------------
def batch_norm(cx: Graph, node: Node) -> None:
    """BatchNormalization: SpatialBN, its mean and variance the running statistics."""
    if node.attr("training_mode", 0):
        raise Unsupported("training_mode=1 (batch statistics at inference) is not supported")
    if not node.attr("spatial", 1):
        raise Unsupported("spatial=0 (statistics per element) is not supported")
    node.attr("is_test")
    node.attr("consumed_inputs")
    if any(cx.used(node, i) for i in range(1, len(node.outputs))):
        raise Unsupported("the running-statistics outputs are not supported")
    x = cx.data(node.inputs[0])
    names = node.inputs[1:5]
    missing = [n for n in names if cx.const(n) is None]
    if missing:
        cx.check(missing[0])
        raise Unsupported(f"'{missing[0]}' is computed at run time; netrun's BatchNorm takes "
                          f"its scale, bias and statistics from initializers")
    layer = _layer(node)
    scale, bias = cx.param(names[0], "scale", layer), cx.param(names[1], "bias", layer)
    mean = cx.param(names[2], "running_mean", layer, trainable=False)
    var = cx.param(names[3], "running_var", layer, trainable=False)
    y = cx.out(node)
    args = {"epsilon": float(node.attr("epsilon", 1e-5)),
            "momentum": float(node.attr("momentum", 0.9))}
    cx.emit(node, "SpatialBN", [x, scale, bias, mean, var], [y],
            train_outputs=[y, mean, var, cx.tmp(node, "saved_mean"),
                           cx.tmp(node, "saved_inv_std")],
            train_args={"is_test": 0}, is_test=1, **args)


def lrn(cx: Graph, node: Node) -> None:
    """LRN across channels."""
    x = cx.data(node.inputs[0])
    y = cx.out(node)
    cx.emit(node, "LRN", [x], [y], train_outputs=[y, cx.tmp(node, "scale")],
            size=int(node.attr("size")), alpha=float(node.attr("alpha", 1e-4)),
            beta=float(node.attr("beta", 0.75)), bias=float(node.attr("bias", 1.0)))


# Matrix products ----------------------------------------------------------------------------
def _chain(cx: Graph, node: Node, steps: list[tuple]) -> None:
    """Emit ops one after another, each reading the previous one's output; the last writes
    the node's output. A step is (type, [extra inputs], args)."""
    current = steps[0][1][0]
    for k, (type_, ins, args) in enumerate(steps):
        last = k == len(steps) - 1
        out = cx.out(node) if last else cx.tmp(node, type_.lower())
        inputs = ins if k == 0 else [current, *ins]
        cx.emit(node, type_, inputs, [out], **args)
        current = out


def gemm(cx: Graph, node: Node) -> None:
    """Gemm: FC when B is an initializer (transposed, scaled by alpha, C as the bias)."""
    a, b, c = node.input(0), node.input(1), node.input(2)
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    trans_a, trans_b = int(node.attr("transA", 0)), int(node.attr("transB", 0))
    node.attr("broadcast")          # before opset 7; C broadcasts as NumPy does either way
    layer = _layer(node)
    weight = cx.const(b)
    if weight is None or cx.const(a) is not None:
        _product(cx, node, cx.operand(a), cx.operand(b), trans_a, trans_b, alpha, beta, c)
        return
    if weight.value.ndim != 2:
        raise Unsupported(f"B is {weight.value.ndim}-D; Gemm's operands are matrices")
    x = cx.data(a)
    w = weight.value if trans_b else weight.value.T     # FC's weight is N×K
    changed = not trans_b or alpha != 1.0
    w_blob = cx.param(b, "weight", layer, form="fc" if changed else "",
                      value=alpha * w if changed else None)
    n = w.shape[0]
    steps: list[tuple] = []
    if trans_a:
        steps.append(("Transpose", [x], {"axes": [1, 0]}))
    bias, add_after = None, None
    if c is not None and beta != 0.0:
        v = cx.const(c).value if cx.const(c) is not None else None
        # C as FC's bias: one value per output (N, 1×N) or one for all; an M×N C is added
        if v is not None and (v.size == 1 or (v.size == n and v.shape[-1] == n)):
            value = np.broadcast_to(beta * v.reshape(-1), (n,))
            plain = beta == 1.0 and v.shape == (n,)
            bias = cx.param(c, "bias", layer, form="" if plain else "fc",
                            value=None if plain else value)
        else:
            add_after = c
    if bias is None:
        bias = cx.new_param(f"{layer}_zero_bias", np.zeros(n, np.float32), "bias", layer,
                            trainable=False)
    fc_inputs = [w_blob, bias] if steps else [x, w_blob, bias]
    steps.append(("FC", fc_inputs, {}))
    if add_after is not None:
        steps.append(_scaled_addend(cx, node, add_after, beta))
    _chain(cx, node, steps)


def _scaled_addend(cx: Graph, node: Node, c: str, beta: float) -> tuple:
    if beta == 1.0:
        return ("Add", [cx.operand(c)], {})
    if cx.const(c) is not None:
        return ("Add", [cx.param(c, "bias", _layer(node), form="beta",
                                 value=beta * cx.const(c).value)], {})
    scaled = cx.tmp(node, "c")
    cx.emit(node, "Scale", [cx.data(c)], [scaled], scale=beta)
    return ("Add", [scaled], {})


def _product(cx: Graph, node: Node, a: str, b: str, trans_a: int, trans_b: int,
             alpha: float, beta: float, c: str | None) -> None:
    ranks = len(cx.shape(a)), len(cx.shape(b))
    if min(ranks) < 2:
        raise Unsupported(f"operands of ranks {ranks}; netrun multiplies matrices (rank >= 2)")
    kind = "MatMul" if ranks == (2, 2) else "BatchMatMul"
    steps: list[tuple] = [(kind, [a, b], {"trans_a": trans_a, "trans_b": trans_b})]
    if alpha != 1.0:
        steps.append(("Scale", [], {"scale": alpha}))
    if c is not None and beta != 0.0:
        steps.append(_scaled_addend(cx, node, c, beta))
    _chain(cx, node, steps)


def matmul(cx: Graph, node: Node) -> None:
    """MatMul: FC over the last axis when B is a 2-D initializer, else (Batch)MatMul."""
    a, b = node.inputs[0], node.inputs[1]
    weight = cx.const(b)
    if weight is None or cx.const(a) is not None or weight.value.ndim != 2:
        _product(cx, node, cx.operand(a), cx.operand(b), 0, 0, 1.0, 0.0, None)
        return
    x = cx.data(a)
    rank = len(cx.shape(x))
    if rank < 2:
        raise Unsupported("A is 1-D; netrun multiplies matrices (rank >= 2)")
    layer = _layer(node)
    # X·B is FC over the last axis with W = Bᵀ (N×K); the leading dims stay.
    w = cx.param(b, "weight", layer, form="t", value=weight.value.T)
    zero = cx.new_param(f"{layer}_zero_bias", np.zeros(weight.value.shape[1], np.float32),
                        "bias", layer, trainable=False)
    cx.emit(node, "FC", [x, w, zero], [cx.out(node)], axis=rank - 1)


# Elementwise --------------------------------------------------------------------------------
def _binary(type_: str):
    def convert(cx: Graph, node: Node) -> None:
        """Convert one node."""
        a, b = node.inputs[0], node.inputs[1]
        cx.emit(node, type_, [cx.operand(a), cx.operand(b)], [cx.out(node)])
    return convert


def sum_(cx: Graph, node: Node) -> None:
    """Sum: netrun's Sum for equal shapes, a chain of broadcasting Adds otherwise."""
    names = [n for n in node.inputs if n]
    blobs = [cx.operand(n) for n in names]
    if len(blobs) == 1:
        cx.alias(node, blobs[0])
        return
    if len({cx.shape(b) for b in blobs}) == 1:
        cx.emit(node, "Sum", blobs, [cx.out(node)])
        return
    _chain(cx, node, [("Add", blobs[:2], {})] + [("Add", [b], {}) for b in blobs[2:]])


def _unary(type_: str):
    def convert(cx: Graph, node: Node) -> None:
        """Convert one node."""
        cx.emit(node, type_, [cx.data(node.inputs[0])], [cx.out(node)])
    return convert


def leaky_relu(cx: Graph, node: Node) -> None:
    """LeakyRelu."""
    cx.emit(node, "LeakyRelu", [cx.data(node.inputs[0])], [cx.out(node)],
            alpha=float(node.attr("alpha", 0.01)))


def elu(cx: Graph, node: Node) -> None:
    """Elu."""
    cx.emit(node, "Elu", [cx.data(node.inputs[0])], [cx.out(node)],
            alpha=float(node.attr("alpha", 1.0)))


def hard_sigmoid(cx: Graph, node: Node) -> None:
    """HardSigmoid."""
    cx.emit(node, "HardSigmoid", [cx.data(node.inputs[0])], [cx.out(node)],
            alpha=float(node.attr("alpha", 0.2)), beta=float(node.attr("beta", 0.5)))


def neg(cx: Graph, node: Node) -> None:
    """Neg: Scale by -1."""
    cx.emit(node, "Scale", [cx.data(node.inputs[0])], [cx.out(node)], scale=-1.0)


def pow_(cx: Graph, node: Node) -> None:
    """Pow with a scalar exponent: Power."""
    exponent = cx.const_array(node.input(1), "the exponent")
    if exponent.size != 1:
        raise Unsupported("a tensor exponent is not supported (a scalar one is)")
    cx.emit(node, "Power", [cx.data(node.inputs[0])], [cx.out(node)],
            power=float(exponent.reshape(-1)[0]))


def prelu(cx: Graph, node: Node) -> None:
    """PRelu with one slope per channel or one for all."""
    x = cx.data(node.inputs[0])
    rank = len(cx.shape(x))
    slope = cx.const(node.inputs[1])
    if slope is None:
        cx.check(node.inputs[1])
        raise Unsupported("the slope is computed at run time; netrun's PRelu takes it from "
                          "an initializer")
    s = slope.value
    if s.size != 1 and not (s.ndim == rank - 1 and all(d == 1 for d in s.shape[1:])) \
            and not (s.ndim == 1 and rank == 2):
        raise Unsupported(f"slope of shape {list(s.shape)}; netrun's PRelu takes one slope "
                          f"per channel (axis 1) or a single one")
    w = cx.param(node.inputs[1], "weight", _layer(node), form="" if s.ndim == 1 else "c",
                 value=None if s.ndim == 1 else s.reshape(-1))
    cx.emit(node, "PRelu", [x, w], [cx.out(node)])


def clip(cx: Graph, node: Node) -> None:
    """Clip: bounds from attributes (before opset 11) or load-time inputs."""
    x = cx.data(node.inputs[0])
    bounds = {}
    if cx.opset < 11:
        for key in ("min", "max"):
            if key in node.attrs:
                bounds[key] = float(node.attr(key))
    else:
        for key, i in (("min", 1), ("max", 2)):
            if node.input(i):
                bounds[key] = float(cx.const_array(node.input(i), f"Clip's {key}").reshape(-1)[0])
    cx.emit(node, "Clip", [x], [cx.out(node)], **bounds)


def _softmax(type_: str):
    def convert(cx: Graph, node: Node) -> None:
        """Convert one node."""
        x = cx.data(node.inputs[0])
        shape = cx.shape(x)
        rank = len(shape)
        axis = int(node.attr("axis", 1 if cx.opset < 13 else -1))
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis < rank:
            raise Unsupported(f"axis {axis} is out of range for a {rank}-D input")
        if cx.opset < 13 or axis == rank - 1 or all(d == 1 for d in shape[axis + 1:]):
            # before opset 13 ONNX's softmax runs over the axes from `axis` on, as netrun's
            cx.emit(node, type_, [x], [cx.out(node)], axis=axis)
        else:
            # one axis only: move it last, where netrun's runs over it alone, and back
            perm = [d for d in range(rank) if d != axis] + [axis]
            back = [perm.index(d) for d in range(rank)]
            _chain(cx, node, [("Transpose", [x], {"axes": perm}),
                              (type_, [], {"axis": rank - 1}),
                              ("Transpose", [], {"axes": back})])
        if type_ == "Softmax" and rank == 2 and axis == 1:
            cx.logits_of[cx.out(node)] = x
    return convert


# Dropout, shapes, data movement -------------------------------------------------------------
def dropout(cx: Graph, node: Node) -> None:
    """Dropout: identity to predict, dropping in the train net."""
    x = cx.data(node.inputs[0])
    node.attr("seed")
    node.attr("is_test")
    if cx.opset < 12:
        ratio = float(node.attr("ratio", 0.5))
    else:
        ratio = float(cx.const_array(node.input(1), "the ratio").reshape(-1)[0]) \
            if node.input(1) else 0.5
        if node.input(2) and cx.const_array(node.input(2), "training_mode").reshape(-1)[0]:
            raise Unsupported("training_mode=true drops values at inference, which netrun's "
                              "predict net never does")
    if cx.used(node, 1):
        raise Unsupported("the mask output is not supported")
    y = cx.out(node)
    cx.emit(node, "Dropout", [x], [y], train_outputs=[y, cx.tmp(node, "mask")],
            train_args={"is_test": 0}, ratio=ratio, is_test=1)


def identity(cx: Graph, node: Node) -> None:
    """Identity: the output is the input's blob."""
    cx.alias(node, cx.data(node.inputs[0]))


def flatten(cx: Graph, node: Node) -> None:
    """Flatten at `axis`."""
    x = cx.data(node.inputs[0])
    rank = len(cx.shape(x))
    axis = int(node.attr("axis", 1))
    cx.emit(node, "Flatten", [x], [cx.out(node)], axis=axis + rank if axis < 0 else axis)


def reshape(cx: Graph, node: Node) -> None:
    """Reshape to a load-time shape; the batch size becomes 0 (copy the dim)."""
    x = cx.data(node.inputs[0])
    shape = cx.shape(x)
    if cx.opset < 5:
        target, batch_at = [int(d) for d in node.attr("shape")], frozenset()
    else:
        c = cx.const(node.input(1))
        if c is None:
            cx.const_array(node.input(1), "the target shape")      # says why
        target, batch_at = [int(d) for d in np.asarray(c.value).reshape(-1)], c.batch_at
    if node.attr("allowzero", 0) and 0 in target:
        raise Unsupported("allowzero=1 with a 0 in the shape (an empty dim) is not supported")
    if batch_at - {0}:
        raise Unsupported("moves the batch size to another axis, which netrun cannot follow")
    if 0 in batch_at or (cx.static_batch and target and target[0] == cx.batch == shape[0]):
        # the batch size as the file saw it: copy whatever batch netrun runs
        target[0] = 0
    cx.emit(node, "Reshape", [x], [cx.out(node)], shape=target)


def _batch_kept(axes: list[int], what: str) -> None:
    if 0 in axes:
        raise Unsupported(f"{what} axis 0 (the batch) is not supported")


def squeeze(cx: Graph, node: Node) -> None:
    """Squeeze of an activation: a Reshape that keeps the batch."""
    x = cx.data(node.inputs[0])
    shape = cx.shape(x)
    axes = [a + len(shape) if a < 0 else a for a in squeeze_axes(cx, node)] or \
        [i for i, d in enumerate(shape) if d == 1 and i > 0]
    _batch_kept(axes, "squeezing")
    target = [0] + [d for i, d in enumerate(shape) if i not in axes and i > 0]
    cx.emit(node, "Reshape", [x], [cx.out(node)], shape=target)


def unsqueeze(cx: Graph, node: Node) -> None:
    """Unsqueeze of an activation: a Reshape that keeps the batch."""
    x = cx.data(node.inputs[0])
    shape = list(cx.shape(x))
    rank = len(shape) + len(squeeze_axes(cx, node))
    axes = sorted(a + rank if a < 0 else a for a in squeeze_axes(cx, node))
    _batch_kept(axes, "inserting")
    for a in axes:
        shape.insert(a, 1)
    cx.emit(node, "Reshape", [x], [cx.out(node)], shape=[0] + shape[1:])


def transpose(cx: Graph, node: Node) -> None:
    """Transpose."""
    x = cx.data(node.inputs[0])
    perm = node.attr("perm", list(range(len(cx.shape(x))))[::-1])
    cx.emit(node, "Transpose", [x], [cx.out(node)], axes=[int(p) for p in perm])


def concat(cx: Graph, node: Node) -> None:
    """Concat along `axis`."""
    blobs = [cx.operand(n) for n in node.inputs if n]
    y = cx.out(node)
    cx.emit(node, "Concat", blobs, [y], train_outputs=[y, cx.tmp(node, "split_info")],
            axis=int(node.attr("axis")))


def _reduce(type_: str, axes_input_from: int):
    def convert(cx: Graph, node: Node) -> None:
        """Convert one node."""
        x = cx.data(node.inputs[0])
        if cx.opset >= axes_input_from:
            axes = cx.const_array(node.input(1), "the axes").tolist() if node.input(1) else []
        else:
            axes = list(node.attr("axes", []))
        if not axes and node.attr("noop_with_empty_axes", 0):
            cx.alias(node, x)
            return
        cx.emit(node, type_, [x], [cx.out(node)], axes=[int(a) for a in axes],
                keepdims=int(node.attr("keepdims", 1)))
    return convert


CONVERTERS: dict[str, Callable[[Graph, Node], None]] = {
    "Conv": conv, "ConvTranspose": conv_transpose,
    "MaxPool": _pool("Max"), "AveragePool": _pool("Average"),
    "GlobalMaxPool": _global_pool("Max"), "GlobalAveragePool": _global_pool("Average"),
    "Pad": pad, "BatchNormalization": batch_norm, "LRN": lrn,
    "Gemm": gemm, "MatMul": matmul,
    "Add": _binary("Add"), "Sub": _binary("Sub"), "Mul": _binary("Mul"), "Div": _binary("Div"),
    "Sum": sum_, **{t: _unary(t) for t in _PLAIN},
    "LeakyRelu": leaky_relu, "Elu": elu, "HardSigmoid": hard_sigmoid, "Neg": neg, "Pow": pow_,
    "PRelu": prelu, "Clip": clip, "Softmax": _softmax("Softmax"),
    "LogSoftmax": _softmax("LogSoftmax"), "Dropout": dropout, "Identity": identity,
    "Flatten": flatten, "Reshape": reshape, "Squeeze": squeeze, "Unsqueeze": unsqueeze,
    "Transpose": transpose, "Concat": concat,
    "ReduceMean": _reduce("ReduceMean", 18), "ReduceSum": _reduce("ReduceSum", 13),
}
