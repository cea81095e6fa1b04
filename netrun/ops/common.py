"""Helpers shared by operator families: shape and cost functions, argument patterns."""
from __future__ import annotations

from typing import Sequence

from netrun.core.schema import Arg, Args, Cost, TensorSpec
from netrun.errors import ShapeError
from netrun.kernels import parallel
from netrun.kernels.geometry import LEGACY_PADS


def same_as_input(index: int = 0):
    """Shape function: every output has the shape and dtype of input `index`."""

    def fn(args: Args, ins: list[TensorSpec]) -> list[TensorSpec]:
        return [ins[index]]

    return fn


def elementwise_cost(flops_per_element: int = 1):
    """Cost function: `flops_per_element` per output element; all inputs read, outputs written."""

    def fn(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
        return Cost(flops_per_element * sum(o.size for o in outs),
                    sum(i.nbytes for i in ins), sum(o.nbytes for o in outs))

    return fn


def require_same_shape(what: str, names: tuple[str, str], a: TensorSpec, b: TensorSpec) -> None:
    """Raise a ShapeError naming both blobs and both shapes when they differ."""
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"{what}: '{names[0]}' has shape {a} but '{names[1]}' has shape {b}; "
                         f"they must match")


class RepeatCall:
    """An op's whole run as one call on the arrays of its last run: the `bound` that
    OpContext.repeat_with repeats while those arrays stay, for ops whose Python costs more
    than their arithmetic at batch 1 (a classifier's FC, a global pooling)."""

    __slots__ = ("run",)

    def __init__(self, call):
        self.run = call

    def close(self) -> None:
        """Nothing to release: the call holds only views of the op's arrays."""


class ScratchHolds:
    """A RepeatCall's check for a call bound to the op's scratch and cut for netrun's thread
    count (a team call): both as they were when it was bound. `steady` is the part a whole
    net's pass checks at once (netrun.core.bound_pass: no op carves scratch there)."""

    __slots__ = ("ctx", "threads", "mark")

    def __init__(self, ctx):
        self.ctx, self.threads, self.mark = ctx, parallel.thread_count(), ctx.scratch_mark()

    def steady(self) -> bool:
        """The thread count is the one the call was cut for."""
        return parallel.thread_count() == self.threads and not parallel.in_chunk()

    def __call__(self) -> bool:
        return self.steady() and self.ctx.scratch_mark() == self.mark


def repeat_team_call(ctx, call) -> None:
    """The op's next runs are `call()` alone (OpContext.repeat_with) while its arrays, its
    scratch regions and the thread count stay; outside a net's run (no scratch promise)
    they run the kernel again."""
    if ctx.scratch_mark() is not None:
        ctx.repeat_with(RepeatCall(call), ScratchHolds(ctx))


def fmt(shape: Sequence[int]) -> str:
    """A shape as error messages print it: 2×3×4 (or 'scalar')."""
    return str(TensorSpec(tuple(shape)))


def input_cost(flops_per_element: int):
    """Cost function: `flops_per_element` per element of input 0; all inputs and outputs moved."""

    def fn(args: Args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
        return Cost(flops_per_element * ins[0].size, sum(i.nbytes for i in ins),
                    sum(o.nbytes for o in outs))

    return fn


def normalize_axis(what: str, axis: int, ndim: int, **shapes: tuple) -> int:
    """`axis` in [-ndim, ndim) made non-negative, or a ShapeError naming the blobs' shapes."""
    if not -ndim <= axis < ndim:
        named = ", ".join(f"{role} {fmt(s)}" for role, s in shapes.items())
        raise ShapeError(f"{what}: axis {axis} is out of range for {ndim} dims: {named}")
    return axis % ndim


def conv_pool_args() -> tuple[Arg, ...]:
    """The argument list shared by the Conv, ConvTranspose and pooling schemas."""
    args = []
    for base, plural, what in (("kernel", "kernels", "window size"), ("stride", "strides", "step"),
                               ("dilation", "dilations", "spacing of kernel taps")):
        args += [Arg(base, "int", None, doc=f"{what}, both axes"),
                 Arg(f"{base}_h", "int", None, doc=f"{what}, height"),
                 Arg(f"{base}_w", "int", None, doc=f"{what}, width"),
                 Arg(plural, "ints", None, doc=f"{what} as [h, w]")]
    args += [Arg("pad", "int", None, doc="zero padding on all four sides"),
             *(Arg(f"pad_{s}", "int", None, doc=f"padding, {side}")
               for s, side in (("t", "top"), ("l", "left"), ("b", "bottom"), ("r", "right"))),
             Arg("pads", "ints", None, doc="padding as [top, left, bottom, right] (Caffe2 order)"),
             Arg("order", "str", "NCHW", allowed=("NCHW", "NHWC"), doc="storage order"),
             Arg("legacy_pad", "any", "NOTSET", allowed=LEGACY_PADS + (0, 1, 2, 3),
                 doc="NOTSET: explicit pads; VALID: none; SAME: output = ceil(in / stride); "
                     "CAFFE_LEGACY_POOLING: Caffe's ceil-mode pooling (also 0..3)")]
    return tuple(args)
