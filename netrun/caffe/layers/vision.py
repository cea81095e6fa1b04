"""Convolution, Deconvolution, Pooling, InnerProduct and LRN."""
from __future__ import annotations

from typing import Any

from netrun.caffe.context import LayerContext
from netrun.caffe.fields import Fields
from netrun.caffe.layers.registry import axis_of, count, layer
from netrun.model.builder import MAX_UNITS


def spatial(t: LayerContext, p: Fields, base: str, single: str, default: int | None
            ) -> tuple[int, int]:
    """(h, w) of a Caffe size given as `base` (one or two values) or `single`_h/_w."""
    values = p.get_all(base, "int")
    h, w = p.get(f"{single}_h", None, "int"), p.get(f"{single}_w", None, "int")
    if values and (h is not None or w is not None):
        raise t.skip(f"give either '{base}' or '{single}_h'/'{single}_w', not both", base)
    if h is not None or w is not None:
        if h is None or w is None:
            raise t.skip(f"'{single}_h' and '{single}_w' go together", f"{single}_h")
        return h, w
    if not values:
        if default is None:
            raise t.skip(f"missing '{base}'")
        return default, default
    if len(values) > 2:
        raise t.skip(f"'{base}' has {len(values)} values; only 2-D (h, w) is supported", base)
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def geometry(kernel, stride, pad, dilation=(1, 1)) -> dict[str, Any]:
    """netrun's Conv/Pool arguments for Caffe's symmetric (h, w) kernel, stride, pad."""
    args: dict[str, Any] = {}
    for one, many, (h, w), default in (("kernel", "kernels", kernel, None),
                                       ("stride", "strides", stride, 1),
                                       ("dilation", "dilations", dilation, 1)):
        if (h, w) != (default, default):
            args.update({one: h} if h == w else {many: [h, w]})
    if any(pad):
        args.update({"pad": pad[0]} if pad[0] == pad[1] else {"pads": [pad[0], pad[1]] * 2})
    return args


def _image(t: LayerContext, i: int = 0) -> tuple[int, ...]:
    shape = t.shape(i)
    if len(shape) != 4:
        raise t.skip(f"needs a 4-d N×C×H×W bottom, got {'×'.join(map(str, shape))}")
    return shape


@layer("Convolution", "Deconvolution")
def convolution(t: LayerContext) -> None:
    """Conv / ConvTranspose; several bottom/top pairs share the weights, as in Caffe."""
    t.counts((1, 99), t.nbottom)
    p = t.f.sub("convolution_param")
    p.ignore("engine", "force_nd_im2col")
    if p.get("axis", 1) != 1:
        raise t.skip("only axis 1 (channels) is supported", "convolution_param")
    n = p.get("num_output", None, "int")
    if n is None or not 1 <= n <= MAX_UNITS:
        raise t.skip(f"convolution_param needs num_output from 1 to {MAX_UNITS:,}, got {n}",
                     "convolution_param")
    kernel = spatial(t, p, "kernel_size", "kernel", None)
    stride = spatial(t, p, "stride", "stride", 1)
    pad = spatial(t, p, "pad", "pad", 0)
    dilation = spatial(t, p, "dilation", "dilation", 1)
    group, bias = p.get("group", 1), p.get("bias_term", True)
    c = _image(t)[1]
    if group < 1 or c % group or n % group:
        raise t.skip(f"group {group} must divide the {c} input and {n} output channels",
                     "convolution_param")
    deconv = t.type == "Deconvolution"
    w_shape = (c, n // group, *kernel) if deconv else (n, c // group, *kernel)
    params = [t.param(0, "w", w_shape, "weight", p.sub("weight_filler"))]
    if bias:
        params.append(t.param(1, "b", (n,), "bias", p.sub("bias_filler")))
    args = geometry(kernel, stride, pad, dilation)
    if group != 1:
        args["group"] = group
    if not bias:
        args["no_bias"] = 1
    for i, x in enumerate(t.bottoms):
        if _image(t, i)[1] != c:
            raise t.skip(f"bottom {i} has {t.shape(i)[1]} channels but bottom 0 has {c}")
        t.add("ConvTranspose" if deconv else "Conv", [x, *params], t.top(i), **args)


def caffe_pool_size(size: int, k: int, s: int, p: int, ceil: bool) -> int:
    """Caffe's pooled size: rounded up (CEIL) or down, then the last window must start
    inside the image or its top/left pad, which Caffe checks only when there is padding."""
    span = size + 2 * p - k
    out = (-(-span // s) if ceil else span // s) + 1
    if p and (out - 1) * s >= size + p:
        out -= 1
    return out


def _ceil_mode(t: LayerContext, p) -> bool:
    """Caffe's output rounding: BVLC's `round_mode: CEIL|FLOOR`, or the `ceil_mode: true|false`
    that forks (and the files written for them) use instead; CEIL when neither is given."""
    by_round = p.enum("round_mode", "CEIL", ("CEIL", "FLOOR")) == "CEIL"
    if not p.has("ceil_mode"):
        return by_round
    by_flag = bool(p.get("ceil_mode", True, "bool"))
    if p.has("round_mode") and by_flag != by_round:
        raise t.skip("round_mode and ceil_mode disagree; give one of them", "pooling_param")
    return by_flag


@layer("Pooling")
def pooling(t: LayerContext) -> None:
    """MaxPool / AveragePool with Caffe's ceil-mode output size (legacy_pad)."""
    t.counts(1, 1)
    p = t.f.sub("pooling_param")
    p.ignore("engine")
    kind = p.enum("pool", "MAX", ("MAX", "AVE"))
    ceil = _ceil_mode(t, p)
    n, c, h, w = _image(t)
    op_type = "MaxPool" if kind == "MAX" else "AveragePool"
    if p.get("global_pooling", False):
        if any(p.has(k) for k in ("kernel_size", "kernel_h", "kernel_w")):
            raise t.skip("global_pooling takes no kernel size", "pooling_param")
        if (spatial(t, p, "pad", "pad", 0) != (0, 0)
                or spatial(t, p, "stride", "stride", 1) != (1, 1)):
            raise t.skip("global_pooling needs pad 0 and stride 1", "pooling_param")
        t.add(op_type, [t.bottoms[0]], t.top(), global_pooling=1)
        return
    kernel = spatial(t, p, "kernel_size", "kernel", None)
    stride = spatial(t, p, "stride", "stride", 1)
    pad = spatial(t, p, "pad", "pad", 0)
    args = geometry(kernel, stride, pad)
    if ceil:
        args["legacy_pad"] = "CAFFE_LEGACY_POOLING"
    t.add(op_type, [t.bottoms[0]], t.top(), **args)
    want = tuple(caffe_pool_size(size, k, s, q, ceil)
                 for size, k, s, q in zip((h, w), kernel, stride, pad))
    got = t.shape(t.top())[2:]
    if tuple(got) != want:
        # Caffe keeps a last window that starts past the image when stride > kernel and
        # there is no padding (it pools nothing there); netrun drops it, as PyTorch does.
        raise t.skip(f"Caffe pools this {h}×{w} input to {want[0]}×{want[1]} but netrun to "
                     f"{got[0]}×{got[1]} (an empty last window, stride > kernel without "
                     f"padding); not supported", "pooling_param")


@layer("InnerProduct")
def inner_product(t: LayerContext) -> None:
    """FC on X flattened at `axis`; Caffe's W is num_output × K (K × num_output transposed)."""
    t.counts(1, 1)
    p = t.f.sub("inner_product_param")
    n = p.get("num_output", None, "int")
    if n is None or not 1 <= n <= MAX_UNITS:
        raise t.skip(f"inner_product_param needs num_output from 1 to {MAX_UNITS:,}, got {n}",
                     "inner_product_param")
    shape = t.shape(0)
    axis = axis_of(t, p.get("axis", 1), len(shape), "inner_product_param")
    k = count(shape[axis:])
    if p.get("transpose", False):
        w = t.param(0, "w", (k, n), "weight", p.sub("weight_filler"))
        wt = t.tmp("w_t")
        t.add("Transpose", [w], wt, axes=[1, 0])       # (n, k), as FC wants it
    else:
        w = wt = t.param(0, "w", (n, k), "weight", p.sub("weight_filler"))
    if p.get("bias_term", True):
        b = t.param(1, "b", (n,), "bias", p.sub("bias_filler"))
    else:  # FC always adds a bias: give it zeros that no gradient reaches
        b = t.tmp("zero_bias")
        t.add("ConstantFill", [], b, shape=[n], value=0.0)
    t.add("FC", [t.bottoms[0], wt, b], t.top(), **({"axis": axis} if axis != 1 else {}))


@layer("LRN")
def lrn(t: LayerContext) -> None:
    """Local response normalization; training keeps the scale for the gradient."""
    t.counts(1, 1)
    p = t.f.sub("lrn_param")
    p.ignore("engine")
    region = p.enum("norm_region", "ACROSS_CHANNELS", ("ACROSS_CHANNELS", "WITHIN_CHANNEL"))
    args = {"size": p.get("local_size", 5), "alpha": p.get("alpha", 1.0),
            "beta": p.get("beta", 0.75), "norm_region": region}
    k = p.get("k", 1.0)
    if region == "ACROSS_CHANNELS":
        args["bias"] = k
    elif k != 1.0:  # Caffe ignores k within channels; netrun insists it is left at 1
        raise t.skip("k must be 1 with norm_region WITHIN_CHANNEL", "lrn_param")
    outs = [t.top(), t.tmp("scale")] if t.train else [t.top()]
    t.add("LRN", [t.bottoms[0]], outs, **args)
