"""Exports of netrun nets to other formats (ONNX)."""
from netrun.export.onnx_export import (
                                       DEFAULT_OPSET,
                                       MIN_OPSET,
                                       ExportSource,
                                       export_onnx,
                                       source_from_checkpoint,
                                       source_from_model,
                                       to_onnx,
)

__all__ = ["DEFAULT_OPSET", "MIN_OPSET", "ExportSource", "export_onnx", "source_from_checkpoint",
           "source_from_model", "to_onnx"]
