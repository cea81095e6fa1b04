"""The training loop: data in, step and update nets, tests, snapshots, exact resume.

UI-free: the CLI passes callbacks for progress and logging. Resuming restores parameters,
optimizer state, the iteration, both RNGs and the data loader's position, so N steps
straight and N/2 + resume + N/2 give bitwise identical parameters on CPU.

A checkpoint is written only at a step boundary, where all of that belongs to one iteration:
an interruption in the middle of a step (a KeyboardInterrupt can land anywhere) skips the
checkpoint rather than write parameters of one iteration with the loader position of the
next. `at_boundary`, `writing` and `saved` say at any moment what is safe and what is on disk.

Bind-time rewrites (netrun.rewrite; off with `fuse: false`): `nets` are the nets as built,
which checkpoints record; `bound` are the nets the workspace runs under the same names: the
step net built from the model's train net rewritten by the training rules (before the
backward pass, so the fused ops' own gradients are built), and the test net rewritten by
the inference rules, its folded weights recomputed from the parameters before every test.

Rank 0 logs: metrics.jsonl in the run folder, and TensorBoard scalars when asked for
(netrun.train.tensorboard). Set-up work that may keep a user waiting (binding the nets, which
compiles Numba kernels on a first run) is announced through netrun.util.progress.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np

from netrun.core.comm import Communicator
from netrun.core.workspace import Workspace
from netrun.errors import CheckpointError, NetrunError
from netrun.model import load_model
from netrun.ops.norm import synchronized
from netrun.proto.pbtxt import netdef_to_text
from netrun.rewrite import (
    Rewritten,
    bind_rewrite,
    layout_block,
    rewrite,
    training_rewrite,
    with_train_net,
)
from netrun.train import checkpoint as ckpt
from netrun.train.config import TrainConfig
from netrun.train.data import (
    BatchLoader,
    data_workers,
    iterate_once,
    make_source,
    make_transform,
)
from netrun.train.dist import world
from netrun.train.dist.gpu import gpu_world
from netrun.train.resume_check import check_resume
from netrun.train.solver import LR, TrainingNets, build_training
from netrun.train.tensorboard import FOLDER as TENSORBOARD_FOLDER
from netrun.train.tensorboard import ScalarLog
from netrun.train.tensorboard import require as require_tensorboard
from netrun.util.progress import activity
from netrun.version import __version__


class NonFiniteLoss(NetrunError):
    """The loss became NaN or infinite; the run stops, earlier checkpoints stay intact."""


class Interrupted(KeyboardInterrupt):
    """The run stopped early; `checkpoint` is the file holding its final state, or None.

    `reason` says why no checkpoint was written when there is none.
    """

    def __init__(self, iteration: int, checkpoint: Path | None, reason: str = ""):
        super().__init__(f"interrupted at iteration {iteration}")
        self.iteration, self.checkpoint, self.reason = iteration, checkpoint, reason


@dataclass
class StepResult:
    iteration: int          # iterations completed after this step
    loss: float
    lr: float
    seconds: float
    examples: int


@dataclass
class TestResult:
    iteration: int
    loss: float
    metrics: dict[str, float]
    examples: int

    @property
    def accuracy(self) -> float | None:
        for name, value in self.metrics.items():
            if "accuracy" in name:
                return value
        return None


@dataclass
class Callbacks:
    on_step: Callable[[StepResult], None] | None = None
    on_test: Callable[[TestResult], None] | None = None
    on_checkpoint: Callable[[str, str], None] | None = None   # (path, why)
    # Polled between steps: True stops the run at that safe point, as Ctrl-C does.
    should_stop: Callable[[], bool] | None = None


@dataclass
class Trainer:
    """Owns the workspace, nets and data of one training run."""

    config: TrainConfig
    device: str | None = None
    output: str | None = None
    data_dir: str | None = None
    model: Any = None
    nets: TrainingNets | None = None
    ws: Workspace | None = None
    best_accuracy: float = -1.0
    history: list[dict] = field(default_factory=list)
    # Parameters, optimizer, RNGs, loader position and `iteration` all belong to one iteration
    # (False from the start of a step until its update is done and counted).
    at_boundary: bool = True
    # The file names being written now ("iter_40.h5 and last.h5"), else None.
    writing: str | None = None
    # (iteration, path) of the newest snapshot this process finished writing.
    saved: tuple[int, Path] | None = None
    resumed_from: str | None = None
    # What the bind-time rewrites did to the train and test nets (empty when fuse is off).
    rewrites: dict[str, Rewritten] = field(default_factory=dict)
    # The processes of a data-parallel job (None: the one this process was launched into).
    comm: Communicator | None = None
    # TensorBoard scalars: None as the config says, False none, True in the run folder's
    # tensorboard/, else this folder. `tensorboard_dir` is the folder rank 0 writes, or None.
    tensorboard: bool | str | os.PathLike | None = None

    def __post_init__(self):
        cfg = self.config
        self.device = self.device or cfg.device
        self.output = Path(self.output or cfg.output)
        if self.comm is None:
            self.comm = world()
        if self.comm.size > 1:          # GPUs: one per rank, gradients summed by NCCL
            self.device, self.comm = gpu_world(self.device, self.comm)
        # Rank 0 tests, logs and writes checkpoints; every rank trains on its shard.
        self.is_root = self.comm.rank == 0
        self.tensorboard_dir = self._tensorboard_dir()
        if self.tensorboard_dir is not None:
            require_tensorboard()      # a missing extra fails now, before any data is read
        self.model = load_model(cfg.model)
        if cfg.sync_bn and self.comm.size > 1:     # BN statistics of the whole global batch
            self.model = with_train_net(self.model, synchronized(self.model.train_net))
        self.nets = build_training(self.model, cfg.solver, ranks=self.comm.size)
        self.ws = Workspace(self.device, seed=cfg.solver.seed, memory_plan=cfg.memory_plan,
                            executor=cfg.executor, comm=self.comm)
        self.bound = self._rewritten_nets(cfg.fuse)
        data = dict(cfg.data)
        self.batch_size = int(data.pop("batch_size", 64))
        if cfg.batch_per_rank:
            self.batch_size *= self.comm.size
        self.test_batch_size = int(data.pop("test_batch_size", self.batch_size))
        config_dir = Path(cfg.path).parent if cfg.path else None
        self.transform = make_transform(data.pop("transform", None), config_dir)
        self.source = make_source(data, self.data_dir, config_dir=config_dir)
        self.data_name = self.model.data_inputs[0]
        self.label_name = self.model.labels[0] if self.model.labels else None
        train = tuple(self.source.train)
        self.loader = BatchLoader(train, self.batch_size,
                                  shuffle=bool(data.get("shuffle", self.source.shuffle)),
                                  seed=cfg.solver.seed, transform=self.transform,
                                  reuse_buffers=True, workers=data_workers(data, train[0]),
                                  shard=(self.comm.rank, self.comm.size))
        self.iteration = 0
        self._started = False
        self._scalars: ScalarLog | None = None      # open while `run` runs

    # Set-up --------------------------------------------------------------------------------
    def _tensorboard_dir(self) -> Path | None:
        """The folder of this process's TensorBoard scalars (rank 0 only), else None."""
        choice = self.config.tensorboard if self.tensorboard is None else self.tensorboard
        if not self.is_root or choice is False:
            return None
        return self.output / TENSORBOARD_FOLDER if choice is True else Path(choice)

    def _rewritten_nets(self, fuse: bool) -> TrainingNets:
        """The nets to bind: `nets` with the training and inference rewrites applied."""
        if not fuse:
            return self.nets
        train = training_rewrite(self.model, self.ws.backend.name)
        nets = self.nets
        if train.fired:
            nets = build_training(with_train_net(self.model, train.net),
                                  self.config.solver, ranks=self.comm.size)
            nets.step.name, nets.update.name = self.nets.step.name, self.nets.update.name
        # The test net's shapes come from the parameters themselves at bind (they exist then).
        keep = [self.model.loss, *self.model.metrics]
        test = rewrite(self.nets.test, "inference", keep, self._param_shape)
        self.rewrites = {"train": train, "test": test}
        return dataclasses.replace(nets, test=test.net)

    def _plan_test_layouts(self) -> None:
        """Rewrite the test net again, now with the layout plan: it needs the parameters'
        data types, which exist once the init net has run (blocked layouts are for float32
        nets on a CPU with oneDNN; elsewhere nothing changes)."""
        if not layout_block(self.ws.backend.name):
            return
        test = bind_rewrite(self.nets.test, self.ws, "inference",
                            [self.model.loss, *self.model.metrics])
        self.rewrites["test"] = test
        self.bound = dataclasses.replace(self.bound, test=test.net)

    def _param_shape(self, name: str):
        """A parameter's shape (the test-net folds need them before the init net has run)."""
        param = next((p for p in self.model.params if p.name == name), None)
        return None if param is None or param.shape is None else tuple(param.shape)

    def start(self, resume: str | None = None, allow_changes: bool = False) -> list[str]:
        """Run the init net, optionally restore a checkpoint, bind the nets.

        Returns the config changes a resume was allowed to make (see `restore`).
        """
        ws, nets = self.ws, self.nets
        # Binding builds the operators, which compile their Numba kernels on a first run
        # (tens of seconds; later runs load them from Numba's cache).
        with activity("preparing the nets (a first run compiles kernels, cached for later "
                      "runs)"):
            ws.run_net_once(nets.init)
            # Bind with real inputs present so buffers and shapes settle on the first run.
            if "test" in self.rewrites:
                self._plan_test_layouts()
                self.rewrites["test"].materialize(ws)
            # What the loop reads between runs; the rest of the activations may share memory.
            keep = [self.model.loss, *self.model.metrics, LR]
            for net in (self.bound.step, self.bound.update, self.bound.test):
                ws.create_net(net, keep=keep)
        changes = self.restore(resume, allow_changes) if resume else []
        if self.comm.size > 1:
            self._broadcast_state()
        self._started = True
        return changes

    def _broadcast_state(self) -> None:
        """Every rank starts from rank 0's parameters and optimizer state (a fresh start
        makes them equal anyway, from the same seed; this makes sure)."""
        for name in (*self.model.param_names, *self.nets.optimizer_state):
            value = self.ws.get_blob(name)
            host = np.ascontiguousarray(self.ws.backend.to_host(value))
            self.comm.broadcast(host)
            self.ws.feed_blob(name, host)

    def _checkpoint_blobs(self) -> tuple[list[str], list[str], list[str]]:
        return list(self.model.param_names), list(self.nets.optimizer_state), list(self.nets.state)

    def restore(self, path: str, allow_changes: bool = False) -> list[str]:
        """Continue from a checkpoint exactly where it stopped.

        A config whose trajectory settings differ from the checkpoint's is refused, listing
        every difference, unless allow_changes; the allowed differences are returned.
        """
        info = ckpt.read_info(path)
        params, optimizer, state = self._checkpoint_blobs()
        problems = ckpt.compatibility_problems(info, self.ws, params, optimizer,
                                               self.config.solver.type)
        changes = check_resume(str(path), info.meta, self.config.raw, allow_changes, problems)
        ckpt.load_blobs(self.ws, path, params, "params")
        ckpt.load_blobs(self.ws, path, optimizer, "optimizer")
        ckpt.load_blobs(self.ws, path, state, "state")
        meta = info.meta
        # The file is data: a state the generators or the loader refuse is a damaged
        # checkpoint, not a bug of ours.
        try:
            rng = meta.get("rng", {})
            if "host" in rng:
                self.ws.host_rng.bit_generator.state = rng["host"]
            if "device" in rng:
                self._set_device_rng(rng["device"])
            if "data" in meta:
                self.loader.load_state(meta["data"])
            best = float(meta.get("best_accuracy", -1.0))
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as e:
            raise CheckpointError(f"checkpoint '{path}': its RNG or data-loader state is "
                                  f"damaged ({type(e).__name__}: {e})") from None
        self.iteration = int(meta.get("iteration", 0))
        self.best_accuracy = best if math.isfinite(best) else -1.0
        self.resumed_from = str(path)
        return changes

    def _set_device_rng(self, state) -> None:
        # Another device kind's generator cannot take this state (a GPU checkpoint resumed on
        # CPU): the run continues, with dropout masks no longer matching the original run.
        try:
            self.ws.rng.bit_generator.state = state
        except (AttributeError, TypeError, ValueError):
            warnings.warn("the checkpoint's device RNG state does not fit this device; "
                          "dropout masks will differ from an uninterrupted run")

    # One step ------------------------------------------------------------------------------
    def step(self) -> StepResult:
        """iter_size forward/backward passes, then one update."""
        ws, nets, cfg = self.ws, self.nets, self.config.solver
        t0 = time.perf_counter()
        self.at_boundary = False
        if cfg.iter_size > 1:
            for p in nets.params:
                acc = ws.get_blob(nets.grads[p])
                acc[...] = 0
                ws.touch(nets.grads[p])
        loss = 0.0
        for _ in range(cfg.iter_size):
            self._feed(self.loader.next())
            ws.run_net(nets.step.name)
            loss += float(ws.fetch_blob(self.model.loss))
        loss /= cfg.iter_size
        if self.comm.size > 1:          # the whole batch's loss: the mean of the shards'
            total = np.array([loss], np.float64)
            self.comm.allreduce_sum(total)
            loss = float(total[0]) / self.comm.size
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"the loss became {loss} at iteration {self.iteration}; "
                                f"training stopped (lower solver.base_lr, or check the data). "
                                f"Checkpoints written before this point are intact.")
        ws.run_net(nets.update.name)
        lr = -float(ws.fetch_blob(LR))
        self.iteration += 1
        self.at_boundary = True
        return StepResult(self.iteration, loss, lr, time.perf_counter() - t0,
                          self.batch_size * cfg.iter_size)

    def _feed(self, batch) -> None:
        self.ws.feed_blob(self.data_name, batch[0])
        if self.label_name is not None:
            spec = self.model.inputs.get(self.label_name)
            self.ws.feed_blob(self.label_name,
                              np.asarray(batch[1], dtype=spec.dtype if spec else np.int32))

    # Testing -------------------------------------------------------------------------------
    def test(self, max_batches: int = 0) -> TestResult:
        """Run the test net over the test part (or its first max_batches batches)."""
        ws, model = self.ws, self.model
        part = self.source.test
        totals: dict[str, float] = {}
        seen = 0
        if "test" in self.rewrites:   # the folded weights follow the parameters
            self.rewrites["test"].materialize(ws)
        workers = data_workers(self.config.data, part.data)
        batches = iterate_once(tuple(part), self.test_batch_size, self.transform, workers,
                               limit=max_batches)
        for k, batch in enumerate(batches):
            if max_batches and k >= max_batches:
                break
            self._feed(batch)
            ws.run_net(self.nets.test.name)
            n = len(batch[0])
            seen += n
            for name in [model.loss, *model.metrics]:
                totals[name] = totals.get(name, 0.0) + float(ws.fetch_blob(name)) * n
        loss = totals.pop(model.loss, 0.0) / max(seen, 1)
        return TestResult(self.iteration, loss, {k: v / max(seen, 1) for k, v in totals.items()},
                          seen)

    # Checkpoints ---------------------------------------------------------------------------
    def save(self, path: Path) -> Path:
        """Write a checkpoint of the current state."""
        params, optimizer, state = self._checkpoint_blobs()
        model = self.model
        meta = {
            "iteration": self.iteration,
            "config": self.config.raw,
            "solver_type": self.config.solver.type,
            "nets": {"init": netdef_to_text(self.nets.init), "step": netdef_to_text(self.nets.step),
                     "update": netdef_to_text(self.nets.update),
                     "test": netdef_to_text(self.nets.test),
                     "predict": netdef_to_text(model.predict_net)},
            "model": {"name": model.name,
                      "inputs": {k: (None if v is None else [list(v.shape), v.dtype])
                                 for k, v in model.inputs.items()},
                      "labels": list(model.labels), "outputs": list(model.outputs),
                      "loss": model.loss, "metrics": list(model.metrics)},
            "rng": {"host": self.ws.host_rng.bit_generator.state,
                    **({"device": self.ws.rng.bit_generator.state}
                       if hasattr(self.ws.rng, "bit_generator") else {})},
            "data": self.loader.state(),
            "lr": -float(self.ws.fetch_blob(LR)) if self.ws.has_blob(LR) else None,
            "best_accuracy": self.best_accuracy,
            "device": self.ws.device,
            "classes": self.source.class_names,
        }
        ckpt.write_checkpoint(self.ws, path, params, optimizer, state, meta)
        return Path(path)

    def snapshot(self, why: str, callbacks: Callbacks | None = None) -> Path:
        """Write iter_<N>.h5 and point last.h5 at it (rank 0 writes; the others name it)."""
        path, last = self.output / f"iter_{self.iteration}.h5", self.output / "last.h5"
        if not self.is_root:
            self.saved = (self.iteration, path)
            return path
        self.output.mkdir(parents=True, exist_ok=True)
        self.writing = f"{path.name} and {last.name}"
        try:
            self.save(path)
            ckpt.link_or_copy(path, last)
            self.saved = (self.iteration, path)      # before `writing` is cleared: see below
        finally:
            # Whoever reads these in between (a signal handler) sees a write in progress, or
            # the finished one: never "nothing in progress" with `saved` not yet updated.
            self.writing = None
        if callbacks and callbacks.on_checkpoint:
            callbacks.on_checkpoint(str(path), why)
        return path

    # The loop ------------------------------------------------------------------------------
    def run(self, max_iter: int | None = None,
            callbacks: Callbacks | None = None) -> TestResult | None:
        """Train to max_iter with periodic tests and snapshots.

        A stop request (callbacks.should_stop, polled between steps) or a KeyboardInterrupt
        raises `Interrupted`, after writing a checkpoint when the state is at a step boundary.
        """
        cfg = self.config.solver
        callbacks = callbacks or Callbacks()
        max_iter = cfg.max_iter if max_iter is None else max_iter
        if not self._started:
            self.start()
        first = self.iteration
        if self.is_root:
            self.output.mkdir(parents=True, exist_ok=True)
        log = open(self.output / "metrics.jsonl" if self.is_root else os.devnull, "a")
        last_test = None
        self._scalars = None
        try:
            if self.tensorboard_dir is not None:
                self._scalars = ScalarLog(self.tensorboard_dir, self.iteration)
            self._log(log, {"event": "start", "iter": self.iteration,
                            "resumed_from": self.resumed_from,
                            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            "netrun_version": __version__})
            self._poll_stop(callbacks)
            if cfg.test_initialization and self.iteration == 0:
                last_test = self._test_and_log(log, callbacks)
            while self.iteration < max_iter:
                self._poll_stop(callbacks)
                result = self.step()
                if callbacks.on_step:
                    callbacks.on_step(result)
                logged = bool(cfg.display) and (result.iteration % cfg.display == 0
                                                or result.iteration == 1)
                if logged:
                    self._log(log, {"iter": result.iteration, "loss": result.loss,
                                    "lr": result.lr, "seconds": result.seconds})
                if self._scalars is not None:
                    self._scalars.step(result.iteration, result.loss, result.lr,
                                       result.examples, result.seconds, logged)
                done = self.iteration >= max_iter
                if cfg.test_interval and self.iteration % cfg.test_interval == 0 and not done:
                    last_test = self._test_and_log(log, callbacks)
                if cfg.snapshot and self.iteration % cfg.snapshot == 0 and not done:
                    self.snapshot("snapshot", callbacks)
            self._poll_stop(callbacks)
            last_test = self._test_and_log(log, callbacks)
            self.snapshot("final", callbacks)
        except KeyboardInterrupt:
            raise self._stop_here(first, callbacks) from None
        finally:
            log.close()
            if self._scalars is not None:
                self._scalars.close()
                self._scalars = None
            self.loader.close()
        return last_test

    def _poll_stop(self, callbacks: Callbacks) -> None:
        stop = callbacks.should_stop is not None and callbacks.should_stop()
        if self.comm.size > 1:
            # The ranks stop at the same step, or those going on would wait for the others
            # in the next exchange forever: any rank's request stops them all.
            flag = np.array([1.0 if stop else 0.0])
            self.comm.allreduce_sum(flag)
            stop = flag[0] > 0
        if stop:
            raise KeyboardInterrupt

    def _stop_here(self, first: int, callbacks: Callbacks) -> Interrupted:
        """Checkpoint the state if it is consistent; say what was written."""
        if not self.at_boundary:
            return Interrupted(self.iteration, None, "interrupted in the middle of a step, "
                               "whose state is not consistent")
        if self.iteration == first:
            return Interrupted(self.iteration, None, "no step was done in this run")
        if self.saved is not None and self.saved[0] == self.iteration:
            return Interrupted(self.iteration, self.saved[1])     # the periodic snapshot
        try:
            path = self.snapshot("interrupted", callbacks)
        except KeyboardInterrupt:
            return Interrupted(self.iteration, None, "the checkpoint write was interrupted "
                               "(the files keep their previous contents)")
        return Interrupted(self.iteration, path)

    def _test_and_log(self, log, callbacks: Callbacks) -> TestResult | None:
        if not self.is_root:           # rank 0 tests; the others wait in the next exchange
            return None
        result = self.test(self.config.solver.test_iter)
        self._log(log, {"iter": result.iteration, "test_loss": result.loss, **{
            f"test_{k}": v for k, v in result.metrics.items()}})
        if self._scalars is not None:
            self._scalars.test(result.iteration, result.loss, result.metrics)
        if callbacks.on_test:
            callbacks.on_test(result)
        acc = result.accuracy
        # A diverged net's NaN must never become "the best": finite loss and accuracy only.
        if (acc is not None and math.isfinite(acc) and math.isfinite(result.loss)
                and acc > self.best_accuracy):
            self._save_best(acc)
            if callbacks.on_checkpoint:
                callbacks.on_checkpoint(str(self.output / "best.h5"), "best")
        return result

    def _save_best(self, accuracy: float) -> None:
        previous, self.best_accuracy = self.best_accuracy, accuracy   # best.h5 records itself
        self.output.mkdir(parents=True, exist_ok=True)
        self.writing = "best.h5"
        try:
            self.save(self.output / "best.h5")
        except BaseException:
            self.best_accuracy = previous        # not written: later checkpoints must not say so
            raise
        finally:
            self.writing = None

    def _log(self, log, record: dict) -> None:
        # NaN and infinities as null: metrics.jsonl stays standard JSON.
        log.write(json.dumps(_finite_or_none(record), allow_nan=False) + "\n")
        log.flush()
        self.history.append(record)


def _finite_or_none(record: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in record.items()}
