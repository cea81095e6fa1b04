"""Models: the Model dataclass, the layer builder (brew), YAML models and `load_model`."""
from __future__ import annotations

from netrun.model import onnx_model  # noqa: F401  (registers the .onnx model format)
from netrun.model.loading import LOADERS, load_model, register_format
from netrun.model.model import NETS, Model, Param, model_from_netdef

__all__ = ["Model", "Param", "NETS", "load_model", "model_from_netdef", "register_format",
           "LOADERS"]
