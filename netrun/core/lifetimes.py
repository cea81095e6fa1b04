"""Blob lifetimes in a net's schedule: which writes may share memory, and for how long.

A *value* is one storage token: the bytes written by one op output, together with the
outputs that continue it in place (the schema allows it and nothing reads the input
later) and the views taken of it (Reshape, Flatten: ops registered with `register_view`).
It lives from its first write to its last read, both op indices, inclusive: an op never
writes an output over an input it is still reading unless the two are one value.

Nothing is shared that lives beyond one run of the net: names read before this net writes
them (parameters, optimizer state, fed inputs, iteration counters, accumulators read again
next iteration), names another bound net reads before writing them (the update net reads
the step net's gradients), the net's external inputs and outputs, the names asked to be
kept, and names whose last write no op of the net reads (its results: loss, metrics,
predictions). Such names are *persistent*: every write of them keeps its own buffer.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from netrun.core.schema import TensorSpec, get_schema
from netrun.errors import UnknownOpError
from netrun.proto.defs import NetDef

# Op type -> (input, output) pairs whose output the kernel returns as a view of the input
# (no copy): the output shares its input's value. Filled by `register_view`, next to the ops.
_VIEWS: dict[str, tuple[tuple[int, int], ...]] = {}


def register_view(type: str, *pairs: tuple[int, int]) -> None:
    """Declare that op `type` returns output j as a view of input i, for each (i, j)."""
    _VIEWS[type] = tuple(pairs) or ((0, 0),)


def view_pairs(type: str) -> tuple[tuple[int, int], ...]:
    """The (input, output) view pairs declared for op `type`."""
    return _VIEWS.get(type, ())


# Op type -> inputs whose kernel reads only their shape, never their data (AddGradient's A
# and B): such a read does not keep a value alive. Filled by `register_shape_reads`.
_SHAPE_READS: dict[str, frozenset[int]] = {}


def register_shape_reads(type: str, *inputs: int) -> None:
    """Declare that op `type`'s kernel reads only the shape of these inputs."""
    _SHAPE_READS[type] = frozenset(inputs)


@dataclass
class Value:
    """One storage token: `nbytes` live from op `start` to op `end` (inclusive)."""

    nbytes: int
    start: int
    end: int
    names: list[str] = field(default_factory=list)


@dataclass
class Lifetimes:
    """The values of one net, and which op output writes (or views) which value."""

    values: list[Value]
    # (op index, output index) -> index into values, for outputs written into a value;
    # outputs that are views of a value map to it too (their kernel returns the view).
    writes: dict[tuple[int, int], int]
    views: set[tuple[int, int]]          # the (op, output) pairs above that are views
    persistent: set[str]
    # op index -> values whose lifetime ends there (debug poisoning)
    ends: dict[int, list[int]]
    # op index -> the value holding its scratch (added by the memory planner)
    scratch: dict[int, int] = field(default_factory=dict)


def external_reads(net: NetDef) -> set[str]:
    """Names `net` reads before it writes them (its inputs from outside the run)."""
    written: set[str] = set()
    reads: set[str] = set()
    for op in net.ops:
        reads.update(n for n in op.inputs if n not in written)
        written.update(op.outputs)
    return reads


def persistent_names(net: NetDef, others: Iterable[NetDef] = (),
                     keep: Iterable[str] = ()) -> set[str]:
    """Names of `net` that must keep their own buffers (see the module doc)."""
    keep = set(keep) | set(net.external_inputs) | set(net.external_outputs)
    keep |= external_reads(net)
    for other in others:
        keep |= external_reads(other)
    # Names whose last write is never read afterwards in this net: the net's results.
    read_after: set[str] = set()
    for op in reversed(net.ops):
        for name in op.outputs:
            if name not in read_after:
                keep.add(name)
        read_after.difference_update(op.outputs)
        read_after.update(op.inputs)
    # A kept view keeps its source: a copy would no longer see later in-place writes.
    grown = True
    while grown:
        grown = False
        for op in net.ops:
            for k, j in view_pairs(op.type):
                if (j < len(op.outputs) and k < len(op.inputs) and op.outputs[j] in keep
                        and op.inputs[k] not in keep):
                    keep.add(op.inputs[k])
                    grown = True
    return keep


def _inplace_pairs(type: str) -> tuple[tuple[int, int], ...]:
    try:
        schema = get_schema(type)
    except UnknownOpError:
        return ()
    return tuple(schema.inplace)


def lifetimes(net: NetDef, specs: Sequence[Sequence[TensorSpec] | None],
              persistent: set[str], min_bytes: int = 0, inplace: bool = True) -> Lifetimes:
    """The values of `net` given each op's output specs (None: unknown, left unplanned).

    Outputs of persistent names, of unknown or non-numeric specs, or smaller than
    `min_bytes` get no value (their op allocates as without a plan).
    """
    ops = net.ops
    # For each (op, input index): is this the last read of the name's current write?
    last_read: set[tuple[int, int]] = set()
    read_later: set[str] = set()
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        shape_only = _SHAPE_READS.get(op.type, ())
        read_later.difference_update(n for n in op.outputs if n not in op.inputs)
        for k, name in enumerate(op.inputs):
            if name not in read_later and op.inputs.count(name) == 1:
                last_read.add((i, k))
        read_later.update(n for k, n in enumerate(op.inputs) if k not in shape_only)

    values: list[Value] = []
    writes: dict[tuple[int, int], int] = {}
    views: set[tuple[int, int]] = set()
    current: dict[str, int] = {}          # name -> its live value (planned names only)
    viewing: set[str] = set()             # names whose live value they only view
    viewed: set[int] = set()              # values with a view: their source may be read later
    for i, op in enumerate(ops):
        ins = [current.get(n) for n in op.inputs]
        shape_only = _SHAPE_READS.get(op.type, ())
        for k, v in enumerate(ins):
            if v is not None and k not in shape_only:
                values[v].end = max(values[v].end, i)
        outs = specs[i] if i < len(specs) else None
        taken: set[int] = set()           # values an output of this op already continues
        view_of = {j: k for k, j in view_pairs(op.type)}
        for j, name in enumerate(op.outputs):
            current.pop(name, None)
            # A view is no buffer of its own: written "in place", it gets a new one (as
            # OpContext.output does without a plan), and its source is left alone.
            was_view = name in viewing
            viewing.discard(name)
            if name in persistent or outs is None or j >= len(outs):
                continue
            spec = outs[j]
            try:
                nbytes = spec.nbytes
                numeric = spec.dtype not in ("object", "str") and not spec.dtype.startswith("<U")
            except TypeError:
                continue
            if not numeric or nbytes < max(min_bytes, 1):
                continue
            v = None
            if j in view_of and view_of[j] < len(ins):
                v = ins[view_of[j]]
                if v is None:             # a view of a buffer that is not shared
                    continue
                views.add((i, j))
                viewing.add(name)
                viewed.add(v)
            elif name in op.inputs and not was_view:
                v = ins[op.inputs.index(name)]     # the net writes it in place: one value
            elif inplace and len(op.outputs) == 1:
                # Kernels of several outputs order their writes by the names they are
                # given (MulGradient writes dA over dY last only when the names say so):
                # memory shared under other names is left to single-output ops. A value
                # continued in place already is fine to continue again (its earlier names
                # were last read where it was continued: a residual net's blocks each add
                # into the last one's output), but not one with a view, whose source may
                # still be read.
                for k, jj in _inplace_pairs(op.type):
                    u = ins[k] if k < len(ins) else None
                    if (jj == j and u is not None and u not in taken and (i, k) in last_read
                            and u not in viewed and values[u].nbytes == nbytes
                            and op.inputs[k] not in persistent):
                        v = u
                        break
            if v is None:
                v = len(values)
                values.append(Value(nbytes, i, i))
            values[v].names.append(name)
            values[v].end = max(values[v].end, i)
            taken.add(v)
            writes[(i, j)] = v
            current[name] = v
    ends: dict[int, list[int]] = {}
    for v, value in enumerate(values):
        ends.setdefault(value.end, []).append(v)
    return Lifetimes(values, writes, views, persistent, ends)
