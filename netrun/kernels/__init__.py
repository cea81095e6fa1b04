"""Pure array code: geometry, batch-parallel helpers, pooling windows, the Numba engine (jit)."""
