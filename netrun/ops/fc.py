"""Dense layers and matrix products: FC, MatMul, BatchMatMul. Each: schema, kernel, gradient."""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import ShapeError
from netrun.kernels import parallel
from netrun.ops.common import RepeatCall, fmt
from netrun.ops.elementwise import broadcast_shapes, sum_to


def _nbytes(specs: list[TensorSpec]) -> int:
    return sum(s.nbytes for s in specs)


def _canonical_axis(what: str, axis: int, arg: str, spec: TensorSpec, role: str) -> int:
    ndim = len(spec.shape)
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"{what}: argument '{arg}' is {axis}, out of range for {role} "
                         f"{spec} ({ndim} dims)")
    return axis % ndim if ndim else 0


# FC -------------------------------------------------------------------------------------
def _fc_dims(what: str, args: Args, x: TensorSpec, w: TensorSpec) -> tuple[int, int, int, int]:
    """(axis, M, K, N): X flattens to M×K at `axis`, W to N×K at `axis_w` (Caffe2 layout)."""
    axis = _canonical_axis(what, args.axis, "axis", x, "X")
    axis_w = _canonical_axis(what, args.axis_w, "axis_w", w, "W")
    m, k = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    n, kw = math.prod(w.shape[:axis_w]), math.prod(w.shape[axis_w:])
    if k != kw:
        raise ShapeError(f"{what}: X flattened at axis {args.axis} has K={k} but W expects "
                         f"K={kw}: X {x}, W {w}")
    return axis, m, k, n


def _check_bias(n: int, w: TensorSpec, b: TensorSpec) -> None:
    if b.shape != (n,):
        raise ShapeError(f"FC: b must have one value per output (N={n}): W {w}, b {b}")


def _fc_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x, w, b = ins
    axis, _, _, n = _fc_dims("FC", args, x, w)
    _check_bias(n, w, b)
    return [TensorSpec(x.shape[:axis] + (n,), x.dtype)]


def _fc_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    _, m, k, n = _fc_dims("FC", args, ins[0], ins[1])
    return Cost(2 * m * n * k + m * n, _nbytes(ins), _nbytes(outs))


_FC_ARGS = [Arg("axis", "int", 1, doc="X is flattened to 2-D at this axis"),
            Arg("axis_w", "int", 1, doc="W is flattened to 2-D (N×K) at this axis")]
register_schema("FC", inputs=3, outputs=1, input_names=("X", "W", "b"), output_names=("Y",),
                args=_FC_ARGS, shape_fn=_fc_shape, cost_fn=_fc_cost, family="fc",
                doc="Fully connected: Y = X·Wᵀ + b, with X flattened to M×K at `axis` and W "
                    "(N×K, as in Caffe2) at `axis_w`; Y has X's dims before `axis`, then N.")


@register_kernel("FC")
def fc(ctx, X, W, b):
    xp = ctx.xp
    axis, m, k, n = _fc_dims("FC", ctx.args, TensorSpec(X.shape), TensorSpec(W.shape))
    if b.shape != (n,):
        _check_bias(n, TensorSpec(W.shape), TensorSpec(b.shape))
    Y = ctx.output(0, X.shape[:axis] + (n,), X.dtype)
    Y2 = Y.reshape(m, n)                                   # (M, N), a view of Y
    a, wt = X.reshape(m, k), W.reshape(n, k).T
    parallel.matmul(xp, a, wt, Y2)                         # (M, K)·(K, N)
    Y2 += b
    # one BLAS call on views of the inputs (contiguous ones reshape to views): the next
    # runs make the same call, without the checks above
    if parallel.one_call(xp, a, Y2) and X.flags.c_contiguous and W.flags.c_contiguous:
        ctx.repeat_with(RepeatCall(partial(_fc_again, a, wt, Y2, b)))


def _fc_again(a, wt, y, b) -> None:
    """y = a·wt + b, as `fc` computes it."""
    np.matmul(a, wt, out=y)
    np.add(y, b, out=y)


def _fc_grad_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    x, w, _ = ins
    _, _, _, n = _fc_dims("FCGradient", args, x, w)
    return [w, TensorSpec((n,), w.dtype), x][:args.get("num_outputs", 3)]


def _note_outputs(op, args: Args) -> None:
    # dX is optional; shape functions see only args, so keep the output count with them.
    args["num_outputs"] = len(op.outputs)


def _fc_grad_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    _, m, k, n = _fc_dims("FCGradient", args, ins[0], ins[1])
    # dW and db always; dX only when asked for (a third output).
    flops = 2 * m * n * k + m * n + (2 * m * n * k if len(outs) == 3 else 0)
    return Cost(flops, _nbytes(ins), _nbytes(outs))


register_schema("FCGradient", inputs=3, outputs=(2, 3), input_names=("X", "W", "dY"),
                output_names=("dW", "db", "dX"), args=_FC_ARGS, shape_fn=_fc_grad_shape,
                cost_fn=_fc_grad_cost, check_fn=_note_outputs, family="fc",
                doc="dW = dYᵀ·X, db = Σ dY over rows, and dX = dY·W when a third output is "
                    "given (skipped when no one needs X's gradient, e.g. the data input).")


@register_kernel("FCGradient")
def fc_gradient(ctx, X, W, dY):
    xp = ctx.xp
    _, m, k, n = _fc_dims("FCGradient", ctx.args, TensorSpec(X.shape), TensorSpec(W.shape))
    dY2 = dY.reshape(m, n)                                  # (M, N)
    dW = ctx.output(0, W.shape, W.dtype)
    products = [(dY2.T, X.reshape(m, k), dW.reshape(n, k))]                 # (N, M)·(M, K)
    if len(ctx.def_.outputs) == 3:
        dX = ctx.output(2, X.shape, X.dtype)
        products.append((dY2, W.reshape(n, k), dX.reshape(m, k)))            # (M, N)·(N, K)
    parallel.matmuls(xp, products)      # side by side on the worker threads
    db = ctx.output(1, (n,), W.dtype)
    xp.sum(dY2, axis=0, out=db)


@register_gradient("FC")
def _fc_grad(g):
    outs = [g.GI(1), g.GI(2)] + ([g.GI(0)] if g.needs(0) else [])
    return [g.op("FCGradient", [g.I(0), g.I(1), g.GO(0)], outs, **g.copy_args())]


# MatMul ---------------------------------------------------------------------------------
_TRANS_ARGS = [Arg("trans_a", "int", 0, (0, 1), "use Aᵀ"),
               Arg("trans_b", "int", 0, (0, 1), "use Bᵀ")]


def _matmul_dims(what: str, args: Args, a: tuple, b: tuple, batched: bool):
    """(M, K, N) of op(A)·op(B); A and B are (..., rows, cols)."""
    if len(a) < 2 or len(b) < 2 or (not batched and (len(a) != 2 or len(b) != 2)):
        need = "at least 2" if batched else "exactly 2"
        raise ShapeError(f"{what}: A and B must have {need} dims: A {fmt(a)}, B {fmt(b)}")
    m, k = (a[-1], a[-2]) if args.trans_a else (a[-2], a[-1])
    kb, n = (b[-1], b[-2]) if args.trans_b else (b[-2], b[-1])
    if k != kb:
        raise ShapeError(f"{what}: A has K={k} but B has K={kb} (trans_a={args.trans_a}, "
                         f"trans_b={args.trans_b}): A {fmt(a)}, B {fmt(b)}")
    return m, k, n


def _matmul_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    m, _, n = _matmul_dims("MatMul", args, ins[0].shape, ins[1].shape, False)
    return [TensorSpec((m, n), ins[0].dtype)]


def _matmul_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    _, k, _ = _matmul_dims("MatMul", args, ins[0].shape, ins[1].shape, True)
    return Cost(2 * k * outs[0].size, _nbytes(ins), _nbytes(outs))


def _t(x, trans: int):
    """x or its transpose over the last two dims (a view)."""
    return x.swapaxes(-1, -2) if trans else x


register_schema("MatMul", inputs=2, outputs=1, input_names=("A", "B"), output_names=("Y",),
                args=_TRANS_ARGS, shape_fn=_matmul_shape, cost_fn=_matmul_cost, family="fc",
                doc="Y = op(A)·op(B) for 2-D A and B, op transposing when trans_a / trans_b.")


@register_kernel("MatMul")
def matmul(ctx, A, B):
    a = ctx.args
    m, _, n = _matmul_dims("MatMul", a, A.shape, B.shape, False)
    Y = ctx.output(0, (m, n), np.result_type(A.dtype, B.dtype))
    parallel.matmul(ctx.xp, _t(A, a.trans_a), _t(B, a.trans_b), Y)


@register_gradient("MatMul")
def _matmul_grad(g):
    # Caffe2's rule: both gradients are MatMuls of dY with the other operand.
    ta, tb = g.args.get("trans_a", 0), g.args.get("trans_b", 0)
    A, B, dY = g.I(0), g.I(1), g.GO(0)
    # MatMul(X, X) names X_grad for both; the backward builder sums the two contributions.
    ga, gb, ops = g.GI(0), g.GI(1), []
    if g.needs(0):
        if ta:   # A is K×M: dA = op(B)·dYᵀ
            ops.append(g.op("MatMul", [B, dY], [ga], trans_a=tb, trans_b=1))
        else:    # dA = dY·op(B)ᵀ
            ops.append(g.op("MatMul", [dY, B], [ga], trans_b=1 - tb))
    if g.needs(1):
        if tb:   # B is N×K: dB = dYᵀ·op(A)
            ops.append(g.op("MatMul", [dY, A], [gb], trans_a=1, trans_b=ta))
        else:    # dB = op(A)ᵀ·dY
            ops.append(g.op("MatMul", [A, dY], [gb], trans_a=1 - ta))
    return ops


# BatchMatMul ----------------------------------------------------------------------------
def _batch_dims(what: str, args: Args, a: tuple, b: tuple) -> tuple[int, ...]:
    """Output shape: leading dims broadcast as in NumPy, then (M, N)."""
    m, _, n = _matmul_dims(what, args, a, b, True)
    if not args.broadcast and a[:-2] != b[:-2]:
        raise ShapeError(f"{what}: A and B have different batch dims (set broadcast=1 to "
                         f"broadcast them): A {fmt(a)}, B {fmt(b)}")
    try:
        lead = broadcast_shapes(what, a[:-2], b[:-2])
    except ShapeError:
        raise ShapeError(f"{what}: the batch dims of A and B cannot be broadcast together "
                         f"(equal or 1, aligned from the right): A {fmt(a)}, B {fmt(b)}") from None
    return lead + (m, n)


def _bmm_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    return [TensorSpec(_batch_dims("BatchMatMul", args, ins[0].shape, ins[1].shape),
                       ins[0].dtype)]


register_schema("BatchMatMul", inputs=2, outputs=1, input_names=("A", "B"),
                output_names=("Y",), shape_fn=_bmm_shape, cost_fn=_matmul_cost, family="fc",
                args=_TRANS_ARGS + [Arg("broadcast", "int", 1, (0, 1),
                                        "broadcast leading (batch) dims as NumPy does")],
                doc="Y[..., :, :] = op(A[...])·op(B[...]) over the leading dims; A is "
                    "(..., M, K), B is (..., K, N), or transposed with trans_a / trans_b.")


@register_kernel("BatchMatMul")
def batch_matmul(ctx, A, B):
    a = ctx.args
    out_shape = _batch_dims("BatchMatMul", a, A.shape, B.shape)
    Y = ctx.output(0, out_shape, np.result_type(A.dtype, B.dtype))
    parallel.matmul(ctx.xp, _t(A, a.trans_a), _t(B, a.trans_b), Y)


def _bmm_grad_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    return [ins[0], ins[1]]


def _bmm_grad_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    _, k, _ = _matmul_dims("BatchMatMulGradient", args, ins[0].shape, ins[1].shape, True)
    return Cost(4 * k * ins[2].size, _nbytes(ins), _nbytes(outs))


register_schema("BatchMatMulGradient", inputs=3, outputs=2, input_names=("A", "B", "dY"),
                output_names=("dA", "dB"), args=_TRANS_ARGS + [Arg("broadcast", "int", 1)],
                shape_fn=_bmm_grad_shape, cost_fn=_bmm_grad_cost, family="fc",
                doc="dA = dY·op(B)ᵀ and dB = op(A)ᵀ·dY (transposed back when trans_a/"
                    "trans_b), summed over the batch dims each input was broadcast along.")


@register_kernel("BatchMatMulGradient")
def batch_matmul_gradient(ctx, A, B, dY):
    xp, a = ctx.xp, ctx.args
    # Gradients w.r.t. op(A) and op(B), at the broadcast batch shape.
    d_opa = xp.matmul(dY, _t(_t(B, a.trans_b), 1))           # (..., M, K)
    d_opb = xp.matmul(_t(_t(A, a.trans_a), 1), dY)           # (..., K, N)
    sum_to(xp, _t(d_opa, a.trans_a), A.shape, ctx.output(0, A.shape, dY.dtype))
    sum_to(xp, _t(d_opb, a.trans_b), B.shape, ctx.output(1, B.shape, dY.dtype))


@register_gradient("BatchMatMul")
def _bmm_grad(g):
    return [g.op("BatchMatMulGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)],
                 **g.copy_args())]
