"""Pointwise activations: Relu, ... Each section: schema, kernel, gradient maker."""
from __future__ import annotations

from netrun.core.gradient import register_gradient
from netrun.core.registry import register_kernel
from netrun.core.schema import register_schema
from netrun.ops.common import elementwise_cost, same_as_input

# Relu -----------------------------------------------------------------------------------
register_schema("Relu", inputs=1, outputs=1, input_names=("X",), output_names=("Y",),
                inplace=((0, 0),), shape_fn=same_as_input(0), cost_fn=elementwise_cost(1),
                family="activation", doc="Y = max(X, 0), elementwise.")


@register_kernel("Relu")
def relu(ctx, X):
    Y = ctx.output(0, X.shape, X.dtype)
    ctx.xp.maximum(X, 0, out=Y)


register_schema("ReluGradient", inputs=2, outputs=1, input_names=("Y", "dY"),
                output_names=("dX",), inplace=((1, 0),), shape_fn=same_as_input(1),
                cost_fn=elementwise_cost(1), family="activation",
                doc="dX = dY where Y > 0, else 0 (uses the output, so Relu may run in place).")


@register_kernel("ReluGradient")
def relu_gradient(ctx, Y, dY):
    dX = ctx.output(0, dY.shape, dY.dtype)
    ctx.xp.multiply(dY, Y > 0, out=dX)


@register_gradient("Relu")
def _relu_grad(g):
    return [g.op("ReluGradient", [g.O(0), g.GO(0)], [g.GI(0)])]
