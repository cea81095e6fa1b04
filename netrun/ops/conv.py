"""Convolution: Conv, ConvTranspose and their gradients (Caffe2's conv_op / conv_transpose_op).

The arithmetic lives in `netrun.conv`; these ops resolve the geometry and, per input shape
and direction, pick an algorithm (the `algo` argument, else the workspace's mode: rules, a
timing search remembered on disk, or deterministic rules; see `netrun.conv.select.choose`)
and keep it in their plan (`ctx.state["plan"]`, a ConvPlan). The same kernels serve every
backend: the algorithms come from the backend's own set.
Algorithms are NCHW-only: for order=NHWC the op transposes its inputs into scratch buffers
and its outputs back (filters: Caffe2's NHWC layout M × kh × kw × C/G, i.e. the same
(0, 3, 1, 2) transpose).

Conv's `relu` argument (set by the bind-time rewrites in netrun.rewrite) applies ReLU to
the output: inside the algorithm's forward when it `fuses_relu` (a post-op), else in place
right after it. Its gradient is ReluGradient on the output, then ConvGradient.

Conv's `blocked` argument (set by the bind-time layout plan, netrun.rewrite.layout) makes Y
channel-blocked, N × ⌈M/B⌉ × oH × oW × B with the channels zero-padded to whole blocks, the
layout oneDNN's direct kernels run on; a 5-D X is read as blocked the same way, and a
residual S is blocked like Y. Such an op runs on the "onednn" algorithm alone (the only one
that reads and writes these layouts), so activations stay blocked from conv to conv and are
reordered only where the plan put a reorder op (netrun.ops.layout).

Gradient ops take (X, W, dY) and write dW, then db unless `no_bias`, then dX: dX is left
out when nobody wants it (the first conv of a net), so its presence is the output count.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from netrun.conv import ConvPlan, ConvProblem, choose, op_directions, warm_up
from netrun.conv.algorithm import KeptFilters, algorithm_names
from netrun.conv.cpu import jit_depthwise, jit_winograd
from netrun.conv.rules import fixed_algorithm
from netrun.conv.select import run_direction
from netrun.core.gradient import register_gradient
from netrun.core.memory import register_bind_warmup, register_scratch_estimate
from netrun.core.registry import register_kernel, register_preparer
from netrun.core.schema import Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import SchemaError, ShapeError, suggest
from netrun.kernels import jit, parallel
from netrun.kernels import relu as relu_kernels
from netrun.kernels.geometry import ConvGeometry
from netrun.kernels.jit import blocked as jit_blocked
from netrun.kernels.jit import im2col as jit_im2col
from netrun.kernels.onednn.conv import NATIVE_BLOCKS, Layout
from netrun.ops.common import conv_pool_args

CONV_TYPES = ("Conv", "ConvGradient", "ConvTranspose", "ConvTransposeGradient")

_COMMON = conv_pool_args() + (
    Arg("group", "int", 1, doc="channel groups; group = C is a depthwise convolution"),
    Arg("algo", "str", "", doc="fixed algorithm (" + ", ".join(algorithm_names())
        + "); '' = automatic; a CPU name means its GPU counterpart on a GPU and vice versa"),
    Arg("no_bias", "int", 0, allowed=(0, 1), doc="1: there is no bias input (and no db output)"))
_ADJ = (Arg("adj", "int", None, doc="extra output rows/cols at the end, both axes (< stride)"),
        Arg("adj_h", "int", None, doc="extra output rows at the bottom"),
        Arg("adj_w", "int", None, doc="extra output columns at the right"),
        Arg("adjs", "ints", None, doc="adj as [h, w]"))


def _check(op, args: Args, transposed: bool, gradient: bool) -> None:
    """Build-time rules beyond single argument types; SchemaError names the op and argument."""
    geom = ConvGeometry.from_args(args, op.label)
    if geom.legacy_pad == "CAFFE_LEGACY_POOLING":
        raise SchemaError(f"op {op.label}: argument 'legacy_pad' is CAFFE_LEGACY_POOLING, which "
                          f"is for pooling ops")
    if args.group < 1:
        raise SchemaError(f"op {op.label}: argument 'group' must be at least 1, got {args.group}")
    known = algorithm_names()
    if args.algo and args.algo not in known:
        raise SchemaError(f"op {op.label}: argument 'algo' is '{args.algo}', an unknown algorithm"
                          f"{suggest(args.algo, known)} (known: {', '.join(known)})")
    if transposed:
        adj = _adj(args, op.label)
        if adj[0] >= geom.sh or adj[1] >= geom.sw:
            raise SchemaError(f"op {op.label}: argument 'adj' must be smaller than the stride "
                              f"{geom.sh}×{geom.sw}, got {adj[0]}×{adj[1]}")
    if gradient:
        least = 2 if args.no_bias else 3
        if len(op.outputs) not in (least - 1, least):
            raise SchemaError(f"op {op.label}: with no_bias={args.no_bias} the outputs are dW"
                              f"{'' if args.no_bias else ', db'}[, dX], got {len(op.outputs)}")
    elif args.no_bias and len(op.inputs) == 3:
        raise SchemaError(f"op {op.label}: argument 'no_bias' is 1 but a bias input is given")


def _adj(args: Args, label: str = "") -> tuple[int, int]:
    if args.get("adj") is not None:
        value = (args.adj, args.adj)
    elif args.get("adjs") is not None:
        if len(args.adjs) != 2:
            raise SchemaError(f"op {label}: argument 'adjs' needs 2 values [h, w], got {args.adjs}")
        value = tuple(args.adjs)
    else:
        value = (args.get("adj_h") or 0, args.get("adj_w") or 0)
    if min(value) < 0:
        raise SchemaError(f"op {label}: argument 'adj' must not be negative, got {list(value)}")
    return value


def _nchw(shape, nhwc: bool) -> tuple[int, ...]:
    """A 4-D shape (data or filter) in NCHW order; NHWC shapes are permuted (0, 3, 1, 2)."""
    return (shape[0], shape[3], shape[1], shape[2]) if nhwc else tuple(shape)


def _layout(shape, nhwc: bool) -> tuple[int, ...]:
    """An NCHW shape in the op's order."""
    return (shape[0], shape[2], shape[3], shape[1]) if nhwc else tuple(shape)


BLOCKED_ALGORITHM = "onednn"   # the one algorithm that reads and writes blocked layouts


def _blocks(args: Args, x: TensorSpec) -> tuple[int, int]:
    """(X's channel block, Y's channel block) of a Conv; 0 where the array is in `order`."""
    return (x.shape[4] if len(x.shape) == 5 else 0), int(args.get("blocked") or 0)


def _unblocked_x(args: Args, x: TensorSpec, w: TensorSpec) -> TensorSpec:
    """X's NCHW spec when X is channel-blocked (N × ⌈C/B⌉ × H × W × B; C from W)."""
    if len(x.shape) != 5:
        return x
    if args.order != "NCHW" or args.group != 1 or len(w.shape) != 4:
        raise ShapeError(f"a channel-blocked X {x} needs order NCHW, group 1 and a 4-D W, "
                         f"got order {args.order}, group {args.group}, W {w}")
    n, blocks, h, wd, block = x.shape
    c = w.shape[1]
    if -(-c // block) != blocks:
        raise ShapeError(f"W expects {c} channels but the blocked X {x} holds {blocks} "
                         f"blocks of {block}")
    _check_block("X", block, c)
    return TensorSpec((n, c, h, wd), x.dtype)


def _check_block(what: str, block: int, channels: int) -> None:
    """A block of oneDNN's (8, 16), or one block of every channel (channels-last: NHWC)."""
    if block not in NATIVE_BLOCKS and block != channels:
        raise ShapeError(f"{what}'s channel block {block} is neither one of oneDNN's "
                         f"({', '.join(map(str, NATIVE_BLOCKS))}) nor its {channels} channels "
                         f"(channels-last, one block)")


def _conv_problem(args: Args, ins: list[TensorSpec], transposed: bool,
                  ) -> tuple[ConvProblem, tuple[int, ...]]:
    """The (equivalent) convolution's problem and the op's output shape; ShapeError on misfit."""
    w = ins[1]
    x = ins[0] if transposed else _unblocked_x(args, ins[0], w)
    for role, spec in (("X", x), ("W", w)):
        if len(spec.shape) != 4:
            raise ShapeError(f"{role} must be 4-D ({args.order}) for a 2-D convolution, got {spec}")
    nhwc, g = args.order == "NHWC", args.group
    n, c, h, wd = _nchw(x.shape, nhwc)
    w0, w1, kh, kw = _nchw(w.shape, nhwc)
    geom = ConvGeometry.from_args(args)
    if (kh, kw) != (geom.kh, geom.kw):
        raise ShapeError(f"W has a {kh}×{kw} kernel but the op's kernel argument is "
                         f"{geom.kh}×{geom.kw}: W {w}")
    if transposed:   # W is C_in × C_out/G × kh × kw
        if w0 != c or c % g:
            raise ShapeError(f"X has {c} channels but W expects {w0} (group {g}): X {x}, W {w}")
        m = w1 * g
        ah, aw = _adj(args)
        if geom.legacy_pad != "NOTSET":   # Caffe2: VALID and SAME both mean no padding here
            geom = ConvGeometry(geom.kh, geom.kw, geom.sh, geom.sw, dh=geom.dh, dw=geom.dw)
        dkh, dkw = geom.dilated_kernel
        oh = (h - 1) * geom.sh - geom.pt - geom.pb + dkh + ah
        ow = (wd - 1) * geom.sw - geom.pl - geom.pr + dkw + aw
        if oh < 1 or ow < 1:
            raise ShapeError(f"X {x} gives an empty {oh}×{ow} output: the pads "
                             f"{list(geom.pads)} crop more than the transposed conv makes")
        # The equivalent conv reads ConvTranspose's output and writes its input.
        problem = ConvProblem.make((n, m, oh, ow), (c, w1), geom, g, x.dtype, args.order)
    else:            # W is M × C/G × kh × kw
        if w1 * g != c:
            raise ShapeError(f"X has {c} channels but W expects {w1}×group {g} = {w1 * g}: "
                             f"X {x}, W {w}")
        m = w0
        if m % g:
            raise ShapeError(f"W has {m} filters, not divisible by group {g}: W {w}")
        geom = geom.resolve(h, wd, f"X {x}")
        problem = ConvProblem.make((n, c, h, wd), (m,), geom, g, x.dtype, args.order)
        oh, ow = problem.oh, problem.ow
    if len(ins) > 2 and tuple(ins[2].shape) != (m,):
        raise ShapeError(f"b has shape {ins[2]} but the op has {m} output channels: "
                         f"b {ins[2]}, W {w}")
    block = int(args.get("blocked") or 0)
    if block and not transposed:
        if nhwc or g != 1:
            raise ShapeError(f"a channel-blocked Y needs order NCHW and group 1, got order "
                             f"{args.order}, group {g}")
        _check_block("Y", block, m)
        return problem, (n, -(-m // block), oh, ow, block)
    return problem, _layout((n, m, oh, ow), nhwc)


def _conv_flops(p: ConvProblem) -> int:
    """2·N·K·C/G·kh·kw·oH·oW multiply-adds of the (equivalent) convolution."""
    return 2 * p.n * p.k * p.cg * p.kh * p.kw * p.oh * p.ow


def _make_shape_fn(transposed: bool):
    def shape_fn(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
        out = _conv_problem(args, ins[:3], transposed)[1]
        if len(ins) > 3 and tuple(ins[3].shape) != tuple(out):
            raise ShapeError(f"the residual S has shape {ins[3]} but the output is "
                             f"{'×'.join(map(str, out))}")
        return [TensorSpec(out, ins[0].dtype)]
    return shape_fn


def _make_cost_fn(transposed: bool):
    def cost_fn(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
        flops = _conv_flops(_conv_problem(args, ins[:2], transposed)[0])
        bias = outs[0].size * (len(ins) - 2)   # the bias and a residual: one add each
        return Cost(flops + bias, sum(i.nbytes for i in ins), sum(o.nbytes for o in outs))
    return cost_fn


def _gradient_shape_fn(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    """dW, db (unless no_bias), dX; an op without the dX output takes the leading ones."""
    x, w, dy = ins
    channels = dy.shape[3 if args.order == "NHWC" else 1]
    if len(dy.shape) == 5:   # channel-blocked (`blocked`): the filters count the channels
        channels = w.shape[0]
    return [w] + ([] if args.no_bias else [TensorSpec((channels,), dy.dtype)]) + [x]


def _make_gradient_cost_fn(transposed: bool):
    def cost_fn(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
        flops = _conv_flops(_conv_problem(args, ins[:2], transposed)[0])
        with_dx = len(outs) == (2 if args.no_bias else 3)
        total = flops * (2 if with_dx else 1) + (0 if args.no_bias else ins[2].size)
        return Cost(total, sum(i.nbytes for i in ins), sum(o.nbytes for o in outs))
    return cost_fn


_RELU = Arg("relu", "int", 0, allowed=(0, 1),
            doc="1: Y = max(conv(X, W) + b, 0), fused into the algorithm where it can")
_BLOCKED = Arg("blocked", "int", 0,
               doc="B > 0: Y is channel-blocked, N×⌈M/B⌉×oH×oW×B (oneDNN's layout; set by "
                   "the bind-time layout plan): B is 8 or 16, or M for channels-last (one "
                   "block of every channel: NHWC); a 5-D X is read as blocked too")


def _register(type: str, transposed: bool, doc: str, grad_doc: str) -> None:
    args = _COMMON + (_ADJ if transposed else ())
    most = 3 if transposed else 4    # Conv's optional S: the rewrites' residual sum
    register_schema(
        type, inputs=(2, most), outputs=1, input_names=("X", "W", "b", "S")[:most],
        output_names=("Y",),
        args=args + (() if transposed else (_RELU, _BLOCKED)),
        # Y over a residual S read last here: oneDNN then adds S where the result goes (its
        # sum post-op), faster than reading it from elsewhere (`_run`, conv.cpu.onednn)
        inplace=() if transposed else ((3, 0),),
        shape_fn=_make_shape_fn(transposed),
        cost_fn=_make_cost_fn(transposed),
        check_fn=lambda op, a: _check(op, a, transposed, False), family="conv", doc=doc)
    register_schema(
        f"{type}Gradient", inputs=3, outputs=(1, 3), input_names=("X", "W", "dY"),
        output_names=("dW", "db", "dX"), args=args + (() if transposed else (_BLOCKED,)),
        shape_fn=_gradient_shape_fn,
        cost_fn=_make_gradient_cost_fn(transposed),
        check_fn=lambda op, a: _check(op, a, transposed, True), family="conv", doc=grad_doc)


# Kernels ----------------------------------------------------------------------------------
# One kernel per op for every backend: only the algorithms differ, and `choose` takes them
# from the backend's own set (netrun.conv.gpu on a GPU workspace).
def _plan(ctx, X, W) -> ConvPlan:
    """The op's plan for these input shapes (made once, redone when shapes or settings change)."""
    key = (X.shape, W.shape, X.dtype, ctx.ws.conv.generation)
    plan = ctx.state.get("plan")
    if plan is None or plan.key != key:
        transposed = ctx.def_.type.startswith("ConvTranspose")
        try:
            specs = [TensorSpec(tuple(X.shape), str(X.dtype)), TensorSpec(tuple(W.shape))]
            problem, out_shape = _conv_problem(ctx.args, specs, transposed)
            if ctx.args.algo:   # a fixed algorithm that cannot run this shape fails here
                fixed_algorithm(problem, ctx.args.algo, ctx.backend.name)
            blocks = _blocks(ctx.args, specs[0])
            if any(blocks):
                blocked = fixed_algorithm(problem, BLOCKED_ALGORITHM, ctx.backend.name)
        except ShapeError as e:
            raise ShapeError(f"op {ctx.def_.label}: {e}") from None
        if any(blocks):   # every direction on the one algorithm that reads these layouts
            directions = {"forward": blocked, "backward_data": blocked,
                          "backward_filter": blocked}
            plan = ctx.state["plan"] = ConvPlan(key, problem, out_shape, directions,
                                                warmed=True, layout=Layout(*blocks))
            ctx.state["algo"] = plan.label
            return plan
        warmed = all((a.name, replace(problem, n=1), d) in ctx.ws.conv.warmed
                     for d, a in _rule_picks(ctx.ws, problem, ctx.def_, ctx.args).items())
        plan = ctx.state["plan"] = ConvPlan(key, problem, out_shape, warmed=warmed)
    return plan


def _algo(ctx, plan: ConvPlan, direction: str, args: tuple, out, keep=None):
    """The algorithm for one direction: chosen once per plan (timed on the op's own buffers
    in exhaustive mode, or on a scratch output where out holds `keep`, an input still to be
    read); ctx.state['algo'] names the choices for profiles."""
    algo = plan.algos.get(direction)
    if algo is None:
        if (keep is not None and ctx.ws.conv.settings.mode == "exhaustive"
                and ctx.xp.may_share_memory(out, keep)):
            out = ctx.scratch("conv.search_out", out.shape, out.dtype)
        run = run_direction(direction, plan.problem, args, out, ctx.scratch, ctx.xp)
        algo = plan.algos[direction] = choose(ctx.ws.conv, plan.problem, direction, ctx.backend,
                                              ctx.args.algo, run)
        ctx.state["algo"] = plan.label
    return algo


def _to_nchw(ctx, key: str, a, nhwc: bool):
    """a itself for NCHW; for NHWC, an NCHW copy in scratch."""
    if not nhwc:
        return a
    buf = ctx.scratch(f"conv.nchw_{key}", _nchw(a.shape, True), a.dtype)
    buf[...] = a.transpose(0, 3, 1, 2)
    return buf


def _run(ctx, plan: ConvPlan, out, nhwc: bool, direction: str, args: tuple, relu: bool = False,
         residual=None, **extra) -> None:
    """One direction of the chosen algorithm straight into `out`, or via scratch and a
    transpose for NHWC; residual: + S (a forward pass's residual sum), then relu: max(out,
    0), each inside the algorithm where it can. S may be out's own memory (Conv's in-place
    pair: the memory plan gives Y the buffer of an S read last here)."""
    shared = residual is not None and ctx.xp.may_share_memory(out, residual)
    buf = out if not nhwc else ctx.scratch(f"conv.nchw_out_{direction}", _nchw(out.shape, True),
                                           out.dtype)
    algo = _algo(ctx, plan, direction, args, buf, keep=residual)
    if residual is not None and algo.fuses_residual and not nhwc:
        extra["residual"], residual = residual, None
    elif shared:
        # the algorithm would write the output over S before the sum reads it: it writes a
        # scratch twin (the same traffic as writing out: the sum then writes out)
        if nhwc:
            residual = _scratch_copy(ctx, "conv.residual", residual)
        else:
            buf = ctx.scratch("conv.before_sum", out.shape, out.dtype)
    # the ReLU comes after the sum: fused only where the sum is
    fused = relu and algo.fuses_relu and residual is None
    if fused:
        extra["relu"] = True
    if plan.layout is not None:
        extra["layout"] = plan.layout
    if direction == "forward" and algo.keeps_filters and not nhwc:
        w = ctx.def_.inputs[1]
        extra["filters"] = KeptFilters((id(ctx.ws.get_blob(w)), ctx.ws.version(w)),
                                       ctx.state.setdefault("kept_filters", {}))
    if (direction == "forward" and algo.binds_calls and not nhwc and residual is None
            and (fused or not relu)):
        extra["bound"] = True   # nothing runs after the algorithm: its calls may repeat
    bound = getattr(algo, direction)(ctx.xp, *args, plan.problem, buf, ctx.scratch, **extra)
    if bound is not None:
        _repeat(ctx, bound)
    if nhwc:
        out[...] = buf.transpose(0, 2, 3, 1)
    if residual is not None:
        relu_kernels.add_relu(ctx.xp, buf if shared and not nhwc else out, residual, out, relu)
    elif relu and not fused:
        relu_kernels.relu(ctx.xp, out, out)


def _scratch_copy(ctx, key: str, a):
    """A copy of a in the op's scratch."""
    buf = ctx.scratch(key, a.shape, a.dtype)
    buf[...] = a
    return buf


def _repeat(ctx, bound) -> None:
    """The op's next runs are `bound`'s calls alone (OpContext.repeat_with) while the conv
    settings, the thread count and the op's scratch regions stay; where the calls read a
    kept copy of the filters, while W is not written; where they reorder W on every run,
    while W is written between runs (training): constant filters are better kept, a copy
    the kernel makes when it runs again."""
    if ctx.scratch_mark() is None:   # scratch outside a net's run: no promise that it stays
        bound.close()
        return
    ctx.repeat_with(bound, _Holds(ctx, bound.reorders_filters),
                    unchanged=(ctx.def_.inputs[1],) if bound.reads_kept_filters else ())


class _Holds:
    """A conv's check that its bound calls still compute its run (`_repeat`). `steady` is
    the part a whole net's pass checks at once (netrun.core.bound_pass), None where the
    check must run in the op's turn: the filters' write count, which the check moves."""

    __slots__ = ("ctx", "generation", "threads", "mark", "last", "steady")

    def __init__(self, ctx, reorders_filters: bool):
        self.ctx = ctx
        self.generation, self.threads = ctx.ws.conv.generation, parallel.thread_count()
        self.mark = ctx.scratch_mark()
        self.last = ctx.ws.version(ctx.def_.inputs[1])
        self.steady = None if reorders_filters else self._steady

    def _steady(self) -> bool:
        """The conv settings and the thread count are the ones the calls were bound under."""
        return (self.ctx.ws.conv.generation == self.generation
                and parallel.thread_count() == self.threads)

    def __call__(self) -> bool:
        if not (self._steady() and self.ctx.scratch_mark() == self.mark):
            return False
        if self.steady is None:   # W reordered on every run: it must have been written
            ws, w = self.ctx.ws, self.ctx.def_.inputs[1]
            version, before = ws.version(w), self.last
            self.last = version
            return version != before
        return True


def _forward(ctx, X, W, b, S=None) -> None:
    plan = _plan(ctx, X, W)
    nhwc = ctx.args.order == "NHWC"
    if S is not None and tuple(S.shape) != plan.out_shape:
        raise ShapeError(f"op {ctx.def_.label}: the residual S has shape "
                         f"{'×'.join(map(str, S.shape))} but the output is "
                         f"{'×'.join(map(str, plan.out_shape))}")
    Y = ctx.output(0, plan.out_shape, X.dtype)
    x, w = _to_nchw(ctx, "x", X, nhwc), _to_nchw(ctx, "w", W, nhwc)
    if ctx.def_.type == "Conv":   # the algorithm adds the bias (fused into its GEMM if it can)
        _run(ctx, plan, Y, nhwc, "forward", (x, w), relu=bool(ctx.args.relu), residual=S,
             bias=b)
        return
    # ConvTranspose is the data gradient of the equivalent conv
    _run(ctx, plan, Y, nhwc, "backward_data", (x, w))
    if b is not None:
        Y += b.reshape((1, 1, 1, -1) if nhwc else (1, -1, 1, 1))


def _backward(ctx, X, W, dY) -> None:
    plan = _plan(ctx, X, W)
    if tuple(dY.shape) != plan.out_shape:
        raise ShapeError(f"op {ctx.def_.label}: dY has shape {'×'.join(map(str, dY.shape))} but "
                         f"the forward output is {'×'.join(map(str, plan.out_shape))}")
    xp, nhwc = ctx.xp, ctx.args.order == "NHWC"
    x, w, dy = (_to_nchw(ctx, k, a, nhwc) for k, a in (("x", X), ("w", W), ("dy", dY)))
    dW = ctx.output(0, W.shape, W.dtype)
    # a channel-blocked dY (N × ⌈M/B⌉ × oH × oW × B) counts its channels in blocks
    channels = plan.problem.k if dY.ndim == 5 else dY.shape[3 if nhwc else 1]
    db = None if ctx.args.no_bias else ctx.output(1, (channels,), dY.dtype)
    index = 1 if db is None else 2
    wants_dx = len(ctx.def_.outputs) > index
    dX = ctx.output(index, X.shape, X.dtype) if wants_dx else None
    if ctx.def_.type == "ConvGradient" and wants_dx and not nhwc:
        both = (_algo(ctx, plan, "backward_filter", (x, dy), dW),
                _algo(ctx, plan, "backward_data", (dy, w), dX))
        if both[0] is both[1]:   # one algorithm for both: it may share work between them
            extra = {"bound": True} if both[0].binds_calls else {}
            if plan.layout is not None:
                extra["layout"] = plan.layout
            bound = both[0].backward(xp, x, dy, w, plan.problem, dX, dW, ctx.scratch,
                                     dbias=db, **extra)
            if bound is not None:   # the whole op: its calls may repeat
                _repeat(ctx, bound)
            return
    if ctx.def_.type == "ConvGradient":   # db = Σ dY comes with the filter gradient
        _run(ctx, plan, dW, nhwc, "backward_filter", (x, dy), dbias=db)
    else:   # ConvTranspose: the equivalent conv's input is dY and its output gradient is X
        _run(ctx, plan, dW, nhwc, "backward_filter", (dy, x))
        if db is not None:
            xp.sum(dY, axis=(0, 1, 2) if nhwc else (0, 2, 3), out=db)
    if wants_dx:
        if ctx.def_.type == "ConvGradient":
            _run(ctx, plan, dX, nhwc, "backward_data", (dy, w))
        else:
            _run(ctx, plan, dX, nhwc, "forward", (dy, w))


def _maker(g) -> list:
    """Gradient op with outputs dW, [db], [dX]; dX only when someone needs it. A fused ReLU
    (relu=1) first masks dY with the output."""
    has_bias = len(g.def_.inputs) >= 3
    outs = [g.GI(1)] + ([g.GI(2)] if has_bias else []) + ([g.GI(0)] if g.needs(0) else [])
    args = {k: v for k, v in g.copy_args().items() if k != "relu"}
    args["no_bias"] = int(not has_bias)
    ops, dy = [], g.GO(0)
    if g.args.get("relu", 0):
        masked = f"{dy}_relu"
        ops.append(g.op("ReluGradient", [g.O(0), dy], [masked]))
        dy = masked
    ops.append(g.op(f"{g.def_.type}Gradient", [g.I(0), g.I(1), dy], outs, **args))
    if len(g.def_.inputs) > 3 and g.needs(3):   # a residual S: dS is the (masked) dY
        ops.append(g.op("Copy", [dy], [g.GI(3)]))
    return ops


# The compiled kernels an algorithm may call load when a conv op is bound, not inside its first
# iteration (even loading them from Numba's disk cache takes a while in every process).
@register_preparer(*CONV_TYPES)
def _prepare(ctx) -> None:
    if not jit.enabled(ctx.xp):
        return
    jit_depthwise.prepare(ctx.args)
    jit_winograd.prepare(ctx.args)
    if len(ctx.def_.inputs) > 3:
        jit_blocked.prepare()
    if ctx.args.group == 1 and ctx.args.algo in ("", "im2col_gemm"):
        jit_im2col.prepare()


def _rule_picks(ws, problem: ConvProblem, op, args) -> dict:
    """direction -> the algorithm this op will run there without timing (rules or fixed)."""
    directions = op_directions(op.type, len(op.outputs), bool(args.no_bias))
    return {d: choose(ws.conv, problem, d, ws.backend, args.algo) for d in directions}


@register_scratch_estimate(*CONV_TYPES)
def _scratch_estimate(ws, op, args, ins) -> int:
    """Scratch of the algorithms this op will pick for the passes it runs (a Conv: forward
    only), so a memory plan can fault it in at bind. Choosing by the rules runs nothing."""
    problem, _ = _conv_problem(args, ins[:2], op.type.startswith("ConvTranspose"))
    if op.type in ("Conv", "ConvGradient") and any(_blocks(args, ins[0])):
        return fixed_algorithm(problem, BLOCKED_ALGORITHM, ws.backend.name).workspace_bytes(
            problem)
    return max(algo.workspace_bytes(problem)
               for algo in _rule_picks(ws, problem, op, args).values())


@register_bind_warmup(*CONV_TYPES)
def _warm_up(ws, op, args, ins) -> None:
    """Run this op's chosen algorithms once on a one-image copy, at bind time: what they build
    per shape (DFT matrices, column maps, compiled dispatch) is then ready for the first
    iteration. CPU only: a GPU's first-call costs are its own kernels' compiles."""
    if ws.backend.xp is not np:
        return
    problem, _ = _conv_problem(args, ins[:2], op.type.startswith("ConvTranspose"))
    blocks = _blocks(args, ins[0]) if op.type in ("Conv", "ConvGradient") else (0, 0)
    if any(blocks):   # one algorithm, and nothing to warm but its primitives
        algo = fixed_algorithm(problem, BLOCKED_ALGORITHM, "cpu")
        if op.type == "Conv":
            algo.prepare(problem, "forward", bias=len(op.inputs) > 2, relu=bool(args.relu),
                         layout=Layout(*blocks), residual=len(op.inputs) > 3)
            return
        for d in op_directions(op.type, len(op.outputs), bool(args.no_bias)):
            algo.prepare(problem, d, bias=not args.no_bias, layout=Layout(*blocks))
        return
    # what the passes will ask of an algorithm that fuses them (a forward's bias and ReLU,
    # a filter gradient's db); ConvTranspose adds its bias outside the algorithm
    bias = len(op.inputs) > 2 if op.type == "Conv" else (
        op.type == "ConvGradient" and not args.no_bias)
    # with a residual S the ReLU comes after the sum, outside the primitive
    relu = op.type == "Conv" and bool(getattr(args, "relu", 0)) and len(op.inputs) < 4
    for d, algo in _rule_picks(ws, problem, op, args).items():
        warm_up(ws.conv, algo, problem, d, np, bias=bias, relu=relu)


# Conv -------------------------------------------------------------------------------------
_register("Conv", False,
          doc="Y = conv(X, W) + b. X is N×C×H×W (or NHWC), W is M×C/G×kh×kw (NHWC: M×kh×kw×C/G), "
              "b is M. Output size per axis: floor((in + pad_head + pad_tail - dil·(k-1) - 1) / "
              "stride) + 1. An optional S of Y's shape is added before the ReLU (relu=1): the "
              "residual sum the inference rewrites fuse into the conv.",
          grad_doc="Inputs X, W, dY; outputs dW, db (unless no_bias), then dX if listed.")


@register_kernel("Conv")
def conv(ctx, X, W, b=None, S=None):
    """Y = conv(X, W) + b (+ S) with the chosen algorithm's forward pass."""
    _forward(ctx, X, W, b, S)


@register_kernel("ConvGradient")
def conv_gradient(ctx, X, W, dY):
    """dW (backward filter), db, and dX (backward data) when it is an output."""
    _backward(ctx, X, W, dY)


register_gradient("Conv")(_maker)

# ConvTranspose ----------------------------------------------------------------------------
_register("ConvTranspose", True,
          doc="The transpose (data gradient) of Conv. X is N×C_in×H×W, W is C_in×C_out/G×kh×kw "
              "(NHWC: C_in×kh×kw×C_out/G), b is C_out. Output size per axis: (in-1)·stride - "
              "pad_head - pad_tail + dil·(k-1) + 1 + adj. legacy_pad VALID and SAME both mean "
              "no padding, as in Caffe2.",
          grad_doc="Inputs X, W, dY; outputs dW, db (unless no_bias), then dX if listed.")


@register_kernel("ConvTranspose")
def conv_transpose(ctx, X, W, b=None):
    """Y = conv^T(X, W) + b: the equivalent conv's backward-data pass."""
    _forward(ctx, X, W, b)


@register_kernel("ConvTransposeGradient")
def conv_transpose_gradient(ctx, X, W, dY):
    """dW, db, and dX (the equivalent conv's forward pass of dY) when it is an output."""
    _backward(ctx, X, W, dY)


register_gradient("ConvTranspose")(_maker)
