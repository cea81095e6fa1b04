"""oneDNN's enumeration values, looked up by name through the library's own *2str functions.

The wheel ships no headers, and numbers typed by hand would break silently on a release that
renumbers an enum. Every value netrun uses is found at load time by asking the library for
the name of each candidate number (dnnl_fmt_tag2str, dnnl_alg_kind2str, dnnl_prop_kind2str,
dnnl_dt2str, dnnl_scratchpad_mode2str, dnnl_engine_kind2str), so a missing name is an
error at load, not a wrong result.

What has no *2str function (argument indices and query kinds, #defines and enums of the C
API) is written out below from dnnl_types.h of oneDNN 3.x; the engine loads only a library
whose dnnl_version() says major version 3 (netrun.kernels.onednn.api.Library), and the
tests check every direction's results, which a wrong index or query would break.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

# Searched range: every enum netrun uses lies below 0x1000 in oneDNN 3.x (format tags run to
# about 700, algorithm kinds to 0x3ff for pooling).
_SEARCH = range(0x1000)

NAMES = {
    "dnnl_fmt_tag2str": ("undef", "any", "a", "ab", "abcd", "abcde", "acdb", "aBcd8b",
                         "aBcd16b"),
    "dnnl_alg_kind2str": ("convolution_direct", "convolution_auto", "eltwise_relu",
                          "pooling_max", "pooling_avg_include_padding",
                          "pooling_avg_exclude_padding"),
    "dnnl_prop_kind2str": ("forward_training", "forward_inference", "backward_data",
                           "backward_weights", "backward"),
    "dnnl_dt2str": ("undef", "f32"),
    "dnnl_scratchpad_mode2str": ("library", "user"),
    "dnnl_engine_kind2str": ("cpu",),
}

# Execution argument indices (DNNL_ARG_*).
ARG = {"src": 1, "dst": 17, "weights": 33, "bias": 41, "workspace": 64, "scratchpad": 80,
       "diff_src": 129, "diff_dst": 145, "diff_weights": 161, "diff_bias": 169}
# Query kinds (dnnl_query_t) for memory descriptors of a primitive descriptor.
QUERY = {"src_md": 129, "diff_src_md": 130, "weights_md": 131, "diff_weights_md": 132,
         "dst_md": 133, "diff_dst_md": 134, "workspace_md": 135, "scratchpad_md": 136,
         "impl_info_str": 8}


@dataclass(frozen=True)
class Enums:
    """The values of one loaded library, by family and name."""

    fmt: dict
    alg: dict
    prop: dict
    dt: dict
    scratchpad: dict
    engine: dict


def derive(lib: ctypes.CDLL) -> Enums:
    """The values of every name in NAMES, found through the library; LookupError if any lacks."""
    found = {}
    for fn_name, names in NAMES.items():
        fn = getattr(lib, fn_name)
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_char_p
        wanted, values = set(names), {}
        for value in _SEARCH:
            text = fn(value)
            name = text.decode() if text else ""
            if name in wanted and name not in values:
                values[name] = value
                if len(values) == len(wanted):
                    break
        missing = wanted - set(values)
        if missing:
            raise LookupError(f"{fn_name} knows no value for {sorted(missing)}")
        found[fn_name] = values
    return Enums(found["dnnl_fmt_tag2str"], found["dnnl_alg_kind2str"],
                 found["dnnl_prop_kind2str"], found["dnnl_dt2str"],
                 found["dnnl_scratchpad_mode2str"], found["dnnl_engine_kind2str"])
