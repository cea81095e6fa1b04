"""ReLU and its gradient over whole arrays: compiled and threaded on netrun's fixed chunks
where the engine is there (netrun.kernels.jit.batch_norm holds the loops, beside the
batch-norm ones that fuse them), on the OpenMP team where it runs (netrun.kernels.omp),
NumPy's (or CuPy's) ufuncs otherwise. No sums, so the bits never depend on the partition."""
from __future__ import annotations

from typing import Any

import netrun.kernels.jit.batch_norm as jit_bn
from netrun.kernels import jit, omp, parallel


def compiled(xp: Any, *arrays) -> bool:
    """Whether the compiled kernels run for these arrays (engine on, NumPy, C-contiguous, one
    built dtype)."""
    return (jit.enabled(xp) and all(a.flags.c_contiguous and a.dtype in jit_bn.DTYPES
                                    and a.dtype == arrays[0].dtype for a in arrays))


def _flat_chunks(xp: Any, kernel, team_kernel, *flat) -> None:
    """kernel over parallel.chunks' chunks of equal flat arrays, or team_kernel, its form
    over the same chunks, on the OpenMP team where it runs (omp.team)."""
    n = flat[0].size
    if parallel.chunk_count(n, n) == 1:   # the one chunk here, without a hand-off's Python
        kernel(*flat)
        return
    team = omp.team(xp, n, n)
    if team is not None:
        jit_bn.prepare_team()
        omp.launch(team_kernel, *team, *flat)
    else:
        parallel.chunks(xp, n, lambda _i, i0, i1: kernel(*(a[i0:i1] for a in flat)), work=n)


def prepare(xp: Any) -> None:
    """Compile (or load) the float32 kernels here, their team forms where the team runs."""
    if jit.enabled(xp):
        jit_bn.prepare("float32")
        if omp.usable(xp):
            jit_bn.prepare_team("float32")


def relu(xp: Any, X, Y):
    """Y = max(X, 0) (Y may be X); returns Y."""
    if compiled(xp, X, Y):
        _flat_chunks(xp, jit_bn.relu, jit_bn.relu_team, X.reshape(-1), Y.reshape(-1))
    else:
        xp.maximum(X, 0, out=Y)
    return Y


def add_relu(xp: Any, A, B, Y, rectify: bool = True):
    """Y = A + B, then max(·, 0) when `rectify` (Y may be A or B); returns Y. Arrays of one
    shape take one compiled pass (a residual block's sum)."""
    if rectify and A.shape == B.shape == Y.shape and compiled(xp, A, B, Y):
        _flat_chunks(xp, jit_bn.add_relu, jit_bn.add_relu_team, A.reshape(-1), B.reshape(-1),
                     Y.reshape(-1))
        return Y
    xp.add(A, B, out=Y)
    return relu(xp, Y, Y) if rectify else Y


def relu_gradient(xp: Any, Y, dY, dX):
    """dX = dY·(Y > 0) (dX may be dY; NaN·0 stays NaN, as in NumPy); returns dX."""
    if compiled(xp, Y, dY, dX):
        _flat_chunks(xp, jit_bn.relu_gradient, jit_bn.relu_gradient_team, Y.reshape(-1),
                     dY.reshape(-1), dX.reshape(-1))
    else:
        xp.multiply(dY, Y > 0, out=dX)
    return dX
