"""Nets as Caffe2 wrote them, in the arguments netrun's schemas take.

Caffe2 operators ignore arguments they do not use, and its model builders put a few on every
op: kernel-search hints (exhaustive_search, ws_nbytes_limit, ...) and `order` on ops whose
result does not depend on the layout. netrun's schemas refuse unknown arguments (a typo must
not pass silently), so a Caffe2 net is brought to netrun's terms when it is loaded: hints
dropped, Concat's and Split's `order` turned into the `axis` it stands for. An argument the
op's schema declares is always left alone, so none of this touches a netrun net.
"""
from __future__ import annotations

from netrun.core.schema import OpSchema, get_schema
from netrun.errors import UnknownOpError
from netrun.proto.defs import NetDef, OperatorDef

# Arguments with which Caffe2 picks a kernel or its scratch space, never the values computed.
KERNEL_HINTS = ("exhaustive_search", "cudnn_exhaustive_search", "ws_nbytes_limit",
                "shared_buffer", "use_cudnn")
# Families whose ops compute element by element (or along an explicit axis): `order` says
# nothing to them, and Caffe2's versions ignore it too.
LAYOUT_FREE = ("activation", "unary", "elementwise", "dropout", "softmax")
# Concat and Split: Caffe2 reads `order` as the channel axis when no `axis` is given.
ORDER_AXIS = {"NCHW": 1, "NHWC": 3}


def from_caffe2(net: NetDef) -> NetDef:
    """The net with Caffe2-only arguments dropped or translated (a copy; ops unchanged when
    there is nothing to do)."""
    return NetDef(net.name, [_op_from_caffe2(op) for op in net.ops],
                  list(net.external_inputs), list(net.external_outputs))


def _op_from_caffe2(op: OperatorDef) -> OperatorDef:
    try:
        schema = get_schema(op.type)
    except UnknownOpError:
        return op                      # binding the net says so, with the closest name
    args = {k: v for k, v in op.args.items()
            if k not in KERNEL_HINTS or schema.arg_spec(k) is not None}
    if "order" in args and schema.arg_spec("order") is None:
        args = _without_order(op, schema, args)
    return op if args == op.args else op.with_(args=args)


def _without_order(op: OperatorDef, schema: OpSchema, args: dict) -> dict:
    order = args["order"]
    if op.type in ("Concat", "Split") and order in ORDER_AXIS:
        rest = {k: v for k, v in args.items() if k != "order"}
        return rest if "axis" in rest else {**rest, "axis": ORDER_AXIS[order]}
    if schema.family in LAYOUT_FREE or order == "NCHW":
        # NCHW is what every netrun op without an `order` argument works in
        return {k: v for k, v in args.items() if k != "order"}
    return args                        # NHWC where it matters: the schema refuses it
