"""Shared by the format tests: random NetDefs with awkward names, and a way to compare nets."""
from __future__ import annotations

from hypothesis import strategies as st

import netrun
from netrun.proto.defs import NetDef


def netdefs(tricky_names: list[str], int_range: tuple[int, int] | None = None):
    """NetDefs whose names mix random text with the given format-specific traps."""
    names = st.text(st.characters(codec="utf-8"), max_size=6) | st.sampled_from(tricky_names)
    ints = st.integers(*int_range) if int_range else st.integers()
    args = st.one_of(ints, st.floats(), names, st.lists(st.integers(), max_size=3),
                     st.lists(st.floats(), min_size=1, max_size=3),
                     st.lists(names, min_size=1, max_size=3))
    devices = st.one_of(st.none(), st.sampled_from(["cpu", "gpu"]),
                        st.integers(0, 15).map(lambda i: f"gpu:{i}"))
    ops = st.builds(netrun.op, names, st.lists(names, max_size=3), st.lists(names, max_size=3),
                    name=names, device=devices, engine=names)
    ops = st.tuples(ops, st.dictionaries(names, args, max_size=4)).map(
        lambda t: t[0].with_(args=t[1]))
    return st.builds(NetDef, names, st.lists(ops, max_size=3), st.lists(names, max_size=3),
                     st.lists(names, max_size=3))


def canonical(net: NetDef):
    """A comparable form of a net: floats by repr, so NaN equals NaN and -0.0 differs from 0.0."""
    def arg(v):
        if isinstance(v, list):
            return ("list", tuple(arg(x) for x in v))
        return (type(v).__name__, repr(v) if isinstance(v, float) else v)
    ops = tuple((o.type, o.inputs, o.outputs, tuple((k, arg(v)) for k, v in o.args.items()),
                 o.name, o.device, o.engine) for o in net.ops)
    return net.name, ops, tuple(net.external_inputs), tuple(net.external_outputs)
