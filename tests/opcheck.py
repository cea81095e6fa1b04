"""Operator test helpers: run one op, finite-difference gradient checks, PyTorch references."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

import netrun
from netrun.proto.defs import OperatorDef

try:
    import torch
except ImportError:  # torch is a test-only reference
    torch = None


def run_op(op: OperatorDef, inputs: Mapping[str, np.ndarray], device: str = "cpu",
           seed: int = 0) -> list[np.ndarray]:
    """Feed `inputs`, run `op` once, return its outputs as NumPy arrays."""
    ws = netrun.Workspace(device, seed=seed)
    for name, value in inputs.items():
        ws.feed_blob(name, value)
    ws.run_operator_once(op)
    return [ws.fetch_blob(o) for o in op.outputs]


def check_gradient(op: OperatorDef, inputs: Mapping[str, np.ndarray], check: Sequence[str] | None = None,
                   outputs: Sequence[int] | None = None, eps: float = 1e-6, atol: float = 1e-6,
                   rtol: float = 1e-5, device: str = "cpu", seed: int = 0) -> None:
    """Compare the op's registered gradient with central differences, in float64.

    The scalar being differentiated is L = sum_j <R_j, Y_j> over the checked outputs with
    fixed random R_j, so every output element contributes with its own weight.
    `check` names the inputs to check (default: every floating input that gets a gradient).
    """
    inputs = {k: np.asarray(v) for k, v in inputs.items()}
    rng = np.random.default_rng(seed + 1)
    outs = run_op(op, inputs, device, seed)
    float_out = [j for j, y in enumerate(outs) if np.issubdtype(y.dtype, np.floating)]
    outputs = list(outputs) if outputs is not None else float_out
    weights = {j: rng.standard_normal(outs[j].shape) for j in outputs}

    def loss(values: Mapping[str, np.ndarray]) -> float:
        ys = run_op(op, values, device, seed)
        return float(sum(np.sum(weights[j] * ys[j]) for j in outputs))

    grad_ops, grad_of = netrun.gradient_ops(op)
    ws = netrun.Workspace(device, seed=seed)
    for name, value in inputs.items():
        ws.feed_blob(name, value)
    ws.run_operator_once(op)
    for j, name in enumerate(op.outputs):
        g = weights.get(j)
        if g is None:
            g = np.zeros_like(outs[j], dtype=np.float64) if j in float_out else None
        if g is not None:
            ws.feed_blob(f"{name}_grad", g)
    for g_op in grad_ops:
        ws.run_operator_once(g_op)

    names = check if check is not None else [
        n for n in dict.fromkeys(op.inputs)
        if grad_of.get(n) and np.issubdtype(inputs[n].dtype, np.floating)]
    assert names, f"nothing to check for {op.type}"
    for name in names:
        assert grad_of.get(name), f"{op.type}: no gradient produced for input '{name}'"
        analytic = ws.fetch_blob(grad_of[name])
        x = inputs[name].astype(np.float64)
        numeric = np.zeros_like(x)
        flat = x.reshape(-1)
        for idx in range(flat.size):
            orig = flat[idx]
            flat[idx] = orig + eps
            plus = loss({**inputs, name: x})
            flat[idx] = orig - eps
            minus = loss({**inputs, name: x})
            flat[idx] = orig
            numeric.reshape(-1)[idx] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(analytic, numeric, atol=atol, rtol=rtol,
                                   err_msg=f"{op.type}: gradient of '{name}'")


def torch_forward_backward(fn, inputs: Sequence[np.ndarray], grad_out=None, seed: int = 0):
    """Run a torch function on float copies of `inputs`; return (outputs, input grads).

    `grad_out` defaults to fixed random weights over the first output.
    """
    ts = [torch.tensor(x, requires_grad=np.issubdtype(np.asarray(x).dtype, np.floating))
          for x in inputs]
    y = fn(*ts)
    ys = y if isinstance(y, (tuple, list)) else (y,)
    if grad_out is None:
        grad_out = np.random.default_rng(seed).standard_normal(tuple(ys[0].shape)).astype(
            np.asarray(inputs[0]).dtype)
    ys[0].backward(torch.tensor(grad_out))
    grads = [t.grad.numpy() if t.grad is not None else None for t in ts]
    return [v.detach().numpy() for v in ys], grads, grad_out


def netrun_forward_backward(op: OperatorDef, inputs: Mapping[str, np.ndarray], grad_out,
                            device: str = "cpu", seed: int = 0):
    """Run op and its gradient ops with `grad_out` as the first output's gradient."""
    grad_ops, grad_of = netrun.gradient_ops(op)
    ws = netrun.Workspace(device, seed=seed)
    for name, value in inputs.items():
        ws.feed_blob(name, value)
    ws.run_operator_once(op)
    ws.feed_blob(f"{op.outputs[0]}_grad", grad_out)
    for j, name in enumerate(op.outputs[1:], start=1):
        y = ws.fetch_blob(name)
        if np.issubdtype(y.dtype, np.floating):
            ws.feed_blob(f"{name}_grad", np.zeros_like(y))
    for g_op in grad_ops:
        ws.run_operator_once(g_op)
    outs = [ws.fetch_blob(o) for o in op.outputs]
    grads = {n: (ws.fetch_blob(g) if g else None) for n, g in grad_of.items()}
    return outs, grads
