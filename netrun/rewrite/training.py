"""Training rules, applied to the forward ops before the backward pass is built: the gradient
registry then makes the fused ops' own gradients (SpatialBNRelu -> SpatialBNReluGradient;
AddRelu -> ReluGradient, its masked dY being both inputs' gradient)."""
from __future__ import annotations

from netrun.core.gradient import has_gradient
from netrun.core.schema import all_schemas
from netrun.proto.defs import OperatorDef
from netrun.rewrite.graph import Graph
from netrun.rewrite.inference import sum_then_relu
from netrun.rewrite.rule import Context, Match, Rule, fused_name


def _bn_relu(g: Graph, ctx: Context) -> Match | None:
    for j, bn, k, relu in g.after("Relu"):
        if bn.type != "SpatialBN" or not g.private(j, k):
            continue
        # Everything but the normalized output moves from j to k.
        if not g.clean_between(j, k, bn.inputs + bn.outputs[1:]):
            continue
        fused = bn.with_(type="SpatialBNRelu", outputs=relu.outputs + bn.outputs[1:],
                         name=fused_name(bn, relu))
        return Match((j, k), fused)
    return None


def _add_relu(g: Graph, ctx: Context) -> Match | None:
    found = sum_then_relu(g)
    if found is None:
        return None
    i, add, j, relu = found
    # inputs of one known shape (a residual sum) share the masked gradient, no copies
    shapes = [ctx.shape_of(n) for n in add.inputs]
    same = int(shapes[0] is not None and shapes[0] == shapes[1])
    fused = OperatorDef("AddRelu", add.inputs, relu.outputs, {"same_shape": same},
                        fused_name(add, relu), add.device, add.engine)
    return Match((i, j), fused)


def _available() -> bool:
    return "SpatialBNRelu" in all_schemas() and has_gradient("SpatialBNRelu")


RULES = (
    Rule("bn_relu", "SpatialBN then Relu: one SpatialBNRelu op (its gradient in one pass "
         "too)", "training", _bn_relu, _available),
    Rule("add_relu", "Add (or a two-input Sum) then Relu: one AddRelu op; inputs of one "
         "shape get the masked gradient itself", "training", _add_relu),
)
