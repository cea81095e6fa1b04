"""oneDNN's convolutions (the optional `netrun[onednn]` engine) as the algorithm "onednn".

oneDNN picks blocked layouts for each problem (format `any`); netrun's NCHW arrays are
reordered into them and back, around primitives compiled once per problem and direction
(netrun.kernels.onednn.conv). The forward pass fuses the bias and, asked with relu=True, a
ReLU post-op (`fuses_relu`).

Threads and determinism (same bits on any thread count, checked in tests/test_determinism.py):
oneDNN's results can depend on its thread count: its filter gradient sums the batch across
threads, and its GEMM-based kernels (small or grouped layers) split sums too. So the
gradients, and a forward pass big enough to cut, run the fixed batch chunks of
netrun.kernels.parallel (they depend on the problem, never on the thread count), each
chunk's calls single-threaded; forward and data-gradient chunks write their own images, and
the chunks' partial dW and db are summed in chunk order. With Numba's OpenMP layer all the
chunks of a pass run as one GIL-free call on an OpenMP team (netrun.kernels.onednn.team,
`_chunked`); otherwise each on one of netrun's worker threads.

The forward pass is one call instead, on an OpenMP team of netrun's thread count, when the
primitive is one of oneDNN's direct JIT kernels (`TEAM_KERNELS`): those hand each thread
whole output rows and channel blocks and sum every output over all its inputs on one
thread, so the bits do not depend on the team's size (tests/test_determinism.py checks 1, 2
and 3). At batch 1 it saves the chunks' hand-off (~50 µs, more than most layers of a small
net); at any batch oneDNN's own split of the whole batch beats fixed chunks of
single-threaded primitives: ResNet-20's training forward convolutions took 0.70× as long at
batch 4, 0.87× at 32 and 0.96× at 128, ResNet-50's at batch 8 0.82× (in-process A/Bs), and
blocked inference layers 0.91×. (Until the chunks themselves ran on the team, and batch norm
and ReLU with them, a team spinning between calls took the cores that the worker threads
needed for the ops between the convolutions, and teams lost above batch 1.)
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from netrun.conv.algorithm import ConvAlgorithm, ConvProblem, KeptFilters, register_algorithm
from netrun.kernels import jit, omp, onednn, parallel
from netrun.kernels import relu as relu_kernels
from netrun.kernels.jit import blocked as jit_blocked
from netrun.kernels.onednn import conv as engine
from netrun.kernels.onednn import team as on_team

# The batch in CHUNKS chunks at most (2 or 4 threads share them evenly), none with less than
# CHUNK_MIN_FLOPS of work: handing a chunk to another thread costs ~0.05-0.1 ms, and more
# while the threads take turns holding the GIL between ctypes calls, so small layers run as
# one call. More than two chunks only while each gets CHUNK_FLOPS: every chunk reorders its
# own slices and runs its own primitive (ResNet-20's training step at batch 32 ran 7% faster
# in 2 chunks than in 4; at batch 128, and ResNet-50 at batch 8, 2 and 4 chunks tie on 2
# cores, and 4 keep 4 cores busy).
CHUNKS = 4
CHUNK_MIN_FLOPS = 8_000_000
CHUNK_FLOPS = 40_000_000
# oneDNN's direct JIT forward kernels (implementation names as oneDNN reports them): no sum
# is split between threads. Its GEMM-based and reference kernels are left out.
TEAM_KERNELS = ("jit:", "jit_1x1:", "jit_dw:", "brg")


def spec(p: ConvProblem, n: int | None = None) -> engine.ConvSpec:
    """The problem in oneDNN's terms (batch `n` for a chunk)."""
    return engine.ConvSpec(p.n if n is None else n, p.c, p.h, p.w, p.k, p.kh, p.kw, p.oh,
                           p.ow, (p.sh, p.sw), (p.dh - 1, p.dw - 1), (p.pt, p.pl),
                           (p.pb, p.pr), p.group)


@register_algorithm
class OneDNNConv(ConvAlgorithm):
    """oneDNN's direct convolutions in its blocked layouts, reordered from and to NCHW."""

    name = "onednn"
    optional_engine = True
    fuses_relu = True
    fuses_residual = True
    keeps_filters = True
    binds_calls = True
    summary = "oneDNN (netrun[onednn]): direct convolution in blocked layouts, fused bias/ReLU"

    def applicable(self, p: ConvProblem) -> bool:
        return p.dtype == "float32" and onednn.available()

    def unavailable(self) -> str:
        """Why the engine cannot run here ('' when it can): what to install, or the switch."""
        return onednn.why_not()

    def supports(self, xp, p: ConvProblem, direction: str) -> bool:
        return xp is None or xp is np

    def workspace_bytes(self, p: ConvProblem) -> int:
        # blocked copies of x, y (or dY) and w, channels padded to a block of 16, and per
        # batch chunk after the first a partial filter gradient (kept until the commits run
        # in chunk order); oneDNN's scratchpad comes on top
        def pad(c):
            return -(-c // 16) * 16
        x, y = p.n * pad(p.c) * p.h * p.w, p.n * pad(p.k) * p.oh * p.ow
        w = pad(p.k) * pad(p.cg) * p.kh * p.kw
        return (x + y + w * len(_batch_spans(p))) * p.itemsize

    def prepare(self, p, direction, bias=False, relu=False, layout=engine.NCHW,
                residual=False):
        """Compile the primitives of every chunk size this pass will run, and the team's
        kernel where its chunks run on one (at bind)."""
        if not self.applicable(p):
            return
        name = {"backward_filter": "backward_weights"}.get(direction, direction)
        if direction == "forward":
            layout, relu, team = _resolve(p, bias, relu, residual, layout)
            if team is not None:
                return
        spans = _batch_spans(p)
        parts = [replace(p, n=n1 - n0) for n0, n1 in spans]
        for part in {q: None for q in parts}:   # each chunk size once, in order
            engine.plan(spec(part), name, 1, bias and direction != "backward_data",
                        relu and direction == "forward", layout=layout)
        if len(spans) > 1 and omp.usable(np):
            on_team.prepare()

    def forward(self, xp, x, w, p, out, scratch, bias=None, relu=False, filters=None,
                residual=None, layout=engine.NCHW, bound=False):
        """`layout` (netrun.kernels.onednn.conv.Layout) says whether x, out and residual are
        channel-blocked arrays rather than NCHW (`blocked_layouts`). With bound=True, a pass
        that was nothing but one plan's oneDNN calls returns them bound to these arrays
        (engine.BoundCall), for the caller to run again while they stay where they are (and
        w unwritten where the calls read a kept copy of it)."""
        x, w = _c(x), _c(w)
        bias = None if bias is None else _c(bias)
        y = _writable(out, scratch, "onednn.y")
        layout, post_relu, team = _resolve(p, bias is not None, relu, residual is not None,
                                           layout)
        # The memory plan gives Y the buffer of an S the conv reads last (Conv's in-place
        # pair): the primitive then adds what y holds, with no copy (engine.Layout.add_dst).
        # Any other overlap is read before y is written.
        if (residual is not None and np.may_share_memory(residual, out)
                and not (layout.add_dst and y is out and _same_memory(residual, out))):
            residual = _copy(residual, scratch, "onednn.residual")
        if layout.add_dst:   # blocked like y: the primitive adds it
            after, extra = None, {"residual": _c(residual)}
        else:   # summed on the way out of oneDNN's layout, before the ReLU
            extra = {}
            after = None if residual is None else _Residual(_c(residual), relu, layout.y_block)

        if team is not None:
            kept = _kept(team, w, filters)
            blocked = engine.run(team, team.threads, scratch, kept and {"weights": kept},
                                 after and after.blocked, src=x, weights=None if kept else w,
                                 bias=bias, dst=y, **extra)
            if after is not None:
                after.finish(blocked, y, 0, p.n)
            elif y is out and bound:
                # nothing but oneDNN calls: the caller may run them again as they are, while
                # w is not written where they read filters kept between runs (inference),
                # and while the arrays stay where they are where they reorder w each run
                if kept is not None:
                    return engine.bind(team, team.threads, scratch, {"weights": kept}, src=x,
                                       bias=bias, dst=y, **extra)
                return engine.bind(team, team.threads, scratch, None, src=x, weights=w,
                                   bias=bias, dst=y, **extra)
        else:
            staged = _Filters(w, scratch, filters)

            def chunk(index, n0, n1, s) -> _Chunk:
                d = engine.plan(spec(p, n1 - n0), "forward", 1, bias is not None, post_relu,
                                layout=layout)
                if after is not None and after.blocked:   # read after every chunk has run
                    s = _own(s, index)
                calls, held, blocked = engine.steps(
                    d, s, staged.staged(d), after and after.blocked, src=x[n0:n1], bias=bias,
                    dst=y[n0:n1], **{k: v[n0:n1] for k, v in extra.items()})
                then = None if after is None else partial(after.finish, blocked, y, n0, n1)
                return _Chunk(calls, held, then)

            _chunked(p, scratch, chunk)
        if y is not out:
            out[...] = y

    def backward_data(self, xp, dy, w, p, out, scratch, layout=engine.NCHW):
        """`layout`: dy blocked as the forward's y (y_block), out as its x (x_block)."""
        dy, w = _c(dy), _c(w)
        dx = _writable(out, scratch, "onednn.dx")

        filters = _Filters(w, scratch)

        def chunk(index, n0, n1, s) -> _Chunk:
            d = engine.plan(spec(p, n1 - n0), "backward_data", 1, layout=layout)
            calls, held, _ = engine.steps(d, s, filters.staged(d), diff_dst=dy[n0:n1],
                                          diff_src=dx[n0:n1])
            return _Chunk(calls, held)

        _chunked(p, scratch, chunk)
        if dx is not out:
            out[...] = dx

    def backward_filter(self, xp, x, dy, p, out, scratch, dbias=None, layout=engine.NCHW):
        """`layout`: x and dy blocked as the forward pass's x and y."""
        x, dy = _c(x), _c(dy)
        dw = _writable(out, scratch, "onednn.dw")

        def chunk(index, n0, n1, s) -> _Chunk:
            d = engine.plan(spec(p, n1 - n0), "backward_weights", 1, dbias is not None,
                            layout=layout)
            return _filter_chunk(d, s, index, x[n0:n1], dy[n0:n1], dw, dbias, {})

        _chunked(p, scratch, chunk)
        if dw is not out:
            out[...] = dw

    def backward(self, xp, x, dy, w, p, dx, dw, scratch, dbias=None, bound=False,
                 layout=engine.NCHW):
        """Both gradients chunk by chunk, dY reordered into oneDNN's layout once for both
        (not at all when `layout` has it blocked as oneDNN runs it). With bound=True, where
        the chunks ran as one team call on dx and dw themselves, that call is returned bound
        (team.BoundTeam), for the caller to run again while the arrays and the op's scratch
        stay where they are; otherwise None."""
        x, dy, w = _c(x), _c(dy), _c(w)
        gx = _writable(dx, scratch, "onednn.dx")
        gw = _writable(dw, scratch, "onednn.dw")
        filters = _Filters(w, scratch)

        def chunk(index, n0, n1, s) -> _Chunk:
            data = engine.plan(spec(p, n1 - n0), "backward_data", 1, layout=layout)
            weights = engine.plan(spec(p, n1 - n0), "backward_weights", 1, dbias is not None,
                                  layout=layout)
            shared, calls, held = {}, [], []
            if data.chosen["diff_dst"] == weights.chosen["diff_dst"]:
                shared["diff_dst"], calls = engine.stage_steps(data, "diff_dst", dy[n0:n1], s,
                                                               "onednn.dy_staged")
                held += shared["diff_dst"].held
            more, more_held, _ = engine.steps(data, s, {**filters.staged(data), **shared},
                                              diff_dst=dy[n0:n1], diff_src=gx[n0:n1])
            rest = _filter_chunk(weights, s, index, x[n0:n1], dy[n0:n1], gw, dbias, shared)
            return _Chunk(calls + more + rest.calls, held + more_held + rest.held,
                          commit=rest.commit)

        again = _chunked(p, scratch, chunk, filters, bound and gx is dx and gw is dw)
        if gx is not dx:
            dx[...] = gx
        if gw is not dw:
            dw[...] = gw
        return again


def _filter_chunk(d, s, index: int, x, dy, dw, dbias, staged: dict) -> _Chunk:
    """One batch chunk's filter (and bias) gradient: chunk 0 writes dw itself, the others a
    partial sum, added by their commit (in chunk order: netrun.kernels.parallel)."""
    # each chunk's own partial sums: its commit may run after its slot's next chunk
    mine = dw if index == 0 else s(f"onednn.dw_part{index}", dw.shape, "float32")
    db = dbias if index == 0 else (
        None if dbias is None else s(f"onednn.db_part{index}", dbias.shape, "float32"))
    calls, held, _ = engine.steps(d, s, staged, src=x, diff_dst=dy, diff_weights=mine,
                                  diff_bias=db)
    if index == 0:
        return _Chunk(calls, held)

    def commit():
        np.add(dw, mine, out=dw)
        if dbias is not None:
            np.add(dbias, db, out=dbias)
    return _Chunk(calls, held + [mine, db], commit=commit)


@dataclass
class _Chunk:
    """One batch chunk's oneDNN calls (engine.steps), the scratch arrays they use, what
    runs after them on the chunk's thread (`then`) and what adds its share into a result
    shared with the other chunks (`commit`, in chunk order)."""

    calls: list
    held: list
    then: Callable[[], None] | None = None
    commit: Callable[[], None] | None = None


def _chunked(p: ConvProblem, scratch, chunk: Callable[..., _Chunk],
             filters: _Filters | None = None, bind: bool = False) -> on_team.BoundTeam | None:
    """chunk(index, n0, n1, scratch) over the problem's fixed batch chunks. Several chunks
    run on the OpenMP team in one call (netrun.kernels.onednn.team) where it can run, chunk i
    with the scratch of slot i % team size (as on worker threads: a slot's chunks run one
    after another), then their `then` and commits in chunk order; with `bind`, that call is
    returned bound (filters, the chunks' shared filters, reordered by its first steps).
    Otherwise each chunk runs on a worker thread (netrun.kernels.parallel), or the one chunk
    on this thread, and None is returned."""
    spans = _batch_spans(p)
    if len(spans) > 1 and omp.usable(np) and not parallel.in_chunk():
        slots = omp.team_size(len(spans))
        if filters is not None:
            filters.defer = bind
        # slot w's scratch is worker w's (slot < slots <= the thread count)
        planned = [chunk(i, n0, n1, parallel.chunk_scratch(scratch, i % slots))
                   for i, (n0, n1) in enumerate(spans)]
        after = [f for c in planned for f in (c.then, c.commit) if f is not None]
        if bind:
            bound = on_team.BoundTeam([c.calls for c in planned], slots,
                                      first=filters.steps if filters else (), after=after,
                                      held=[c.held for c in planned])
            bound.run()
            return bound
        on_team.run([c.calls for c in planned], slots)
        for step in after:
            step()
        return None

    def work(index, n0, n1):
        c = chunk(index, n0, n1, parallel.chunk_scratch(scratch, index))
        engine.execute(c.calls, 1)
        if c.then is not None:
            c.then()
        return c.commit

    _split(p.n, _batch_split(p), work)


def _own(scratch, index: int):
    """Scratch keys of chunk `index` alone (what is read after the whole table has run)."""
    return lambda key, shape, dtype="float32": scratch(f"{key}#chunk{index}", shape, dtype)


# (problem, bias, ReLU, residual, layout, threads) -> what `forward` runs: the plan's layout,
# whether the ReLU is its post-op, and the team plan or None. Worked out once per key (a call
# at batch 1 costs little more than this), immutable, shared like the engine's plan memo.
_RESOLVED: dict[tuple, tuple] = {}


def _resolve(p: ConvProblem, bias: bool, relu: bool, residual: bool,
             layout: engine.Layout) -> tuple[engine.Layout, bool, engine.Direction | None]:
    """(layout, post_relu, team) of a forward pass (`_forward_layout`, `_team`), memoized."""
    threads = 1 if parallel.in_chunk() else parallel.thread_count()
    key = (p, bias, relu, residual, layout, threads)
    found = _RESOLVED.get(key)
    if found is None:
        planned, post_relu = _forward_layout(p, layout, bias, relu, residual, threads)
        found = _RESOLVED[key] = (planned, post_relu,
                                  _team(p, bias, post_relu, planned, threads))
    return found


def _forward_layout(p: ConvProblem, layout: engine.Layout, bias: bool, relu: bool,
                    residual: bool, threads: int) -> tuple[engine.Layout, bool]:
    """(the plan's layout, whether its ReLU is a post-op) of a forward pass. A residual with
    a blocked output is summed by the primitive, which then applies the ReLU too, unless
    oneDNN would not write that layout itself; without a blocked output the sum (and so the
    ReLU) comes after the primitive. The primitive adds what the output holds (a sum
    post-op; the memory plan puts the residual there): on AVX2 each such layer of ResNet-20
    and ResNet-50 ran 3-14% faster than with a binary post-op reading the residual from
    elsewhere, whose sums differ from these in the last bit, so every run takes this form
    (a residual elsewhere is copied in first) and the bits do not depend on the plan."""
    if not residual:
        return layout, relu
    if layout.y_block:
        summed = replace(layout, add_dst=True)
        # the plan a blocked pass runs (one call on the team: `_team`), asked once
        d = engine.plan(spec(p), "forward", threads, bias, relu, layout=summed)
        if d is not None and "dst" not in d.reorders:
            return summed, relu
    return layout, False


def _team(p: ConvProblem, bias: bool, relu: bool, layout: engine.Layout = engine.NCHW,
          threads: int | None = None) -> engine.Direction | None:
    """The forward plan for one call on an OpenMP team of `threads` (netrun's thread count;
    in a chunk, one), when oneDNN runs p on a direct JIT kernel (see the module doc); None:
    run it as chunks."""
    if threads is None:
        threads = 1 if parallel.in_chunk() else parallel.thread_count()
    d = engine.plan(spec(p), "forward", threads, bias, relu, layout=layout)
    if d is None or not d.prim.impl.startswith(TEAM_KERNELS):
        return None
    return d


def _batch_split(p: ConvProblem) -> tuple[int, int] | None:
    """(work, block) for `parallel.chunks` over p's images; None: one call."""
    per_image = max(2 * p.k * p.oh * p.ow * p.cg * p.kh * p.kw, 1)   # flops of one image
    if p.n * per_image < 2 * CHUNK_MIN_FLOPS:
        return None
    return (p.n * per_image * p.cg * p.kh * p.kw,
            max(-(-p.n // CHUNKS), -(-CHUNK_FLOPS // per_image)))


def _split(n: int, split: tuple[int, int] | None, work) -> None:
    """work(index, i0, i1) over range(n): one call on this thread when `split` is None (too
    small to share; chunk 0 commits nothing), else the fixed chunks on netrun's workers."""
    if split is None:
        work(0, 0, n)
    else:
        parallel.chunks(np, n, work, work=split[0], block=split[1])


def _spans(n: int, split: tuple[int, int] | None) -> list[tuple[int, int]]:
    """The (i0, i1) ranges `_split` runs."""
    return [(0, n)] if split is None else parallel.chunk_bounds(n, *split)


def _batch_spans(p: ConvProblem) -> list[tuple[int, int]]:
    return _spans(p.n, _batch_split(p))


class _Filters:
    """The filters of one pass, reordered into oneDNN's layout once and shared by its batch
    chunks (each chunk reordering them again cost as much as a small layer's convolution),
    or kept from an earlier pass (`_kept`)."""

    def __init__(self, w, scratch, kept: KeptFilters | None = None):
        self.w, self.scratch, self.kept = w, scratch, kept
        self.ready: list = []
        self.lock = threading.Lock()
        # defer: leave the reorders in `steps` for the caller to run (before the chunks that
        # read them) instead of running them when asked
        self.defer, self.steps = False, []

    def staged(self, d) -> dict:
        """{"weights": the filters in d's layout}, reordered by the first chunk that asks."""
        with self.lock:
            for ready in self.ready:   # chunks of another size may want another layout
                if ready.md == d.chosen["weights"]:
                    return {"weights": ready}
            ready = _kept(d, self.w, self.kept)
            if ready is None:
                key = f"onednn.weights_staged{len(self.ready)}"
                if self.defer:
                    ready, steps = engine.stage_steps(d, "weights", self.w, self.scratch, key)
                    self.steps += steps
                else:
                    ready = engine.stage(d, 1, "weights", self.w, self.scratch, key)
            self.ready.append(ready)
            return {"weights": ready}


class _Residual:
    """A residual summed into the forward output, then its ReLU when asked: straight out of
    oneDNN's blocked output into NCHW in one compiled pass (netrun.kernels.jit.blocked),
    else on the output as netrun holds it (NCHW, or blocked like the residual)."""

    def __init__(self, residual, relu: bool, y_block: int = 0):
        self.residual, self.relu = residual, relu
        # a blocked output is never handed back still in oneDNN's own layout
        self.blocked = None if y_block else "dst"

    def finish(self, blocked, y, n0: int, n1: int) -> None:
        """Images n0:n1 of y (already written unless `blocked` holds them) get the sum."""
        r, out = self.residual[n0:n1], y[n0:n1]
        if blocked is not None and jit.enabled(np):
            shape = (n1 - n0, y.shape[1], y.shape[2] * y.shape[3])
            jit_blocked.unblock_add(blocked, r.reshape(shape), out.reshape(shape), self.relu)
            return
        if blocked is not None:   # no compiled engine: the layouts in NumPy
            n, cb, hw, b = blocked.shape
            full = blocked.transpose(0, 1, 3, 2).reshape(n, cb * b, hw)[:, :y.shape[1]]
            np.add(full.reshape(out.shape), r, out=out)
        else:
            np.add(out, r, out=out)
        if self.relu:
            relu_kernels.relu(np, out, out)


def _kept(d: engine.Direction, w, filters: KeptFilters | None) -> engine.Staged | None:
    """The filters in d's layout, kept between passes while their version stays; None: stage
    them in scratch as usual. A copy is kept from the second pass in a row that sees the same
    version on: training changes the filters every step, and holds no copy."""
    if filters is None or "weights" not in d.reorders:
        return None
    kept = filters.kept
    entry = kept.get(d)
    if entry is not None and entry[0] == filters.version:
        return entry[1]
    if kept.get("seen") != filters.version:
        kept["seen"] = filters.version
        kept.pop(d, None)
        return None
    staged = engine.stage(d, d.threads, "weights", w,
                          lambda key, shape, dtype: np.empty(shape, dtype), "onednn.kept")
    kept[d] = (filters.version, staged)
    return staged


def _c(a):
    """a as a C-contiguous float32 array (no copy when it already is one)."""
    return np.ascontiguousarray(a, dtype=np.float32)


def _same_memory(a, b) -> bool:
    """Whether a and b are one C-contiguous float32 array's memory, element for element."""
    return (a.ctypes.data == b.ctypes.data and a.shape == b.shape and a.dtype == b.dtype
            and a.flags.c_contiguous and b.flags.c_contiguous)


def _copy(a, scratch, key: str):
    """A C-contiguous float32 copy of a in scratch."""
    buf = scratch(key, a.shape, "float32")
    buf[...] = a
    return buf


def _writable(out, scratch, key: str):
    """out itself when oneDNN can write it in place, else a contiguous scratch twin."""
    if out.flags.c_contiguous and out.dtype == np.float32:
        return out
    return scratch(key, out.shape, "float32")
