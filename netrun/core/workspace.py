"""The Workspace: blobs by name on one backend, the nets bound to them, and the RNGs."""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from netrun.backends import get_backend
from netrun.conv.state import ConvState
from netrun.core.comm import Communicator, SingleProcess
from netrun.core.dag import EXECUTORS, DagNet, make_net
from netrun.core.memory import WorkspaceMemory
from netrun.core.net import SimpleNet
from netrun.core.operator import Operator
from netrun.errors import NetrunError, suggest
from netrun.kernels import parallel
from netrun.proto.defs import NetDef, OperatorDef


class Workspace:
    """Owns every blob and buffer; nets and operators only borrow them."""

    def __init__(self, device: str = "cpu", seed: int | None = None, memory_plan: bool = False,
                 plan_debug: bool | None = None, executor: str = "simple",
                 comm: Communicator | None = None):
        shared = get_backend(device)
        # The other processes of a data-parallel job (collective ops use it); one: itself.
        self.comm: Communicator = comm if comm is not None else SingleProcess()
        # Collectives started and not yet waited for: bucket name -> (request, buffer).
        self.collectives: dict[str, tuple] = {}
        # How create_net runs nets by default: 'simple' (in order) or 'dag' (netrun.core.dag).
        self.executor = check_executor(executor)
        # Output buffers and scratch: planned per net, carved from this workspace's blocks.
        # memory_plan: activations share memory by lifetime (netrun.core.lifetimes);
        # plan_debug (default: env NETRUN_PLAN_DEBUG=1): a value's memory is filled with
        # NaN when it dies, so that a planning mistake shows in the results.
        if plan_debug is None:
            plan_debug = os.environ.get("NETRUN_PLAN_DEBUG", "") not in ("", "0")
        self.memory = WorkspaceMemory(shared, plan=memory_plan, debug=plan_debug)
        self.backend = shared.bind(self.memory)
        # GPU: make the device and its stream current for this thread (sticky; CPU: no-op).
        self.backend.activate()
        self._blobs: dict[str, Any] = {}
        # Writes per blob (feeds, op outputs, touch): what lets an op keep something derived
        # from a blob (a reordered copy of its filters) while the blob stays the same.
        self._versions: dict[str, int] = {}
        self._nets: dict[str, SimpleNet] = {}
        # How conv ops pick algorithms here, and what they picked (netrun.conv.configure).
        self.conv = ConvState()
        self.seed(seed)

    @property
    def device(self) -> str:
        return self.backend.device

    def seed(self, seed: int | None) -> None:
        """Reseed the host and device generators (None: from OS entropy)."""
        self.host_rng = np.random.Generator(np.random.PCG64(seed))
        self.rng = self.backend.new_rng(seed)

    # Blobs -----------------------------------------------------------------------------
    def feed_blob(self, name: str, value: Any, dtype: Any = None) -> None:
        """Copy a host array (or scalar) into blob `name` on this workspace's device."""
        host = np.asarray(value, dtype=dtype)
        self.backend.activate()
        self._blobs[name] = self.backend.to_device(host)
        self.touch(name)
        self.memory.fed(name, self._blobs, self)   # plans bound nets waiting for this shape

    def refill_blob(self, name: str, value: Any) -> None:
        """`feed_blob`, but into the blob's own array where it is a host array of the same
        shape and dtype: a loop feeding batch after batch keeps the array, so an op that
        bound its calls to it (netrun.core.operator, `repeat_with`) goes on repeating them."""
        host = np.asarray(value)
        existing = self._blobs.get(name)
        # on a device the copy is a transfer, which feed_blob makes and counts
        if (self.backend.name == "cpu" and isinstance(existing, np.ndarray)
                and existing.shape == host.shape
                and existing.dtype == host.dtype and existing.flags.writeable
                and self.backend.owns_data(existing)):
            np.copyto(existing, host)
            self.touch(name)
            return
        self.feed_blob(name, host)

    def fetch_blob(self, name: str) -> np.ndarray:
        """The blob's value as a host NumPy array (a copy)."""
        if name not in self._blobs:
            raise NetrunError(f"blob '{name}' does not exist{suggest(name, self._blobs)}")
        self.backend.activate()
        return self.backend.to_host(self._blobs[name])

    def has_blob(self, name: str) -> bool:
        return name in self._blobs

    def blobs(self) -> list[str]:
        """Names of all blobs, sorted."""
        return sorted(self._blobs)

    def remove_blob(self, name: str) -> None:
        self._blobs.pop(name, None)
        self.touch(name)

    def version(self, name: str) -> int:
        """A number that changes whenever blob `name` is written (fed, an op's output, or
        `touch`): equal readings mean the same values."""
        return self._versions.get(name, 0)

    def touch(self, name: str) -> None:
        """Record a write into blob `name` made in place outside ops and feeds (code that
        writes through `get_blob` must call this, or ops may use what they derived from the
        old values)."""
        self._versions[name] = self._versions.get(name, 0) + 1

    def get_blob(self, name: str) -> Any:
        """The blob's array on the device, not copied (for code that stays on the device;
        after writing into it, call `touch`)."""
        return self._blobs[name]

    def scratch(self, key: str, shape, dtype="float32") -> Any:
        """A scratch buffer of the given shape for `key`, its contents undefined.

        Inside a net's run it is valid until the operator asking for it returns: the next
        operator may get the same memory under any key. Within one operator, asking again for
        a key (and dtype) gives the same memory if it still fits. Outside net runs a key keeps
        its buffer, shared by everyone asking for it.
        """
        return self.memory.scratch(key, shape, dtype)

    # Operators and nets ----------------------------------------------------------------
    def run_operator_once(self, op: OperatorDef) -> None:
        """Validate, create and run one operator."""
        self.backend.activate()
        bound = Operator(op, self)
        self.memory.begin_op()
        try:
            bound.run()
        finally:
            self.memory.end_run()

    def create_net(self, net: NetDef, overwrite: bool = True, keep=(),
                   executor: str | None = None) -> SimpleNet:
        """Bind a NetDef to this workspace under its name (validating every op), run by
        `executor` ('simple' or 'dag'; None: the workspace's).

        With memory planning, blobs that live only inside one run of the net share memory:
        read them after the run only if named in `keep` (or the net's external outputs).
        """
        if net.name in self._nets and not overwrite:
            raise NetrunError(f"net '{net.name}' already exists in this workspace")
        bound = make_net(net, self, check_executor(executor or self.executor))
        old = self._nets.get(net.name)
        if isinstance(old, DagNet):
            old.close()
        self._nets[net.name] = bound
        # Memory planning: the buffers of the first run, faulted in now (or once fed).
        self.memory.plan(net, self._blobs, self, tuple(keep))
        if self.backend.xp is np:   # the CPU kernels' worker threads start now, not in a run
            parallel.start()
        return bound

    def run_net(self, name: str, iterations: int = 1) -> None:
        """Run a net created earlier with create_net."""
        net = self._nets.get(name)
        if net is None:
            raise NetrunError(f"net '{name}' was not created in this workspace{suggest(name, self._nets)}")
        self.backend.activate()
        for _ in range(iterations):
            net.run()

    def run_net_once(self, net: NetDef) -> None:
        """Create and run a net once without keeping it (init nets); its outputs must fit
        the memory budget (netrun.core.budget) before any is allocated."""
        self.backend.activate()
        bound = SimpleNet(net, self)
        self.memory.check_run(net, self._blobs)
        bound.run()

    def nets(self) -> list[str]:
        """Names of the nets created in this workspace, sorted."""
        return sorted(self._nets)


def check_executor(executor: str) -> str:
    """`executor` if it names one, else a NetrunError listing them."""
    if executor not in EXECUTORS:
        raise NetrunError(f"unknown executor '{executor}' (choose from: {', '.join(EXECUTORS)})")
    return executor
