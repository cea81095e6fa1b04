"""Power (Caffe's Power layer) and Max (Eltwise MAX): schema, kernel, gradient maker each."""
from __future__ import annotations

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import MANY, Arg, Args, TensorSpec, register_schema
from netrun.errors import ShapeError
from netrun.ops.caffe_ops.common import FAMILY, moved as _moved
from netrun.ops.common import elementwise_cost, same_as_input


# Power: Y = (shift + scale·X)^power --------------------------------------------------------
_POWER_ARGS = [Arg("power", "float", 1.0), Arg("scale", "float", 1.0), Arg("shift", "float", 0.0)]
register_schema("Power", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                args=_POWER_ARGS, shape_fn=same_as_input(0), cost_fn=elementwise_cost(3),
                family=FAMILY, doc="Y = (shift + scale·X)^power, elementwise (Caffe's Power).")


@register_kernel("Power")
def power(ctx, X):
    a, xp = ctx.args, ctx.xp
    Y = ctx.output(0, X.shape, X.dtype)
    xp.multiply(X, a.scale, out=Y)      # Python floats are weak scalars: Y keeps X's dtype
    Y += a.shift
    if a.power != 1.0:
        xp.power(Y, a.power, out=Y)


register_schema("PowerGradient", inputs=2, outputs=1, input_names=("X", "dY"),
                output_names=("dX",), args=_POWER_ARGS, inplace=((1, 0),),
                shape_fn=same_as_input(0), cost_fn=elementwise_cost(4), family=FAMILY,
                doc="dX = dY·power·scale·(shift + scale·X)^(power − 1).")


@register_kernel("PowerGradient")
def power_gradient(ctx, X, dY):
    a, xp = ctx.args, ctx.xp
    dX = ctx.output(0, X.shape, X.dtype)
    slope = a.power * a.scale
    if slope == 0.0 or a.power == 1.0:  # a constant derivative, as Caffe special-cases it
        xp.multiply(dY, slope, out=dX)
        return
    s = ctx.scratch("caffe.tmp", X.shape, X.dtype)
    xp.multiply(X, a.scale, out=s)
    s += a.shift
    if a.power != 2.0:
        xp.power(s, a.power - 1.0, out=s)
    s *= slope
    xp.multiply(dY, s, out=dX)


@register_gradient("Power")
def _power_grad(g):
    return [g.op("PowerGradient", [g.I(0), g.GO(0)], [g.GI(0)], **g.copy_args())]


# Max: Y = elementwise maximum of the inputs (Caffe's Eltwise MAX) --------------------------
def _max_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    for i, spec in enumerate(ins[1:], start=1):
        if tuple(spec.shape) != tuple(ins[0].shape):
            raise ShapeError(f"Max: input {i} has shape {spec} but input 0 has shape {ins[0]}; "
                             f"they must match")
    return [ins[0]]


register_schema("Max", inputs=(2, MANY), outputs=1, output_names=("Y",),
                shape_fn=_max_shape,
                cost_fn=lambda a, ins, outs: _moved(ins, outs, (len(ins) - 1) * outs[0].size),
                family=FAMILY, doc="Y = the elementwise maximum of the inputs (same shapes).")


@register_kernel("Max")
def max_(ctx, *xs):
    Y = ctx.output(0, xs[0].shape, xs[0].dtype)
    ctx.xp.maximum(xs[0], xs[1], out=Y)
    for x in xs[2:]:
        ctx.xp.maximum(Y, x, out=Y)


def _max_grad_shape(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    return [ins[0]] * (len(ins) - 2)


register_schema("MaxGradient", inputs=(4, MANY), outputs=(2, MANY), shape_fn=_max_grad_shape,
                cost_fn=lambda a, ins, outs: _moved(ins, outs, 3 * sum(o.size for o in outs)),
                family=FAMILY,
                doc="Inputs X0..Xn−1, Y, dY; dXi = dY where input i holds the maximum. Ties "
                    "follow Caffe: X1 wins a tie with X0, and any later input loses a tie.")


@register_kernel("MaxGradient")
def max_gradient(ctx, *ins):
    xp = ctx.xp
    xs, Y, dY = ins[:-2], ins[-2], ins[-1]
    hit, other, taken = (ctx.scratch(f"caffe.max_{k}", Y.shape, "bool")
                         for k in ("hit", "other", "taken"))

    def route(i: int, allowed) -> None:
        """dX_i = dY where input i holds the maximum and `allowed` says it wins the tie."""
        xp.equal(xs[i], Y, out=hit)
        xp.logical_and(hit, allowed, out=hit)
        xp.multiply(dY, hit, out=ctx.output(i, Y.shape, dY.dtype))

    # Caffe's first pair: X0 wins only when strictly greater than X1; later inputs win only
    # when strictly greater than the maximum so far.
    xp.greater(xs[0], xs[1], out=other)
    route(0, other)
    taken[...] = hit
    xp.logical_not(other, out=other)
    route(1, other)
    taken |= hit
    for i in range(2, len(xs)):
        xp.logical_not(taken, out=other)
        route(i, other)
        taken |= hit


@register_gradient("Max")
def _max_grad(g):
    n = len(g.def_.inputs)
    return [g.op("MaxGradient", [*(g.I(i) for i in range(n)), g.O(0), g.GO(0)],
                 [g.GI(i) for i in range(n)])]
