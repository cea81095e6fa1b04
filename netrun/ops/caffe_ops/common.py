"""Shared bits of the Caffe operators."""
from __future__ import annotations

from netrun.core.schema import Cost, TensorSpec

FAMILY = "caffe_ops"


def moved(ins: list[TensorSpec], outs: list[TensorSpec], flops: int) -> Cost:
    """`flops` FLOPs; every input read and every output written once."""
    return Cost(flops, sum(i.nbytes for i in ins), sum(o.nbytes for o in outs))
