"""What makes a convolution algorithm a GPU one, and the problems it applies to.

`ALGORITHMS` is one registry for every backend, and `applicable(p)` sees only the problem, so
the backend travels in the problem's type: the GPU conv kernels bind a `GPUConvProblem` (the
same fields), GPU algorithms accept only those, and the CPU algorithms' own tests never pick
a GPU algorithm for a CPU problem.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from netrun.ops.conv_algos import ConvAlgorithm, ConvProblem

# Budget for an algorithm's per-block buffers (column matrices, transforms): a GPU has the
# memory to take whole batches at once, which keeps each GEMM large.
BLOCK_BYTES = 512 << 20


@dataclass(frozen=True)
class GPUConvProblem(ConvProblem):
    """A ConvProblem to be run on a GPU: only GPU algorithms apply to it."""

    @classmethod
    def of(cls, p: ConvProblem) -> "GPUConvProblem":
        """The same problem, marked for the GPU."""
        return cls(**{f.name: getattr(p, f.name) for f in fields(ConvProblem)})


class GPUAlgorithm(ConvAlgorithm):
    """A convolution algorithm that runs on CuPy arrays (custom kernels, cuBLAS, cuFFT)."""

    backends = ("gpu",)

    def applicable(self, p: ConvProblem) -> bool:
        return isinstance(p, GPUConvProblem) and self.fits(p)

    def fits(self, p: ConvProblem) -> bool:
        """Whether the algorithm handles the problem's shape (the backend aside)."""
        return True


def blocks(n: int, size: int):
    """(n0, n1) ranges of at most `size` images covering range(n)."""
    return ((n0, min(n0 + size, n)) for n0 in range(0, n, size))
