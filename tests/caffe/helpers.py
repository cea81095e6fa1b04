"""Shared helpers for the Caffe tests: the real model files, nets from prototxt text, runs."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import netrun
from netrun.caffe import load_caffe_model

SHARED = Path(os.environ.get("NETRUN_SHARED", Path(__file__).resolve().parents[2].parent
                             / "shared"))
CAFFE_MODELS = SHARED / "models" / "caffe"


def shared_model(relative: str) -> Path:
    """A file under shared/models/caffe, or a skip saying it is absent."""
    path = CAFFE_MODELS / relative
    if not path.is_file():
        pytest.skip(f"{path} not found (set NETRUN_SHARED to the shared folder)")
    return path


def net_from_text(tmp_path: Path, text: str, name: str = "net.prototxt", **options):
    """Write a prototxt and translate it."""
    path = tmp_path / name
    path.write_text(text)
    return load_caffe_model(path, **options)


def init_workspace(model, seed: int = 0, params: dict | None = None) -> netrun.Workspace:
    """A workspace with the model's init net run, then `params` fed over it."""
    ws = netrun.Workspace("cpu", seed=seed)
    ws.run_net_once(model.init_net)
    for name, value in (params or {}).items():
        ws.feed_blob(name, value)
    return ws


def run(model, feeds: dict, net: str = "predict", ws=None, fetch=None) -> dict:
    """Run one of the model's nets on `feeds`; returns the fetched blobs (default: outputs)."""
    ws = ws or init_workspace(model)
    for name, value in feeds.items():
        ws.feed_blob(name, value)
    ws.run_net_once(model.net(net))
    names = fetch or model.outputs
    return {n: ws.fetch_blob(n) for n in names}


def random_params(model, seed: int = 0, scale: float = 0.5) -> dict[str, np.ndarray]:
    """Random float32 values for every parameter (BatchNorm statistics kept plausible)."""
    rng = np.random.default_rng(seed)
    out = {}
    for p in model.params:
        if p.role == "running_var":
            out[p.name] = rng.uniform(0.5, 2.0, p.shape).astype(np.float32)
        elif p.role == "running_factor":
            out[p.name] = np.full(p.shape, 2.0, np.float32)
        else:
            out[p.name] = (rng.standard_normal(p.shape) * scale).astype(np.float32)
    return out


def input_layers(inputs: dict[str, np.ndarray]) -> str:
    """Input layers declaring each array's shape (batch included)."""
    return "\n".join(
        f'layer {{ name: "in_{n}" type: "Input" top: "{n}" input_param {{ shape {{ '
        + " ".join(f"dim: {d}" for d in a.shape) + " } } }" for n, a in inputs.items())


def run_layers(tmp_path: Path, layers: str, inputs: dict[str, np.ndarray], tops: list[str],
               net: str = "test", params: dict | None = None, **options) -> list[np.ndarray]:
    """Translate Input layers for `inputs` plus `layers`, run one net, fetch Caffe tops."""
    model = net_from_text(tmp_path, input_layers(inputs) + "\n" + layers, **options)
    ws = init_workspace(model, params=params)
    for name, value in inputs.items():
        ws.feed_blob(name, value)
    ws.run_net_once(model.net(net))
    names = model.blob_names["predict" if net == "predict" else net]
    return [ws.fetch_blob(names[t]) for t in tops]
