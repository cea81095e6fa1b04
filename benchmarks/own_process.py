"""netrun timed in a process of its own, beside PyTorch and ONNX Runtime in the benchmark's.

In one process the libraries share what was loaded first. PyTorch's wheel brings its own
libgomp.so.1; loaded before netrun's, it also serves oneDNN's and Numba's OpenMP teams,
whose idle threads then spin ~3 ms after every parallel region (netrun loads libgomp with a
10,000-round spin, ~0.5 ms: netrun.kernels.omp). Those threads hold the cores that netrun's
worker threads need for the ops that run there: ResNet-20's training step took 1.1-1.25× as
long with torch merely imported first. A user runs netrun as a process of its own
(`netrun train`), so the benchmark does too. The libraries still alternate in blocks
(bench_cpu.alternate) on the same machine state; the child times each run of its net
itself, so the pipe's round trip (~0.1 ms) is not charged to netrun.
"""
from __future__ import annotations

import multiprocessing
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any


class OwnProcess:
    """A benchmark target built in a child process by `factory(*args)` (a top-level callable:
    the child imports it by name). The target is a callable running its work once, with an
    optional `info` dict and `profile(iters)`; calling this object runs it once there and
    returns the run's milliseconds (`times_itself`)."""

    times_itself = True

    def __init__(self, factory: Callable[..., Any], *args):
        # spawn, not fork: a forked child would inherit the parent's loaded libraries
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), daemon=True)
        self._process.start()
        child.close()
        try:
            self.info = self._ask("prepare", factory, args)
        except BaseException:
            self.close()
            raise

    def __call__(self) -> float:
        return self._ask("run")

    def block(self, settle_ms: float, count: int) -> list[float]:
        """Runs made back to back in the child, as the benchmark's loop makes PyTorch's and
        ONNX Runtime's: untimed ones for at least `settle_ms` (one at least), then `count`
        timed; their milliseconds. One run per request would leave the child idle for the
        pipe's round trip before each run, its OpenMP threads gone to sleep (ResNet-20's
        batch-1 pass took ~10% longer so)."""
        return self._ask("block", settle_ms, count)

    def profile(self, iters: int) -> dict:
        """The target's profile (a net's: netrun's profiler in the child)."""
        return self._ask("profile", iters)

    def close(self) -> None:
        """End the child (its memory goes with it)."""
        if self._process.is_alive():
            self._conn.send(("close",))
            self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
        self._conn.close()

    def __enter__(self) -> OwnProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ask(self, *request) -> Any:
        self._conn.send(request)
        try:
            status, value = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"netrun's benchmark process ended (exit code "
                               f"{self._process.exitcode}) during '{request[0]}'") from None
        if status == "error":
            raise RuntimeError(f"netrun's benchmark process failed during '{request[0]}':\n"
                               f"{value}")
        return value


def _serve(conn) -> None:
    """The child: answer requests until 'close' (or the parent's end)."""
    target = None
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        kind, args = request[0], request[1:]
        if kind == "close":
            return
        try:
            if kind == "prepare":
                factory, factory_args = args
                target = factory(*factory_args)
                answer = {"torch_loaded": "torch" in sys.modules, **getattr(target, "info", {})}
            elif kind == "run":
                t0 = time.perf_counter()
                target()
                answer = (time.perf_counter() - t0) * 1e3
            elif kind == "block":
                answer = run_block(target, *args)
            elif kind == "profile":
                answer = target.profile(*args)
            else:
                raise ValueError(f"unknown request {kind!r}")
        except Exception:   # the parent reports it; the child keeps serving
            conn.send(("error", traceback.format_exc()))
            continue
        conn.send(("ok", answer))


def run_block(target: Callable[[], Any], settle_ms: float, count: int) -> list[float]:
    """`target` run untimed for at least settle_ms (once at least), then `count` times back
    to back: the milliseconds of those."""
    settle = time.perf_counter() + settle_ms / 1e3
    target()
    while time.perf_counter() < settle:
        target()
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        target()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


class InProcess:
    """OwnProcess's twin in this process (`--same-process`): calling it runs the target once
    (timed by the caller)."""

    times_itself = False

    def __init__(self, factory: Callable[..., Any], *args):
        self.target = factory(*args)
        self.info = {"torch_loaded": "torch" in sys.modules, **getattr(self.target, "info", {})}

    def __call__(self) -> None:
        self.target()

    def block(self, settle_ms: float, count: int) -> list[float]:
        """As OwnProcess.block, in this process."""
        return run_block(self.target, settle_ms, count)

    def profile(self, iters: int) -> dict:
        """The target's profile."""
        return self.target.profile(iters)

    def close(self) -> None:
        """Drop the target."""
        self.target = None

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NetTarget:
    """A netrun profile target (netrun.profile.targets.prepare) bound, its algorithms picked
    by a first run; calling it runs the net once. `info` names each conv's algorithm."""

    def __init__(self, path: str, batch: int, forward_only: bool, algo_mode: str):
        from netrun import conv as algos
        from netrun.profile.targets import prepare

        self.target = prepare(path, batch, "cpu", forward_only=forward_only)
        algos.configure(self.target.net.ws, mode=algo_mode)
        self.target.net.run()   # picks the algorithms (a timing search in exhaustive mode)
        self.info = {"algos": {o.def_.name: str(o.ctx.state["algo"])
                               for o in self.target.net.ops if o.ctx.state.get("algo")}}

    def __call__(self) -> None:
        self.target.net.run()

    def profile(self, iters: int) -> dict:
        """netrun's profiler: iteration and per-op-type times, and algorithms."""
        from netrun.profile.timing import profile_net

        t = self.target
        prof = profile_net(t.net, iters=iters, warmup=1, phases=t.phases, costs=t.costs,
                           before_iteration=t.feed)
        return {"profile_iteration_ms": prof.total_ms, "profile_sum_of_ops_ms":
                prof.sum_of_ops_ms, "by_type": [{"type": k, "ms": ms, "count": n}
                                                for k, ms, n in prof.by_type()],
                **self.info}


def OwnProcessNet(path: str, batch: int, forward_only: bool, algo_mode: str) -> OwnProcess:
    """A net (NetTarget) bound and timed in a process of its own."""
    return OwnProcess(NetTarget, path, batch, forward_only, algo_mode)


def InProcessNet(path: str, batch: int, forward_only: bool, algo_mode: str) -> InProcess:
    """A net (NetTarget) bound in this process."""
    return InProcess(NetTarget, path, batch, forward_only, algo_mode)
