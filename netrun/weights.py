"""Initial weights for fine-tuning: from a netrun checkpoint or a Caffe caffemodel."""
from __future__ import annotations

from pathlib import Path

from netrun.caffe import load_caffe_weights
from netrun.errors import CheckpointError
from netrun.train import checkpoint as ckpt


def load_weights(ws, path: str | Path, model) -> str:
    """Copy matching parameters into the workspace; every shape mismatch is listed first."""
    path = Path(path)
    if path.suffix in (".h5", ".hdf5") and not path.name.endswith(".caffemodel.h5"):
        try:
            info = ckpt.read_info(path)
        except CheckpointError:
            info = None            # not a netrun checkpoint: maybe a Caffe HDF5 caffemodel
        if info is not None:
            return _from_checkpoint(ws, info, model)
    if not hasattr(model, "layer_params"):
        raise CheckpointError(f"{path}: Caffe weights load into Caffe nets (by layer name); "
                              f"this model is not a Caffe .prototxt")
    return load_caffe_weights(ws, path, model).summary()


def _from_checkpoint(ws, info, model) -> str:
    names = [p for p in model.param_names if p in info.shapes]
    problems = [f"'{p}': checkpoint has {'×'.join(map(str, info.shapes[p]))}, the net has "
                f"{'×'.join(map(str, ws.get_blob(p).shape))}"
                for p in names if list(info.shapes[p]) != list(ws.get_blob(p).shape)]
    if problems:
        raise CheckpointError(f"weights '{info.path}' do not fit this net:\n  - "
                              + "\n  - ".join(problems))
    if not names:
        raise CheckpointError(f"weights '{info.path}' share no parameter names with this net")
    ckpt.load_blobs(ws, info.path, names, "params")
    kept = [p for p in model.param_names if p not in names]
    return (f"loaded {len(names)} parameters from {info.path}"
            + (f"; kept initial values for {', '.join(kept)}" if kept else ""))
