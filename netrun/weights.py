"""Initial weights for fine-tuning: from a netrun checkpoint or a Caffe caffemodel.

Loading is all or nothing and exact by default: a file that loads nothing, leaves a model
parameter at its initial value, or holds parameters the model lacks is a CheckpointError
listing them. `partial=True` (`netrun train --weights-partial`) allows the last two, the
usual case being fine-tuning with a renamed or new last layer; loading nothing stays an error.
"""
from __future__ import annotations

from pathlib import Path

from netrun.caffe import load_caffe_weights
from netrun.caffe.weights import partial_hint
from netrun.core.db import DAMAGE
from netrun.errors import CheckpointError
from netrun.train import checkpoint as ckpt


def load_weights(ws, path: str | Path, model, partial: bool = False) -> str:
    """Copy the file's parameters into the workspace; every mismatch is listed first."""
    path = Path(path)
    if path.suffix in (".h5", ".hdf5") and not path.name.endswith(".caffemodel.h5"):
        try:
            info = ckpt.read_info(path)
        except CheckpointError:
            if _is_netrun_file(path):
                raise          # a damaged netrun checkpoint: say so, not "not a caffemodel"
            info = None        # not a netrun checkpoint: maybe a Caffe HDF5 caffemodel
        if info is not None:
            return _from_checkpoint(ws, info, model, partial)
    if not hasattr(model, "layer_params"):
        raise CheckpointError(f"{path}: Caffe weights load into Caffe nets (by layer name); "
                              f"this model is not a Caffe .prototxt")
    return load_caffe_weights(ws, path, model, partial).summary()


def _is_netrun_file(path: Path) -> bool:
    import h5py  # lazy: a heavy import that only HDF5 paths need

    try:
        with h5py.File(path, "r") as f:
            return "format_version" in f.attrs or "netrun_complete" in f.attrs
    except DAMAGE:
        return False


def _from_checkpoint(ws, info, model, partial: bool) -> str:
    names = [p for p in model.param_names if p in info.shapes and p in info.params]
    problems = [f"'{p}': checkpoint has {'×'.join(map(str, info.shapes[p]))}, the net has "
                f"{'×'.join(map(str, ws.get_blob(p).shape))}"
                for p in names if list(info.shapes[p]) != list(ws.get_blob(p).shape)]
    if problems:
        raise CheckpointError(f"weights '{info.path}' do not fit this net:\n  - "
                              + "\n  - ".join(problems))
    if not names:
        raise CheckpointError(f"weights '{info.path}' share no parameter names with this net, "
                              f"nothing to load (the file has: {', '.join(info.params) or 'none'})")
    kept = [p for p in model.param_names if p not in names]
    extra = [p for p in info.params if p not in model.param_names]
    if not partial and (kept or extra):
        raise CheckpointError(f"weights '{info.path}' do not cover this net exactly, nothing "
                              f"was loaded:{partial_hint(kept, extra, 'parameters')}")
    ckpt.load_blobs(ws, info.path, names, "params")
    return (f"loaded {len(names)} parameters from {info.path}"
            + (f"; kept initial values for {', '.join(kept)}" if kept else "")
            + (f"; ignored {', '.join(extra)}" if extra else ""))
