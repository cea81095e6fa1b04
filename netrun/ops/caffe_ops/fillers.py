"""Caffe's fillers that netrun's fill family lacks: BilinearFill, SparseGaussianFill,
PositiveUnitballFill. Random draws come from the workspace's host generator, as the fill
family's do, so CPU and GPU runs initialize identically."""
from __future__ import annotations

import math

import numpy as np

from netrun.core.registry import register_kernel
from netrun.core.schema import Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import SchemaError
from netrun.ops.caffe_ops.common import FAMILY


def _register_filler(type_: str, args: list[Arg], doc: str, check=None) -> None:
    def check_fn(op, a: Args) -> None:
        if any(d < 0 for d in a.shape):
            raise SchemaError(f"op {op.label}: argument 'shape' {a.shape} has a negative size")
        if check is not None:
            check(op, a)

    register_schema(type_, inputs=0, outputs=1, output_names=("Y",),
                    args=[Arg("shape", "ints", [], doc="output shape"),
                          Arg("dtype", "str", "float32", allowed=("float32", "float64"))] + args,
                    shape_fn=lambda a, ins: [TensorSpec(tuple(a.shape), a.dtype)],
                    cost_fn=lambda a, ins, outs: Cost(outs[0].size, 0, outs[0].nbytes),
                    check_fn=check_fn, no_gradient=True, family=FAMILY, doc=doc)


def _check_bilinear(op, a: Args) -> None:
    if len(a.shape) != 4 or a.shape[2] != a.shape[3]:
        raise SchemaError(f"op {op.label}: argument 'shape' must be 4-D with a square kernel "
                          f"(C_out×C_in×k×k, as Caffe's bilinear filler requires), got "
                          f"{a.shape}")


_register_filler("BilinearFill", [], "Y[..., y, x] = (1 − |x/f − c|)·(1 − |y/f − c|), f = "
                 "ceil(k/2), c = (2f − 1 − f mod 2)/(2f): bilinear upsampling weights for a "
                 "deconvolution (Caffe's bilinear filler).", check=_check_bilinear)


@register_kernel("BilinearFill")
def bilinear_fill(ctx):
    shape = tuple(ctx.args.shape)
    k = shape[-1]
    f = math.ceil(k / 2)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    row = 1 - np.abs(np.arange(k) / f - c)                       # (k,)
    host = np.broadcast_to(np.outer(row, row), shape).astype(ctx.args.dtype)
    return ctx.backend.to_device(np.ascontiguousarray(host))


_register_filler("SparseGaussianFill",
                 [Arg("mean", "float", 0.0), Arg("std", "float", 1.0),
                  Arg("sparse", "int", -1, doc="expected non-zeros per column; < 0: dense")],
                 "Y ~ normal(mean, std), each value kept with probability sparse/shape[0] "
                 "and zeroed otherwise (Caffe's gaussian filler with `sparse`).")


@register_kernel("SparseGaussianFill")
def sparse_gaussian_fill(ctx):
    a, rng = ctx.args, ctx.host_rng
    shape = tuple(a.shape)
    host = rng.normal(a.mean, a.std, shape)
    if a.sparse >= 0 and shape:
        host *= rng.uniform(size=shape) < a.sparse / shape[0]   # Bernoulli(sparse / num)
    return ctx.backend.to_device(host.astype(a.dtype))


_register_filler("PositiveUnitballFill", [],
                 "Y ~ uniform[0, 1), then each of the shape[0] slices divided by its sum "
                 "(Caffe's positive_unitball filler).")


@register_kernel("PositiveUnitballFill")
def positive_unitball_fill(ctx):
    shape = tuple(ctx.args.shape)
    host = ctx.host_rng.uniform(size=shape)
    rows = host.reshape(shape[0] if shape else 1, -1)            # (num, count / num)
    rows /= rows.sum(axis=1, keepdims=True)
    return ctx.backend.to_device(host.astype(ctx.args.dtype))
