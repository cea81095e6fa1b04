"""Layout reorders: NCHWToBlocked and BlockedToNCHW, the boundaries of the channel-blocked
regions the bind-time layout plan (netrun.rewrite.layout) keeps between oneDNN convolutions
(Caffe2's IDEEP had CopyCPUToIDEEP / CopyIDEEPToCPU for the same job). Blocked is
N × ⌈C/B⌉ × H × W × B, the channels zero-padded to whole blocks. Each section: schema,
kernel, gradient maker: the other reorder, told the forward input's layout by a second
input (`Like`), since a gradient maker sees no shapes."""
from __future__ import annotations

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel, register_preparer
from netrun.core.schema import Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import ShapeError
from netrun.kernels import jit, layout
from netrun.kernels.jit import blocked as jit_blocked
from netrun.ops.common import fmt


def _cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    return Cost(0, ins[0].nbytes, outs[0].nbytes)


# NCHWToBlocked --------------------------------------------------------------------------
def _to_blocked_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    if len(ins[0].shape) != 4:
        raise ShapeError(f"NCHWToBlocked: X must be 4-D (NCHW), got {fmt(ins[0].shape)}")
    block = args.block
    if len(ins) > 1:
        if len(ins[1].shape) != 5:
            raise ShapeError(f"NCHWToBlocked: Like must be 5-D (blocked), got "
                             f"{fmt(ins[1].shape)}")
        block = ins[1].shape[4]
    return [TensorSpec(layout.blocked_shape(ins[0].shape, block), ins[0].dtype)]


register_schema("NCHWToBlocked", inputs=(1, 2), outputs=1, input_names=("X", "Like"),
                output_names=("Y",),
                args=[Arg("block", "int", 8, (8, 16), "channels per block (B), unless Like "
                                                      "is given")],
                shape_fn=_to_blocked_shape, cost_fn=_cost, family="layout",
                doc="Y (N×⌈C/B⌉×H×W×B, channels zero-padded to whole blocks) = X (N×C×H×W): "
                    "into oneDNN's channel-blocked layout; B from a blocked Like if given.")


@register_kernel("NCHWToBlocked")
def nchw_to_blocked(ctx, X, Like=None):
    """Y = X reordered into blocks of B channels."""
    specs = [TensorSpec(X.shape)] + ([] if Like is None else [TensorSpec(Like.shape)])
    out = _to_blocked_shape(ctx.args, specs)[0]
    layout.to_blocked(ctx.xp, X, ctx.output(0, out.shape, X.dtype))


@register_gradient("NCHWToBlocked")
def _to_blocked_grad(g):
    return [g.op("BlockedToNCHW", [g.GO(0), g.I(0)], [g.GI(0)])]


# BlockedToNCHW --------------------------------------------------------------------------
def _to_nchw_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    shape = ins[0].shape
    if len(shape) != 5:
        raise ShapeError(f"BlockedToNCHW: X must be 5-D (N×⌈C/B⌉×H×W×B), got {fmt(shape)}")
    n, blocks, h, w, block = shape
    c = args.channels if args.channels > 0 else blocks * block
    if len(ins) > 1:
        if len(ins[1].shape) != 4:
            raise ShapeError(f"BlockedToNCHW: Like must be 4-D (NCHW), got {fmt(ins[1].shape)}")
        c = ins[1].shape[1]
    if -(-c // block) != blocks:
        raise ShapeError(f"BlockedToNCHW: {c} channels do not fill {blocks} blocks of {block} "
                         f"(X {fmt(shape)})")
    return [TensorSpec((n, c, h, w), ins[0].dtype)]


register_schema("BlockedToNCHW", inputs=(1, 2), outputs=1, input_names=("X", "Like"),
                output_names=("Y",),
                args=[Arg("channels", "int", -1,
                          doc="C, the channels without the padding (unless Like is given); "
                              "-1: every block full")],
                shape_fn=_to_nchw_shape, cost_fn=_cost, family="layout",
                doc="Y (N×C×H×W) = X (N×⌈C/B⌉×H×W×B): out of oneDNN's channel-blocked "
                    "layout, the padding channels dropped; C from an NCHW Like if given.")


@register_kernel("BlockedToNCHW")
def blocked_to_nchw(ctx, X, Like=None):
    """Y = X reordered from blocks of B channels into NCHW."""
    specs = [TensorSpec(X.shape)] + ([] if Like is None else [TensorSpec(Like.shape)])
    out = _to_nchw_shape(ctx.args, specs)[0]
    layout.to_nchw(ctx.xp, X, ctx.output(0, out.shape, X.dtype))


@register_gradient("BlockedToNCHW")
def _to_nchw_grad(g):
    return [g.op("NCHWToBlocked", [g.GO(0), g.I(0)], [g.GI(0)])]


@register_preparer("NCHWToBlocked", "BlockedToNCHW")
def _prepare(ctx) -> None:
    """Load the compiled reorders at bind time (not in the first iteration)."""
    if jit.enabled(ctx.xp):
        jit_blocked.prepare()
