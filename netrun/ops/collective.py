"""Collectives of data-parallel training: AllreduceStart and AllreduceWait (Caffe2's
data_parallel_model put Allreduce ops into the net the same way).

The solver puts an `AllreduceStart` right after the backward op that finishes the last
gradient of a bucket, so the bucket travels while backward goes on, and the matching
`AllreduceWait`s at the end of the step net: each gradient then holds the mean over the ranks.
The start packs the bucket's gradients into one flat host buffer (small tensors fused into
one message) and begins a non-blocking allreduce on the workspace's communicator; the wait
completes it, divides by the number of ranks and unpacks. A token blob links each pair, so a
graph executor orders the wait after its start.

Where the communicator sums device arrays itself (`device_buffers`: NCCL,
netrun.backends.cuda.nccl) and the workspace is on a GPU, the flat buffer lives on the device
instead: packing, the sum, the division and the unpack are all queued on the compute stream,
and no gradient crosses to the host. Every other case (every CPU workspace) keeps the host
buffer, bit for bit as before.
"""
from __future__ import annotations

import numpy as np

from netrun.core.registry import register_kernel
from netrun.core.schema import MANY, Arg, Cost, TensorSpec, register_schema
from netrun.errors import InternalError, SchemaError

# In-place pairs of a wait: gradient i (input i + 1) is written back as output i.
_MAX_BUCKET = 1 << 14


def _start_cost(args, ins: list[TensorSpec], outs: list[TensorSpec]) -> Cost:
    nbytes = sum(s.size * 4 for s in ins)
    return Cost(0, nbytes, nbytes)


def _check_wait(op, args) -> None:
    if tuple(op.inputs[1:]) != tuple(op.outputs):
        raise SchemaError(f"op {op.label}: the gradients must be written in place (outputs "
                          f"the same blobs as inputs 1..n)")


register_schema(
    "AllreduceStart", inputs=(1, MANY), outputs=1, no_gradient=True, family="collective",
    input_names=("grads",), output_names=("token",),
    args=[Arg("bucket", "str", "", doc="name pairing this start with its wait")],
    shape_fn=lambda args, ins: [TensorSpec((1,), "float32")], cost_fn=_start_cost,
    doc="Pack the inputs into one buffer and start summing it over all ranks (non-blocking).")

register_schema(
    "AllreduceWait", inputs=(2, MANY), outputs=(1, MANY), no_gradient=True,
    family="collective", input_names=("token", "grads"), output_names=("grads",),
    inplace=tuple((i + 1, i) for i in range(_MAX_BUCKET)),
    enforce_inplace=(), check_fn=_check_wait,
    args=[Arg("bucket", "str", "", doc="the start's bucket name")],
    shape_fn=lambda args, ins: list(ins[1:]), cost_fn=_start_cost,
    doc="Finish the bucket's allreduce and write each gradient back as the mean over ranks.")


def _device_buffers(ctx) -> bool:
    """Whether the bucket's buffer lives on the device: a communicator that reduces device
    arrays, and a workspace whose arrays are not NumPy's."""
    return bool(getattr(ctx.ws.comm, "device_buffers", False)) and ctx.xp is not np


@register_kernel("AllreduceStart")
def allreduce_start(ctx, *grads):
    comm, backend = ctx.ws.comm, ctx.backend
    if any(g.dtype != np.float32 for g in grads):
        raise SchemaError(f"op {ctx.def_.label}: gradients must be float32")
    sizes = [int(g.size) for g in grads]
    on_device = _device_buffers(ctx)
    flat = ctx.state.get("flat")
    if flat is None or flat.size != sum(sizes):
        xp = ctx.xp if on_device else np
        flat = ctx.state["flat"] = xp.empty(sum(sizes), np.float32)
    # Gradients go straight into the buffer where both live in one memory (CPU, or the device
    # with a device communicator: a copy queued on the stream after the kernel that wrote g).
    direct = on_device or ctx.xp is np
    offset = 0
    for g, n in zip(grads, sizes):
        flat[offset:offset + n] = g.reshape(-1) if direct else backend.to_host(g).reshape(-1)
        offset += n
    # Buckets started earlier move on only inside MPI calls: give them a turn on the way.
    for request, _ in ctx.ws.collectives.values():
        request.test()
    ctx.ws.collectives[ctx.args.bucket] = (comm.start_allreduce_sum(flat), flat)
    token = ctx.output(0, (1,), "float32")
    token[...] = 0
    return token


@register_kernel("AllreduceWait")
def allreduce_wait(ctx, token, *grads):
    pending = ctx.ws.collectives.pop(ctx.args.bucket, None)
    if pending is None:
        raise InternalError(f"AllreduceWait '{ctx.args.bucket}' ran without its start")
    request, flat = pending
    request.wait()
    flat *= np.float32(1.0 / ctx.ws.comm.size)
    direct = _device_buffers(ctx) or ctx.xp is np
    outs, offset = [], 0
    for i, g in enumerate(grads):
        part = flat[offset:offset + g.size].reshape(g.shape)
        offset += g.size
        out = ctx.output(i, g.shape, g.dtype)
        out[...] = part if direct else ctx.backend.to_device(part)
        outs.append(out)
    return tuple(outs)
