"""Activation memory plans for `inspect --memory` and the `profile` footer."""
from __future__ import annotations

from typing import Any

from netrun.cli.console import console


def memory_plans(model, batch: int, overrides: dict, fuse: bool, plan: bool) -> list[dict]:
    """Plan summaries (netrun.core.activations.NetMemory.summary) of the nets a training
    run binds (step and update) and of the predict net, at this batch, bound as the
    trainer and `infer` bind them. With plan=False the planned peak is the unplanned one."""
    import numpy as np  # lazy: loaded when the command runs

    from netrun.core.workspace import Workspace
    from netrun.rewrite import bind_rewrite, training_rewrite, with_train_net
    from netrun.train.config import SolverConfig
    from netrun.train.solver import LR, build_training

    specs = model.input_specs(batch, overrides)
    feeds = {n: np.zeros(s.shape, s.dtype) for n, s in specs.items()}
    out = []
    if model.loss:
        done = training_rewrite(model, enabled=fuse)
        nets = build_training(with_train_net(model, done.net),
                              SolverConfig(type="sgd", momentum=0.9))
        ws = Workspace(seed=0, memory_plan=True)
        ws.run_net_once(nets.init)
        keep = [model.loss, *model.metrics, LR]
        for net in (nets.step, nets.update):
            ws.create_net(net, keep=keep)
        for name, value in feeds.items():
            ws.feed_blob(name, value)
        step = ["forward"] * nets.n_forward + ["backward"] * (len(nets.step.ops)
                                                               - nets.n_forward)
        for net, phases in ((nets.step, step), (nets.update, ["update"] * len(nets.update.ops))):
            out.append(_summary(ws, net.name, "train", phases, plan))
    ws = Workspace(seed=0, memory_plan=True)
    ws.run_net_once(model.init_net)
    net = model.predict_net.copy()
    net.name = "predict"
    output = (list(model.outputs) or [net.ops[-1].outputs[0]])[:1] if net.ops else []
    done = bind_rewrite(net, ws, "inference", keep=output, enabled=fuse)
    ws.create_net(done.net, keep=output)
    for name, value in feeds.items():
        if name in model.labels:
            continue
        ws.feed_blob(name, value)
    out.append(_summary(ws, "predict", "inference", ["forward"] * len(done.net.ops), plan))
    return [o for o in out if o is not None]


def _summary(ws, name: str, kind: str, phases: list[str], plan: bool) -> dict[str, Any] | None:
    record = ws.memory.net_plans.get(name)
    if record is None:
        return None
    d = {"kind": kind, **record.summary(phases)}
    if not plan:
        d["planned_peak"] = d["unplanned_peak"]
    return d


def print_memory(plans: list[dict], plan: bool) -> None:
    """The plans as a table, one row per net and phase."""
    rows = []
    for p in plans:
        saved = 1 - p["planned_peak"] / p["unplanned_peak"] if p["unplanned_peak"] else 0.0
        rows.append([p["net"], "all", _mb(p["planned_peak"]), _mb(p["unplanned_peak"]),
                     f"{100 * saved:.0f}%", _mb(p["live_peak"]), p["peak_op"]])
        for phase, q in p.get("phases", {}).items():
            rows.append(["", phase, "", "", "", _mb(q["live_peak"]), q["peak_op"]])
    console.table(["net", "phase", "planned" if plan else "planned (off)", "unplanned",
                   "saved", "largest live set", "peaks at"], rows,
                  right=("planned", "planned (off)", "unplanned", "saved", "largest live set"))
    console.line()
    console.line("planned: the shared arena (activations and the ops' estimated scratch) plus "
                 "the activations that keep their own buffers (results, blobs other nets "
                 "read); unplanned: every activation its own buffer, plus the scratch arena; "
                 "parameters and optimizer state not counted.")


def footer(ws, phases: list[str] | None = None) -> list[str]:
    """Lines for the `profile` table's footer: each planned net's activation memory."""
    lines = []
    for record in ws.memory.net_plans.values():
        s = record.summary(phases if phases and len(phases) == len(record.op_labels) else None)
        lines.append(f"activation memory ({s['net']}): planned {_mb(s['planned_peak'])}, "
                     f"unplanned {_mb(s['unplanned_peak'])}; largest live set "
                     f"{_mb(s['live_peak'])} at {s['peak_op']}")
        for phase, q in s.get("phases", {}).items():
            lines.append(f"  {phase}: largest live set {_mb(q['live_peak'])} at {q['peak_op']}")
    if not lines:
        lines.append("activation memory: not planned (--no-memory-plan)")
    return lines


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"
