"""Caffe2 init nets as weights: a NetDef of fill ops that creates a model's parameters.

A Caffe2 model-zoo model is a predict net plus an init net whose ops are GivenTensorFill and
its typed siblings, one per parameter, the values in the op's arguments. A weights file is
data, so an init net may hold fill ops only: anything that computes (or reads a blob the
init net did not make) is refused before a single op runs.
"""
from __future__ import annotations

import copy
import dataclasses
import os

from netrun.core.schema import TensorSpec, get_schema
from netrun.core.shape_inference import infer_shapes
from netrun.errors import CheckpointError, SchemaError, ShapeError, UnknownOpError
from netrun.model.model import Model
from netrun.proto.defs import NetDef, OperatorDef
from netrun.proto.io import load_netdef

# Caffe2's typed fills, all GivenTensorFill with a dtype here. The integer ones go through
# GivenTensorFill's float `values`, exact up to 2**53 (checked).
TYPED_FILLS = {"GivenTensorDoubleFill": "float64", "GivenTensorIntFill": "int32",
               "GivenTensorInt64Fill": "int64", "GivenTensorBoolFill": "bool"}
# Caffe2 writes a fill's dtype as its TensorProto.DataType number.
CAFFE2_DTYPES = {1: "float32", 2: "int32", 5: "bool", 10: "int64", 12: "float16", 13: "float64"}
_EXACT = 2 ** 53


def read_init_net(path: str | os.PathLike) -> NetDef:
    """An init net file (.pb, .pbtxt) checked to hold fill ops only, in netrun's fill ops."""
    return as_init_net(load_netdef(path), str(path))


def as_init_net(net: NetDef, where: str) -> NetDef:
    """The net with Caffe2's typed fills and numeric dtypes in netrun's terms; every op must
    be a fill that reads nothing, or only blobs an earlier op of the net made."""
    made: set[str] = set()
    ops = []
    for index, op in enumerate(net.ops):
        op = _netrun_fill(op, index, where)
        unmade = [b for b in op.inputs if b not in made]
        if unmade:
            raise CheckpointError(f"{where}: op {index} {op.label} of the init net reads blob "
                                  f"'{unmade[0]}', which no earlier op of it makes; a weights file "
                                  f"creates its blobs from its own values only")
        made.update(op.outputs)
        ops.append(op)
    return NetDef(net.name, ops, list(net.external_inputs), list(net.external_outputs))


def _netrun_fill(op: OperatorDef, index: int, where: str) -> OperatorDef:
    args = dict(op.args)
    dtype = args.get("dtype")
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype not in CAFFE2_DTYPES:
            raise CheckpointError(f"{where}: op {index} {op.label} has dtype {dtype} (Caffe2's "
                                  f"TensorProto.DataType); netrun's fills make "
                                  f"{', '.join(f'{k} ({v})' for k, v in CAFFE2_DTYPES.items())}")
        args["dtype"] = CAFFE2_DTYPES[dtype]
    if op.type in TYPED_FILLS:
        typed = TYPED_FILLS[op.type]
        if args.setdefault("dtype", typed) != typed:
            raise CheckpointError(f"{where}: op {index} {op.label} has dtype {args['dtype']}, "
                                  f"but its type says {typed}")
        big = next((v for v in args.get("values", []) if isinstance(v, int) and abs(v) > _EXACT),
                   None)
        if big is not None:
            raise CheckpointError(f"{where}: op {index} {op.label} holds the value {big}, beyond "
                                  f"what netrun's GivenTensorFill keeps exactly (2**53)")
        op = op.with_(type="GivenTensorFill", args=args)
    elif args != op.args:
        op = op.with_(args=args)
    try:
        family = get_schema(op.type).family
    except UnknownOpError:
        family = None
    if family != "fill":
        raise CheckpointError(f"{where}: op {index} {op.label} is not a fill op; an init net "
                              f"(weights) may only create blobs from its values (GivenTensorFill, "
                              f"ConstantFill, ...). Is this the predict net? Give the init net.")
    return op


def init_net_specs(net: NetDef, where: str) -> dict[str, TensorSpec]:
    """The shape and dtype of every blob the init net creates (its ops checked first)."""
    try:
        return dict(infer_shapes(net, {}).blobs)
    except (SchemaError, ShapeError) as e:
        raise type(e)(f"{where}: {e}") from None


def with_init_net(model: Model, net: NetDef, where: str) -> Model:
    """A copy of the model whose init net is `net` (checked as_init_net) and whose parameter
    shapes are the ones it creates; its data inputs keep what the model says of them."""
    net = as_init_net(net, where)
    specs = init_net_specs(net, where)
    out = copy.copy(model)
    out.init_net = net
    out.params = [dataclasses.replace(p, shape=tuple(specs[p.name].shape))
                  if p.name in specs else p for p in model.params]
    return out
