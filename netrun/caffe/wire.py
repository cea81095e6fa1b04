"""Caffe's binary `.caffemodel` (a serialized NetParameter): layer names, types and blobs.

Field numbers are Caffe's (caffe.proto):

    NetParameter       name=1, layers=2 (V1LayerParameter), layer=100 (LayerParameter)
    LayerParameter     name=1, type=2, blobs=7
    V1LayerParameter   name=4, type=5 (an enum), blobs=6

The wire format itself and BlobProto live in netrun.proto (data files use them too).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from netrun.errors import CheckpointError
from netrun.proto.blobproto import parse_blob, read_blobproto
from netrun.proto.wire import LENGTH, VARINT, WireError, as_text, iter_fields


@dataclass
class LayerBlobs:
    """One layer of a caffemodel: name, type (V1 enums as their number) and blobs."""

    name: str
    type: str
    blobs: list[np.ndarray] = field(default_factory=list)


def parse_layer(buf: memoryview, v1: bool) -> LayerBlobs:
    """A LayerParameter (or V1LayerParameter): its name, type and blobs; the rest is skipped."""
    name_no, type_no, blobs_no = (4, 5, 6) if v1 else (1, 2, 7)
    layer = LayerBlobs("", "")
    for number, wire, value in iter_fields(buf):
        if number == name_no:
            layer.name = as_text(value)
        elif number == type_no:
            layer.type = str(value) if wire == VARINT else as_text(value)
        elif number == blobs_no and wire == LENGTH:
            layer.blobs.append(parse_blob(value))
    return layer


def parse_net(data: bytes) -> tuple[str, list[LayerBlobs]]:
    """(net name, layers) of a serialized NetParameter."""
    buf = memoryview(data)
    name, layers = "", []
    for number, wire, value in iter_fields(buf):
        if number == 1 and wire == LENGTH:
            name = as_text(value)
        elif number in (2, 100) and wire == LENGTH:
            layers.append(parse_layer(value, v1=number == 2))
    return name, layers


def read_caffemodel(path: str | Path) -> tuple[str, list[LayerBlobs]]:
    """Read a binary .caffemodel: (net name, layers with their blobs)."""
    data = _read(path)
    try:
        return parse_net(data)
    except WireError as e:
        raise WireError(f"{path}: not a readable binary caffemodel ({e})") from None


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None


__all__ = ["LayerBlobs", "WireError", "parse_blob", "parse_layer", "parse_net", "read_blobproto",
           "read_caffemodel"]
