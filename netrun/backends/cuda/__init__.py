"""Device code of the GPU backend that imports no CuPy at import time: CUDA source compiling
and launching (source), device-side checks, the counter-based generator, cuDNN discovery."""
