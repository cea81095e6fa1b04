"""Convolution algorithms as pluggable units (cuDNN's forward / backward-data / backward-filter).

Every algorithm computes the same three directions of one `ConvProblem`, always in NCHW with
Caffe2's filter layout K × C/G × kh × kw:

    forward          Y  (N, K, oH, oW)    = conv(X (N, C, H, W), W)
    backward_data    dX (N, C, H, W)      = conv^T(dY, W)
    backward_filter  dW (K, C/G, kh, kw)  = corr(X, dY)

ConvTranspose runs on the same units: its forward is the backward-data pass of the conv
whose input has ConvTranspose's output shape, and vice versa. Algorithms write into `out`
and draw temporaries from `scratch(key, shape, dtype)` (the workspace's shared scratch), so
nothing is allocated per iteration.

The registry is keyed by backend: each algorithm class names the backend whose arrays it
runs on, and registers itself there when its module is imported (netrun.conv.cpu and
netrun.conv.gpu are the two sets). A CPU problem never sees a GPU algorithm, with no tag on
the problem itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from netrun.conv.problem import ConvProblem

Scratch = Callable[..., Any]   # scratch(key, shape, dtype) -> array


@dataclass
class KeptFilters:
    """What an op tells a forward pass about its filters across runs: `version` changes
    whenever their values may have (the blob was written), and `kept` is the op's own store,
    where an algorithm that reorders filters may keep its copy while the version stays (the
    constant weights of inference: ResNet-50's are 100 MB to reorder per image)."""

    version: tuple
    kept: dict


class ConvAlgorithm:
    """One way to compute all three directions of a convolution."""

    name = ""
    backend = "cpu"        # the backend whose arrays it runs on (its registry)
    deterministic = True   # same bits on every run (no atomics / reordering by timing)
    optional_engine = False   # an outside library that may fail to run: a search skips it
    # Float32 products in a shorter mantissa (TF32 tensor cores): a candidate only where the
    # workspace's settings allow it (AlgoSettings.tf32), never by default.
    reduced_precision = False
    fuses_relu = False     # forward takes relu=True and applies it itself (a post-op)
    # forward takes residual=S: out = conv + bias + S, then the ReLU; S may be out's own
    # memory (the memory plan's in-place pair of Conv), which it must read before writing
    fuses_residual = False
    keeps_filters = False  # forward takes filters=KeptFilters (see there)
    # forward and backward (both gradients) take bound=True and may return their calls bound
    # to these arrays (an object with run() and close(); `reads_kept_filters`: it reads a
    # copy of w kept while w is not written; `reorders_filters`: a forward pass that reorders
    # w on every run), to be run again while they and the op's scratch stay
    binds_calls = False
    summary = ""           # one line for `netrun algos` and profiles

    def applicable(self, p: ConvProblem) -> bool:
        """Whether this algorithm handles the problem."""
        return True

    def supports(self, xp, p: ConvProblem, direction: str) -> bool:
        """Whether the rules may pick it for this direction (an engine may lack a plan)."""
        return True

    def workspace_bytes(self, p: ConvProblem) -> int:
        """Scratch bytes needed by the most demanding of the three directions."""
        return 0

    def prepare(self, p: ConvProblem, direction: str, bias: bool = False,
                relu: bool = False) -> None:
        """Build what one `direction` pass of p will need (compiled primitives) without
        running it; called when a net is bound. Most algorithms need nothing."""

    def forward(self, xp, x, w, p: ConvProblem, out, scratch: Scratch, bias=None) -> None:
        """out (N, K, oH, oW) = conv(x, w) (+ bias (K,) when given, fused where possible).
        Algorithms that declare them take more keywords: relu=True (`fuses_relu`),
        residual=S added before the ReLU (`fuses_residual`), filters=KeptFilters
        (`keeps_filters`), bound=True (`binds_calls`)."""
        raise NotImplementedError

    def backward_data(self, xp, dy, w, p: ConvProblem, out, scratch: Scratch) -> None:
        """out (N, C, H, W) = gradient of the loss with respect to x."""
        raise NotImplementedError

    def backward_filter(self, xp, x, dy, p: ConvProblem, out, scratch: Scratch,
                        dbias=None) -> None:
        """out (K, C/G, kh, kw) = gradient with respect to w (and dbias (K,) = Σ dy if given)."""
        raise NotImplementedError

    def backward(self, xp, x, dy, w, p: ConvProblem, dx, dw, scratch: Scratch,
                 dbias=None) -> None:
        """Both gradients, when this algorithm was chosen for both directions; algorithms that
        share work between them (a transform of dy) override it."""
        self.backward_filter(xp, x, dy, p, dw, scratch, dbias=dbias)
        self.backward_data(xp, dy, w, p, dx, scratch)


def add_bias(xp, out, bias) -> None:
    """out (N, K, ...) += bias (K,): for algorithms that cannot fold the bias into a GEMM."""
    if bias is not None:
        xp.add(out, bias.reshape((1, -1) + (1,) * (out.ndim - 2)), out=out)


def sum_bias(xp, dy, dbias, scratch: Scratch) -> None:
    """dbias (K,) = Σ dy over every axis but the channel axis 1."""
    if dbias is not None:
        n, k = dy.shape[:2]
        # The pixel sums as a matrix-vector product with ones (BLAS runs it faster than
        # NumPy's reduction), then the batch sum of the small (N, K) result. The ones live in
        # scratch, filled per call: oH·oW writes, nothing next to the product's cost.
        ones = scratch("conv.ones", (dy[0, 0].size,), dy.dtype)
        ones.fill(1)
        pixels = xp.matmul(dy.reshape(n, k, -1), ones)
        xp.sum(pixels, axis=0, out=dbias)


# backend -> name -> the one instance of each algorithm, in registration order.
_ALGORITHMS: dict[str, dict[str, ConvAlgorithm]] = {}


def register_algorithm(cls: type[ConvAlgorithm]) -> type[ConvAlgorithm]:
    """Class decorator: register one instance of the algorithm under its backend and name."""
    table = _ALGORITHMS.setdefault(cls.backend, {})
    if cls.name in table:
        raise ValueError(f"conv algorithm {cls.name} registered twice for {cls.backend}")
    table[cls.name] = cls()
    return cls


def algorithms(backend: str) -> dict[str, ConvAlgorithm]:
    """The algorithms of one backend ("cpu", "gpu") by name, in registration order."""
    return dict(_ALGORITHMS.get(backend, {}))


def algorithm_names() -> list[str]:
    """Every registered algorithm's name, all backends (what an op's `algo` may say)."""
    return [name for table in _ALGORITHMS.values() for name in table]


def find_algorithm(name: str) -> ConvAlgorithm | None:
    """The algorithm of that name on whichever backend has it (names are unique)."""
    for table in _ALGORITHMS.values():
        if name in table:
            return table[name]
    return None


def applicable_algorithms(p: ConvProblem, backend: str = "cpu") -> list[ConvAlgorithm]:
    """The backend's algorithms that can run the problem, in registration order."""
    return [a for a in _ALGORITHMS.get(backend, {}).values() if a.applicable(p)]
