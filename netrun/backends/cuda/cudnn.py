"""Finding NVIDIA's cuDNN frontend (`import cudnn`), an optional package, and its version."""
from __future__ import annotations

from typing import Any

_MODULE: Any = False


def cudnn_module() -> Any:
    """The cuDNN frontend module, or None when it is not installed or cannot load."""
    global _MODULE
    if _MODULE is False:
        try:
            import cudnn  # optional: nvidia-cudnn-frontend
        except Exception:   # not installed, or the cuDNN library is missing
            cudnn = None
        _MODULE = cudnn
    return _MODULE


def cudnn_version() -> str:
    """'<frontend version>/<cuDNN version>' for algorithm-cache keys ('' without cuDNN)."""
    cudnn = cudnn_module()
    if cudnn is None:
        return ""
    try:
        return f"{getattr(cudnn, '__version__', '?')}/{cudnn.backend_version()}"
    except Exception:
        return f"{getattr(cudnn, '__version__', '?')}/?"
