"""Layers that combine, split or reshape blobs: Eltwise, Concat, Slice, Split, Flatten,
Reshape, Softmax, Silence."""
from __future__ import annotations

from netrun.caffe.context import LayerContext
from netrun.caffe.layers.registry import axis_of, count, layer


@layer("Eltwise")
def eltwise(t: LayerContext) -> None:
    """SUM (with coefficients: Scale each term, then Sum), PROD (a chain of Mul) or MAX."""
    t.counts((2, 99), 1)
    p = t.f.sub("eltwise_param")
    p.ignore("stable_prod_grad")   # how Caffe computes PROD's gradient, not what
    operation = p.enum("operation", "SUM", ("SUM", "PROD", "MAX"))
    coeffs = p.get_all("coeff", "float")
    for i in range(1, t.nbottom):
        if t.shape(i) != t.shape(0):
            raise t.skip(f"bottom {i} has shape {'×'.join(map(str, t.shape(i)))} but bottom 0 "
                         f"has {'×'.join(map(str, t.shape(0)))}")
    if coeffs and (operation != "SUM" or len(coeffs) != t.nbottom):
        raise t.skip(f"coeff needs operation SUM and one value per bottom ({t.nbottom}), got "
                     f"{len(coeffs)} for {operation}", "eltwise_param")
    if operation == "MAX":
        t.add("Max", t.bottoms, t.top())
    elif operation == "PROD":
        acc = t.bottoms[0]
        for k, b in enumerate(t.bottoms[1:], start=1):
            out = t.top() if k == t.nbottom - 1 else t.tmp(f"prod{k}")
            t.add("Mul", [acc, b], out)
            acc = out
    else:
        terms = []
        for i, (b, c) in enumerate(zip(t.bottoms, coeffs or [1.0] * t.nbottom)):
            if c != 1.0:
                scaled = t.tmp(f"term{i}")
                t.add("Scale", [b], scaled, scale=c)
                b = scaled
            terms.append(b)
        t.add("Sum", terms, t.top())


@layer("Concat")
def concat(t: LayerContext) -> None:
    """Join along `axis` (or the legacy concat_dim)."""
    t.counts((1, 99), 1)
    p = t.f.sub("concat_param")
    ndim = len(t.shape(0))
    axis = p.get("concat_dim", None, "int") if p.has("concat_dim") else p.get("axis", 1)
    axis = axis_of(t, axis, ndim, "concat_param")
    t.add("Concat", t.bottoms, [t.top(), t.tmp("split_info")], axis=axis)


@layer("Slice")
def slice_(t: LayerContext) -> None:
    """Split at slice_point (or into equal parts) along `axis`."""
    t.counts(1, (1, 99))
    p = t.f.sub("slice_param")
    shape = t.shape(0)
    axis = p.get("slice_dim", None, "int") if p.has("slice_dim") else p.get("axis", 1)
    axis = axis_of(t, axis, len(shape), "slice_param")
    points = p.get_all("slice_point", "int")
    size = shape[axis]
    if points:
        bounds = [0, *points, size]
        if len(points) != t.ntop - 1 or any(b >= e for b, e in zip(bounds, bounds[1:])):
            raise t.skip(f"slice_point {points} must be {t.ntop - 1} increasing points inside "
                         f"0..{size}", "slice_param")
        sizes = [e - b for b, e in zip(bounds, bounds[1:])]
    elif size % t.ntop:
        raise t.skip(f"{size} does not split into {t.ntop} equal parts", "slice_param")
    else:
        sizes = [size // t.ntop] * t.ntop
    t.add("Split", [t.bottoms[0]], [t.top(i) for i in range(t.ntop)], axis=axis, split=sizes)


@layer("Split")
def split(t: LayerContext) -> None:
    """Every top is the bottom itself (no copy); gradients of the tops are summed."""
    t.counts(1, (1, 99))
    for i in range(t.ntop):
        t.alias(i, t.bottoms[0])


@layer("Silence")
def silence(t: LayerContext) -> None:
    """Consumes its bottoms and makes nothing."""
    t.counts((1, 99), 0)


@layer("Flatten")
def flatten(t: LayerContext) -> None:
    """Dims axis..end_axis into one: Flatten for the usual N×rest, else a Reshape."""
    t.counts(1, 1)
    p = t.f.sub("flatten_param")
    shape = t.shape(0)
    axis = axis_of(t, p.get("axis", 1), len(shape), "flatten_param")
    end = axis_of(t, p.get("end_axis", -1), len(shape), "flatten_param")
    if end < axis:
        raise t.skip(f"end_axis {end} comes before axis {axis}", "flatten_param")
    if axis == 1 and end == len(shape) - 1:
        t.add("Flatten", [t.bottoms[0]], t.top())
        return
    # 0 copies a leading dim (the batch stays free); the trailing dims are spelled out.
    new = [0] * axis + [-1] + list(shape[end + 1:])
    t.add("Reshape", [t.bottoms[0]], [t.top(), t.tmp("old_shape")], shape=new)


@layer("Reshape")
def reshape(t: LayerContext) -> None:
    """Caffe's reshape of dims axis..axis+num_axes (0 copies a dim, -1 infers one)."""
    t.counts(1, 1)
    p = t.f.sub("reshape_param")
    shape = t.shape(0)
    dims = p.sub("shape").get_all("dim", "int")
    axis = p.get("axis", 0)
    axis = axis if axis >= 0 else len(shape) + 1 + axis   # Caffe: -1 means after the last
    num_axes = p.get("num_axes", -1)
    end = len(shape) if num_axes == -1 else axis + num_axes
    if not 0 <= axis <= end <= len(shape):
        raise t.skip(f"axis {axis} and num_axes {num_axes} do not fit a {len(shape)}-d bottom",
                     "reshape_param")
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise t.skip(f"shape {dims}: at most one -1, and no other negative dims",
                     "reshape_param")
    # Leading dims are copied with 0 at their own index (keeping the batch free); a 0 in
    # Caffe's spec copies the bottom dim at the same position, the same index here too.
    new = [0] * axis + dims + list(shape[end:])
    t.add("Reshape", [t.bottoms[0]], [t.top(), t.tmp("old_shape")], shape=new)


@layer("Softmax")
def softmax(t: LayerContext) -> None:
    """Softmax along one axis; with dims after it, that axis is moved last and back."""
    t.counts(1, 1)
    p = t.f.sub("softmax_param")
    p.ignore("engine")
    shape = t.shape(0)
    axis = axis_of(t, p.get("axis", 1), len(shape), "softmax_param")
    if count(shape[axis + 1:]) == 1:
        t.add("Softmax", [t.bottoms[0]], t.top(), **({"axis": axis} if axis != 1 else {}))
        return
    last = len(shape) - 1
    order = [d for d in range(len(shape)) if d != axis] + [axis]     # axis moved last
    back = [order.index(d) for d in range(len(shape))]
    moved, prob = t.tmp("moved"), t.tmp("moved_prob")
    t.add("Transpose", [t.bottoms[0]], moved, axes=order)
    t.add("Softmax", [moved], prob, axis=last)
    t.add("Transpose", [prob], t.top(), axes=back)
