"""oneDNN's C API through ctypes: prototypes, status checks and the objects netrun holds.

Handles are opaque pointers (in oneDNN 3.x a memory descriptor is one too); every object
netrun creates is destroyed by a weakref finalizer when its Python owner goes, so a
primitive cached for a problem lives as long as the cache holds it. Calls release the GIL
(ctypes does), so netrun's worker threads run primitives side by side.
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Sequence
from ctypes import (
    POINTER,
    byref,
    c_char_p,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint,
    c_void_p,
)
from functools import partial

from netrun.errors import InternalError
from netrun.kernels.onednn import enums, library

MAX_DIMS = 12
Dims = c_int64 * MAX_DIMS
_P = POINTER(c_void_p)
_D = POINTER(c_int64)


class ExecArg(ctypes.Structure):
    """dnnl_exec_arg_t: an argument index and a memory object."""

    _fields_ = [("arg", c_int), ("memory", c_void_p)]


_PROTOTYPES = {   # name -> argument types (every function returns a dnnl_status_t unless below)
    "dnnl_engine_create": [_P, c_int, c_size_t],
    "dnnl_engine_destroy": [c_void_p],
    "dnnl_stream_create": [_P, c_void_p, c_uint],
    "dnnl_stream_destroy": [c_void_p],
    "dnnl_memory_desc_create_with_tag": [_P, c_int, _D, c_int, c_int],
    "dnnl_memory_desc_create_with_strides": [_P, c_int, _D, c_int, _D],
    "dnnl_memory_desc_clone": [_P, c_void_p],
    "dnnl_memory_desc_destroy": [c_void_p],
    "dnnl_memory_create": [_P, c_void_p, c_void_p, c_void_p],
    "dnnl_memory_destroy": [c_void_p],
    "dnnl_memory_set_data_handle": [c_void_p, c_void_p],
    "dnnl_primitive_attr_create": [_P],
    "dnnl_primitive_attr_destroy": [c_void_p],
    "dnnl_primitive_attr_set_scratchpad_mode": [c_void_p, c_int],
    "dnnl_primitive_attr_set_post_ops": [c_void_p, c_void_p],
    "dnnl_post_ops_create": [_P],
    "dnnl_post_ops_destroy": [c_void_p],
    "dnnl_post_ops_append_eltwise": [c_void_p, c_int, c_float, c_float],
    "dnnl_post_ops_append_sum": [c_void_p, c_float, c_int32, c_int],
    "dnnl_convolution_forward_primitive_desc_create":
        [_P, c_void_p, c_int, c_int, c_void_p, c_void_p, c_void_p, c_void_p, _D, _D, _D, _D,
         c_void_p],
    "dnnl_convolution_backward_data_primitive_desc_create":
        [_P, c_void_p, c_int, c_void_p, c_void_p, c_void_p, _D, _D, _D, _D, c_void_p, c_void_p],
    "dnnl_convolution_backward_weights_primitive_desc_create":
        [_P, c_void_p, c_int, c_void_p, c_void_p, c_void_p, c_void_p, _D, _D, _D, _D, c_void_p,
         c_void_p],
    "dnnl_reorder_primitive_desc_create": [_P, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p],
    "dnnl_primitive_desc_query": [c_void_p, c_int, c_int, c_void_p],
    "dnnl_primitive_desc_destroy": [c_void_p],
    "dnnl_primitive_create": [_P, c_void_p],
    "dnnl_primitive_destroy": [c_void_p],
    "dnnl_primitive_execute": [c_void_p, c_void_p, c_int, POINTER(ExecArg)],
}
_RETURNS = {   # functions that return something other than a status
    "dnnl_memory_desc_get_size": ([c_void_p], c_size_t),
    "dnnl_memory_desc_equal": ([c_void_p, c_void_p], c_int),
    "dnnl_primitive_desc_query_md": ([c_void_p, c_int, c_int], c_void_p),
    "dnnl_status2str": ([c_int], c_char_p),
}


class OneDNNError(InternalError):
    """A oneDNN call that failed on arguments netrun built (a bug, not the user's input)."""


class Version(ctypes.Structure):
    """dnnl_version_t."""

    _fields_ = [("major", c_int), ("minor", c_int), ("patch", c_int), ("hash", c_char_p),
                ("cpu_runtime", c_uint), ("gpu_runtime", c_uint)]


MAJOR = 3   # the C API (argument indices, query kinds, signatures) netrun is written against


class Library:
    """The loaded library: typed functions, enum values, the CPU engine (one per process)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.dnnl_version.argtypes, lib.dnnl_version.restype = [], POINTER(Version)
        v = lib.dnnl_version().contents
        self.version = f"{v.major}.{v.minor}.{v.patch}"
        if v.major != MAJOR:
            raise LookupError(f"oneDNN {self.version} is installed; netrun needs {MAJOR}.x "
                              f"({library.INSTALL_HINT})")
        for name, argtypes in _PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, c_int
        for name, (argtypes, restype) in _RETURNS.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype
        self.enums = enums.derive(lib)
        self.f32 = self.enums.dt["f32"]
        # the one status netrun handles rather than reports: no kernel for this problem
        self.unimplemented = next(s for s in range(16)
                                  if lib.dnnl_status2str(s) == b"unimplemented")
        self.engine = c_void_p()
        self.check(lib.dnnl_engine_create(byref(self.engine), self.enums.engine["cpu"], 0),
                   "dnnl_engine_create")
        # streams are per thread: netrun's workers execute primitives at the same time
        self._streams = threading.local()

    def check(self, status: int, what: str) -> None:
        """Raise OneDNNError naming the call and oneDNN's status when it failed."""
        if status != 0:
            text = self.lib.dnnl_status2str(status)
            raise OneDNNError(f"oneDNN {what} failed: {text.decode() if text else status}")

    def stream(self) -> c_void_p:
        """This thread's stream on the CPU engine."""
        s = getattr(self._streams, "stream", None)
        if s is None:
            s = c_void_p()
            self.check(self.lib.dnnl_stream_create(byref(s), self.engine, 1), "stream_create")
            self._streams.stream = s
            weakref.finalize(self._streams, self.lib.dnnl_stream_destroy, s)
        return s

    def streams(self, count: int) -> list[int]:
        """`count` streams of this thread, one per slot of an OpenMP team running batch
        chunks side by side (netrun.kernels.onednn.team), as addresses."""
        found = getattr(self._streams, "team", None)
        if found is None:
            found = self._streams.team = []
            destroy = self.lib.dnnl_stream_destroy
            weakref.finalize(self._streams, lambda: [destroy(s) for s in found])
        while len(found) < count:
            s = c_void_p()
            self.check(self.lib.dnnl_stream_create(byref(s), self.engine, 1), "stream_create")
            found.append(s.value)
        return found[:count]


def dims(values: Sequence[int]) -> Dims:
    """A dnnl_dims_t holding `values`."""
    return Dims(*[int(v) for v in values])


class MemoryDesc:
    """A memory descriptor netrun owns (destroyed with this object)."""

    def __init__(self, lib: Library, handle: c_void_p):
        self.lib, self.handle = lib, handle
        self.size = int(lib.lib.dnnl_memory_desc_get_size(handle))   # bytes
        weakref.finalize(self, lib.lib.dnnl_memory_desc_destroy, handle)

    @classmethod
    def tagged(cls, lib: Library, shape: Sequence[int], tag: str) -> MemoryDesc:
        """float32 memory of `shape` in the layout named `tag` ('any', 'abcd', ...)."""
        h = c_void_p()
        lib.check(lib.lib.dnnl_memory_desc_create_with_tag(
            byref(h), len(shape), dims(shape), lib.f32, lib.enums.fmt[tag]),
            f"memory_desc_create_with_tag({list(shape)}, {tag})")
        return cls(lib, h)

    @classmethod
    def copy_of(cls, lib: Library, handle: int) -> MemoryDesc:
        """An owned clone of a descriptor another object owns (a primitive descriptor's)."""
        h = c_void_p()
        lib.check(lib.lib.dnnl_memory_desc_clone(byref(h), handle), "memory_desc_clone")
        return cls(lib, h)

    def __eq__(self, other) -> bool:
        return (isinstance(other, MemoryDesc)
                and bool(self.lib.lib.dnnl_memory_desc_equal(self.handle, other.handle)))

    __hash__ = None   # compared by layout, never used as a key


class Attr:
    """Primitive attributes: user-managed scratchpad, optionally post-ops: with `accumulate`
    the destination's contents before the call added to the result (a sum post-op), then a
    ReLU."""

    def __init__(self, lib: Library, relu: bool = False, accumulate: bool = False):
        self.lib, self.handle = lib, c_void_p()
        f = lib.lib
        lib.check(f.dnnl_primitive_attr_create(byref(self.handle)), "primitive_attr_create")
        weakref.finalize(self, f.dnnl_primitive_attr_destroy, self.handle)
        lib.check(f.dnnl_primitive_attr_set_scratchpad_mode(
            self.handle, lib.enums.scratchpad["user"]), "set_scratchpad_mode")
        if relu or accumulate:
            ops = c_void_p()
            lib.check(f.dnnl_post_ops_create(byref(ops)), "post_ops_create")
            try:
                if accumulate:   # dst = 1.0 × dst before + the result (data type: dst's)
                    lib.check(f.dnnl_post_ops_append_sum(ops, 1.0, 0, lib.enums.dt["undef"]),
                              "append_sum")
                if relu:
                    lib.check(f.dnnl_post_ops_append_eltwise(
                        ops, lib.enums.alg["eltwise_relu"], 0.0, 0.0), "append_eltwise")
                lib.check(f.dnnl_primitive_attr_set_post_ops(self.handle, ops), "set_post_ops")
            finally:
                f.dnnl_post_ops_destroy(ops)   # the attribute keeps its own copy


class Primitive:
    """A primitive and its descriptor: the memory layouts it chose and its scratchpad size.

    Executing wraps each (layout, address) in a oneDNN memory object; creating and destroying
    them cost more than a small layer's convolution, so each thread keeps the memory objects
    of its last BOUND argument sets (a net's buffers do not move between iterations).
    """

    BOUND = 16

    def __init__(self, lib: Library, pd: c_void_p, what: str):
        self.lib, self.pd, self.handle = lib, pd, c_void_p()
        f = lib.lib
        self._memories: set[int] = set()    # every live memory object of every thread
        self._bound = threading.local()
        self._lock = threading.Lock()
        weakref.finalize(self, _destroy_primitive, f, pd, self.handle, self._memories)
        lib.check(f.dnnl_primitive_create(byref(self.handle), pd), f"primitive_create ({what})")
        self.scratch_md = self.md("scratchpad_md")
        self.scratch_bytes = self.scratch_md.size if self.scratch_md is not None else 0
        name = c_char_p()
        f.dnnl_primitive_desc_query(pd, enums.QUERY["impl_info_str"], 0, byref(name))
        self.impl = name.value.decode() if name.value else "?"

    def md(self, query: str) -> MemoryDesc | None:
        """The layout the primitive chose for one of its arguments (None: it has none)."""
        handle = self.lib.lib.dnnl_primitive_desc_query_md(self.pd, enums.QUERY[query], 0)
        if not handle:
            return None
        desc = MemoryDesc.copy_of(self.lib, handle)
        return desc if desc.size else None

    def execute(self, args: Sequence[tuple[int, MemoryDesc, int]]) -> None:
        """Run on this thread's stream with (argument index, layout, data pointer) triples."""
        packed = self.bound(args)
        f = self.lib.lib
        self.lib.check(f.dnnl_primitive_execute(self.handle, self.lib.stream(), len(args),
                                                packed), f"primitive_execute ({self.impl})")

    def bound(self, args: Sequence[tuple[int, MemoryDesc, int]]):
        """The packed dnnl_exec_arg_t array for these (index, layout, pointer) triples, its
        memory objects kept by this thread's last BOUND argument sets (the most recent are
        never the ones released)."""
        bound = getattr(self._bound, "sets", None)
        if bound is None:
            bound = self._bound.sets = {}
        # the layouts' ids are safe in the key: the entry holds the layouts themselves
        key = tuple((index, id(desc), pointer) for index, desc, pointer in args)
        entry = bound.pop(key, None)
        if entry is None:
            entry = self._bind(args)
            if len(bound) >= self.BOUND:
                self._release(bound.pop(next(iter(bound))))
        bound[key] = entry   # most recent last
        return entry[0]

    def bound_once(self, args: Sequence[tuple[int, MemoryDesc, int]]):
        """(packed array, release): `bound` for a call that needs more of this primitive's
        argument sets alive at once than BOUND keeps (a team call over many batch chunks);
        release() destroys their memory objects after the call."""
        entry = self._bind(args)
        return entry[0], partial(self._release, entry)

    def _bind(self, args) -> tuple:
        """(packed dnnl_exec_arg_t array, memory handles, layouts) for one argument set."""
        lib, f = self.lib, self.lib.lib
        mems = []
        try:
            for _, desc, pointer in args:
                m = c_void_p()
                lib.check(f.dnnl_memory_create(byref(m), desc.handle, lib.engine,
                                               c_void_p(pointer)), "memory_create")
                mems.append(m.value)
        except BaseException:
            for m in mems:
                f.dnnl_memory_destroy(m)
            raise
        with self._lock:
            self._memories.update(mems)
        packed = (ExecArg * len(args))(*[ExecArg(a[0], m) for a, m in zip(args, mems)])
        return packed, mems, [a[1] for a in args]

    def _release(self, entry: tuple) -> None:
        with self._lock:
            for m in entry[1]:
                self._memories.discard(m)
                self.lib.lib.dnnl_memory_destroy(m)


def _destroy_primitive(f, pd: c_void_p, handle: c_void_p, memories: set[int]) -> None:
    for m in memories:
        f.dnnl_memory_destroy(m)
    memories.clear()
    if handle:
        f.dnnl_primitive_destroy(handle)
    f.dnnl_primitive_desc_destroy(pd)


def create_pd(lib: Library, fn_name: str, *args, what: str = "") -> c_void_p | None:
    """A primitive descriptor from `fn_name`(…); None when oneDNN has no implementation."""
    pd = c_void_p()
    status = getattr(lib.lib, fn_name)(byref(pd), *args)
    if status == lib.unimplemented:   # no kernel for this problem on this CPU
        return None
    lib.check(status, what or fn_name)
    return pd


_LIBRARY: dict[str, Library] = {}
_LOCK = threading.Lock()


def get() -> Library | None:
    """The process's Library (engine and prototypes set up once), or None without oneDNN."""
    lib = library.load()
    if lib is None:
        return None
    if "lib" not in _LIBRARY:
        with _LOCK:
            if "lib" not in _LIBRARY:
                _LIBRARY["lib"] = Library(lib)
    return _LIBRARY["lib"]
