"""Initial weights: from a netrun checkpoint, a Caffe caffemodel or a Caffe2 init net.

Loading is all or nothing and exact by default: a file that loads nothing, leaves a model
parameter at its initial value, or holds parameters the model lacks is a CheckpointError
listing them. `partial=True` (`netrun train --weights-partial`) allows the last two, the
usual case being fine-tuning with a renamed or new last layer; loading nothing stays an error.
A Caffe2 init net (.pb, .pbtxt) may hold fill ops only (the file is data); they run in a
workspace of their own, and the parameters they make are copied in.
"""
from __future__ import annotations

from pathlib import Path

from netrun.caffe import load_caffe_weights
from netrun.caffe.weights import partial_hint
from netrun.core.db import DAMAGE
from netrun.core.workspace import Workspace
from netrun.errors import CheckpointError, SchemaError, ShapeError
from netrun.model.init_net import read_init_net
from netrun.proto.defs import NetDef
from netrun.proto.io import is_caffe2_netdef
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
    if is_caffe2_netdef(path):
        return _from_init_net(ws, path, model, partial)
    # By layer name: a Caffe .prototxt, or a model whose parameters name their layers (one
    # converted from a prototxt keeps them under `params:`).
    if not hasattr(model, "layer_params") and not (model.params and
                                                   all(p.layer for p in model.params)):
        raise CheckpointError(f"{path}: Caffe weights load by layer name into Caffe nets, or "
                              f"models whose parameters name their layers; this one does not")
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


def _from_init_net(ws, path: Path, model, partial: bool) -> str:
    """Run a Caffe2 init net's fill ops, then copy in the blobs that are model parameters."""
    net = read_init_net(path)
    data = set(model.inputs)        # zoo init nets often fill a placeholder for the data too
    made = [b for b in dict.fromkeys(b for o in net.ops for b in o.outputs) if b not in data]
    names = [p for p in model.param_names if p in made]
    if not names:
        raise CheckpointError(f"init net '{path}' makes none of this net's parameters, nothing "
                              f"to load (it makes: {_listed(made) or 'nothing'})")
    kept = [p for p in model.param_names if p not in names]
    unset = [p for p in kept if not ws.has_blob(p)]
    if unset:       # a NetDef model has no other source of values: partial cannot help
        raise CheckpointError(f"init net '{path}' does not make {_listed(unset)}, which the net "
                              f"reads and nothing else provides; is it this model's init net?")
    extra = [b for b in made if b not in model.param_names]
    if not partial and (kept or extra):
        raise CheckpointError(f"init net '{path}' does not cover this net exactly, nothing "
                              f"was loaded:{partial_hint(kept, extra, 'parameters')}")
    # A workspace of its own: the model's blobs are untouched until every shape is checked,
    # and blobs made only for another fill (or ignored) never reach it.
    made_here = Workspace("cpu")
    try:
        made_here.run_net_once(NetDef(net.name or "init", _ops_making(net.ops, names)))
    except (SchemaError, ShapeError) as e:
        raise type(e)(f"init net '{path}': {e}") from None
    problems = [f"'{p}': the init net makes {_shape(made_here.get_blob(p).shape)}, the net has "
                f"{_shape(ws.get_blob(p).shape)}" for p in names if ws.has_blob(p)
                and tuple(made_here.get_blob(p).shape) != tuple(ws.get_blob(p).shape)]
    if problems:
        raise CheckpointError(f"init net '{path}' does not fit this net:\n  - "
                              + "\n  - ".join(problems))
    for p in names:
        ws.feed_blob(p, made_here.fetch_blob(p))
    return (f"loaded {len(names)} parameters from init net {path}"
            + (f"; kept initial values for {', '.join(kept)}" if kept else "")
            + (f"; ignored {', '.join(extra)}" if extra else ""))


def _shape(shape) -> str:
    return "×".join(map(str, shape)) if len(shape) else "scalar"


def _ops_making(ops: list, names: list[str]) -> list:
    """The ops that make `names`, with the earlier ops they read from, in net order."""
    needed, kept = set(names), []
    for op in reversed(ops):
        if needed & set(op.outputs):
            kept.append(op)
            needed.update(op.inputs)
    return kept[::-1]


def _listed(names: list[str], shown: int = 5) -> str:
    """'a', 'b' and 3 more."""
    text = ", ".join(f"'{n}'" for n in names[:shown])
    return text + (f" and {len(names) - shown} more" if len(names) > shown else "")
