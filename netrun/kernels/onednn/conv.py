"""Convolution primitives of oneDNN for one problem: blocked layouts, reorders, scratchpads.

A plan holds, per direction, the primitive oneDNN built with format `any` (it picks its
blocked layouts, e.g. 16 channels innermost) and the reorders between netrun's NCHW arrays
(filters K × C/G × kh × kw) and those layouts; where oneDNN chose plain NCHW, no reorder
runs. Blocked intermediates and the scratchpad (attributes ask for a user-managed one) come
from the caller's `scratch(key, shape, dtype)`, so nothing is allocated per call.

Netrun's arrays may also be in a channel-blocked layout themselves (`Layout`: the bind-time
layout plan of netrun.rewrite.layout keeps activations blocked between convolutions, the
IDEEP design): then oneDNN usually picks that same layout and no reorder runs at all.

Plans are compiled once per (problem, direction, layout, bias, ReLU, thread count) and
memoized:
the memo is a cache of immutable compiled objects, safe to share between workspaces and
threads. The thread count is part of the key because oneDNN fits its blocking to the
threads it sees when a primitive is created.
"""
from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from netrun.kernels.onednn import api, threads
from netrun.kernels.onednn.api import MemoryDesc, Primitive

ALIGN = 64   # bytes: oneDNN's kernels load whole cache lines


@dataclass(frozen=True)
class ConvSpec:
    """One convolution in oneDNN's terms (dilation as oneDNN counts it: d - 1)."""

    n: int
    c: int
    h: int
    w: int
    k: int
    kh: int
    kw: int
    oh: int
    ow: int
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pad_l: tuple[int, int]
    pad_r: tuple[int, int]
    groups: int

    @property
    def weight_shape(self) -> tuple[int, ...]:
        if self.groups == 1:
            return (self.k, self.c, self.kh, self.kw)
        return (self.groups, self.k // self.groups, self.c // self.groups, self.kh, self.kw)


@dataclass(frozen=True)
class Layout:
    """How netrun holds a forward pass's arrays: x_block / y_block, the channel block of the
    input / output in aBcd{B}b (N × ⌈C/B⌉ × H × W × B, channels zero-padded to whole
    blocks; 0: NCHW); add_dst: a residual in the output's layout is added to the output
    by the primitive, before the ReLU: the output's memory holds it when the kernel runs
    (a sum post-op: IDEEP's in-place sum), copied there first unless it is that memory
    (the `residual` argument of `steps`)."""

    x_block: int = 0
    y_block: int = 0
    add_dst: bool = False


NCHW = Layout()
# oneDNN's own channel blocks. A block of any other size holds every channel of its array
# (netrun.rewrite.layout's channels-last values): one block is NHWC's memory, oneDNN's acdb.
NATIVE_BLOCKS = (8, 16)


def channels_last(block: int, channels: int) -> bool:
    """Whether `channels` in blocks of `block` are one block in NHWC's order (see above)."""
    return block == channels and block not in NATIVE_BLOCKS


def _tag(block: int, channels: int = 0, plain: str = "abcd") -> str:
    if not block:
        return plain
    return "acdb" if channels_last(block, channels) else f"aBcd{block}b"


class Direction:
    """One primitive with its reorders: `args` name which memory each argument uses."""

    def __init__(self, lib: api.Library, prim: Primitive, user: dict[str, MemoryDesc],
                 threads: int = 1, dst_dims: tuple[int, ...] | None = None,
                 accumulates: bool = False):
        self.lib, self.prim = lib, prim
        self.threads = threads   # the OpenMP thread count oneDNN fitted the primitive to
        self.chosen = {}      # argument -> the layout the primitive runs on
        self.reorders = {}    # argument -> the reorder between user and chosen layouts
        for arg, user_md in user.items():
            # bias vectors are plain (K,) arrays in every layout oneDNN uses
            chosen = None if "bias" in arg else prim.md(f"{arg}_md")
            if chosen is None or chosen == user_md:
                self.chosen[arg] = user_md
                continue
            self.chosen[arg] = chosen
            src, dst = (chosen, user_md) if arg in _OUTPUTS else (user_md, chosen)
            self.reorders[arg] = (_reorder(lib, src, dst), src, dst)
        # What a call needs, worked out once (a call costs little more than its kernels):
        # the argument indices, and one scratch region holding every blocked copy and the
        # scratchpad at fixed aligned offsets.
        self.index = {arg: api_arg(arg) for arg in self.chosen}
        self.offsets, end = {}, 0
        for arg in self.reorders:
            self.offsets[arg], end = end, end + _aligned(self.chosen[arg].size)
        self.scratchpad_offset = end
        self.region_bytes = end + (_aligned(prim.scratch_bytes) if prim.scratch_bytes else 0)
        self._src, self._dst = api_arg("src"), api_arg("dst")
        # A primitive adding what dst holds (Layout.add_dst; `build` makes one only where
        # it writes dst in netrun's layout): a residual elsewhere is copied there first, by
        # oneDNN (a reorder between equal layouts) on the call's threads, among its calls.
        self.fill = _reorder(lib, user["dst"], user["dst"]) if accumulates else None
        # The channel block of a forward output in aBcd8b or aBcd16b (None: another layout),
        # for callers that read the blocked output themselves (`run(..., blocked="dst")`).
        self.dst_block = None
        if "dst" in self.reorders and dst_dims is not None:
            for block in (8, 16):
                if self.chosen["dst"] == MemoryDesc.tagged(lib, dst_dims, f"aBcd{block}b"):
                    self.dst_block = block

    def stage(self, arg: str, array, scratch: Callable, key: str) -> Staged:
        """An input reordered once into this primitive's layout, for several calls (the
        filters, shared by every batch chunk of one pass)."""
        staged, steps = self.stage_steps(arg, array, scratch, key)
        _execute(steps)
        return staged

    def stage_steps(self, arg: str, array, scratch: Callable,
                    key: str) -> tuple[Staged, list]:
        """`stage`, its reorder not yet run: (the staged input, the steps that fill it)."""
        held: list = []
        if arg not in self.reorders:
            return Staged(self.chosen[arg], array.ctypes.data, [array]), []
        prim, src, dst = self.reorders[arg]
        pointer = _buffer(scratch, key, self.chosen[arg].size, held)
        return Staged(self.chosen[arg], pointer, held), [
            (prim, [(self._src, src, array.ctypes.data), (self._dst, dst, pointer)])]

    def run(self, arrays: dict[str, Any], scratch: Callable,
            staged: dict[str, Staged] | None = None, blocked: str | None = None):
        """Execute: reorder inputs in, run, reorder outputs out (arrays: NCHW, C-contiguous;
        `staged` inputs are already in this primitive's layout). With blocked="dst" (a
        forward pass with a `dst_block`), the output is not reordered: the blocked result,
        (N, ⌈K/B⌉, oH·oW, B) in scratch, is returned for the caller to read before its op
        returns; otherwise None."""
        steps, held, result = self.steps(arrays, scratch, staged, blocked)
        _execute(steps)
        return result

    def steps(self, arrays: dict[str, Any], scratch: Callable,
              staged: dict[str, Staged] | None = None,
              blocked: str | None = None) -> tuple[list, list, Any]:
        """What `run` executes, not yet run: (steps, the scratch arrays they use, which the
        caller keeps alive until they have run, and `run`'s result). arrays["residual"]: what
        a primitive adding what dst holds (`fill`) adds, copied into dst first unless it is
        dst's memory."""
        chosen, index = self.chosen, self.index
        pointers = {arg: a.ctypes.data for arg, a in arrays.items()
                    if a is not None and arg != "residual"}
        ready = {}
        for arg, s in (staged or {}).items():
            if s.md is chosen[arg] or s.md == chosen[arg]:
                ready[arg] = s.pointer
                pointers.setdefault(arg, s.pointer)
        held = []   # the scratch array behind the raw pointers stays alive until the call ends
        base = (_buffer(scratch, "onednn.region", self.region_bytes, held)
                if self.region_bytes else 0)
        copies, steps, outputs = {}, [], []
        residual = arrays.get("residual")
        if (residual is None) != (self.fill is None):
            raise api.OneDNNError("a residual is given exactly to a primitive that adds it")
        if residual is not None and residual.ctypes.data != pointers["dst"]:
            md = chosen["dst"]
            steps.append((self.fill, [(self._src, md, residual.ctypes.data),
                                      (self._dst, md, pointers["dst"])]))
        for arg, (prim, src, dst) in self.reorders.items():
            if arg not in pointers or arg in ready:
                continue
            copies[arg] = base + self.offsets[arg]
            if arg in _OUTPUTS:
                outputs.append((arg, prim, src, dst, copies[arg], pointers[arg]))
            else:
                steps.append((prim, [(self._src, src, pointers[arg]),
                                     (self._dst, dst, copies[arg])]))
        args = [(index[arg], chosen[arg], copies.get(arg) or ready.get(arg) or pointer)
                for arg, pointer in pointers.items()]
        if self.prim.scratch_bytes:
            args.append((api_arg("scratchpad"), self.prim.scratch_md,
                         base + self.scratchpad_offset))
        steps.append((self.prim, args))
        result = None
        for arg, prim, src, dst, inside, outside in outputs:
            if arg == blocked == "dst" and self.dst_block:
                result = _blocked_view(held[0], inside, self.chosen["dst"].size,
                                       arrays["dst"].shape, self.dst_block)
                continue
            steps.append((prim, [(self._src, src, inside), (self._dst, dst, outside)]))
        return steps, held, result


def _execute(steps: list) -> None:
    for prim, args in steps:
        prim.execute(args)


_OUTPUTS = ("dst", "diff_src", "diff_weights")


@dataclass(frozen=True, eq=False)
class Staged:
    """An input already in a primitive's layout: its descriptor, address and owner arrays."""

    md: MemoryDesc
    pointer: int
    held: list


def api_arg(name: str) -> int:
    """The execution argument index of `name` (DNNL_ARG_*)."""
    return api.enums.ARG[name]


def _reorder(lib: api.Library, src: MemoryDesc, dst: MemoryDesc) -> Primitive:
    attr = api.Attr(lib)
    pd = api.create_pd(lib, "dnnl_reorder_primitive_desc_create", src.handle, lib.engine,
                       dst.handle, lib.engine, attr.handle, what="reorder")
    return Primitive(lib, pd, "reorder")


def _blocked_view(raw: np.ndarray, pointer: int, nbytes: int, shape, block: int):
    """The blocked output at `pointer` inside the scratch array `raw`, as
    (N, ⌈K/B⌉, oH·oW, B)."""
    n, k, oh, ow = shape
    start = (pointer - raw.ctypes.data) // 4
    flat = raw[start:start + nbytes // 4]
    return flat.reshape(n, -(-k // block), oh * ow, block)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _buffer(scratch: Callable, key: str, nbytes: int, held: list) -> int:
    """A 64-byte-aligned pointer to at least nbytes of the caller's scratch (its array is
    appended to `held`: the caller keeps it alive while oneDNN uses the pointer)."""
    raw = scratch(key, ((nbytes + 2 * ALIGN) // 4,), "float32")
    held.append(raw)
    start = raw.ctypes.data
    return (start + ALIGN - 1) // ALIGN * ALIGN


# Building -------------------------------------------------------------------------------------
def _user_mds(lib: api.Library, s: ConvSpec, layout: Layout = NCHW) -> dict[str, MemoryDesc]:
    tag_w = "abcd" if s.groups == 1 else "abcde"
    return {"src": MemoryDesc.tagged(lib, (s.n, s.c, s.h, s.w), _tag(layout.x_block, s.c)),
            "weights": MemoryDesc.tagged(lib, s.weight_shape, tag_w),
            "dst": MemoryDesc.tagged(lib, (s.n, s.k, s.oh, s.ow), _tag(layout.y_block, s.k)),
            "bias": MemoryDesc.tagged(lib, (s.k,), "a")}


def _any_mds(lib: api.Library, s: ConvSpec, plain: bool,
             layout: Layout = NCHW) -> dict[str, MemoryDesc]:
    if plain:
        return _user_mds(lib, s, layout)
    return {"src": MemoryDesc.tagged(lib, (s.n, s.c, s.h, s.w), "any"),
            "weights": MemoryDesc.tagged(lib, s.weight_shape, "any"),
            "dst": MemoryDesc.tagged(lib, (s.n, s.k, s.oh, s.ow), "any"),
            "bias": MemoryDesc.tagged(lib, (s.k,), "a")}


def _geometry(s: ConvSpec) -> tuple:
    return tuple(api.dims(v) for v in (s.strides, s.dilations, s.pad_l, s.pad_r))


def _forward_pd(lib: api.Library, s: ConvSpec, bias: bool, relu: bool, plain: bool,
                layout: Layout = NCHW, kind: str | None = None):
    mds = _any_mds(lib, s, plain, layout)
    attr = api.Attr(lib, relu=relu, accumulate=layout.add_dst)
    pd = api.create_pd(
        lib, "dnnl_convolution_forward_primitive_desc_create", lib.engine,
        lib.enums.prop[kind or _forward_kind(s, layout)], lib.enums.alg["convolution_direct"],
        mds["src"].handle, mds["weights"].handle, mds["bias"].handle if bias else None,
        mds["dst"].handle, *_geometry(s), attr.handle, what="convolution forward")
    return pd


# Channels (per group, both ways) from which a convolution larger than 1×1 runs its forward
# pass on oneDNN's BRGEMM kernels (see _forward_kind): they won from 128 channels on and lost
# below (AVX2).
BRGEMM_MIN_CHANNELS = 128


def _forward_kind(s: ConvSpec, layout: Layout = NCHW) -> str:
    """oneDNN's propagation kind of a forward pass. Built for inference, a kernel larger than
    1×1 runs on oneDNN's BRGEMM kernels, which on AVX2 ran ResNet-50's blocked 3×3 layers of
    256 and 512 channels 16-30% faster (the whole net 7% at batch 8) and the NCHW 3×3 stride-2
    layer of 128 channels at batch 32 (bench_cpu's shape c) 8-12% faster, but 64-channel
    layers and ResNet-20's up to 10% slower, and 1×1 layers 2× slower: with the reorders into
    the NHWC they run on. Where netrun holds the output channels-last (`channels_last`), every
    layer runs them: a direct kernel would reorder instead. The forward pass computes the same
    either way; a training net's backward primitives are built with a forward_training hint
    of their own (`build`)."""
    wide = min(s.c, s.k) // s.groups >= BRGEMM_MIN_CHANNELS
    inference = (s.kh * s.kw > 1 and wide) or channels_last(layout.y_block, s.k)
    return "forward_inference" if inference else "forward_training"


def build(s: ConvSpec, direction: str, bias: bool = False, relu: bool = False,
          plain: bool = False, count: int = 1, layout: Layout = NCHW) -> Direction | None:
    """The compiled direction ('forward', 'backward_data', 'backward_weights') for s on
    `count` OpenMP threads (the caller has set them); None when oneDNN has no kernel for it.
    A backward direction's layout blocks its data gradients as the forward pass's arrays:
    diff_src like src (x_block), diff_dst like dst (y_block); add_dst is forward-only."""
    lib = api.get()
    if layout.add_dst and direction != "forward":
        raise api.OneDNNError(f"a {direction} plan with a residual post-op (layout {layout}): "
                              f"the residual is a forward pass's")
    user = _user_mds(lib, s, layout)
    hint = _forward_pd(lib, s, bias, relu and direction == "forward", plain, layout,
                       None if direction == "forward" else "forward_training")
    if hint is None:
        return None
    if direction == "forward":
        prim = Primitive(lib, hint, "convolution forward")
        args = {a: user[a] for a in ("src", "weights", "dst", "bias")}
        if layout.add_dst and prim.md("dst_md") != user["dst"]:
            return None   # it would add what its own dst buffer holds, not the residual
        return Direction(lib, prim, args, count, (s.n, s.k, s.oh, s.ow), layout.add_dst)
    try:
        # On netrun's blocked arrays, the kernels for those layouts first: with `any`,
        # oneDNN 3.2 picks its NHWC BRGEMM kernels for strided data gradients and reorders
        # in and out, which took ResNet-20's stride-2 layers 2-4x as long (1×1: 0.72 ms and
        # two reorders against 0.23 ms at batch 32).
        # Only a JIT kernel will do: for a half-blocked layer (NCHW input of 20 channels,
        # blocked output) oneDNN offers its reference kernel, 1.5-2 s a call.
        if layout.x_block or layout.y_block:
            made = _backward(lib, s, direction, bias, _blocked_mds(lib, s, plain, user), hint,
                             user, count)
            if made is not None and made.prim.impl.startswith(FAST_KERNELS):
                return made
        return _backward(lib, s, direction, bias, _any_mds(lib, s, plain), hint, user, count)
    finally:   # the backward descriptors keep their own copy of the hint
        lib.lib.dnnl_primitive_desc_destroy(hint)


# oneDNN's implementations worth their layouts: its JIT and BRGEMM kernels, not `ref:any`.
FAST_KERNELS = ("jit", "brg")


def _blocked_mds(lib: api.Library, s: ConvSpec, plain: bool,
                 user: dict[str, MemoryDesc]) -> dict[str, MemoryDesc]:
    """`_any_mds` with the data in netrun's own (blocked) layouts."""
    return {**_any_mds(lib, s, plain), "src": user["src"], "dst": user["dst"]}


def _backward(lib: api.Library, s: ConvSpec, direction: str, bias: bool,
              mds: dict[str, MemoryDesc], hint, user: dict[str, MemoryDesc],
              count: int) -> Direction | None:
    """A backward direction built on these descriptors; None where oneDNN has no kernel."""
    attr = api.Attr(lib)
    if direction == "backward_data":
        pd = api.create_pd(
            lib, "dnnl_convolution_backward_data_primitive_desc_create", lib.engine,
            lib.enums.alg["convolution_direct"], mds["src"].handle,
            mds["weights"].handle, mds["dst"].handle, *_geometry(s), hint, attr.handle,
            what="convolution backward data")
        if pd is None:
            return None
        prim = Primitive(lib, pd, "convolution backward data")
        return Direction(lib, prim, {"diff_src": user["src"], "weights": user["weights"],
                                     "diff_dst": user["dst"]}, count)
    pd = api.create_pd(
        lib, "dnnl_convolution_backward_weights_primitive_desc_create", lib.engine,
        lib.enums.alg["convolution_direct"], mds["src"].handle, mds["weights"].handle,
        mds["bias"].handle if bias else None, mds["dst"].handle, *_geometry(s), hint,
        attr.handle, what="convolution backward weights")
    if pd is None:
        return None
    prim = Primitive(lib, pd, "convolution backward weights")
    return Direction(lib, prim, {"src": user["src"], "diff_weights": user["weights"],
                                 "diff_dst": user["dst"], "diff_bias": user["bias"]}, count)


# The memo: compiled plans are immutable and thread-safe to execute, so one per key serves
# every workspace and thread of the process.
_PLANS: dict[tuple, Direction | None] = {}
_LOCK = threading.Lock()


def plan(s: ConvSpec, direction: str, count: int, bias: bool = False, relu: bool = False,
         plain: bool = False, layout: Layout = NCHW) -> Direction | None:
    """The memoized `build` for `count` OpenMP threads (oneDNN picks kernels for it)."""
    key = (s, direction, bias, relu, plain, count, layout)
    found = _PLANS.get(key, _PLANS)
    if found is _PLANS:
        with _LOCK, threads.running(count):
            if key not in _PLANS:
                _PLANS[key] = build(s, direction, bias, relu, plain, count, layout)
            found = _PLANS[key]
    return found


def channel_block() -> int:
    """The channel block oneDNN's direct convolutions use on this CPU (8 with AVX2, 16 with
    AVX-512): the layout a net's activations are best kept in between them; 0 when oneDNN
    keeps a mid-sized convolution in NCHW (no blocked kernel here)."""
    found = _BLOCK.get("block")
    if found is None:
        s = ConvSpec(1, 64, 14, 14, 64, 3, 3, 14, 14, (1, 1), (0, 0), (1, 1), (1, 1), 1)
        d = plan(s, "forward", 1)
        found = 0
        for block in (16, 8):
            if d is not None and d.chosen["dst"] == MemoryDesc.tagged(d.lib, (1, 64, 14, 14),
                                                                      _tag(block)):
                found = block
        _BLOCK["block"] = found
    return found


_BLOCK: dict[str, int] = {}


def run(d: Direction, count: int, scratch: Callable, staged: dict[str, Staged] | None = None,
        blocked: str | None = None, **arrays):
    """Execute a plan on `count` OpenMP threads of this thread (`staged`, `blocked` and what
    it returns: see Direction.run)."""
    _check(arrays.values())
    with threads.running(count):
        return d.run(arrays, scratch, staged, blocked)


def steps(d: Direction, scratch: Callable, staged: dict[str, Staged] | None = None,
          blocked: str | None = None, **arrays) -> tuple[list, list, Any]:
    """Direction.steps with `run`'s checks: the calls, for `execute` or a team table."""
    _check(arrays.values())
    return d.steps(arrays, scratch, staged, blocked)


def execute(calls: list, count: int) -> None:
    """Steps (from `steps`, `stage_steps`) in order on `count` OpenMP threads of this thread."""
    with threads.running(count):
        _execute(calls)


class BoundCall:
    """One pass of a plan with every argument fixed: its calls bound once to their arrays, to
    run again as they are (`run`) while the caller knows the arrays have not moved. A
    batch-1 layer spent ~50 µs of Python around each oneDNN call (~25 µs of kernels); run
    again, the calls cost ~2 µs each. The scratch region is asked of `scratch` on every run,
    as a pass asks for it (an arena shared by the ops that run in turn), and the calls are
    bound again where it moved. `close` (or the object's end) releases the memory objects."""

    def __init__(self, d: Direction, count: int, scratch: Callable,
                 staged: dict[str, Staged] | None, arrays: dict[str, Any]):
        _check(arrays.values())
        self.d, self.count, self.scratch = d, count, scratch
        self.staged, self.arrays = staged, arrays
        self.runner = runner(d.lib, count)
        # staged filters (a copy kept while w is not written), or w reordered on every run
        self.reads_kept_filters = bool(staged and "weights" in staged)
        self.reorders_filters = "weights" in d.reorders and not self.reads_kept_filters
        # the region holds the scratchpad and the copies of arguments not staged: none at
        # all for a direct kernel on blocked arrays with kept filters
        self.uses_region = bool(d.prim.scratch_bytes) or any(
            arrays.get(arg) is not None and arg not in (staged or {}) for arg in d.reorders)
        self.base: int | None = None
        self.calls: list = []
        self._finalizer = None
        self._bind(self._region())

    def _region(self) -> int | None:
        """The scratch region's address this time (None: the calls use none)."""
        if not self.uses_region:
            return None
        return _buffer(self.scratch, "onednn.region", self.d.region_bytes, [])

    def _bind(self, base: int | None) -> None:
        self.close()
        steps, _, _ = self.d.steps(self.arrays, self.scratch, self.staged)
        calls, releases = [], []
        for prim, args in steps:
            packed, release = prim.bound_once(args)
            calls.append((prim.handle, len(args), packed, prim.impl))
            releases.append(release)
        self.base, self.calls = base, calls
        self._finalizer = weakref.finalize(self, release_all, releases)

    def run(self) -> None:
        """The calls again, on `count` OpenMP threads of this thread."""
        runner, calls = self.defer()
        runner([calls])

    def defer(self) -> tuple[Callable[[list], None], list]:
        """(runner, calls): the calls, bound again first where the scratch region moved, for
        runner([calls, ...]) to make later with other ops' calls (netrun.core.net). Asked
        while the op's scratch is current (its turn in the net), made before the next op
        writes anything."""
        if self.uses_region:
            base = self._region()
            if base != self.base:
                self._bind(base)
        return self.runner, self.calls

    def close(self) -> None:
        """Release the memory objects now."""
        if self._finalizer is not None:
            self._finalizer()


def run_bound(lib: api.Library, calls: list, count: int) -> None:
    """Bound calls (handle, argument count, packed arguments, kernel name) in order, on
    `count` OpenMP threads of this thread."""
    run_bound_lists(lib, count, [calls])


def run_bound_lists(lib: api.Library, count: int, lists: list) -> None:
    """Lists of bound calls (as `run_bound` takes), in order, on `count` OpenMP threads."""
    execute, stream = lib.lib.dnnl_primitive_execute, lib.stream()
    before = threads.set_count(count)
    try:
        for calls in lists:
            for handle, n, packed, impl in calls:
                status = execute(handle, stream, n, packed)
                if status:
                    lib.check(status, f"primitive_execute ({impl}, a bound call)")
    finally:
        threads.restore(before)


@functools.lru_cache(maxsize=None)
def runner(lib: api.Library, count: int) -> Callable[[list], None]:
    """run_bound_lists for `lib` on `count` threads, one object per pair: BoundCalls with
    the same runner batch their calls (netrun.core.net compares runners by identity)."""
    return functools.partial(run_bound_lists, lib, count)


def release_all(releases: list) -> None:
    """Release every argument set (Primitive.bound_once's release functions)."""
    for release in releases:
        release()


def bind(d: Direction, count: int, scratch: Callable, staged: dict[str, Staged] | None = None,
         **arrays) -> BoundCall:
    """A BoundCall of d for these arrays (C-contiguous float32, as for `run`)."""
    return BoundCall(d, count, scratch, staged, arrays)


def stage(d: Direction, count: int, arg: str, array, scratch: Callable, key: str) -> Staged:
    """Direction.stage on `count` OpenMP threads of this thread."""
    _check([array])
    with threads.running(count):
        return d.stage(arg, array, scratch, key)


def stage_steps(d: Direction, arg: str, array, scratch: Callable,
                key: str) -> tuple[Staged, list]:
    """Direction.stage_steps with `stage`'s checks."""
    _check([array])
    return d.stage_steps(arg, array, scratch, key)


def _check(arrays) -> None:
    for a in arrays:
        if a is not None and (a.dtype != np.float32 or not a.flags.c_contiguous):
            raise ValueError("oneDNN arrays must be C-contiguous float32")
