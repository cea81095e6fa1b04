"""What makes a convolution algorithm a GPU one: it registers under the "gpu" backend."""
from __future__ import annotations

from netrun.conv.algorithm import ConvAlgorithm

# Budget for an algorithm's per-block buffers (column matrices, transforms): a GPU has the
# memory to take whole batches at once, which keeps each GEMM large.
BLOCK_BYTES = 512 << 20


class GPUAlgorithm(ConvAlgorithm):
    """A convolution algorithm that runs on CuPy arrays (custom kernels, cuBLAS, cuFFT)."""

    backend = "gpu"

    def applicable(self, p) -> bool:
        return self.fits(p)

    def fits(self, p) -> bool:
        """Whether the algorithm handles the problem's shape."""
        return True


def blocks(n: int, size: int):
    """(n0, n1) ranges of at most `size` images covering range(n)."""
    return ((n0, min(n0 + size, n)) for n0 in range(0, n, size))
