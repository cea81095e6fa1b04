"""netrun: a command-line deep-learning model runner in the Caffe/Caffe2 lineage."""
from __future__ import annotations

__version__ = "0.1.0"

from netrun.core.gradient import add_gradient_ops, gradient_ops
from netrun.core.schema import TensorSpec, get_schema
from netrun.core.workspace import Workspace
from netrun.errors import NetrunError
from netrun.proto.defs import NetDef, OperatorDef, op


def load_model(path, **kwargs):
    """Load a model file (.yaml, .pbtxt or Caffe .prototxt) into init/train/predict nets."""
    from netrun.model import load_model as _load

    return _load(path, **kwargs)


__all__ = ["NetDef", "OperatorDef", "op", "Workspace", "gradient_ops", "add_gradient_ops",
           "load_model", "get_schema", "TensorSpec", "NetrunError", "__version__"]
