"""A binary `.caffemodel` for an exported Caffe net (`netrun convert ... --weights`).

The file is a NetParameter holding, for every layer with parameters, its name, type and
blobs in Caffe's order (the order load_caffe_weights and Caffe's CopyTrainedLayersFrom match
them by). Field numbers are caffe.proto's: NetParameter name=1, layer=100; LayerParameter
name=1, type=2, blobs=7.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from netrun.caffe.prototxt_export import CaffeNet
from netrun.errors import CheckpointError
from netrun.proto.blobproto import blob_bytes
from netrun.proto.wire import Writer
from netrun.util.atomic import atomic_open


def caffemodel_bytes(net: CaffeNet, values: Mapping[str, np.ndarray]) -> bytes:
    """The serialized NetParameter with every parameter of `net` taken from `values`."""
    missing = [ref.blob for layer in net.weight_layers() for ref in layer.params
               if ref.blob is not None and ref.blob not in values]
    if missing:
        raise CheckpointError(f"no values for parameter(s) {', '.join(missing)}")
    out = Writer().bytes(1, net.name)
    for layer in net.weight_layers():
        w = Writer().bytes(1, layer.name).bytes(2, layer.type)
        for ref in layer.params:
            array = (np.full((1,), ref.constant, np.float32) if ref.blob is None
                     else np.asarray(values[ref.blob], np.float32))
            w.bytes(7, blob_bytes(array))
        out.bytes(100, w.to_bytes())
    return out.to_bytes()


def write_caffemodel(path: str | Path, net: CaffeNet, values: Mapping[str, np.ndarray]) -> None:
    """Write the caffemodel atomically (a temporary file beside it, then renamed)."""
    data = caffemodel_bytes(net, values)
    with atomic_open(path, "wb") as f:
        f.write(data)
