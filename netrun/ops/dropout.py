"""Dropout (inverted, as Caffe and Caffe2 do it) and its gradient."""
from __future__ import annotations

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, TensorSpec, register_schema
from netrun.errors import SchemaError
from netrun.ops.common import elementwise_cost, same_as_input

_ARGS = [Arg("ratio", "float", 0.5, doc="probability of zeroing an element, in [0, 1)"),
         Arg("is_test", "int", 0, allowed=(0, 1), doc="1: Y = X, no mask is drawn")]


def _check_ratio(op, args: Args) -> None:
    if not 0.0 <= args.ratio < 1.0:
        raise SchemaError(f"op {op.label}: argument 'ratio' is {args.ratio}; it must lie in "
                          f"[0, 1) (the kept elements are scaled by 1/(1 − ratio))")


def _check(op, args: Args) -> None:
    _check_ratio(op, args)
    if not args.is_test and len(op.outputs) != 2:
        raise SchemaError(f"op {op.label}: Dropout in training (is_test=0) needs a second "
                          f"output for the mask, which its gradient reads")


def _check_gradient(op, args: Args) -> None:
    _check_ratio(op, args)
    if not args.is_test and len(op.inputs) != 2:
        raise SchemaError(f"op {op.label}: {op.type} in training (is_test=0) needs the mask "
                          f"as its second input")


# Dropout ---------------------------------------------------------------------------------
def _dropout_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    return [ins[0], TensorSpec(ins[0].shape, "bool")]


register_schema(
    "Dropout", inputs=1, outputs=(1, 2), input_names=("X",), output_names=("Y", "mask"),
    args=_ARGS, inplace=((0, 0),), shape_fn=_dropout_shape, cost_fn=elementwise_cost(2),
    check_fn=_check, family="dropout",
    doc="Training: mask = uniform[0,1) ≥ ratio (kept with probability 1 − ratio), "
        "Y = X · mask / (1 − ratio), so no rescaling is needed at test time (Caffe and "
        "Caffe2's inverted dropout). The draws come from the workspace's device generator, "
        "so a seeded workspace repeats its masks; training needs the mask output. "
        "is_test=1: Y = X (and the mask, if asked for, all true).")


@register_kernel("Dropout")
def dropout(ctx, X):
    xp, a = ctx.xp, ctx.args
    if a.is_test:
        if len(ctx.def_.outputs) == 2:
            ctx.output(1, X.shape, "bool").fill(True)
        # A view of X, not a copy; in place (Y is X) there is nothing to do at all.
        return None if ctx.def_.outputs[0] == ctx.def_.inputs[0] else X
    # float32 draws whatever X's dtype: P(u ≥ ratio) = 1 − ratio up to 2^-24.
    u = ctx.scratch("dropout.uniform", X.shape, "float32")
    # size is passed with out: CuPy's Generator would otherwise draw one value and broadcast it.
    ctx.rng.random(u.shape, dtype=xp.float32, out=u)
    mask = ctx.output(1, X.shape, "bool")
    xp.greater_equal(u, a.ratio, out=mask)
    Y = ctx.output(0, X.shape, X.dtype)
    xp.multiply(X, mask, out=Y)
    Y *= 1.0 / (1.0 - a.ratio)


# DropoutGradient (also under Caffe2's name DropoutGrad) ---------------------------------------
for _type in ("DropoutGradient", "DropoutGrad"):
    register_schema(
        _type, inputs=(1, 2), outputs=1, input_names=("dY", "mask"), output_names=("dX",),
        args=_ARGS, inplace=((0, 0),), shape_fn=same_as_input(0),
        cost_fn=elementwise_cost(2), check_fn=_check_gradient, family="dropout",
        doc="dX = dY · mask / (1 − ratio); is_test=1: dX = dY (no mask input needed).")


def dropout_gradient(ctx, dY, mask=None):
    a = ctx.args
    if a.is_test:
        return None if ctx.def_.outputs[0] == ctx.def_.inputs[0] else dY
    dX = ctx.output(0, dY.shape, dY.dtype)
    ctx.xp.multiply(dY, mask, out=dX)
    dX *= 1.0 / (1.0 - a.ratio)


register_kernel("DropoutGradient")(dropout_gradient)
register_kernel("DropoutGrad")(dropout_gradient)


@register_gradient("Dropout")
def _dropout_grad(g):
    args = g.copy_args("ratio", "is_test")
    if g.args.get("is_test", 0):
        return [g.op("DropoutGradient", [g.GO(0)], [g.GI(0)], **args)]
    return [g.op("DropoutGradient", [g.GO(0), g.O(1)], [g.GI(0)], **args)]
