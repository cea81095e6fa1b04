"""Every CUDA source of the GPU backend compiles: for the host emulator (g++), to PTX with nvcc
where it is installed (NVIDIA's front end, every template instance), and with CuPy's NVRTC on
a real GPU."""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.gpu.hostcuda import _cache_dir, compile_library


@pytest.fixture(scope="module")
def sources(emulated):
    """name -> KernelSource of every CUDA source (each registers itself where it is written:
    netrun.backends.cuda.source.all_sources), for the tests that compile them all."""
    from netrun.backends.cuda.source import all_sources

    return {s.name: s for s in all_sources()}


def test_sources_are_named_and_instanced(sources):
    SOURCES = sources
    assert set(SOURCES) == {"bn", "conv_depthwise", "conv_im2col", "hard_sigmoid", "lrn", "optim",
                            "pool", "random", "softmax_loss"}
    for s in SOURCES.values():
        assert s.names and len(set(s.names)) == len(s.names)
        assert "--fmad=false" in s.options
        assert "#include" not in s.code       # NVRTC compiles without headers


@pytest.mark.skipif(shutil.which("g++") is None, reason="the emulator compiles with g++")
def test_every_source_compiles_for_the_host_emulator(sources):
    for s in sources.values():
        _, signatures = compile_library(s.full_code, s.names)
        assert len(signatures) == len(s.names) and all("?" not in sig for sig in signatures), \
            (s.name, signatures)


def _ptx(s) -> tuple[str, int]:
    """(nvcc's error output, number of kernel entries) for one source, cached by content."""
    code = s.full_code + "\nvoid* netrun_instances[] = {\n" + ",\n".join(
        f"(void*)&{n}" for n in s.names) + "\n};\n"
    flags = ["-std=c++17", "-arch=sm_90", *s.options]
    digest = hashlib.sha256((code + " ".join(flags)).encode()).hexdigest()[:24]
    ptx = _cache_dir() / f"{s.name}-{digest}.ptx"
    if not ptx.exists():
        src = ptx.with_suffix(".cu")
        src.write_text(code)
        result = subprocess.run(["nvcc", *flags, "-ptx", str(src), "-o", str(ptx)],
                                capture_output=True, text=True)
        if result.returncode:
            return result.stderr[-4000:], 0
    return "", len(re.findall(r"^\.visible \.entry ", ptx.read_text(), re.M))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not installed")
def test_every_source_compiles_to_ptx_with_nvcc(sources):
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(sources, pool.map(_ptx, sources.values())))
    for name, (errors, entries) in results.items():
        assert not errors, f"{name}: {errors}"
        assert entries == len(sources[name].names), name


@pytest.mark.gpu
def test_every_source_compiles_with_cupy_on_a_real_gpu(cuda):
    import cupy

    from netrun.backends.cuda.source import all_sources

    for s in all_sources():
        module = cupy.RawModule(code=s.full_code, options=s.options, name_expressions=s.names)
        for name in s.names:
            assert module.get_function(name) is not None, (s.name, name)
