"""Inference rules: test-mode normalization folded into the conv, ReLU fused into the conv
and into the residual sum, and that sum into the conv that feeds it."""
from __future__ import annotations

from netrun.proto.defs import OperatorDef
from netrun.rewrite.fold import Fold
from netrun.rewrite.graph import Graph
from netrun.rewrite.rule import Context, Match, Rule, fused_name


def _test_mode(o: OperatorDef) -> bool:
    return int(o.args.get("is_test", 0)) == 1


def _conv_before(g: Graph, j: int, ctx: Context):
    """(index, conv) when op j's input 0 is a plain Conv's output read by op j alone, with
    filters and bias that are parameters of known shape; else None."""
    found = g.producer(j, 0)
    if found is None:
        return None
    i, conv = found
    if conv.type != "Conv" or int(conv.args.get("relu", 0)) or not g.private(i, j):
        return None
    if not all(g.constant(n) and ctx.shape_of(n) is not None for n in conv.inputs[1:]):
        return None
    return i, conv


def _params(g: Graph, ctx: Context, names, channels: int) -> bool:
    """Whether every name is a parameter of shape (channels,)."""
    return all(g.constant(n) and tuple(ctx.shape_of(n) or ()) == (channels,) for n in names)


def _folded_conv(conv: OperatorDef, last: OperatorDef, fold: Fold, *parts) -> OperatorDef:
    args = {k: v for k, v in conv.args.items() if k != "no_bias"}
    return conv.with_(inputs=(conv.inputs[0], fold.weight, fold.bias), outputs=last.outputs[:1],
                      args=args, name=fused_name(conv, *parts))


def _fold_spatial_bn(g: Graph, ctx: Context) -> Match | None:
    for j, bn in enumerate(g.ops):
        if bn.type != "SpatialBN" or not _test_mode(bn) or len(bn.outputs) != 1:
            continue
        found = _conv_before(g, j, ctx)
        if found is None:
            continue
        i, conv = found
        channels = ctx.shape_of(conv.inputs[1])[0]
        if (bn.args.get("order", "NCHW") != conv.args.get("order", "NCHW")
                or not _params(g, ctx, bn.inputs[1:], channels)
                or not g.clean_between(i, j, conv.inputs)):
            continue
        out = bn.outputs[0]
        fold = Fold(ctx.fresh(f"{out}_fused_w"), ctx.fresh(f"{out}_fused_b"), conv.inputs[1],
                    conv.inputs[2] if len(conv.inputs) > 2 else None, bn.inputs[3],
                    bn.inputs[4], float(bn.args.get("epsilon", 1e-5)), gamma=bn.inputs[1],
                    beta=bn.inputs[2])
        return Match((i, j), _folded_conv(conv, bn, fold, bn), (fold,))
    return None


def _affine_after(g: Graph, j: int, type: str, channels: int, ctx: Context):
    """(index, op) of a Caffe Scale/Bias half (Mul or Add of a per-channel parameter at
    axis 1) reading op j's output alone, else None."""
    readers = g.readers.get((j, 0), [])
    if len(readers) != 1 or (j, 0) in g.observable:
        return None
    k, slot = readers[0]
    o = g.ops[k]
    if (o.type != type or slot != 0 or int(o.args.get("broadcast", 0)) != 1
            or int(o.args.get("axis", -1)) != 1 or not _params(g, ctx, o.inputs[1:], channels)):
        return None
    return k, o


def _fold_caffe_bn(g: Graph, ctx: Context) -> Match | None:
    for j, bn in enumerate(g.ops):
        if bn.type != "CaffeBatchNorm" or not _test_mode(bn) or len(bn.outputs) != 1:
            continue
        found = _conv_before(g, j, ctx)
        if found is None or found[1].args.get("order", "NCHW") != "NCHW":
            continue
        i, conv = found
        channels = ctx.shape_of(conv.inputs[1])[0]
        if (not _params(g, ctx, bn.inputs[1:3], channels)
                or tuple(ctx.shape_of(bn.inputs[3]) or ()) != (1,) or not g.constant(bn.inputs[3])):
            continue
        chain = [(j, bn)]
        mul = _affine_after(g, j, "Mul", channels, ctx)
        if mul is not None:
            chain.append(mul)
            add = _affine_after(g, mul[0], "Add", channels, ctx)
            if add is not None:
                chain.append(add)
        last = chain[-1][0]
        if not g.clean_between(i, last, conv.inputs + bn.inputs[1:], [k for k, _ in chain]):
            continue
        out = chain[-1][1].outputs[0]
        fold = Fold(ctx.fresh(f"{out}_fused_w"), ctx.fresh(f"{out}_fused_b"), conv.inputs[1],
                    conv.inputs[2] if len(conv.inputs) > 2 else None, bn.inputs[1],
                    bn.inputs[2], float(bn.args.get("epsilon", 1e-5)), factor=bn.inputs[3],
                    gamma=mul[1].inputs[1] if mul else None,
                    beta=chain[2][1].inputs[1] if len(chain) > 2 else None)
        parts = [o for _, o in chain]
        return Match((i, *(k for k, _ in chain)), _folded_conv(conv, parts[-1], fold, *parts),
                     (fold,))
    return None


def _conv_relu(g: Graph, ctx: Context) -> Match | None:
    for i, conv, j, relu in g.after("Relu"):
        if (conv.type != "Conv" or int(conv.args.get("relu", 0)) or not g.private(i, j)
                or not g.clean_between(i, j, conv.inputs)):
            continue
        return Match((i, j), conv.with_(outputs=relu.outputs, args={**conv.args, "relu": 1},
                                        name=fused_name(conv, relu)))
    return None


def sum_then_relu(g: Graph) -> tuple[int, OperatorDef, int, OperatorDef] | None:
    """The first (i, add, j, relu): a two-input plain Add (no legacy broadcast) or Sum whose
    result only a Relu reads, with nothing between them touching the summands."""
    for i, add, j, relu in g.after("Relu"):
        plain = add.type == "Add" and not int(add.args.get("broadcast", 0))
        if ((plain or add.type == "Sum") and len(add.inputs) == 2 and g.private(i, j)
                and g.clean_between(i, j, add.inputs)):
            return i, add, j, relu
    return None


def _add_relu(g: Graph, ctx: Context) -> Match | None:
    found = sum_then_relu(g)
    if found is None:
        return None
    i, add, j, relu = found
    fused = OperatorDef("AddRelu", add.inputs, relu.outputs, {}, fused_name(add, relu),
                        add.device, add.engine)
    return Match((i, j), fused)


def _conv_add_relu(g: Graph, ctx: Context) -> Match | None:
    for j, add in enumerate(g.ops):
        if add.type != "AddRelu" or len(add.inputs) != 2 or add.outputs[0] in add.inputs:
            continue
        convs = []
        for slot in (0, 1):
            found = g.producer(j, slot)
            if found is None:
                continue
            i, conv = found
            other = add.inputs[1 - slot]
            if (conv.type == "Conv" and not int(conv.args.get("relu", 0))
                    and len(conv.inputs) == 3 and conv.args.get("order", "NCHW") == "NCHW"
                    and other not in conv.outputs and g.private(i, j)
                    and g.clean_between(i, j, conv.inputs)):
                convs.append((i, conv, other))
        if not convs:
            continue
        i, conv, residual = max(convs, key=lambda c: c[0])   # the later conv moves less
        fused = conv.with_(inputs=(*conv.inputs, residual), outputs=add.outputs,
                           args={**conv.args, "relu": 1}, name=fused_name(conv, add))
        return Match((i, j), fused)
    return None


RULES = (
    Rule("fold_spatial_bn", "SpatialBN (is_test) after a Conv folded into its weights and bias",
         "inference", _fold_spatial_bn),
    Rule("fold_caffe_bn", "Caffe BatchNorm (+ Scale) after a Conv folded into its weights and "
         "bias", "inference", _fold_caffe_bn),
    Rule("conv_relu", "Conv then Relu: the Conv with relu=1 (a post-op where the algorithm "
         "has one)", "inference", _conv_relu),
    Rule("add_relu", "Add (or a two-input Sum) then Relu: one AddRelu op", "inference",
         _add_relu),
    Rule("conv_add_relu", "a Conv's output summed by an AddRelu: the Conv with the other "
         "summand as its residual input S and relu=1 (one pass out of oneDNN's layout)",
         "inference", _conv_add_relu),
)
