"""Operator instances: an OperatorDef bound to a workspace, its schema and a kernel."""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

from netrun.core.registry import find_kernel, find_preparer, kernel_backends
from netrun.core.schema import Args, TensorSpec, get_schema
from netrun.errors import InternalError, NetrunError, SchemaError, ShapeError
from netrun.proto.defs import OperatorDef

if TYPE_CHECKING:
    from netrun.core.workspace import Workspace


class OpContext:
    """What a kernel sees besides its inputs: args, array module, output buffers, RNG, state."""

    __slots__ = ("def_", "args", "ws", "backend", "xp", "state", "_inputs", "_outputs",
                 "_is_array", "_owns_data", "_planned", "_scratch", "_rng_ok", "_again")

    def __init__(self, def_: OperatorDef, args: Args, ws: "Workspace"):
        self.def_ = def_
        self.args = args
        self.ws = ws
        self.backend = ws.backend
        self.xp = ws.backend.xp
        # Per-operator memory across runs (a chosen algorithm, a cached index table).
        self.state: dict[str, Any] = {}
        self._inputs: tuple = ()
        # Resolved once: `output` runs for every output of every op of every iteration.
        self._outputs = def_.outputs
        self._is_array = ws.backend.is_array
        self._owns_data = ws.backend.owns_data
        # The memory plan's view for each output (None: not planned), or None for no plan.
        self._planned: tuple | None = None
        # The scratch arena of the graph executor's worker running this op (None: the
        # workspace's): chunk threads ask through this context, not their own thread.
        self._scratch = None
        # False where a graph executor runs this op unordered with other random draws
        # (netrun.core.dag.RANDOM_OPS does not name its type): drawing would then depend on
        # which op ran first, so it fails loudly instead.
        self._rng_ok = True
        # What this run's kernel offered to repeat (`repeat_with`), taken by Operator.run.
        self._again: tuple | None = None

    def repeat_with(self, bound: Any, check: Any = None, unchanged: tuple[str, ...] = ()) -> None:
        """This run's work, done again by bound.run() alone, is the whole of the next run
        while its inputs and outputs are the same array objects, the inputs named in
        `unchanged` have not been written, and check() (if given) holds: a kernel's calls
        bound once (netrun.kernels.onednn.conv.BoundCall) skip its Python. bound.close()
        releases what it holds when it is dropped."""
        self._again = (bound, check, unchanged)

    @property
    def rng(self):
        """The workspace's device random generator (seeded; saved in checkpoints)."""
        if not self._rng_ok:
            raise _unordered_draw(self.def_)
        return self.ws.rng

    @property
    def host_rng(self):
        """The workspace's host NumPy generator: fillers use it so CPU and GPU init agree."""
        if not self._rng_ok:
            raise _unordered_draw(self.def_)
        return self.ws.host_rng

    def output(self, i: int, shape, dtype="float32") -> Any:
        """A buffer for output i: its planned view in the workspace's activation arena, or
        the previous run's buffer when shape and dtype still fit."""
        name = self._outputs[i]
        versions = self.ws._versions
        versions[name] = versions.get(name, 0) + 1
        if type(shape) is not tuple:
            shape = tuple(int(d) for d in shape)
        planned = self._planned
        if planned is not None:
            view = planned[i]
            if view is not None and view.shape == shape and view.dtype == dtype:
                # Stored on every run: another net may have left its own view under the name.
                self.ws._blobs[name] = view
                return view
        existing = self.ws._blobs.get(name)
        # The steady state: last run's buffer fits (a tuple of NumPy ints compares equal too).
        if (existing is not None and self._is_array(existing)
                and existing.shape == shape and existing.dtype == dtype
                and self._owns_data(existing)):
            return existing
        shape = tuple(int(d) for d in shape)
        buf = self.backend.empty(shape, dtype)
        self.ws._blobs[name] = buf
        return buf

    def scratch(self, key: str, shape, dtype="float32") -> Any:
        """Workspace-owned scratch memory shared by ops that never run at the same time."""
        arena = self._scratch
        if arena is not None:
            return arena.get(key, shape, dtype)
        return self.ws.scratch(key, shape, dtype)

    def scratch_mark(self) -> Any:
        """Equal while this op's scratch regions stay where they are (netrun.core.memory
        ScratchArena.mark); None: no such promise."""
        arena = self._scratch
        if arena is not None:
            return arena.mark()
        return self.ws.memory.scratch_mark()


class Operator:
    """A validated, runnable operator (Caffe2's OperatorBase)."""

    def __init__(self, def_: OperatorDef, ws: "Workspace"):
        schema = get_schema(def_.type)
        self.def_ = def_
        self.schema = schema
        self.args = schema.verify(def_)
        self.kernel = find_kernel(def_.type, ws.backend.name)
        if self.kernel is None:
            have = ", ".join(kernel_backends(def_.type)) or "none"
            raise SchemaError(f"op {def_.label}: no kernel for backend '{ws.backend.name}' "
                              f"(kernels exist for: {have})")
        self.ws = ws
        self.ctx = OpContext(def_, self.args, ws)
        # Bound once, so that a run looks its inputs up in one C call (batch-1 inference is
        # per-op overhead): itemgetter of two or more names returns a tuple, of one a value.
        names = def_.inputs
        self._fetch = (operator.itemgetter(*names) if len(names) > 1
                       else (lambda blobs, n=names[0]: (blobs[n],)) if names
                       else (lambda blobs: ()))
        prepare = find_preparer(def_.type)
        if prepare is not None:
            prepare(self.ctx)
        self.attach_plan(None, (), None, ())
        # Bytes of the activation arena that the plan set aside for this op's scratch
        # (netrun.core.memory.ScratchArena carves from them first), or None.
        self.scratch_room = None
        self._repeat: _Repeat | None = None

    def attach_plan(self, planned: tuple | None, views: tuple, arena, poison: tuple) -> None:
        """Take the memory plan's output views (netrun.core.activations.attach)."""
        self.ctx._planned = planned
        self._views = views          # outputs the plan expects as views of an input
        self._arena = arena
        self.poison = poison         # regions whose value dies here (debug mode)

    @property
    def repeat(self) -> "_Repeat | None":
        """What the kernel's last run offered to repeat (OpContext.repeat_with), or None."""
        return self._repeat

    def run(self) -> bool:
        """Read the inputs from the workspace, run the kernel, store the outputs; or repeat
        the calls the kernel bound last time, while they still compute this run. True: it
        repeated them."""
        ws, def_ = self.ws, self.def_
        blobs = ws._blobs
        repeat = self._repeat
        if repeat is not None:
            if repeat.holds(blobs, ws._versions):
                repeat.run(ws._versions)
                return True
            self._drop_repeat()
        self.ctx._again = None
        try:
            inputs = self._fetch(blobs)
        except KeyError:
            missing = [n for n in def_.inputs if n not in blobs]
            raise NetrunError(f"op {def_.label}: input blob '{missing[0]}' does not exist in the "
                              f"workspace (feed it, or run the init net first)") from None
        self.ctx._inputs = inputs
        try:
            result = self.kernel(self.ctx, *inputs)
        # OSError: the file system's answer to an I/O op (disk full, read-only), not a bug.
        except (NetrunError, MemoryError, OSError):
            raise
        except Exception as e:
            raise self._diagnose(inputs, e) from e
        again = self.ctx._again
        if again is not None:
            self.ctx._again = None
            if result is None:
                self._repeat = _Repeat(def_, inputs, blobs, ws._versions, *again)
            else:   # outputs stored below are not the buffers the calls were bound to
                again[0].close()
        if result is None:
            return False
        if not isinstance(result, (tuple, list)):
            result = (result,)
        xp = ws.backend.xp
        for i, value in enumerate(result):
            if value is None:
                continue
            name = def_.outputs[i]
            if not ws.backend.is_array(value):
                value = xp.asarray(value)
            # An output that is one of the inputs' arrays under another name is stored as a
            # view, so a later in-place write to this blob cannot reach the input.
            for n, x in zip(def_.inputs, inputs):
                if value is x and n != name:
                    value = value.view()
                    break
            if self._arena is not None:
                value = self._settle(i, value)
            blobs[name] = value
            ws.touch(name)
        return False

    def deferred(self) -> tuple[Any, Any] | None:
        """This run as (runner, item) for the net to make later, where it repeats bound calls
        that offer it (`defer`): runner(items) makes the calls of consecutive ops with the same
        runner in order, in one native loop (netrun.core.net). The checks run and the outputs'
        write counts move now. None: the op runs itself (`run`)."""
        repeat = self._repeat
        if repeat is None or repeat.defer is None:
            return None
        ws = self.ws
        if not repeat.holds(ws._blobs, ws._versions):
            return None
        item = repeat.defer()
        repeat.count(ws._versions)
        return item

    def _drop_repeat(self) -> None:
        repeat, self._repeat = self._repeat, None
        if repeat is not None:
            repeat.bound.close()

    def _settle(self, i: int, value: Any) -> Any:
        """A returned output the plan did not foresee in the arena (a view of an input in
        it) is copied out: its source's memory is another value's once the source dies."""
        planned = self.ctx._planned[i]
        if (value is planned or (i < len(self._views) and self._views[i])
                or not self.ws.backend.is_array(value)
                or not self.ws.backend.xp.may_share_memory(value, self._arena.array)):
            return value
        if planned is not None and planned.shape == value.shape and planned.dtype == value.dtype:
            planned[...] = value
            return planned
        return value.copy()


    def _diagnose(self, inputs: tuple, error: Exception) -> Exception:
        """What a kernel's unexpected exception means: inputs that the schema rejects (the
        user's ShapeError or SchemaError), else a bug in netrun (InternalError)."""
        def_ = self.def_
        shapes = ", ".join(f"{n} {_shape_str(x)}" for n, x in zip(def_.inputs, inputs))
        specs = [TensorSpec(tuple(x.shape), str(x.dtype)) if hasattr(x, "shape") else None
                 for x in inputs]
        if self.schema.shape_fn is not None and None not in specs:
            try:
                self.schema.infer_shapes(def_, self.args, specs)
            except (ShapeError, SchemaError) as e:
                return type(e)(f"op {def_.label}: inputs {shapes} do not fit: {e}")
            except Exception:   # shape inference itself failed: say what the kernel said
                pass
        return InternalError(f"op {def_.label} failed inside its {self.ws.backend.name} kernel "
                             f"on inputs {shapes}: {type(error).__name__}: {error}")


def _unordered_draw(def_: OperatorDef) -> InternalError:
    return InternalError(f"op {def_.label} draws random numbers but the graph executor does "
                         f"not keep its draws in order: add '{def_.type}' to "
                         f"netrun.core.dag.RANDOM_OPS")


def _shape_str(x: Any) -> str:
    shape = getattr(x, "shape", None)
    return "×".join(map(str, shape)) if shape else ("scalar" if shape == () else type(x).__name__)


class _Repeat:
    """An op's last run, to be done again by its bound calls alone (OpContext.repeat_with):
    valid while every input and output name holds the array object it held then, the
    `unchanged` inputs keep their write counts, and the kernel's check holds."""

    __slots__ = ("bound", "defer", "check", "arrays", "versions", "outputs")

    def __init__(self, def_: OperatorDef, inputs: tuple, blobs: dict, versions: dict,
                 bound: Any, check: Any, unchanged: tuple[str, ...]):
        self.bound, self.check = bound, check
        self.defer = getattr(bound, "defer", None)   # calls the net may make later
        self.arrays = tuple(zip(def_.inputs, inputs)) + tuple(
            (name, blobs.get(name)) for name in def_.outputs)
        self.versions = tuple((name, versions.get(name, 0)) for name in unchanged)
        self.outputs = def_.outputs

    def holds(self, blobs: dict, versions: dict) -> bool:
        """Whether the bound calls still compute this op's run."""
        for name, array in self.arrays:
            if blobs.get(name) is not array:
                return False
        for name, count in self.versions:
            if versions.get(name, 0) != count:
                return False
        return self.check is None or self.check()

    def run(self, versions: dict) -> None:
        """The calls, and the outputs' write counts (as OpContext.output counts them)."""
        self.bound.run()
        self.count(versions)

    def count(self, versions: dict) -> None:
        """The outputs' write counts, as a run counts them."""
        for name in self.outputs:
            versions[name] = versions.get(name, 0) + 1
