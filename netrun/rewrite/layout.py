"""The layout plan: keep activations channel-blocked between oneDNN's convolutions.

oneDNN's direct kernels run on channels in blocks of B (8 with AVX2, 16 with AVX-512):
N × ⌈C/B⌉ × H × W × B. Converting NCHW into that layout and back around every convolution
costs two passes over memory per layer, more than a small layer's arithmetic. Planned once at
bind (the IDEEP design), a value stays blocked from the conv that writes it to the convs and
elementwise ops that read it, and reorder ops (netrun.ops.layout) sit only at the boundaries
of such regions: where an op that knows only NCHW reads a blocked value, and where an
elementwise op mixes layouts. An FC or a Flatten reads a global pooling's blocked result as
it is: one pixel in whole blocks is NCHW's order already.

Which values are blocked: the output of a Conv that can run on oneDNN (2-D, NCHW, group 1,
float32 filters, no other fixed algorithm) when at least one reader can take it blocked, the
value is not one the caller keeps, and its name is written once in the net (no in-place
reuse that would make one name hold two layouts); and the output of an elementwise op whose
inputs are all blocked (Relu, AddRelu, a plain Add, Sum: the same arithmetic in any layout,
as the padding channels stay 0; and global pooling, which keeps the channel blocks), which
then reorders its one result where needed rather than each of its inputs. Every kept value
and net output stays NCHW.

Channels-last: on AVX2 (blocks of 8), an inference plan holds a convolution's output as one
block of all its channels, oneDNN's NHWC (`channels_last`), where oneDNN's BRGEMM kernels run
it faster than its direct kernels run the blocks of 8: 3×3 layers of 64+ channels (ResNet-20's
64-channel 8×8 layers at batch 128: 4.9 against 6.8 ms), in a region where every reader takes
that layout too, as X or as the residual of another such convolution, or a global pooling.
1×1 stride-1 layers stay in blocks (ResNet-50's: 8.0 against 5.9 ms in NHWC), and so a
region that reaches one, which keeps ResNet-50 as it was.

A training net's forward ops are planned the same way before its backward pass is built
(netrun.rewrite.apply), and batch normalization in training (SpatialBN, SpatialBNRelu)
joins the ops that keep a blocked value blocked: a residual net's activations then stay
blocked from its first convolution to its pooling, and so do their gradients, which the
gradient registry makes from the planned ops (a reorder's gradient is the other reorder).
Batch normalization would make padding channels nonzero, so a training plan blocks only
convolutions whose channels fill whole blocks. And a training net is planned only where
most of its convolution work is of the kinds NCHW training runs on oneDNN anyway: blocked,
every convolution runs oneDNN's kernels, and where netrun's own win in NCHW (1×1 layers on
GEMM, 3×3 layers of 64+ channels on Winograd: netrun.conv.rules) the reorders saved do not
pay for it. ResNet-50's step at batch 8 took 1.05-1.07× as long planned (its 3×3 layers'
gradients 680 ms on oneDNN against 430 on Winograd); ResNet-20's, 70% of whose work is 3×3
layers of 16 and 32 channels, 0.875-0.93×.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from netrun.conv import rules
from netrun.kernels.geometry import ConvGeometry
from netrun.proto.defs import OperatorDef
from netrun.rewrite.graph import Graph
from netrun.rewrite.rule import Context

ELEMENTWISE = ("Relu", "AddRelu", "Add", "Sum")
# Output channels from which a convolution's output may be held channels-last (module doc),
# and the channel block (AVX2's) with which oneDNN's BRGEMM kernels were measured to win.
CHANNELS_LAST_MIN = 64
CHANNELS_LAST_BLOCK = 8


@dataclass
class LayoutPlan:
    """The ops with their layouts planned, the ops made blocked, the reorders inserted."""

    ops: list[OperatorDef]
    blocked: list[str] = field(default_factory=list)     # labels of the ops made blocked
    channels_last: list[str] = field(default_factory=list)   # those of them channels-last
    reorders: list[str] = field(default_factory=list)    # labels of the reorder ops added


def _conv_capable(o: OperatorDef, ctx: Context, whole: int = 0) -> bool:
    """Whether Conv o can run on oneDNN in blocked layouts (with whole > 0: and its filters
    fill whole blocks of `whole` channels)."""
    a = o.args
    if (o.type != "Conv" or a.get("order", "NCHW") != "NCHW" or int(a.get("group", 1)) != 1
            or a.get("algo", "") not in ("", "onednn") or int(a.get("blocked", 0))):
        return False
    w = o.inputs[1]
    shape = ctx.shape_of(w) or ()
    return (len(shape) == 4 and ctx.dtype_of(w) == "float32"
            and (not whole or shape[0] % whole == 0))


def _normalizes(o: OperatorDef) -> bool:
    """Whether o is batch normalization over NCHW's channel axis (blocked in training: its
    first output takes its X's layout, the statistics stay per-channel vectors)."""
    return o.type in ("SpatialBN", "SpatialBNRelu") and o.args.get("order", "NCHW") == "NCHW"


def _elementwise(o: OperatorDef) -> bool:
    """Whether o computes the same on blocked arrays: elementwise ops, and global pooling
    (its reduction over the spatial axes keeps the channel blocks)."""
    if o.type in ("MaxPool", "AveragePool"):
        return (int(o.args.get("global_pooling", 0)) == 1 and len(o.outputs) == 1
                and o.args.get("order", "NCHW") == "NCHW")
    if o.type not in ELEMENTWISE or not o.inputs or len(o.outputs) != 1:
        return False
    return o.type != "Add" or (len(o.inputs) == 2 and not int(o.args.get("broadcast", 0)))


def _flattens_channels(o: OperatorDef) -> bool:
    """Whether o reads its X flattened from the channels on (an FC or a Flatten at axis 1):
    of one pixel and whole blocks, N × C/B × 1 × 1 × B flattens to N × C in NCHW's order, so
    a classifier's head reads global pooling's blocked result without a reorder."""
    return o.type in ("FC", "Flatten") and int(o.args.get("axis", 1)) == 1


def _netrun_kind(o: OperatorDef, ctx: Context) -> bool:
    """Whether NCHW training runs Conv o on netrun's own kernels rather than oneDNN's: a 1×1
    layer (GEMM), or a 3×3 stride-1 layer of ONEDNN_WINOGRAD_CHANNELS+ both ways (Winograd)."""
    k, c, kh, kw = ctx.shape_of(o.inputs[1])
    if kh == kw == 1:
        return True
    strides = ConvGeometry.from_args(o.args)
    return ((kh, kw, strides.sh, strides.sw) == (3, 3, 1, 1)
            and min(c, k) >= rules.ONEDNN_WINOGRAD_CHANNELS)


def _worth_training_plan(ops: list[OperatorDef], ctx: Context, block: int) -> bool:
    """Whether at least half of a training net's work in the convolutions a plan would block
    is of the kinds NCHW training runs on oneDNN anyway (see the module doc)."""
    ours = theirs = 0
    for o in ops:
        if not _conv_capable(o, ctx, block):
            continue
        k, c, kh, kw = ctx.shape_of(o.inputs[1])
        out = ctx.shape_of(o.outputs[0])
        work = k * c * kh * kw * (out[-1] * out[-2] if out and len(out) == 4 else 1)
        if _netrun_kind(o, ctx):
            ours += work
        else:
            theirs += work
    return theirs >= ours


def _global_pool(o: OperatorDef) -> bool:
    return o.type in ("MaxPool", "AveragePool") and _elementwise(o)


def _channels_last(ops: list[OperatorDef], g: Graph, ctx: Context, candidate) -> set[int]:
    """The convs (indices) whose outputs an inference plan holds channels-last: of the
    `candidate` convs with CHANNELS_LAST_MIN+ output channels other than 1×1 stride 1, those
    in a region that only such convs (as X, or as the residual S, which is in the output's
    layout) and global poolings read."""
    chosen = set()
    for i, o in enumerate(ops):
        if not candidate(i):
            continue
        k, _, kh, kw = ctx.shape_of(o.inputs[1])
        geom = ConvGeometry.from_args(o.args)
        if k >= CHANNELS_LAST_MIN and (kh * kw > 1 or (geom.sh, geom.sw) != (1, 1)):
            chosen.add(i)
    changed = True
    while changed:   # a conv dropped can leave the convs that feed it a reader outside
        changed = False
        for i in sorted(chosen):
            # a residual is summed in the output's layout: an NCHW one (a net input, a
            # value outside the region) would be reordered into blocks of 8
            residual_ok = len(ops[i].inputs) <= 3 or (
                g.producers.get((i, 3), (None,))[0] in chosen)
            readers_ok = all((j in chosen and slot in (0, 3)) or _global_pool(ops[j])
                             for j, slot in g.readers.get((i, 0), []))
            if not (readers_ok and residual_ok):
                chosen.discard(i)
                changed = True
    return chosen


def plan_layouts(ops: list[OperatorDef], keep: set[str], block: int,
                 ctx: Context, training: bool = False) -> LayoutPlan:
    """The plan for channel blocks of `block`, as described in the module doc (training: a
    training net's forward ops)."""
    if training and not _worth_training_plan(ops, ctx, block):
        return LayoutPlan(list(ops))
    g = Graph(ops, keep)
    writes: dict[str, int] = {}
    for o in ops:
        for name in o.outputs:
            writes[name] = writes.get(name, 0) + 1

    def conv_capable(o: OperatorDef) -> bool:
        return _conv_capable(o, ctx, block if training else 0)

    def normalizes(o: OperatorDef) -> bool:
        return training and _normalizes(o)

    capable = [conv_capable(o) or _elementwise(o) or normalizes(o) for o in ops]

    def _holds_one_value(i: int, name: str) -> bool:
        """Whether `name`, op i's first output, is written once and kept by nobody."""
        return name not in keep and writes[name] == 1 and (i, 0) not in g.observable

    def may_block(i: int) -> bool:
        """Whether op i's output may be held blocked (see the module doc)."""
        readers = g.readers.get((i, 0), [])
        return _holds_one_value(i, ops[i].outputs[0]) and any(capable[j] for j, _ in readers)

    wide = set() if training or block != CHANNELS_LAST_BLOCK else _channels_last(
        ops, g, ctx, lambda i: conv_capable(ops[i]) and may_block(i))
    out = LayoutPlan([])
    channels: dict[str, int] = {}     # blocked value name -> its channels (C, unpadded)
    blocks: dict[str, int] = {}       # blocked value name -> its block (B, or C: channels-last)
    pixel: set[str] = set()           # blocked values of one pixel (global pooling's)
    copies: dict[str, str] = {}       # blocked value name -> its NCHW copy's name
    blocked_in: dict[str, str] = {}   # NCHW name -> its blocked copy's name

    def nchw(name: str) -> str:
        """`name` as NCHW: itself, or a reorder's output inserted before the reader."""
        if name not in channels:
            return name
        if name not in copies:
            copies[name] = ctx.fresh(f"{name}_nchw")
            _reorder(out, OperatorDef("BlockedToNCHW", (name,), (copies[name],),
                                      {"channels": channels[name]}, f"{name}_to_nchw"))
        return copies[name]

    def as_blocked(name: str) -> str:
        """`name` as blocked: itself, or a reorder's output inserted before the reader."""
        if name in channels:
            return name
        if name not in blocked_in:
            blocked_in[name] = ctx.fresh(f"{name}_blocked")
            _reorder(out, OperatorDef("NCHWToBlocked", (name,), (blocked_in[name],),
                                      {"block": block}, f"{name}_to_blocked"))
        return blocked_in[name]

    # NCHW values that several blocked-capable convs read (with ≥ B channels, which oneDNN
    # would reorder in each of them): reordered once, before the first
    shared = {}
    for i, o in enumerate(ops):
        if conv_capable(o) and ctx.shape_of(o.inputs[1])[1] >= block:
            value = g.producers.get((i, 0), o.inputs[0])
            shared[value] = shared.get(value, 0) + 1

    for i, o in enumerate(ops):
        x = o.inputs[0] if o.inputs else None
        if (conv_capable(o) and x not in channels
                and shared.get(g.producers.get((i, 0), x), 0) > 1):
            o = o.with_(inputs=(as_blocked(x), *o.inputs[1:]))
        if conv_capable(o) and may_block(i):
            ins = list(o.inputs)
            if len(ins) > 3:   # the residual is summed in the output's layout
                ins[3] = as_blocked(ins[3])
            k = ctx.shape_of(o.inputs[1])[0]
            made = o.with_(inputs=tuple(ins), args={**o.args, "blocked": k if i in wide
                                                    else block})
            channels[o.outputs[0]], blocks[o.outputs[0]] = k, (k if i in wide else block)
            out.blocked.append(made.label)
            if i in wide:
                out.channels_last.append(made.label)
        elif conv_capable(o):   # reads X blocked or not; writes NCHW
            made = o.with_(inputs=(o.inputs[0], *map(nchw, o.inputs[1:])))
        elif normalizes(o) and o.inputs[0] in channels and _holds_one_value(i, o.outputs[0]):
            # Y blocked like X; the scale, bias and statistics are per-channel vectors
            made = o.with_(inputs=(o.inputs[0], *map(nchw, o.inputs[1:])),
                           args={**o.args, "blocked": block})
            channels[o.outputs[0]], blocks[o.outputs[0]] = channels[o.inputs[0]], block
            out.blocked.append(made.label)
        elif (_elementwise(o) and all(n in channels for n in o.inputs)
              and len({(channels[n], blocks[n]) for n in o.inputs}) == 1):
            # blocked even when no reader takes it so: one reorder of the result instead of
            # one per input; a kept (or rewritten) name gets it through a fresh blocked twin
            name, width = o.outputs[0], channels[o.inputs[0]]
            twin = name if _holds_one_value(i, name) else ctx.fresh(f"{name}_blocked")
            made = o if twin == name else o.with_(outputs=(twin,))
            channels[twin], blocks[twin] = width, blocks[o.inputs[0]]
            if o.type in ("MaxPool", "AveragePool"):
                pixel.add(twin)
            out.blocked.append(made.label)
            if blocks[twin] != block:
                out.channels_last.append(made.label)
            if twin != name:
                out.ops.append(made)
                made = OperatorDef("BlockedToNCHW", (twin,), (name,), {"channels": width},
                                   f"{name}_to_nchw")
                out.reorders.append(made.label)
        else:
            # a blocked X of one pixel in whole blocks is NCHW's order to a flattening reader
            flat = (_flattens_channels(o) and o.inputs[0] in pixel
                    and channels[o.inputs[0]] % blocks[o.inputs[0]] == 0)
            made = o.with_(inputs=tuple(n if k == 0 and flat else nchw(n)
                                        for k, n in enumerate(o.inputs))) if any(
                n in channels for n in o.inputs) else o
        out.ops.append(made)
        for name in made.outputs:   # a blocked copy of the name's old value is stale now
            blocked_in.pop(name, None)
    return out


def _reorder(plan: LayoutPlan, op: OperatorDef) -> None:
    plan.ops.append(op)
    plan.reorders.append(op.label)
