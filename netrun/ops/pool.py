"""Pooling: MaxPool, AveragePool and their gradients (Caffe2's pool_op, Caffe's ceil mode).

Both layouts are handled natively: every kernel loops over the kh·kw window taps and
combines views of the padded input, never over pixels; with a stride (NCHW) the views come
from the input's stride phases so they are unit-stride (netrun.kernels.windows).
MaxPoolGradient takes (X, Y, dY) as in Caffe2 and recomputes where the maximum was, so the
forward pass stores nothing extra: the first tap (in window order) whose value equals Y wins.
It first routes dY to every tap equal to Y (two passes per tap, straight into dX when windows
do not overlap) and counts the hits; only if some window had a tie does it redo the routing
the exact way (first tap wins). Max pooling whose windows tile the image (kernel == stride,
no pads: LeNet's 2×2 s2) takes a separable path instead (netrun.kernels.tiled_pool).
With the compiled engine (netrun.kernels.jit), NCHW float32 pooling runs Numba kernels instead
(netrun.kernels.jit.pool): the same values, the same bits for max pooling; other layouts and dtypes
run the NumPy path.
"""
from __future__ import annotations

import numpy as np

import netrun.kernels.jit as jit
import netrun.kernels.jit.blocked as jit_blocked
import netrun.kernels.jit.pool as jit_pool
import netrun.kernels.layout as layouts
import netrun.kernels.parallel as parallel
import netrun.kernels.tiled_pool as tiled_pool
import netrun.kernels.windows as windows
from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel, register_preparer
from netrun.core.schema import Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import SchemaError, ShapeError
from netrun.kernels.geometry import ConvGeometry
from netrun.ops.common import RepeatCall, conv_pool_args, same_as_input

BLOCK_BYTES = 1 << 20   # input bytes per batch block, sized for cache (see benchmarks/README.md)
_POOL_ARGS = conv_pool_args() + (
    Arg("global_pooling", "int", 0, allowed=(0, 1), doc="1: one window over the whole image"),)
_AVG_ARGS = _POOL_ARGS + (
    Arg("count_include_pad", "int", 1, allowed=(0, 1),
        doc="1: Caffe's divisor (padding counts, ceil-mode overhang does not); "
            "0: divide by the in-image elements only"),)


def _check(op, args: Args) -> None:
    """Build-time rules: explicit kernel (unless global), no dilation, pads smaller than kernel."""
    geom = ConvGeometry.from_args(args, op.label, require_kernel=not args.global_pooling)
    if geom.dh != 1 or geom.dw != 1:
        raise SchemaError(f"op {op.label}: argument 'dilation' is not supported by pooling ops")
    if args.global_pooling:
        given = [n for n in ("kernel", "kernel_h", "kernel_w", "kernels", "stride", "stride_h",
                             "stride_w", "strides", "pad", "pads", "pad_t", "pad_l", "pad_b",
                             "pad_r") if args.get(n) is not None]
        if given or geom.legacy_pad != "NOTSET":
            name = given[0] if given else "legacy_pad"
            raise SchemaError(f"op {op.label}: argument '{name}' cannot be combined with "
                              f"global_pooling=1 (the window is the whole image)")
        return
    # Caffe: pad < kernel, so every window holds at least one pixel of the image.
    if max(geom.pt, geom.pb) >= geom.kh or max(geom.pl, geom.pr) >= geom.kw:
        raise SchemaError(f"op {op.label}: argument 'pad' must be smaller than the kernel "
                          f"{geom.kh}×{geom.kw}, got pads {list(geom.pads)}")


def _axes(args: Args) -> tuple[int, int]:
    """The spatial axes of a 4-D tensor in the op's storage order."""
    return (1, 2) if args.order == "NHWC" else (2, 3)


def _geometry(args: Args, shape, what: str) -> tuple[ConvGeometry, ConvGeometry, int, int]:
    """(declared, resolved) geometry and the output size for a 4-D input shape."""
    if len(shape) != 4:
        raise ShapeError(f"{what} must be 4-D ({args.order}) for 2-D pooling")
    ah, aw = _axes(args)
    h, w = shape[ah], shape[aw]
    if args.global_pooling:
        declared = ConvGeometry(h, w)
    else:
        declared = ConvGeometry.from_args(args)
    resolved = declared.resolve(h, w, what)
    oh, ow = declared.output_size(h, w, what)
    return declared, resolved, oh, ow


def pooled_shape(args: Args, shape, oh: int, ow: int) -> tuple[int, ...]:
    """X's shape with the spatial sizes replaced by the pooled ones."""
    out = list(shape)
    ah, aw = _axes(args)
    out[ah], out[aw] = oh, ow
    return tuple(out)


def _blocked_global(args: Args, x: TensorSpec) -> TensorSpec | None:
    """Y's spec for a channel-blocked X (N×⌈C/B⌉×H×W×B, the layout plan's), which only
    global pooling takes: N×⌈C/B⌉×1×1×B; None for a 4-D X."""
    if len(x.shape) != 5:
        return None
    if not args.global_pooling or args.order != "NCHW":
        raise ShapeError(f"a channel-blocked X {x} is pooled only with global_pooling=1 "
                         f"(order NCHW)")
    n, blocks, _, _, block = x.shape
    return TensorSpec((n, blocks, 1, 1, block), x.dtype)


def _shape_fn(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x = ins[0]
    blocked = _blocked_global(args, x)
    if blocked is not None:
        return [blocked]
    _, _, oh, ow = _geometry(args, x.shape, f"X {x}")
    return [TensorSpec(pooled_shape(args, x.shape, oh, ow), x.dtype)]


def _cost_fn(extra_per_output: int):
    """kh·kw operations per pooled element (+ `extra_per_output`); inputs read, outputs written."""

    def fn(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
        x = ins[0]
        if len(x.shape) == 5:   # global pooling of a channel-blocked X
            n, blocks, h, w, block = x.shape
            return Cost(n * blocks * block * (h * w + extra_per_output), x.nbytes,
                        sum(o.nbytes for o in outs))
        g, _, oh, ow = _geometry(args, x.shape, f"X {x}")
        pooled = pooled_shape(args, x.shape, oh, ow)
        count = pooled[0] * pooled[1] * pooled[2] * pooled[3]
        return Cost(count * (g.kh * g.kw + extra_per_output), sum(i.nbytes for i in ins),
                    sum(o.nbytes for o in outs))

    return fn


def pool_setup(ctx, X):
    """Resolved geometry, output shape and (for averages) the divisor, kept in ctx.state."""
    cached = ctx.state.get("setup")
    if cached is None or cached[0] != X.shape:
        try:
            declared, g, oh, ow = _geometry(ctx.args, X.shape, "X " + "×".join(map(str, X.shape)))
        except ShapeError as e:
            raise ShapeError(f"op {ctx.def_.label}: {e}") from None
        divisor = None
        if ctx.def_.type.startswith("AveragePool"):
            divisor = _divisor(ctx, declared, g, X, oh, ow)
        cached = ctx.state["setup"] = (X.shape, g, oh, ow, divisor)
    return cached[1:]


def _divisor(ctx, declared: ConvGeometry, g: ConvGeometry, X, oh: int, ow: int):
    """Window sizes per output position, shaped to broadcast against Y.

    Caffe: hstart = oh·s - pad_t; hend = min(hstart + k, H + pad_b); size = hend - hstart
    (padding counts, the ceil-mode overhang beyond the padded image does not). With
    count_include_pad=0 the window is clipped to the image instead. Separable in h and w.
    """
    xp = ctx.xp
    ah, aw = _axes(ctx.args)
    h, w = X.shape[ah], X.shape[aw]
    tail_b, tail_r = declared.counted_tail_pads(h, w)

    def sizes(n_out, size, k, s, head, tail):
        start = xp.arange(n_out) * s - head
        end = xp.minimum(start + k, size + tail)
        if not ctx.args.count_include_pad:
            start, end = xp.maximum(start, 0), xp.minimum(end, size)
        return end - start

    rows = sizes(oh, h, g.kh, g.sh, g.pt, tail_b)
    cols = sizes(ow, w, g.kw, g.sw, g.pl, tail_r)
    div = (rows[:, None] * cols[None, :]).astype(X.dtype)
    return div[:, :, None] if ctx.args.order == "NHWC" else div   # (oH, oW[, 1])


def _register(type: str, args, extra: int, doc: str, grad_inputs: tuple[int, int],
              grad_doc: str) -> None:
    register_schema(type, inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                    args=args, shape_fn=_shape_fn, cost_fn=_cost_fn(extra), check_fn=_check,
                    family="pool", doc=doc)
    register_schema(f"{type}Gradient", inputs=grad_inputs, outputs=1,
                    input_names=("X", "Y", "dY"), output_names=("dX",), args=args,
                    shape_fn=same_as_input(0), cost_fn=_cost_fn(extra), check_fn=_check,
                    family="pool", doc=grad_doc)


def _in_blocks(ctx, fn, *arrays) -> None:
    """fn(scratch, *block slices) over batch blocks of about BLOCK_BYTES of input, the
    blocks split between threads (netrun.kernels.parallel): the kh·kw passes over a block's
    taps and buffers then run in cache, on every core."""
    n = arrays[0].shape[0]
    size = max(1, BLOCK_BYTES // max(1, arrays[0][:1].nbytes))

    def work(index, c0, c1):
        scratch = parallel.chunk_scratch(ctx.scratch, index)
        for n0 in range(c0, c1, size):
            fn(scratch, *(a[n0:min(n0 + size, c1)] for a in arrays))

    parallel.chunks(ctx.xp, n, work, work=arrays[0].size)


def check_pooled(ctx, role: str, a, shape) -> None:
    """ShapeError unless `a` (Y or dY of a gradient op) has the pooled output's shape."""
    if tuple(a.shape) != tuple(shape):
        raise ShapeError(f"op {ctx.def_.label}: {role} has shape {'×'.join(map(str, a.shape))} "
                         f"but the pooled output of X is {'×'.join(map(str, shape))}")


def _compiled(ctx, X=None) -> bool:
    """Whether this op runs the compiled kernels: engine enabled (NumPy arrays), NCHW and a
    dtype they are built for (netrun.kernels.jit.pool.DTYPES)."""
    return (ctx.args.order == "NCHW" and jit.enabled(ctx.xp)
            and (X is None or X.dtype in jit_pool.DTYPES))


def _in_planes(ctx, g: ConvGeometry, fn, *arrays, passes: int = 0) -> None:
    """fn(*planes) over batch chunks on the worker threads, each array's chunk viewed as
    C-contiguous planes (n·C, H, W): one compiled call per thread. `passes` over the
    elements (0: one per window tap)."""
    arrays = tuple(np.ascontiguousarray(a) for a in arrays)

    def work(index, n0, n1):
        fn(*(a[n0:n1].reshape(-1, a.shape[2], a.shape[3]) for a in arrays))

    # a kernel touches each element once per tap: cifar10_quick's pool3 (0.4M elements, 9
    # taps) is worth both threads, which plain element counts would not give it; LeNet's
    # pool2 in one pass (0.26M elements, 0.06 ms) is not worth a worker's wake-up (~0.1 ms)
    parallel.chunks(ctx.xp, arrays[0].shape[0], work,
                    work=sum(a.size for a in arrays) * (passes or g.kh * g.kw))


def _window_args(g: ConvGeometry) -> tuple[int, ...]:
    """The kernels' geometry arguments: kernel, stride and the top/left pads."""
    return g.kh, g.kw, g.sh, g.sw, g.pt, g.pl


@register_preparer("MaxPool", "MaxPoolGradient", "AveragePool", "AveragePoolGradient")
def _prepare(ctx) -> None:
    """Load the op's compiled float32 kernel at bind time (not in the first iteration), and
    for global pooling the one it runs on channel-blocked arrays."""
    if _compiled(ctx):
        jit_pool.prepare(ctx.def_.type)
    if ctx.args.global_pooling and jit.enabled(ctx.xp):
        jit_blocked.prepare()


# MaxPool ----------------------------------------------------------------------------------
_register("MaxPool", _POOL_ARGS, 0,
          doc="Maximum over each kernel window. Padding never wins (it is -inf); Caffe's ceil "
              "mode with legacy_pad=CAFFE_LEGACY_POOLING.",
          grad_inputs=(3, 3),
          grad_doc="dX: dY routed to the first maximum of each window in window order, found "
                   "again from X and Y (nothing is stored by the forward pass).")


def _pool_blocked(ctx, X, average: bool) -> bool:
    """Global pooling of a channel-blocked X into a blocked Y (the padding channels stay 0):
    one reduction over its pixels. False: X is not blocked."""
    spec = _blocked_global(ctx.args, TensorSpec(tuple(X.shape), str(X.dtype)))
    if spec is None:
        return False
    again = layouts.global_pool(ctx.xp, X, ctx.output(0, spec.shape, X.dtype), average)
    if again is not None:
        ctx.repeat_with(RepeatCall(again))
    return True


@register_kernel("MaxPool")
def max_pool(ctx, X):
    """Y = the running maximum over the window taps of X padded with -inf."""
    if _pool_blocked(ctx, X, average=False):
        return
    g, oh, ow, _ = pool_setup(ctx, X)
    Y = ctx.output(0, pooled_shape(ctx.args, X.shape, oh, ow), X.dtype)
    if _compiled(ctx, X):      # before tiled_pool: faster on LeNet's 2×2 s2 too (measured)
        one = jit_pool.disjoint_2x2(_window_args(g), X.shape[2:], Y.shape[2:])
        _in_planes(ctx, g, lambda x, y: jit_pool.max_forward(x, y, *_window_args(g)), X, Y,
                   passes=1 if one else 0)
        return
    if tiled_pool.applies(g, X.shape, oh, ow, ctx.args.order):   # LeNet's 2×2 s2
        _in_blocks(ctx, lambda s, x, y: tiled_pool.forward(ctx.xp, s, g, x, y), X, Y)
        return

    def block(scratch, x, y):
        win = windows.Windows(scratch, x.shape, g, _axes(ctx.args), oh, ow)
        yf = win.full("pool.y", X.dtype, alias=y)
        for t, tap in enumerate(win.taps(x, float("-inf"))):
            if t == 0:
                yf[...] = tap
            else:
                ctx.xp.maximum(yf, tap, out=yf)
        if win.junk:
            y[...] = win.crop(yf)

    _in_blocks(ctx, block, X, Y)


@register_kernel("MaxPoolGradient")
def max_pool_gradient(ctx, X, Y, dY):
    """dX: each dY added at the first tap whose value equals the window's maximum Y."""
    g, oh, ow, _ = pool_setup(ctx, X)
    check_pooled(ctx, "dY", dY, pooled_shape(ctx.args, X.shape, oh, ow))
    check_pooled(ctx, "Y", Y, pooled_shape(ctx.args, X.shape, oh, ow))
    dX = ctx.output(0, X.shape, X.dtype)
    if _compiled(ctx, X):
        _in_planes(ctx, g, lambda x, y, dy, dx: jit_pool.max_backward(x, y, dy, dx,
                                                                  *_window_args(g)),
                   X, Y, dY, dX)
        return
    if tiled_pool.applies(g, X.shape, oh, ow, ctx.args.order):
        _in_blocks(ctx, lambda s, x, dy, dx: tiled_pool.backward(ctx.xp, s, g, x, dy, dx),
                   X, dY, dX)
        return

    def block(scratch, x, y, dy, dx):
        win = windows.Windows(scratch, x.shape, g, _axes(ctx.args), oh, ow)
        taps = win.taps(x, float("-inf"))
        # junk columns: a NaN maximum is never hit, and a zero gradient adds nothing
        yf = win.full("pool.y", y.dtype, like=y, junk=float("nan"))
        dyf = win.full("pool.dy", dy.dtype, like=dy, junk=0.0)
        # a NaN window has no hit and could hide a tie elsewhere from the hit count
        unique_ok = not ctx.xp.isnan(y).any()
        if not (unique_ok and _route_unique(ctx.xp, scratch, win, taps, yf, dyf, dx, y.size)):
            _route_first(ctx.xp, scratch, win, taps, yf, dyf, dx)

    _in_blocks(ctx, block, X, Y, dY, dX)


def _route_unique(xp, scratch, win, taps, yf, dyf, dX, windows_count: int) -> bool:
    """The fast path: route dY to every tap equal to Y; False if some window had a tie, i.e.
    the hits do not number exactly one per window (Y has no NaN), and the exact path must run."""
    g = win.g
    disjoint = g.sh >= g.kh and g.sw >= g.kw      # every pixel lies in at most one window
    acc = win.accumulator(dX, zero=not (disjoint and win.covers_once()))
    hit = scratch("pool.hit", yf.shape, "bool")
    part = scratch("pool.part", yf.shape, dyf.dtype)
    hits = 0
    for tap, target in zip(taps, acc.views):
        xp.equal(tap, yf, out=hit)
        hits += int(xp.count_nonzero(hit))
        if disjoint:   # each pixel written once: straight into the buffer, no accumulation
            xp.multiply(dyf, hit, out=target)
        else:
            xp.multiply(dyf, hit, out=part)
            target += part
    if hits != windows_count:
        return False
    acc.finish()
    return True


def _route_first(xp, scratch, win, taps, yf, dyf, dX) -> None:
    """The exact path: ties go to the first tap in window order (Caffe's argmax)."""
    acc = win.accumulator(dX)
    taken = scratch("pool.taken", yf.shape, "bool")   # windows routed already
    hit = scratch("pool.hit", yf.shape, "bool")
    part = scratch("pool.part", yf.shape, dyf.dtype)
    taken.fill(False)
    for tap, target in zip(taps, acc.views):
        xp.equal(tap, yf, out=hit)
        xp.greater(hit, taken, out=hit)      # hit and not taken: ties go to the first tap
        xp.logical_or(taken, hit, out=taken)
        xp.multiply(dyf, hit, out=part)
        target += part
    acc.finish()


@register_gradient("MaxPool")
def _max_pool_grad(g):
    return [g.op("MaxPoolGradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)], **g.copy_args())]


# AveragePool ------------------------------------------------------------------------------
_register("AveragePool", _AVG_ARGS, 1,
          doc="Mean over each kernel window. Divisor (Caffe's rule, count_include_pad=1): the "
              "window clipped to the padded image [-pad_t, H + pad_b), so padding counts but the "
              "ceil-mode overhang beyond it does not; count_include_pad=0 clips the window to "
              "the image.",
          grad_inputs=(2, 3),
          grad_doc="dX: each dY spread evenly (by the forward divisor) over its window. Inputs "
                   "(X, dY), or Caffe2's (X, Y, dY) where Y is not read; X gives the shape.")


@register_kernel("AveragePool")
def average_pool(ctx, X):
    """Y = the sum over the window taps of X padded with 0, divided by Caffe's window size."""
    if _pool_blocked(ctx, X, average=True):
        return
    g, oh, ow, divisor = pool_setup(ctx, X)
    Y = ctx.output(0, pooled_shape(ctx.args, X.shape, oh, ow), X.dtype)
    if _compiled(ctx, X):
        _in_planes(ctx, g, lambda x, y: jit_pool.avg_forward(x, y, divisor, *_window_args(g)),
                   X, Y)
        return

    def block(scratch, x, y):
        win = windows.Windows(scratch, x.shape, g, _axes(ctx.args), oh, ow)
        yf = win.full("pool.y", X.dtype, alias=y)
        for t, tap in enumerate(win.taps(x, 0.0)):
            if t == 0:
                yf[...] = tap
            else:
                yf += tap
        ctx.xp.divide(win.crop(yf), divisor, out=y)

    _in_blocks(ctx, block, X, Y)


@register_kernel("AveragePoolGradient")
def average_pool_gradient(ctx, X, *rest):
    """dX: dY / divisor added at every tap of its window; the last input is dY."""
    dY = rest[-1]
    blocked = _blocked_global(ctx.args, TensorSpec(tuple(X.shape), str(X.dtype)))
    if blocked is not None:   # one window of H·W pixels, the channel blocks kept
        check_pooled(ctx, "dY", dY, blocked.shape)
        ctx.xp.divide(dY, X.shape[2] * X.shape[3], out=ctx.output(0, X.shape, X.dtype))
        return
    g, oh, ow, divisor = pool_setup(ctx, X)
    check_pooled(ctx, "dY", dY, pooled_shape(ctx.args, X.shape, oh, ow))
    dX = ctx.output(0, X.shape, X.dtype)
    if _compiled(ctx, X):
        _in_planes(ctx, g, lambda dy, dx: jit_pool.avg_backward(dy, dx, divisor,
                                                             *_window_args(g)), dY, dX)
        return

    def block(scratch, dy, dx):
        win = windows.Windows(scratch, dx.shape, g, _axes(ctx.args), oh, ow)
        share = win.full("pool.share", dY.dtype, junk=0.0)
        ctx.xp.divide(dy, divisor, out=win.crop(share))
        acc = win.accumulator(dx)
        for target in acc.views:
            target += share
        acc.finish()

    _in_blocks(ctx, block, dY, dX)


@register_gradient("AveragePool")
def _average_pool_grad(g):
    return [g.op("AveragePoolGradient", [g.I(0), g.GO(0)], [g.GI(0)], **g.copy_args())]
