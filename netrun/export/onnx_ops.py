"""Per-operator converters from netrun (Caffe2) operators to ONNX nodes.

Each converter gets the graph builder, the op and the specs shape inference gave its inputs
and outputs; it reads inputs through the builder (which knows each blob's current SSA name)
and declares outputs through it.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from netrun.errors import NetrunError
from netrun.kernels.geometry import ConvGeometry


def _ceil_out(size: int, k: int, s: int, head: int, tail: int) -> int:
    """ONNX Runtime's ceil-mode output size (the last window must start inside the input
    or its head padding, the rule Caffe's legacy pooling and PyTorch follow)."""
    out = -(-(size + head + tail - k) // s) + 1
    if (out - 1) * s >= size + head:
        out -= 1
    return out


def _nchw(cx, op) -> None:
    if op.args.get("order", "NCHW") != "NCHW":
        raise NetrunError(f"op {op.label}: only NCHW storage order exports to ONNX")


def conv(cx, op, ins, outs) -> None:
    _nchw(cx, op)
    x, w = ins[0].shape, ins[1].shape
    args = dict(op.args)
    if not any(k in args for k in ("kernel", "kernel_h", "kernels")):
        args["kernels"] = list(w[2:])     # Caffe2 may leave the kernel to W's shape
    g = ConvGeometry.from_args(args, op.label).resolve(x[2], x[3], f"op {op.label}'s input")
    inputs = [cx.inp(op, 0), cx.inp(op, 1)] + ([cx.inp(op, 2)] if len(op.inputs) > 2 else [])
    cx.node("Conv", inputs, [cx.out(op, 0)], kernel_shape=[g.kh, g.kw], strides=[g.sh, g.sw],
            pads=[g.pt, g.pl, g.pb, g.pr], dilations=[g.dh, g.dw],
            group=int(op.args.get("group", 1)))


def _pool(kind: str):
    def convert(cx, op, ins, outs) -> None:
        _nchw(cx, op)
        if op.args.get("global_pooling", 0):
            cx.node(f"Global{kind}Pool", [cx.inp(op, 0)], [cx.out(op, 0)])
            return
        x = ins[0].shape
        h, w = x[2], x[3]
        oh, ow = outs[0].shape[2], outs[0].shape[3]
        declared = ConvGeometry.from_args(op.args, op.label)
        g = declared.resolve(h, w, f"op {op.label}'s input")
        caffe_ceil = declared.legacy_pad == "CAFFE_LEGACY_POOLING"
        common = {"kernel_shape": [g.kh, g.kw], "strides": [g.sh, g.sw]}
        src = cx.inp(op, 0)
        if kind == "Max":
            if caffe_ceil and (_ceil_out(h, g.kh, g.sh, g.pt, g.pt) == oh
                               and _ceil_out(w, g.kw, g.sw, g.pl, g.pl) == ow):
                # Caffe's ceil mode is ONNX's ceil_mode=1 with the declared (symmetric) pads.
                pads = [declared.pt, declared.pl, declared.pb, declared.pr]
                cx.node("MaxPool", [src], [cx.out(op, 0)], pads=pads, ceil_mode=1, **common)
            else:
                cx.node("MaxPool", [src], [cx.out(op, 0)], pads=[g.pt, g.pl, g.pb, g.pr],
                        **common)
            return
        if not op.args.get("count_include_pad", 1):
            cx.node("AveragePool", [src], [cx.out(op, 0)], pads=[g.pt, g.pl, g.pb, g.pr],
                    count_include_pad=0, **common)
            return
        # Caffe's divisor: the window clipped to [-pad, H + pad) (padding counts, the ceil
        # overhang does not). ONNX has no such mode, so the counted padding becomes explicit
        # zeros and the window is then clipped to that padded image (count_include_pad=0).
        cb, cr = declared.counted_tail_pads(h, w)
        counted = [g.pt, g.pl, cb, cr]
        if any(counted):
            padded = cx.tmp(f"{op.outputs[0]}_padded")
            pads = cx.const(f"{op.outputs[0]}_pads",
                            np.array([0, 0, g.pt, g.pl, 0, 0, cb, cr], np.int64))
            cx.node("Pad", [src, pads], [padded], mode="constant")
            src, h, w = padded, h + g.pt + cb, w + g.pl + cr
        extra_b, extra_r = g.pb - cb, g.pr - cr
        if (extra_b or extra_r) and (_ceil_out(h, g.kh, g.sh, 0, 0) == oh
                                     and _ceil_out(w, g.kw, g.sw, 0, 0) == ow):
            cx.node("AveragePool", [src], [cx.out(op, 0)], ceil_mode=1, count_include_pad=0,
                    **common)
        else:
            cx.node("AveragePool", [src], [cx.out(op, 0)], pads=[0, 0, extra_b, extra_r],
                    count_include_pad=0, **common)
    return convert


def fc(cx, op, ins, outs) -> None:
    axis, axis_w = int(op.args.get("axis", 1)), int(op.args.get("axis_w", 1))
    x = ins[0].shape
    axis = axis + len(x) if axis < 0 else axis
    w = cx.param(op.inputs[1])
    if w is None:
        raise NetrunError(f"op {op.label}: FC's weight '{op.inputs[1]}' must be a parameter "
                          f"to export")
    if w.ndim != 2 or axis_w != 1:
        w = w.reshape(math.prod(w.shape[:axis_w]), -1)
        wname = cx.const(f"{op.inputs[1]}_2d", w)
    else:
        wname = cx.inp(op, 1)
    src = cx.inp(op, 0)
    if len(x) != 2 or axis != 1:
        flat = cx.tmp(f"{op.outputs[0]}_flat")
        cx.node("Flatten", [src], [flat], axis=axis)
        src = flat
    y = outs[0].shape
    if len(y) == 2:
        cx.node("Gemm", [src, wname, cx.inp(op, 2)], [cx.out(op, 0)], transB=1)
        return
    # FC at axis > 1 keeps the leading axes: Gemm on the flattened rows, then reshaped back.
    gemm = cx.tmp(f"{op.outputs[0]}_2d")
    cx.node("Gemm", [src, wname, cx.inp(op, 2)], [gemm], transB=1)
    shape = cx.const(f"{op.outputs[0]}_shape", np.array([-1, *y[1:]], np.int64))
    cx.node("Reshape", [gemm, shape], [cx.out(op, 0)])


def spatial_bn(cx, op, ins, outs) -> None:
    _nchw(cx, op)
    if not op.args.get("is_test", 0):
        raise NetrunError(f"op {op.label}: SpatialBN in training mode (is_test=0) does not "
                          f"export; export the predict net")
    cx.node("BatchNormalization", [cx.inp(op, i) for i in range(5)], [cx.out(op, 0)],
            epsilon=float(op.args.get("epsilon", 1e-5)))


def caffe_batch_norm(cx, op, ins, outs) -> None:
    # Caffe keeps running sums and their weight; the statistics are sum/factor (0 if 0).
    mean, var, factor = (cx.param(n) for n in op.inputs[1:4])
    if mean is None or var is None or factor is None:
        raise NetrunError(f"op {op.label}: CaffeBatchNorm's statistics must be parameters "
                          f"to export")
    f = float(factor.reshape(-1)[0])
    scale = 0.0 if f == 0 else 1.0 / f
    c = mean.shape[0]
    name = op.outputs[0]
    inputs = [cx.inp(op, 0), cx.const(f"{name}_bn_scale", np.ones(c, np.float32)),
              cx.const(f"{name}_bn_bias", np.zeros(c, np.float32)),
              cx.const(f"{name}_bn_mean", (mean * scale).astype(np.float32)),
              cx.const(f"{name}_bn_var", (var * scale).astype(np.float32))]
    cx.node("BatchNormalization", inputs, [cx.out(op, 0)],
            epsilon=float(op.args.get("epsilon", 1e-5)))


def _binary(onnx_type: str):
    def convert(cx, op, ins, outs) -> None:
        a, b = ins[0].shape, ins[1].shape
        axis = int(op.args.get("axis", -1))
        bname = None
        if op.args.get("broadcast", 0) and axis != -1 and len(b) + axis < len(a):
            # Caffe2's legacy broadcast aligns B at `axis`; ONNX aligns at the end, so B gets
            # trailing ones.
            shape = tuple(b) + (1,) * (len(a) - axis - len(b))
            value = cx.param(op.inputs[1])
            if value is not None:
                bname = cx.const(f"{op.inputs[1]}_bcast", value.reshape(shape))
            else:
                target = cx.const(f"{op.outputs[0]}_bshape", np.array(shape, np.int64))
                reshaped = cx.tmp(f"{op.outputs[0]}_b")
                cx.node("Reshape", [cx.inp(op, 1), target], [reshaped])
                bname = reshaped
        cx.node(onnx_type, [cx.inp(op, 0), bname or cx.inp(op, 1)], [cx.out(op, 0)])
    return convert


def _unary(onnx_type: str):
    def convert(cx, op, ins, outs) -> None:
        cx.node(onnx_type, [cx.inp(op, 0)], [cx.out(op, 0)])
    return convert


def sum_(cx, op, ins, outs) -> None:
    cx.node("Sum", [cx.inp(op, i) for i in range(len(op.inputs))], [cx.out(op, 0)])


def lrn(cx, op, ins, outs) -> None:
    region = op.args.get("norm_region", "ACROSS_CHANNELS")
    if region != "ACROSS_CHANNELS":
        raise NetrunError(f"op {op.label}: LRN with norm_region={region} has no ONNX "
                          f"equivalent (ONNX's LRN is across channels)")
    _nchw(cx, op)
    cx.node("LRN", [cx.inp(op, 0)], [cx.out(op, 0)], size=int(op.args.get("size", 5)),
            alpha=float(op.args.get("alpha", 1e-4)), beta=float(op.args.get("beta", 0.75)),
            bias=float(op.args.get("bias", 1.0)))


def concat(cx, op, ins, outs) -> None:
    if op.args.get("add_axis", 0):
        raise NetrunError(f"op {op.label}: Concat with add_axis=1 does not export")
    axis = int(op.args.get("axis", 1 if op.args.get("order", "NCHW") == "NCHW" else 3))
    cx.node("Concat", [cx.inp(op, i) for i in range(len(op.inputs))], [cx.out(op, 0)],
            axis=axis)
    # the split_info output (sizes along the axis) is a training aid: no node writes it


def softmax(cx, op, ins, outs) -> None:
    x = ins[0].shape
    axis = int(op.args.get("axis", 1))
    axis = axis + len(x) if axis < 0 else axis
    if axis == len(x) - 1 or all(d == 1 for d in x[axis + 1:]):
        cx.node("Softmax", [cx.inp(op, 0)], [cx.out(op, 0)], axis=axis)
        return
    # Caffe2's softmax runs over all axes from `axis` on (X coerced to N×D); ONNX's over one.
    flat, prob, shape = (cx.tmp(f"{op.outputs[0]}_{s}") for s in ("flat", "2d", "shape"))
    cx.node("Flatten", [cx.inp(op, 0)], [flat], axis=axis)
    cx.node("Softmax", [flat], [prob], axis=1)
    cx.node("Shape", [cx.inp(op, 0)], [shape])
    cx.node("Reshape", [prob, shape], [cx.out(op, 0)])


def dropout(cx, op, ins, outs) -> None:
    # The predict net runs dropout as the identity: its output is its input.
    cx.alias(op, 0, 0)


def flatten(cx, op, ins, outs) -> None:
    cx.node("Flatten", [cx.inp(op, 0)], [cx.out(op, 0)], axis=int(op.args.get("axis", 1)))


def reshape(cx, op, ins, outs) -> None:
    shape = op.args.get("shape")
    if shape:
        target = cx.const(f"{op.outputs[0]}_shape", np.array(shape, np.int64))
    elif len(op.inputs) > 1 and cx.param(op.inputs[1]) is not None:
        target = cx.const(f"{op.outputs[0]}_shape", cx.param(op.inputs[1]).astype(np.int64))
    else:
        raise NetrunError(f"op {op.label}: Reshape needs its shape as an argument or a "
                          f"parameter to export")
    cx.node("Reshape", [cx.inp(op, 0), target], [cx.out(op, 0)])


def scale(cx, op, ins, outs) -> None:
    factor = cx.const(f"{op.outputs[0]}_scale", np.array(op.args.get("scale", 1.0), np.float32))
    cx.node("Mul", [cx.inp(op, 0), factor], [cx.out(op, 0)])


CONVERTERS: dict[str, Callable] = {
    "Conv": conv, "MaxPool": _pool("Max"), "AveragePool": _pool("Average"), "FC": fc,
    "SpatialBN": spatial_bn, "CaffeBatchNorm": caffe_batch_norm,
    "Add": _binary("Add"), "Mul": _binary("Mul"), "Sub": _binary("Sub"), "Div": _binary("Div"),
    "Sum": sum_, "Relu": _unary("Relu"), "Sigmoid": _unary("Sigmoid"), "Tanh": _unary("Tanh"),
    "LRN": lrn, "Concat": concat, "Softmax": softmax, "Dropout": dropout,
    "Flatten": flatten, "Reshape": reshape, "Scale": scale,
}
