"""Conv, ConvTranspose and their gradients on the GPU: the CPU ops' code with GPU algorithms.

Geometry, NHWC transposes, bias and the dX-is-optional logic stay in netrun.ops.conv; what
differs on a GPU is the choice of algorithm. Before the shared kernel runs, the op's state is
bound to a `GPUConvProblem` (so only GPU algorithms apply) and the algorithm of each
direction the op will run is chosen by netrun.algos.gpu.search and stored where the shared
kernel looks for it (`ctx.state["setup"]`: key, problem, output shape, choices).
"""
from __future__ import annotations

from netrun.algos.gpu import search
from netrun.algos.gpu.base import GPUConvProblem
from netrun.core.registry import register_kernel
from netrun.core.schema import TensorSpec
from netrun.errors import ShapeError
from netrun.ops import conv as conv_ops

_SHORT = {"forward": "fwd", "backward_data": "data", "backward_filter": "filter"}


def _setup(ctx, X, W) -> tuple:
    """ctx.state['setup'] for these shapes with a GPUConvProblem (the shared kernel's key)."""
    key = (X.shape, W.shape, str(X.dtype), getattr(ctx.ws, "algo_generation", 0))
    cached = ctx.state.get("setup")
    if cached is None or cached[0] != key or not isinstance(cached[1], GPUConvProblem):
        transposed = ctx.def_.type.startswith("ConvTranspose")
        try:
            specs = [TensorSpec(tuple(X.shape), str(X.dtype)), TensorSpec(tuple(W.shape))]
            problem, out_shape = conv_ops._conv_problem(ctx.args, specs, transposed)
            problem = GPUConvProblem.of(problem)
            if ctx.args.algo:   # a fixed GPU algorithm that cannot run this shape fails here
                search.select(problem, ctx.args.algo)
        except ShapeError as e:
            raise ShapeError(f"op {ctx.def_.label}: {e}") from None
        cached = ctx.state["setup"] = (key, problem, out_shape, {})
    return cached


def directions(ctx) -> list[str]:
    """The algorithm directions this op runs (the dX pass only when dX is an output)."""
    type_, outputs = ctx.def_.type, ctx.def_.outputs
    if type_ == "Conv":
        return ["forward"]
    if type_ == "ConvTranspose":
        return ["backward_data"]
    with_dx = len(outputs) == (2 if ctx.args.no_bias else 3)
    data = "backward_data" if type_ == "ConvGradient" else "forward"
    return ["backward_filter"] + ([data] if with_dx else [])


def prepare(ctx, X, W) -> None:
    """Bind the GPU problem and choose the algorithm of every direction not chosen yet."""
    _, problem, _, chosen = _setup(ctx, X, W)
    missing = [d for d in directions(ctx) if d not in chosen]
    for d in missing:
        chosen[d] = search.choose(ctx.ws, problem, d, ctx.backend, ctx.args.algo, ctx.scratch)
    if missing:
        names = list(dict.fromkeys(a.name for a in chosen.values()))
        ctx.state["algo"] = names[0] if len(names) == 1 else "/".join(
            f"{_SHORT[d]}:{a.name}" for d, a in chosen.items())


@register_kernel("Conv", backend="gpu")
@register_kernel("ConvTranspose", backend="gpu")
def conv_forward(ctx, X, W, b=None):
    """Y = conv(X, W) + b (ConvTranspose: its transpose) with the chosen GPU algorithm."""
    prepare(ctx, X, W)
    conv_ops._forward(ctx, X, W, b)


@register_kernel("ConvGradient", backend="gpu")
@register_kernel("ConvTransposeGradient", backend="gpu")
def conv_backward(ctx, X, W, dY):
    """dW, db and (when it is an output) dX with the chosen GPU algorithms."""
    prepare(ctx, X, W)
    conv_ops._backward(ctx, X, W, dY)
