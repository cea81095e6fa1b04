"""CPU-only users never import CuPy, the GPU kernels or the GPU algorithms; asking for the GPU
without CuPy fails with a clear BackendError."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_cpu_workspaces_never_import_cupy():
    out = _run("""
        import sys
        import numpy as np
        import netrun
        from netrun import algos
        ws = netrun.Workspace("cpu")
        ws.feed_blob("X", np.ones((1, 1, 6, 6), np.float32))
        ws.feed_blob("W", np.ones((2, 1, 3, 3), np.float32))
        ws.run_operator_once(netrun.op("Conv", ["X", "W"], ["Y"], kernel=3))
        loaded = [m for m in sys.modules if m == "cupy" or m.startswith("cupy.")
                  or m.startswith("netrun.backends.gpu") or m.startswith("netrun.algos.gpu")]
        print(loaded)
    """)
    assert out.strip() == "[]"


def test_the_gpu_kernel_package_itself_does_not_import_cupy():
    out = _run("""
        import sys
        import netrun.backends.gpu_kernels, netrun.algos.gpu
        netrun.algos.gpu.register()
        print("cupy" in sys.modules)
    """)
    assert out.strip() == "False"


def test_gpu_without_cupy_is_a_clear_error():
    out = _run("""
        import sys
        sys.modules["cupy"] = None          # as if CuPy were not installed
        import netrun
        from netrun.errors import BackendError
        try:
            netrun.Workspace("gpu:1")
        except BackendError as e:
            print(e)
    """)
    assert "needs CuPy, which is not installed" in out and "pip install" in out
