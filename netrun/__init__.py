"""netrun: a command-line deep-learning model runner in the Caffe/Caffe2 lineage."""
from __future__ import annotations

import netrun.caffe  # noqa: F401  (the .prototxt model format)

# The operator families and the model formats register themselves on import: this is the one
# place that imports them, so every registry is filled before any netrun code looks it up.
import netrun.ops  # noqa: F401
from netrun.core.gradient import add_gradient_ops, gradient_ops
from netrun.core.schema import TensorSpec, get_schema
from netrun.core.workspace import Workspace
from netrun.errors import NetrunError
from netrun.model import load_model
from netrun.proto.defs import NetDef, OperatorDef, op
from netrun.version import __version__

__all__ = ["NetDef", "OperatorDef", "op", "Workspace", "gradient_ops", "add_gradient_ops",
           "load_model", "get_schema", "TensorSpec", "NetrunError", "__version__"]
