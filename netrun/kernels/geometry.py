"""Convolution and pooling geometry: Caffe2's kernel/stride/pad/dilation arguments, resolved once.

Caffe2 (ConvPoolOpBase) accepts each 2-D quantity in three spellings: a single value
(`kernel`), per axis (`kernel_h`/`kernel_w`) or a list (`kernels`); pads come as `pad`,
`pad_t/l/b/r` or `pads` = [t, l, b, r]. `ConvGeometry.from_args` turns any of them into one
frozen record, and `resolve` makes the padding concrete for an input size (SAME, VALID and
Caffe's ceil-mode pooling depend on it).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from netrun.errors import SchemaError, ShapeError

# Caffe2's LegacyPadding enum, in its integer order (legacy_pad may be given as 0..3).
LEGACY_PADS = ("NOTSET", "VALID", "SAME", "CAFFE_LEGACY_POOLING")


def legacy_name(value: Any) -> str:
    """legacy_pad as its enum name (Caffe2 nets store it as an int)."""
    return LEGACY_PADS[int(value)] if isinstance(value, (int, float)) else str(value)


@dataclass(frozen=True)
class ConvGeometry:
    """Kernel, stride, pads [t, l, b, r] and dilation of a 2-D window op, plus the pad mode."""

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
    legacy_pad: str = "NOTSET"

    @property
    def pads(self) -> tuple[int, int, int, int]:
        return (self.pt, self.pl, self.pb, self.pr)

    @property
    def padded(self) -> bool:
        return any(self.pads)

    @classmethod
    def from_args(cls, args: Mapping[str, Any], label: str = "",
                  require_kernel: bool = True) -> "ConvGeometry":
        """Resolve and validate Caffe2's spellings; SchemaError names the op and the argument."""
        where = f"op {label}: " if label else ""
        kernel = _pair(args, "kernel", "kernels", where, 1, None)
        if kernel is None:
            if require_kernel:
                raise SchemaError(f"{where}missing argument 'kernel' (or 'kernel_h'/'kernel_w', "
                                  f"'kernels'): convolution and pooling need an explicit kernel")
            kernel = (0, 0)
        stride = _pair(args, "stride", "strides", where, 1, 1)
        dilation = _pair(args, "dilation", "dilations", where, 1, 1)
        pads, pad_arg = _pads(args, where)
        mode = legacy_name(args.get("legacy_pad", "NOTSET"))
        if mode in ("VALID", "SAME") and pad_arg:
            # Caffe2: "If you use legacy padding VALID or SAME, you should not specify any
            # specific padding values."
            raise SchemaError(f"{where}argument '{pad_arg}' conflicts with legacy_pad={mode}, "
                              f"which computes the padding itself")
        if mode == "SAME" and dilation != (1, 1):
            raise SchemaError(f"{where}argument 'dilation' must be 1 with legacy_pad=SAME")
        if mode == "CAFFE_LEGACY_POOLING" and pads[:2] != pads[2:]:
            raise SchemaError(f"{where}argument '{pad_arg}' must be symmetric with legacy_pad="
                              f"CAFFE_LEGACY_POOLING (Caffe's pad_h/pad_w), got {list(pads)}")
        return cls(*kernel, *stride, *pads, *dilation, legacy_pad=mode)

    def resolve(self, h: int, w: int, what: str = "the input") -> "ConvGeometry":
        """This geometry with explicit pads for an h×w input (legacy modes made concrete)."""
        top, bottom = _resolve_dim(self.legacy_pad, h, self.kh, self.sh, self.dh, self.pt, self.pb)
        left, right = _resolve_dim(self.legacy_pad, w, self.kw, self.sw, self.dw, self.pl, self.pr)
        g = replace(self, pt=top, pl=left, pb=bottom, pr=right, legacy_pad="NOTSET")
        dkh, dkw = g.dilated_kernel
        if h + top + bottom < dkh or w + left + right < dkw:
            raise ShapeError(f"{what} is {h}×{w} (with pads [t, l, b, r] = {list(g.pads)}), "
                             f"smaller than the {dkh}×{dkw} (dilated) kernel")
        return g

    @property
    def dilated_kernel(self) -> tuple[int, int]:
        """Extent of the kernel window with its dilation: d·(k-1) + 1."""
        return self.dh * (self.kh - 1) + 1, self.dw * (self.kw - 1) + 1

    def output_size(self, h: int, w: int, what: str = "the input") -> tuple[int, int]:
        """Output (height, width) for an h×w input: floor((in + pads - dk) / s) + 1 per axis."""
        g = self.resolve(h, w, what)
        dkh, dkw = g.dilated_kernel
        return (h + g.pt + g.pb - dkh) // g.sh + 1, (w + g.pl + g.pr - dkw) // g.sw + 1

    def counted_tail_pads(self, h: int, w: int) -> tuple[int, int]:
        """Bottom and right padding that Caffe's average pooling counts in its divisor.

        In ceil mode the resolved tail pads include the overhang of the last window beyond
        the declared padding; Caffe clips the window at H + pad, so the overhang never counts.
        """
        if self.legacy_pad == "CAFFE_LEGACY_POOLING":
            return self.pt, self.pl
        g = self.resolve(h, w)
        return g.pb, g.pr


def window_slices(g: ConvGeometry, i: int, j: int, oh: int, ow: int) -> tuple[slice, slice]:
    """Rows and columns of the padded image that kernel tap (i, j) reads for all oh×ow outputs."""
    r0, c0 = i * g.dh, j * g.dw
    return (slice(r0, r0 + (oh - 1) * g.sh + 1, g.sh), slice(c0, c0 + (ow - 1) * g.sw + 1, g.sw))


def spatial_index(axes: tuple[int, int], rows: slice, cols: slice) -> tuple:
    """An index tuple that applies `rows`/`cols` to the two spatial axes of a 4-D array."""
    index: list = [slice(None)] * 4
    index[axes[0]], index[axes[1]] = rows, cols
    return tuple(index)


def pad_into(x: Any, buf: Any, g: ConvGeometry, axes: tuple[int, int], value: float) -> Any:
    """Copy x into the middle of buf (x plus g's pads on `axes`) and fill only the border."""
    h, w = x.shape[axes[0]], x.shape[axes[1]]
    rows = slice(g.pt, g.pt + h)
    everything = slice(None)
    for r, c in ((slice(0, g.pt), everything), (slice(g.pt + h, None), everything),
                 (rows, slice(0, g.pl)), (rows, slice(g.pl + w, None))):
        buf[spatial_index(axes, r, c)] = value
    buf[spatial_index(axes, rows, slice(g.pl, g.pl + w))] = x
    return buf


def _resolve_dim(mode: str, size: int, k: int, s: int, d: int, head: int, tail: int,
                 ) -> tuple[int, int]:
    """(head, tail) padding of one axis for `size` under the legacy mode (Caffe2's rules)."""
    if mode == "VALID":
        return 0, 0
    if mode == "SAME":
        target = -(-size // s)
        # Clamped at zero as TensorFlow does: with stride > kernel Caffe2 computes a negative
        # pad, which yields the same output size.
        needed = max(0, (target - 1) * s + k - size)
        return needed // 2, needed - needed // 2   # Caffe2 pads the tail more (PAD_HEAD_MORE=0)
    if mode == "CAFFE_LEGACY_POOLING":
        span = size + 2 * head - k
        if span < 0:
            return head, head   # too small; resolve() reports it
        out = -(-span // s) + 1   # Caffe rounds the output size up, Caffe2 down
        # The last window must start inside the image or the left pad. Caffe checks this only
        # when pad > 0, which with stride > kernel leaves an empty last window; we always do,
        # as PyTorch's ceil_mode does.
        if (out - 1) * s >= size + head:
            out -= 1
        floor_out = span // s + 1
        return head, head + s * (out - floor_out)   # tail grows to fit the extra window
    return head, tail


def _pair(args: Mapping[str, Any], base: str, plural: str, where: str, minimum: int,
          default: int | None) -> tuple[int, int] | None:
    """One 2-D quantity from `base`, `base_h`/`base_w` or `plural`; at most one spelling."""
    single, h, w, many = (args.get(n) for n in (base, f"{base}_h", f"{base}_w", plural))
    given = [n for n, v in ((base, single), (f"{base}_h/_w", h if h is not None else w),
                            (plural, many)) if v is not None]
    if len(given) > 1:
        raise SchemaError(f"{where}arguments {' and '.join(repr(n) for n in given)} both set "
                          f"the {base}; use one of them")
    if single is not None:
        value, names = (single, single), (base, base)
    elif h is not None or w is not None:
        if h is None or w is None:
            missing = f"{base}_h" if h is None else f"{base}_w"
            raise SchemaError(f"{where}missing argument '{missing}' ({base}_h and {base}_w go "
                              f"together)")
        value, names = (h, w), (f"{base}_h", f"{base}_w")
    elif many is not None:
        if len(many) != 2:
            raise SchemaError(f"{where}argument '{plural}' needs 2 values [h, w] for a 2-D op, "
                              f"got {len(many)}: {list(many)}")
        value, names = tuple(many), (plural, plural)
    else:
        return None if default is None else (default, default)
    for v, name in zip(value, names):
        if v < minimum:
            raise SchemaError(f"{where}argument '{name}' must be at least {minimum}, got {v}")
    return int(value[0]), int(value[1])


def _pads(args: Mapping[str, Any], where: str) -> tuple[tuple[int, int, int, int], str]:
    """Pads [t, l, b, r] and the argument that gave them ('' when none did)."""
    sides = [args.get(f"pad_{s}") for s in "tlbr"]
    spellings = [(n, v) for n, v in (("pad", args.get("pad")), ("pads", args.get("pads")),
                                     ("pad_t/l/b/r", sides if any(s is not None for s in sides)
                                      else None)) if v is not None]
    if len(spellings) > 1:
        raise SchemaError(f"{where}arguments {' and '.join(repr(n) for n, _ in spellings)} both "
                          f"set the padding; use one of them")
    if not spellings:
        return (0, 0, 0, 0), ""
    name, value = spellings[0]
    if name == "pad":
        pads, names = [value] * 4, [name] * 4
    elif name == "pads":
        if len(value) != 4:
            raise SchemaError(f"{where}argument 'pads' needs 4 values [t, l, b, r] for a 2-D op, "
                              f"got {len(value)}: {list(value)}")
        pads, names = list(value), [name] * 4
    else:
        names = [f"pad_{s}" for s in "tlbr"]
        if any(v is None for v in value):
            missing = [n for n, v in zip(names, value) if v is None]
            raise SchemaError(f"{where}missing argument '{missing[0]}' (pad_t, pad_l, pad_b and "
                              f"pad_r go together)")
        pads = list(value)
    for v, n in zip(pads, names):
        if v < 0:
            raise SchemaError(f"{where}argument '{n}' must not be negative, got {v}")
    return (int(pads[0]), int(pads[1]), int(pads[2]), int(pads[3])), name
