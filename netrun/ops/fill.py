"""Fillers: ConstantFill, GivenTensorFill, UniformFill, GaussianFill, XavierFill, MSRAFill.

The output shape comes from `shape`, from the one input's shape, or (input_as_shape=1) from
the input's values. Random fillers draw from the workspace's host NumPy generator and copy
the result to the device, so CPU and GPU runs initialize identically for a seed.
"""
from __future__ import annotations

import math

import numpy as np

from netrun.core.registry import register_kernel
from netrun.core.schema import REQUIRED, Arg, Args, Cost, TensorSpec, register_schema
from netrun.errors import SchemaError, ShapeError

FLOATS = ("float16", "float32", "float64")
ALL_DTYPES = FLOATS + ("int32", "int64", "bool")
FAN_IN, FAN_OUT, AVERAGE = "FAN_IN", "FAN_OUT", "AVERAGE"


def _common_args(dtypes: tuple[str, ...], dtype_default: str | None = "float32") -> list[Arg]:
    return [Arg("shape", "ints", [], doc="output shape, when there is no input"),
            Arg("dtype", "str", dtype_default, allowed=dtypes),
            Arg("input_as_shape", "int", 0, allowed=(0, 1),
                doc="1: the input is a 1-D integer tensor whose values are the output shape")]


def _check_common(op, args: Args) -> None:
    if op.inputs and args.shape and not args.input_as_shape:
        raise SchemaError(f"op {op.label}: argument 'shape' and an input were both given; the "
                          f"output takes the input's shape, so drop one of them")
    if args.input_as_shape and not op.inputs:
        raise SchemaError(f"op {op.label}: argument 'input_as_shape' is 1 but the op has no "
                          f"input to read the shape from")
    if any(d < 0 for d in args.shape):
        raise SchemaError(f"op {op.label}: argument 'shape' {args.shape} has a negative size")


def _output_spec(what: str, args: Args, ins: list[TensorSpec], dtype: str) -> TensorSpec:
    if args.input_as_shape:
        raise ShapeError(f"{what}: with input_as_shape=1 the output shape is the values of the "
                         f"input {ins[0]}, which shape inference cannot see")
    return TensorSpec(tuple(ins[0].shape) if ins else tuple(args.shape), dtype)


def _fill_cost(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    return Cost(outs[0].size, 0, outs[0].nbytes)  # the input lends its shape only


def _output_shape(ctx, inputs) -> tuple[int, ...]:
    if not inputs:
        return tuple(ctx.args.shape)
    if ctx.args.input_as_shape:
        return tuple(int(d) for d in ctx.backend.to_host(inputs[0]).reshape(-1))
    return tuple(inputs[0].shape)


def _register(type_: str, args: list[Arg], doc: str, dtypes=FLOATS, check=None,
              dtype_default: str | None = "float32", shape_fn=None) -> None:
    def default_shape_fn(a: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
        dtype = a.dtype or (ins[0].dtype if ins and not a.input_as_shape else "float32")
        return [_output_spec(type_, a, ins, dtype)]

    def check_fn(op, a: Args) -> None:
        _check_common(op, a)
        if check is not None:
            check(op, a)

    register_schema(type_, inputs=(0, 1), outputs=1, input_names=("shape_like",),
                    output_names=("Y",), args=_common_args(dtypes, dtype_default) + args,
                    shape_fn=shape_fn or default_shape_fn, cost_fn=_fill_cost,
                    check_fn=check_fn, no_gradient=True,
                    family="fill", doc=doc)


# ConstantFill ----------------------------------------------------------------------------
def _check_constant(op, args: Args) -> None:
    if isinstance(args.value, bool) or not isinstance(args.value, (int, float)):
        raise SchemaError(f"op {op.label}: argument 'value' must be a number, got {args.value!r}")


_register("ConstantFill", [Arg("value", "any", 0.0, doc="the fill value")],
          "Y = value everywhere. With one input and no dtype, Y also takes the input's dtype "
          "(the backward pass seeds gradients this way); else dtype defaults to float32.",
          dtypes=ALL_DTYPES, check=_check_constant, dtype_default=None)


@register_kernel("ConstantFill")
def constant_fill(ctx, *inputs):
    a = ctx.args
    dtype = a.dtype or (inputs[0].dtype if inputs and not a.input_as_shape else "float32")
    Y = ctx.output(0, _output_shape(ctx, inputs), dtype)
    Y.fill(a.value)


# GivenTensorFill -------------------------------------------------------------------------
def _check_given(op, args: Args) -> None:
    count = len(args["values"])  # args.values would be dict.values
    if op.inputs or not args.shape:
        return
    if math.prod(args.shape) != count:
        raise SchemaError(f"op {op.label}: argument 'values' has {count} entries but "
                          f"argument 'shape' {args.shape} holds {math.prod(args.shape)}")


def _given_shape(a: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
    if not ins and not a.shape:
        return [TensorSpec((len(a["values"]),), a.dtype)]
    return [_output_spec("GivenTensorFill", a, ins, a.dtype)]


_register("GivenTensorFill", [Arg("values", "floats", REQUIRED, doc="the elements, row-major")],
          "Y = values reshaped to `shape` (1-D of len(values) when neither shape nor an input "
          "is given).", dtypes=ALL_DTYPES, check=_check_given, shape_fn=_given_shape)


@register_kernel("GivenTensorFill")
def given_tensor_fill(ctx, *inputs):
    a = ctx.args
    shape = _output_shape(ctx, inputs) if inputs or a.shape else (len(a["values"]),)
    values = np.asarray(a["values"], dtype=a.dtype)
    if values.size != math.prod(shape):
        raise ValueError(f"values has {values.size} entries but the output shape {shape} "
                         f"holds {math.prod(shape)}")
    return ctx.backend.to_device(values.reshape(shape))


# UniformFill, GaussianFill ---------------------------------------------------------------
def _check_uniform(op, args: Args) -> None:
    if args.min > args.max:
        raise SchemaError(f"op {op.label}: argument 'min' ({args.min}) is above 'max' "
                          f"({args.max})")


def _check_gaussian(op, args: Args) -> None:
    if args.std < 0:
        raise SchemaError(f"op {op.label}: argument 'std' is {args.std}; it must be ≥ 0")


_register("UniformFill", [Arg("min", "float", 0.0), Arg("max", "float", 1.0)],
          "Y ~ uniform[min, max).", check=_check_uniform)
_register("GaussianFill", [Arg("mean", "float", 0.0), Arg("std", "float", 1.0)],
          "Y ~ normal(mean, std).", check=_check_gaussian)


def _random_output(ctx, inputs, draw):
    """Draw on the host in float64 (the same numbers for every dtype), then copy to the device."""
    shape = _output_shape(ctx, inputs)
    host = draw(ctx.host_rng, shape).astype(ctx.args.dtype, copy=False)
    return ctx.backend.to_device(host)


@register_kernel("UniformFill")
def uniform_fill(ctx, *inputs):
    a = ctx.args
    return _random_output(ctx, inputs, lambda rng, shape: rng.uniform(a.min, a.max, shape))


@register_kernel("GaussianFill")
def gaussian_fill(ctx, *inputs):
    a = ctx.args
    return _random_output(ctx, inputs, lambda rng, shape: rng.normal(a.mean, a.std, shape))


# XavierFill, MSRAFill --------------------------------------------------------------------
def fans(shape) -> tuple[float, float]:
    """(fan_in, fan_out) as Caffe's fillers count them: size / shape[0] and size / shape[1].

    For a conv filter K×C×kh×kw that is C·kh·kw and K·kh·kw; for an FC weight N_out×K it is
    K and N_out. A 1-D blob has fan_out = its size; a scalar counts as 1 and 1.
    """
    shape = tuple(shape)
    size = math.prod(shape)
    if not shape:
        return 1.0, 1.0
    fan_in = size / shape[0] if shape[0] else 0.0
    fan_out = (size / shape[1] if shape[1] else 0.0) if len(shape) > 1 else float(size)
    return fan_in, fan_out


def fan(shape, variance_norm: str = FAN_IN) -> float:
    """The n of Caffe's variance_norm: fan_in, fan_out or their average."""
    fan_in, fan_out = fans(shape)
    return {FAN_IN: fan_in, FAN_OUT: fan_out, AVERAGE: (fan_in + fan_out) / 2}[variance_norm]


_VARIANCE_NORM = Arg("variance_norm", "str", FAN_IN, allowed=(FAN_IN, FAN_OUT, AVERAGE),
                     doc="n = fan_in (size/shape[0]), fan_out (size/shape[1]) or their mean")
_register("XavierFill", [_VARIANCE_NORM],
          "Y ~ uniform(−√(3/n), +√(3/n)), n = fan_in by default (Caffe's and Caffe2's Xavier).")
_register("MSRAFill", [_VARIANCE_NORM],
          "Y ~ normal(0, √(2/n)), n = fan_in by default as in Caffe (Caffe2's MSRAFill used "
          "fan_out: pass variance_norm=FAN_OUT for that).")


@register_kernel("XavierFill")
def xavier_fill(ctx, *inputs):
    def draw(rng, shape):
        n = fan(shape, ctx.args.variance_norm)
        limit = math.sqrt(3.0 / n) if n else 0.0  # n = 0 only for an empty blob
        return rng.uniform(-limit, limit, shape)

    return _random_output(ctx, inputs, draw)


@register_kernel("MSRAFill")
def msra_fill(ctx, *inputs):
    def draw(rng, shape):
        n = fan(shape, ctx.args.variance_norm)
        return rng.normal(0.0, math.sqrt(2.0 / n) if n else 0.0, shape)

    return _random_output(ctx, inputs, draw)
