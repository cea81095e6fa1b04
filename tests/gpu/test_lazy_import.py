"""CPU-only users never import CuPy, the GPU backend or cuDNN (the GPU kernels and algorithms
are always registered, as CUDA source text, and never run); asking for the GPU without CuPy
fails with a clear BackendError."""
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
        from netrun.conv.algorithm import algorithms
        ws = netrun.Workspace("cpu")
        ws.feed_blob("X", np.ones((1, 1, 6, 6), np.float32))
        ws.feed_blob("W", np.ones((2, 1, 3, 3), np.float32))
        net = ws.create_net(netrun.NetDef("n", [netrun.op("Conv", ["X", "W"], ["Y"], kernel=3)]))
        ws.run_net("n")
        loaded = [m for m in sys.modules if m.split(".")[0] in ("cupy", "cudnn")
                  or m.startswith("netrun.backends.gpu")]
        algo = net.ops[0].ctx.state["algo"]
        print(loaded, algo in algorithms("cpu"), algo in algorithms("gpu"))
    """)
    assert out.strip() == "[] True False"


def test_the_gpu_kernel_package_itself_does_not_import_cupy():
    out = _run("""
        import sys
        import netrun.backends.cuda, netrun.ops.gpu, netrun.conv.gpu
        from netrun.conv.algorithm import algorithms
        print("cupy" in sys.modules, "cudnn" in sys.modules, len(algorithms("gpu")) > 0)
    """)
    assert out.strip() == "False False True"   # registered on import, CuPy not loaded


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
