"""Errors that device kernels find (an out-of-range label), reported at the next host sync.

Checking a label on the host would stall the device once per op and run: the check would wait
for every queued kernel. Instead a kernel that meets a bad value writes [1, value, slot] into
a small flag buffer on the device (plain stores: any writer's value will do), and the backend
reads the flag where it synchronizes anyway: when a blob is fetched (`to_host`) and in
`synchronize`. The error then names the op and the value, one fetch later than on the CPU,
and the flag is cleared. Reading the flag is not a blob transfer and is not counted as one.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from netrun.errors import NetrunError


class DeviceChecks:
    """The flag buffer of one backend and the messages of the checks that write it."""

    def __init__(self, backend: Any):
        self.backend = backend
        self._flag = None                       # int64 (3,) on the device: [set, value, slot]
        self._slots: dict[Any, int] = {}
        self._messages: list[Callable[[int], str]] = []
        self.pending = False                    # a check ran since the flag was last read

    def flag(self, key: Any, message: Callable[[int], str]) -> tuple[Any, np.int32]:
        """(flag buffer, slot) for a check; message(value) is the error text if it fires.

        Call once per kernel run: it marks the flag for reading at the next sync point.
        """
        if self._flag is None:
            self._flag = self.backend.xp.zeros((3,), dtype="int64")
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = len(self._messages)
            self._messages.append(message)
        self.pending = True
        return self._flag, np.int32(slot)

    def check(self) -> None:
        """Raise the error a kernel flagged since the last check (the device must be idle)."""
        if not self.pending:
            return
        self.pending = False
        host = self._flag.get()    # a 24-byte read where the caller has synchronized already
        if host[0]:
            self._flag.fill(0)
            raise NetrunError(self._messages[int(host[2])](int(host[1])))
