"""Window taps of a pooling op: one view of the padded input per kernel tap.

NumPy loops are fast over long contiguous runs and slow over short or strided ones, and a
pooling tap is both: rows of oW elements, s elements apart. For NCHW the input is therefore
rearranged once into its s_h·s_w stride phases, each (n, c) image a flat plane,

    phase[a, b][n, c, u·Wq + v] = x_pad[n, c, u·s_h + a, v·s_w + b]

(one strided pass that also writes the padding). Tap (i, j) is then the contiguous run of
oH·Wq elements of phase (i mod s_h, j mod s_w) starting at (i div s_h)·Wq + (j div s_w): the
pooled output in "full-width" rows of Wq ≥ oW columns, whose last Wq - oW columns are junk
that the ops mask (NaN, zero) or crop. Gradients accumulate into phase planes the same way and
are interleaved back into dX in one pass. NHWC (contiguous along C already) uses a padded
copy, or the input itself, with plain strided views shaped like the output.
"""
from __future__ import annotations

from typing import Any, Callable

from netrun.kernels.geometry import ConvGeometry, pad_into, spatial_index, window_slices

Scratch = Callable[..., Any]


class Windows:
    """The layout of one pooling problem: its taps, full-width buffers and accumulators."""

    def __init__(self, scratch: Scratch, shape, g: ConvGeometry, axes: tuple[int, int],
                 oh: int, ow: int):
        self.scratch, self.g, self.axes, self.oh, self.ow = scratch, g, axes, oh, ow
        self.shape, self.out_shape = tuple(shape), _out_shape(shape, axes, oh, ow)
        self.phases = _Phases(g, shape[2], shape[3], oh, ow) if axes == (2, 3) else None
        self.wq = self.phases.wq if self.phases else ow
        self.full_shape = (shape[0], shape[1], oh * self.wq) if self.phases else self.out_shape

    @property
    def junk(self) -> bool:
        """Whether full-width rows have junk columns (Wq > oW)."""
        return self.wq > self.ow

    def taps(self, x, fill: float, key: str = "pool.src") -> list:
        """One view per tap (window order) of x padded with `fill`, full-width shaped."""
        g, axes = self.g, self.axes
        if self.phases:
            planes = self.scratch(key, self.phases.buffer_shape(*x.shape[:2]), x.dtype)
            self.phases.write(planes, x, fill)
            return self.phases.views(planes)
        src = x
        if g.padded:
            src = pad_into(x, self.scratch(key, _padded_shape(x.shape, g, axes), x.dtype), g,
                           axes, fill)
        return [src[spatial_index(axes, *window_slices(g, i, j, self.oh, self.ow))]
                for i in range(g.kh) for j in range(g.kw)]

    def crop(self, full):
        """The pooled-output-shaped view of a full-width buffer."""
        if not self.phases:
            return full
        n, c = self.shape[:2]
        return full.reshape(n, c, self.oh, self.wq)[..., :self.ow]

    def full(self, key: str, dtype, like=None, junk: float = 0.0, alias=None):
        """A full-width buffer whose junk columns hold `junk`; with `like` (output-shaped) its
        values. Where the layouts agree no copy is made: `like` itself, or `alias` (an
        output-shaped array the caller will overwrite) when given."""
        if not self.junk and (like is not None or alias is not None):
            return (like if like is not None else alias).reshape(self.full_shape)
        buf = self.scratch(key, self.full_shape, dtype)
        if self.junk:
            # the junk columns are a column or two per row: filling the whole buffer first
            # is one fast contiguous pass, where a strided fill pays NumPy's per-run overhead
            buf.fill(junk)
        if like is not None:
            self.crop(buf)[...] = like
        return buf

    def accumulator(self, dx, zero: bool = True, key: str = "pool.acc") -> "Accumulator":
        """Gradient buffers whose views line up with the taps; `finish` writes dX."""
        return Accumulator(self, dx, zero, key)

    def covers_once(self) -> bool:
        """Whether the windows tile the padded input exactly (each element in one window)
        and every element of the accumulator is written by some tap (no zeroing needed)."""
        g = self.g
        if g.sh != g.kh or g.sw != g.kw:
            return False
        if self.phases:
            p = self.phases
            return (p.hq, p.wq) == (self.oh, self.ow) and p.plane == self.oh * self.ow
        padded = _padded_shape(self.shape, g, self.axes)
        return padded[self.axes[0]] == self.oh * g.kh and padded[self.axes[1]] == self.ow * g.kw


class Accumulator:
    """Gradient buffers laid out like the taps; `finish` writes the image part to dX."""

    def __init__(self, win: Windows, dx, zero: bool, key: str):
        self.win, self.dx = win, dx
        g, axes = win.g, win.axes
        if win.phases:
            self.buf = win.scratch(key, win.phases.buffer_shape(*dx.shape[:2]), dx.dtype)
            self.views = win.phases.views(self.buf)
        else:
            self.buf = dx if not g.padded else win.scratch(key, _padded_shape(dx.shape, g, axes),
                                                           dx.dtype)
            self.views = [self.buf[spatial_index(axes, *window_slices(g, i, j, win.oh, win.ow))]
                          for i in range(g.kh) for j in range(g.kw)]
        if zero:
            self.buf.fill(0)

    def finish(self) -> None:
        """dX = the image part of the buffer (the phases interleaved back)."""
        win, dx = self.win, self.dx
        if win.phases:
            win.phases.read(self.buf, dx)
        elif self.buf is not dx:
            g, axes = win.g, win.axes
            h, w = dx.shape[axes[0]], dx.shape[axes[1]]
            dx[...] = self.buf[spatial_index(axes, slice(g.pt, g.pt + h),
                                             slice(g.pl, g.pl + w))]


class _Phases:
    """The stride-phase layout of an h×w image under geometry g: (s_h, s_w, N, C, plane)."""

    def __init__(self, g: ConvGeometry, h: int, w: int, oh: int, ow: int):
        self.g, self.h, self.w, self.oh = g, h, w, oh
        self.hq = -(-(h + g.pt + g.pb) // g.sh)
        self.wq = -(-(w + g.pl + g.pr) // g.sw)
        self.offsets = [((i * g.dh) % g.sh, (j * g.dw) % g.sw,
                         (i * g.dh // g.sh) * self.wq + j * g.dw // g.sw)
                        for i in range(g.kh) for j in range(g.kw)]
        # room for the last tap's run of oH·Wq, which may end a few junk elements past Hq·Wq
        self.plane = max(self.hq * self.wq, max(o for _, _, o in self.offsets) + oh * self.wq)

    def buffer_shape(self, n: int, c: int) -> tuple[int, ...]:
        return (self.g.sh, self.g.sw, n, c, self.plane)

    def views(self, buf) -> list:
        run = self.oh * self.wq
        return [buf[a, b, :, :, o:o + run] for a, b, o in self.offsets]

    def _ranges(self):
        g = self.g
        for a in range(g.sh):
            u0, u1, y0 = _phase_range(a, g.sh, g.pt, self.h, self.hq)
            for b in range(g.sw):
                v0, v1, x0 = _phase_range(b, g.sw, g.pl, self.w, self.wq)
                yield a, b, (u0, u1, y0), (v0, v1, x0)

    def write(self, buf, x, fill: float) -> None:
        """buf = the phases of x padded with `fill` (junk past Hq·Wq left as is)."""
        g, hq, wq = self.g, self.hq, self.wq
        for a, b, (u0, u1, y0), (v0, v1, x0) in self._ranges():
            dst = buf[a, b, :, :, :hq * wq].reshape(x.shape[0], x.shape[1], hq, wq)
            if v0 > 0 or v1 < wq:
                # padding columns: one contiguous fill of the whole plane beats strided
                # fills whose inner runs are a column or two wide (NumPy's per-run overhead)
                dst.fill(fill)
            else:
                dst[:, :, :u0] = fill
                dst[:, :, u1:] = fill
            if u1 > u0 and v1 > v0:
                dst[:, :, u0:u1, v0:v1] = x[:, :, y0::g.sh, x0::g.sw][:, :, :u1 - u0, :v1 - v0]

    def read(self, buf, dx) -> None:
        """dx = the image positions of the phases (each image pixel is in exactly one)."""
        g, hq, wq = self.g, self.hq, self.wq
        for a, b, (u0, u1, y0), (v0, v1, x0) in self._ranges():
            if u1 > u0 and v1 > v0:
                src = buf[a, b, :, :, :hq * wq].reshape(dx.shape[0], dx.shape[1], hq, wq)
                dx[:, :, y0::g.sh, x0::g.sw][:, :, :u1 - u0, :v1 - v0] = src[:, :, u0:u1, v0:v1]


def _phase_range(a: int, s: int, head: int, size: int, q: int) -> tuple[int, int, int]:
    """Phase a's positions [u0, u1) that hold image rows, and the first image row (y0)."""
    u0 = max(0, -(-(head - a) // s))
    u1 = min(q, (size - 1 + head - a) // s + 1) if size - 1 + head - a >= 0 else 0
    return u0, max(u0, u1), u0 * s + a - head


def _out_shape(shape, axes, oh: int, ow: int) -> tuple[int, ...]:
    out = list(shape)
    out[axes[0]], out[axes[1]] = oh, ow
    return tuple(out)


def _padded_shape(shape, g: ConvGeometry, axes) -> tuple[int, ...]:
    out = list(shape)
    out[axes[0]] += g.pt + g.pb
    out[axes[1]] += g.pl + g.pr
    return tuple(out)
