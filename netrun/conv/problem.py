"""The convolution problem: every field that changes a convolution's result or speed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from netrun.kernels.geometry import ConvGeometry

DIRECTIONS = ("forward", "backward_data", "backward_filter")


@dataclass(frozen=True)
class ConvProblem:
    """Every field that changes a convolution's result or speed, except the direction."""

    n: int
    c: int
    h: int
    w: int
    k: int              # output channels (Caffe2's M)
    kh: int
    kw: int
    sh: int = 1
    sw: int = 1
    pt: int = 0
    pl: int = 0
    pb: int = 0
    pr: int = 0
    dh: int = 1
    dw: int = 1
    group: int = 1
    dtype: str = "float32"
    # The op's storage order; algorithms always see NCHW (the op transposes NHWC), but the
    # transposes are part of what a timing measures, so it stays in the key.
    order: str = "NCHW"

    @classmethod
    def make(cls, x_shape, w_shape, geom: ConvGeometry, group: int, dtype: Any,
             order: str = "NCHW") -> "ConvProblem":
        """The problem for NCHW input/filter shapes and a geometry resolved for that input."""
        n, c, h, w = (int(d) for d in x_shape)
        return cls(n, c, h, w, int(w_shape[0]), geom.kh, geom.kw, geom.sh, geom.sw, *geom.pads,
                   geom.dh, geom.dw, group, str(np.dtype(dtype)), order)

    @property
    def geometry(self) -> ConvGeometry:
        return ConvGeometry(self.kh, self.kw, self.sh, self.sw, self.pt, self.pl, self.pb,
                            self.pr, self.dh, self.dw)

    @property
    def oh(self) -> int:
        return (self.h + self.pt + self.pb - self.dh * (self.kh - 1) - 1) // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.w + self.pl + self.pr - self.dw * (self.kw - 1) - 1) // self.sw + 1

    @property
    def cg(self) -> int:
        return self.c // self.group

    @property
    def kg(self) -> int:
        return self.k // self.group

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def padded(self) -> bool:
        return any((self.pt, self.pl, self.pb, self.pr))

    def describe(self) -> str:
        """One line for error messages and profiles."""
        return (f"N={self.n} C={self.c} H={self.h} W={self.w} K={self.k} kernel {self.kh}×"
                f"{self.kw} stride {self.sh}×{self.sw} pads {[self.pt, self.pl, self.pb, self.pr]}"
                f" dilation {self.dh}×{self.dw} group {self.group} {self.dtype} {self.order}")
