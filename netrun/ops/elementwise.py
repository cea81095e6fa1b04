"""Binary elementwise arithmetic with broadcasting: Add, Sub, Mul, Div; n-ary Sum; AddRelu
(the residual sum and its ReLU as one op, made by the bind-time rewrites for inference).

Two broadcasting rules, as in Caffe2: NumPy's (the default, `broadcast`=0) and the legacy
`broadcast`=1 form, where B's shape matches a contiguous run of A's dims starting at `axis`
(axis -1: B matches A's trailing dims) and the output always has A's shape.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from netrun.core.gradient import GradientContext, register_gradient
from netrun.core.lifetimes import register_shape_reads
from netrun.core.registry import register_kernel, register_preparer
from netrun.core.schema import MANY, Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import SchemaError, ShapeError
from netrun.kernels import parallel
from netrun.kernels import relu as relu_kernels
from netrun.ops.common import elementwise_cost, fmt, require_same_shape
from netrun.proto.defs import OperatorDef


# Shared helpers (also used by fc.py) -----------------------------------------------------
def sum_to(xp, x, shape: Sequence[int], out) -> None:
    """Sum `x` over the dims it was broadcast along so it fits `shape`; write into `out`."""
    shape = tuple(shape)
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                      if d == 1 and x.shape[lead + i] != 1)
    if not axes:
        xp.copyto(out.reshape(x.shape), x)
        return
    # keepdims keeps the reduced dims as 1s: (1,)*lead + shape, the same memory as `shape`.
    xp.sum(x, axis=axes, keepdims=True, out=out.reshape((1,) * lead + shape))


def broadcast_shapes(what: str, a: Sequence[int], b: Sequence[int],
                     names: tuple[str, str] = ("A", "B")) -> tuple[int, ...]:
    """NumPy broadcasting of two shapes, or a ShapeError naming both."""
    a, b = tuple(a), tuple(b)
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"{what}: {names[0]} and {names[1]} cannot be broadcast together "
                             f"(dims must be equal or 1, aligned from the right): "
                             f"{names[0]} {fmt(a)}, {names[1]} {fmt(b)}")
        out.append(max(x, y) if x and y else 0)
    return tuple(out)


def binary_shapes(what: str, a: Sequence[int], b: Sequence[int], args: Args
                  ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(B's shape aligned for broadcasting, output shape) under either broadcasting rule."""
    a, b = tuple(a), tuple(b)
    if not args.broadcast:
        return b, broadcast_shapes(what, a, b)
    axis = len(a) - len(b) if args.axis == -1 else args.axis
    fits = 0 <= axis and axis + len(b) <= len(a)
    if fits:
        fits = all(d == 1 or d == a[axis + i] for i, d in enumerate(b))
    if not fits:
        raise ShapeError(f"{what}: with broadcast=1, B's dims must equal A's dims starting at "
                         f"axis {args.axis} (or be 1): A {fmt(a)}, B {fmt(b)}")
    # Legacy broadcast: pad B with 1s before `axis` and after its last matched dim.
    return (1,) * axis + b + (1,) * (len(a) - axis - len(b)), a


def _check_broadcast_args(op: OperatorDef, args: Args) -> None:
    if "axis" in op.args and not args.broadcast:
        raise SchemaError(f"op {op.label}: argument 'axis' applies only with broadcast=1 "
                          f"(NumPy broadcasting aligns shapes from the right)")
    if args.axis < -1:
        raise SchemaError(f"op {op.label}: argument 'axis' is {args.axis}; use -1 (B matches "
                          f"A's trailing dims) or a dim index >= 0")


BROADCAST_ARGS = (
    Arg("broadcast", "int", 0, (0, 1), "1: Caffe2's legacy broadcast of B over A at `axis`"),
    Arg("axis", "int", -1, doc="legacy broadcast: A's dim where B's dims start; -1 = suffix"),
)


# Forward ops ----------------------------------------------------------------------------
_FORWARD = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "true_divide"}
_DOCS = {"Add": "Y = A + B", "Sub": "Y = A - B", "Mul": "Y = A * B",
         "Div": "Y = A / B (floor division for integer inputs)"}
# In-place pairs the gradients tolerate: Add/Sub read A and B only for their shapes,
# Div reads Y and B, Mul reads both input values.
_INPLACE = {"Add": ((0, 0), (1, 0)), "Sub": ((0, 0), (1, 0)), "Mul": (), "Div": ((0, 0),)}


def _binary_shape_fn(type: str):
    def fn(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
        _, out = binary_shapes(type, ins[0].shape, ins[1].shape, args)
        return [TensorSpec(out, np.result_type(ins[0].dtype, ins[1].dtype).name)]

    return fn


def _binary_kernel(type: str):
    def kernel(ctx, A, B):
        xp = ctx.xp
        b_shape, out_shape = binary_shapes(type, A.shape, B.shape, ctx.args)
        dtype = np.result_type(A.dtype, B.dtype)
        Y = ctx.output(0, out_shape, dtype)
        ufunc = getattr(xp, _FORWARD[type])
        if type == "Div" and not np.issubdtype(dtype, np.floating):
            ufunc = xp.floor_divide
        ufunc(A, B.reshape(b_shape), out=Y)

    return kernel


for _type in _FORWARD:
    register_schema(_type, inputs=2, outputs=1, input_names=("A", "B"), output_names=("Y",),
                    args=BROADCAST_ARGS, inplace=_INPLACE[_type],
                    shape_fn=_binary_shape_fn(_type), cost_fn=elementwise_cost(1),
                    check_fn=_check_broadcast_args, family="elementwise",
                    doc=f"{_DOCS[_type]}, elementwise with broadcasting (NumPy rules, or "
                        f"Caffe2's legacy broadcast=1 with axis).")
    register_kernel(_type)(_binary_kernel(_type))


# Gradient ops ---------------------------------------------------------------------------
# Each takes (dY, A, B[, Y]) and writes (dA, dB), summed back to A's and B's shapes.
def _grad_shape_fn(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    return [TensorSpec(ins[1].shape, ins[0].dtype), TensorSpec(ins[2].shape, ins[0].dtype)]


def _grad_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    return Cost(3 * ins[0].size, sum(i.nbytes for i in ins), sum(o.nbytes for o in outs))


def _grad_terms(type: str, xp, dY, A, B, Y):
    """(dA_full, dB_full) writers: each fills a dY-shaped buffer before the broadcast sum."""
    if type == "Add":
        return (lambda o: xp.copyto(o, dY)), (lambda o: xp.copyto(o, dY))
    if type == "Sub":
        return (lambda o: xp.copyto(o, dY)), (lambda o: xp.negative(dY, out=o))
    if type == "Mul":
        return (lambda o: xp.multiply(dY, B, out=o)), (lambda o: xp.multiply(dY, A, out=o))

    def div_b(o):
        # d(A/B)/dB = -A/B² = -Y/B, so the gradient reads the output instead of A.
        xp.multiply(dY, Y, out=o)
        xp.divide(o, B, out=o)
        xp.negative(o, out=o)

    return (lambda o: xp.divide(dY, B, out=o)), div_b


def _binary_grad_kernel(type: str):
    def kernel(ctx, dY, A, B, Y=None):
        xp = ctx.xp
        b_aligned, _ = binary_shapes(type, A.shape, B.shape, ctx.args)
        write = _grad_terms(type, xp, dY, A, B.reshape(b_aligned), Y)
        aligned, shapes = (A.shape, b_aligned), (A.shape, B.shape)
        # An output written over dY (an in-place forward op) goes last, after dY is used.
        order = sorted((0, 1), key=lambda i: ctx.def_.outputs[i] == ctx.def_.inputs[0])
        for i in order:
            out = ctx.output(i, shapes[i], dY.dtype)
            if tuple(aligned[i]) == dY.shape:
                write[i](out.reshape(dY.shape))
            else:
                full = ctx.scratch("binary_grad", dY.shape, dY.dtype)
                write[i](full)
                sum_to(xp, full, aligned[i], out)

    return kernel


# dY may be overwritten by dA or dB; after an in-place forward, dY also stands in for the
# overwritten input's shape (input 1 or 2), so that pair may alias too.
_GRAD_INPLACE = {"Add": ((0, 0), (0, 1), (1, 0), (2, 1)), "Sub": ((0, 0), (0, 1), (1, 0), (2, 1)),
                 "Mul": ((0, 0), (0, 1)), "Div": ((0, 0), (0, 1), (1, 0))}
for _type in _FORWARD:
    _div = _type == "Div"
    register_schema(f"{_type}Gradient", inputs=4 if _div else 3, outputs=2,
                    input_names=("dY", "A", "B") + (("Y",) if _div else ()),
                    output_names=("dA", "dB"), args=BROADCAST_ARGS, inplace=_GRAD_INPLACE[_type],
                    shape_fn=_grad_shape_fn, cost_fn=_grad_cost, family="elementwise",
                    doc=f"Gradient of {_type}: dY's contributions summed back to A's and B's "
                        f"shapes." + (" dB = -dY·Y/B." if _div else ""))
    register_kernel(f"{_type}Gradient")(_binary_grad_kernel(_type))
    if _type in ("Add", "Sub"):
        # dA and dB come from dY alone: A and B are read for their shapes, so the memory
        # plan need not keep them alive until the backward pass.
        register_shape_reads(f"{_type}Gradient", 1, 2)


def _binary_maker(type: str):
    def maker(g: GradientContext) -> list[OperatorDef]:
        d = g.def_
        def ref(i: int) -> str:
            # Add/Sub/Div read A only for its shape (Add/Sub also B's): when this op wrote
            # that input in place, dY has the same shape and stands in for it.
            shape_only = type in ("Add", "Sub") or (i == 0 and type == "Div")
            if d.inputs[i] == d.outputs[0] and shape_only:
                return g.GO(0)
            return g.I(i)

        ins = [g.GO(0), ref(0), ref(1)] + ([g.O(0)] if type == "Div" else [])
        args = g.copy_args("broadcast", "axis")
        # Mul(X, X) names X_grad twice; the backward builder sums the two contributions.
        return [g.op(f"{type}Gradient", ins, [g.GI(0), g.GI(1)], **args)]

    return maker


for _type in _FORWARD:
    register_gradient(_type)(_binary_maker(_type))


# Sum ------------------------------------------------------------------------------------
def _sum_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    for k, spec in enumerate(ins[1:], start=1):
        require_same_shape("Sum", ("input 0", f"input {k}"), ins[0], spec)
    return [ins[0]]


def _sum_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    return Cost((len(ins) - 1) * outs[0].size, sum(i.nbytes for i in ins), outs[0].nbytes)


register_schema("Sum", inputs=(1, MANY), outputs=1, output_names=("Y",), inplace=((0, 0),),
                shape_fn=_sum_shape, cost_fn=_sum_cost, family="elementwise",
                doc="Y = X0 + X1 + ... (same shapes). May write over input 0: the backward "
                    "builder accumulates gradients with Sum([g, tmp], [g]).")


@register_kernel("Sum")
def sum_kernel(ctx, *xs):
    for k, x in enumerate(xs[1:], start=1):
        if x.shape != xs[0].shape:
            raise ShapeError(f"Sum: input 0 has shape {fmt(xs[0].shape)} but input {k} has "
                             f"shape {fmt(x.shape)}; they must match")
    Y = ctx.output(0, xs[0].shape, xs[0].dtype)
    if len(xs) == 1:
        ctx.xp.copyto(Y, xs[0])
        return
    # Y may be xs[0] itself (in place); xs[1:] never alias Y (the schema forbids it).
    ctx.xp.add(xs[0], xs[1], out=Y)
    for x in xs[2:]:
        ctx.xp.add(Y, x, out=Y)


@register_gradient("Sum")
def _sum_grad(g: GradientContext) -> list[OperatorDef]:
    dY, ops, seen = g.GO(0), [], {}
    for i, blob in enumerate(g.def_.inputs):
        seen.setdefault(blob, []).append(i)
    for blob, idx in seen.items():
        gi = g.GI(idx[0])
        if len(idx) > 1:  # Sum(X, X): dX = 2·dY
            ops.append(g.op("Scale", [dY], [gi], scale=float(len(idx))))
        elif gi != dY:    # in place over input 0, dX is dY already
            ops.append(g.op("Copy", [dY], [gi]))
    return ops


# AddRelu --------------------------------------------------------------------------------
# Elements per block: the sum and the ReLU run on one block while it is in the L2 cache,
# instead of two passes over the whole tensor.
_BLOCK = 1 << 15


def _shape_of_sum(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    out = broadcast_shapes("AddRelu", ins[0].shape, ins[1].shape)
    return [TensorSpec(out, np.result_type(ins[0].dtype, ins[1].dtype).name)]


def _same_shape_of_sum(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    if args.same_shape:
        require_same_shape("AddRelu", ("A", "B"), ins[0], ins[1])
    return _shape_of_sum(args, ins)


register_schema("AddRelu", inputs=2, outputs=1, input_names=("A", "B"), output_names=("Y",),
                args=[Arg("same_shape", "int", 0, allowed=(0, 1),
                          doc="1: A and B have the same shape (checked), so the gradient of "
                              "each is the masked dY itself, with no copy")],
                inplace=((0, 0), (1, 0)), shape_fn=_same_shape_of_sum,
                cost_fn=elementwise_cost(2), family="elementwise",
                doc="Y = max(A + B, 0) with NumPy broadcasting: Add then Relu in one op (a "
                    "residual block's sum; the bind-time rewrites make it, for inference and "
                    "training).")


def _add_relu_blocks(xp, a, b, y) -> None:
    """y = max(a + b, 0) over flat views, block by block."""
    for start in range(0, y.size, _BLOCK):
        part = slice(start, start + _BLOCK)
        xp.add(a[part], b[part], out=y[part])
        xp.maximum(y[part], 0, out=y[part])


@register_kernel("AddRelu")
def add_relu(ctx, A, B):
    xp = ctx.xp
    if ctx.args.same_shape and A.shape != B.shape:
        raise ShapeError(f"AddRelu: same_shape=1 but A has shape {fmt(A.shape)} and B "
                         f"{fmt(B.shape)}")
    shape = broadcast_shapes("AddRelu", A.shape, B.shape)
    Y = ctx.output(0, shape, np.result_type(A.dtype, B.dtype))
    same = A.shape == B.shape == Y.shape and A.ndim > 0
    if xp is not np or not same or not all(a.flags.c_contiguous for a in (A, B, Y)):
        xp.add(A, B, out=Y)
        xp.maximum(Y, 0, out=Y)
        return
    if relu_kernels.compiled(xp, A, B, Y):   # one compiled pass over fixed chunks
        relu_kernels.add_relu(xp, A, B, Y)
        return
    # Images are independent: the batch's fixed chunks on the worker threads (no sums, so
    # the bits never depend on the partition).
    n = Y.shape[0]
    a, b, y = (t.reshape(n, -1) for t in (A, B, Y))

    def chunk(_i: int, n0: int, n1: int) -> None:
        _add_relu_blocks(xp, a[n0:n1].reshape(-1), b[n0:n1].reshape(-1), y[n0:n1].reshape(-1))

    parallel.chunks(xp, n, chunk, work=3 * Y.size)


@register_preparer("AddRelu")
def _prepare_add_relu(ctx) -> None:
    """Load the compiled pass at bind time (not in the first iteration)."""
    relu_kernels.prepare(ctx.xp)


@register_gradient("AddRelu")
def _add_relu_grad(g: GradientContext) -> list[OperatorDef]:
    """ReluGradient on the output, and that masked dY is the gradient of both inputs (of
    the same shape, as a plain sum's are: no copy); with broadcasting, Add's gradient sums
    it back to each input's shape (reading A and B for their shapes only: an input
    overwritten in place is stood in for by the masked dY)."""
    d, dy = g.def_, g.GO(0)
    masked = f"{dy}_relu"
    ops = [g.op("ReluGradient", [g.O(0), dy], [masked])]
    if g.args.get("same_shape", 0):
        for i in (0, 1):
            g.grad_is(i, masked)
        return ops
    refs = [masked if d.inputs[i] == d.outputs[0] else g.I(i) for i in (0, 1)]
    return ops + [g.op("AddGradient", [masked, *refs], [g.GI(0), g.GI(1)])]
