"""The CPU backend on NumPy, and the host memory blocks that workspace arenas carve."""
from __future__ import annotations

import copy
import mmap
import platform
import sys
from typing import Any

import numpy as np

from netrun.backends.base import Backend

HUGE_PAGE = 2 << 20         # x86-64 transparent huge page
PAGE = 4096
MADV_POPULATE_WRITE = 23    # Linux 5.14+: fault the range in now, writable (not in Python 3.11)
# Linux: address space without swap reserved up front (other systems: a plain mapping)
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class HostBlock(mmap.mmap):
    """Anonymous host memory for a workspace arena (netrun.core.memory).

    Arrays made on it with np.ndarray(..., buffer=block) have the block as their base, which
    is how the backend tells a workspace-owned buffer from a view of another array; the
    mapping is returned to the OS when the last such array is gone.
    """

    def populate(self, nbytes: int | None = None) -> None:
        """Fault the first nbytes (default: all) in now, writable, in huge pages if it can.

        Faulted in bulk ahead of use, 2 MiB pages cost one fault (and one TLB entry) each
        instead of 512; MADV_POPULATE_WRITE does it in one call where the kernel has it.
        """
        length = len(self) if nbytes is None else min(len(self), -(-nbytes // PAGE) * PAGE)
        if length <= 0:
            return
        if length >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self.madvise(mmap.MADV_HUGEPAGE, 0, min(len(self), -(-length // HUGE_PAGE)
                                                        * HUGE_PAGE))
            except OSError:
                pass
        try:
            self.madvise(MADV_POPULATE_WRITE, 0, length)
            return
        except (OSError, ValueError):
            pass
        # Older kernels: one write per 4 KiB page does the same (zeros, as the pages are).
        pages = np.ndarray((length // PAGE,), np.uint8, buffer=self, strides=(PAGE,))
        pages[...] = 0
        del pages


def host_block(nbytes: int, populate: bool = False, reserve: bool = False) -> HostBlock:
    """A fresh anonymous mapping of at least nbytes (whole pages; whole huge pages from 2 MiB).

    `populate` faults it all in now, in huge pages (a planning step, so that a net's first
    iteration does not pay the faults). `reserve` asks for address space only
    (MAP_NORESERVE): pages cost memory once touched, so a large reservation holds what its
    users touch. Memory touched on demand stays in 4 KiB pages: those come from the kernel's
    free lists, while a huge page needs a free 2 MiB block, which a VM with free page
    reporting (ours) has handed back to its host. Huge pages fault in faster per byte on a
    quiet host but far slower on a busy one (measurements: benchmarks/README.md).
    """
    size = max(PAGE, -(-int(nbytes) // PAGE) * PAGE)
    if size >= HUGE_PAGE:
        size = -(-size // HUGE_PAGE) * HUGE_PAGE   # whole huge pages: the kernel aligns those
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (MAP_NORESERVE if reserve else 0)
    block = HostBlock(-1, size, flags=flags)
    if populate:
        block.populate()
    return block


class CPUBackend(Backend):
    """Host memory, NumPy kernels; synchronize is a no-op."""

    name = "cpu"
    xp = np
    host_memory = hasattr(mmap, "MAP_ANONYMOUS")   # POSIX: workspace arenas on mmap blocks

    def __init__(self):
        self._model = _cpu_model()
        self._memory: Any = None

    @property
    def device(self) -> str:
        return "cpu"

    @property
    def device_name(self) -> str:
        return self._model

    def bind(self, memory: Any) -> "CPUBackend":
        """A copy of this backend whose `empty` draws on `memory` (a workspace's
        netrun.core.memory.WorkspaceMemory) before falling back to NumPy's allocator."""
        _ = self.transfers   # created now, so that the copy shares the counters
        bound = copy.copy(self)
        bound._memory = memory
        return bound

    def empty(self, shape, dtype) -> np.ndarray:
        if self._memory is not None:
            buf = self._memory.output_buffer(shape, dtype)
            if buf is not None:
                return buf
        return np.empty(shape, dtype=dtype)

    def new_block(self, nbytes: int, populate: bool = False, reserve: bool = False) -> HostBlock:
        return host_block(nbytes, populate, reserve)

    @property
    def plans_activations(self) -> bool:
        return self.host_memory

    def arena_bytes(self, nbytes: int) -> np.ndarray:
        # Faulted in now (in huge pages where the host has them): at bind, not in a run.
        block = host_block(nbytes, populate=True)
        return np.ndarray((len(block),), np.uint8, buffer=block)

    def owns_data(self, array: Any) -> bool:
        # A buffer carved from a workspace block is not a view of another array.
        base = array.base
        return base is None or isinstance(base, HostBlock)

    def to_device(self, array: Any) -> np.ndarray:
        return np.array(array, copy=True, order="C")

    def to_host(self, array: Any) -> np.ndarray:
        return np.array(array, copy=True)

    def new_rng(self, seed: int | None) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(seed))
