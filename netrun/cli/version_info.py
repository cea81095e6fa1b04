"""What `netrun --version` reports besides the version: the engines this installation found,
as `caffe device_query` told Caffe users what they were running on."""
from __future__ import annotations

import importlib.util
import platform


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _blas() -> str:
    """NumPy's BLAS as threadpoolctl sees it: library, version, threads."""
    from threadpoolctl import threadpool_info

    found = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not found:
        return "not found"
    info = found[0]
    return (f"{info.get('internal_api', '?')} {info.get('version') or ''}".strip()
            + f" ({info.get('num_threads', '?')} threads)")


def _numba() -> str:
    if not _installed("numba"):
        return "not installed (pip install 'netrun[fast]')"
    import numba

    from netrun.kernels import jit
    return f"{numba.__version__}" + ("" if jit.available() else " (switched off: NETRUN_JIT=0)")


def _onednn() -> str:
    from netrun.kernels import onednn
    return "found" if onednn.available() else "not found (pip install 'netrun[onednn]')"


def _cupy() -> str:
    if not _installed("cupy"):
        return "not installed (pip install 'netrun[gpu-cuda12]' or [gpu-cuda13])"
    from netrun.backends.gpu import describe_cuda
    from netrun.errors import NetrunError
    try:
        return describe_cuda()
    except NetrunError as e:      # installed, but no driver or no device
        return str(e)
    except Exception as e:  # noqa: BLE001  (a report: an odd CUDA setup must not end it)
        return f"installed; could not describe it ({type(e).__name__}: {e})"


def _mpi() -> str:
    if not _installed("mpi4py"):
        return "not installed (pip install 'netrun[dist]')"
    import mpi4py

    from netrun.errors import NetrunError
    from netrun.train.dist.launch import find_mpiexec
    try:
        launcher = find_mpiexec()
    except NetrunError:
        launcher = "no mpiexec found"
    return f"mpi4py {mpi4py.__version__}, {launcher}"


def _tensorboard() -> str:
    if not _installed("tensorboardX"):
        return "not installed (pip install 'netrun[tensorboard]')"
    from importlib.metadata import PackageNotFoundError, version

    try:     # the metadata, not the module: importing it loads protobuf
        return f"tensorboardX {version('tensorboardX')}"
    except PackageNotFoundError:
        return "tensorboardX (version unknown)"


def describe() -> list[tuple[str, str]]:
    """(engine, what was found) for every engine netrun can use."""
    import numpy

    return [("Python", platform.python_version()),
            ("NumPy", f"{numpy.__version__}, BLAS {_blas()}"),
            ("Numba (compiled CPU kernels)", _numba()),
            ("oneDNN (CPU convolutions)", _onednn()),
            ("CuPy (GPU)", _cupy()),
            ("MPI (data-parallel training)", _mpi()),
            ("TensorBoard (train --tensorboard)", _tensorboard())]
