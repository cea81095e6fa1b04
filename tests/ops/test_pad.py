"""Pad (constant padding, ONNX's pad order): forward against NumPy and PyTorch, the gradient
against finite differences and PyTorch, shape inference, errors."""
from __future__ import annotations

import numpy as np
import pytest

import netrun
from netrun.core.schema import TensorSpec, get_schema
from netrun.errors import SchemaError, ShapeError
from tests.checks import checks_ops, requires_torch
from tests.opcheck import check_gradient, netrun_forward_backward, run_op, torch_forward_backward


def _inferred(op, x):
    schema = get_schema(op.type)
    return schema.infer_shapes(op, schema.verify(op), [TensorSpec(x.shape)])[0].shape


@checks_ops("Pad", kind="finite_differences")
@pytest.mark.parametrize("shape, pads", [
    ((2, 3), [1, 0, 0, 2]),
    ((1, 2, 3, 4), [0, 0, 1, 2, 0, 0, 3, 0]),
    ((2, 3, 4), [1, 2]),                      # pads for dim 0 only; the rest stay
    ((2, 2), [0, 0, 0, 0]),
])
def test_pad_forward_and_gradient(shape, pads):
    x = np.random.default_rng(0).standard_normal(shape)
    op = netrun.op("Pad", ["X"], ["Y"], pads=pads, value=-1.5)
    (y,) = run_op(op, {"X": x})
    n = len(pads) // 2
    widths = [(pads[i], pads[n + i]) for i in range(n)] + [(0, 0)] * (len(shape) - n)
    np.testing.assert_array_equal(y, np.pad(x, widths, constant_values=-1.5))
    assert _inferred(op, x) == y.shape
    check_gradient(op, {"X": x})


@checks_ops("Pad", kind="torch_gradient")
@requires_torch
def test_pad_matches_torch_float32():
    import torch.nn.functional as F

    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32)
    # torch lists the last dim first: (left, right, top, bottom)
    (ty,), (tdx,), dy = torch_forward_backward(lambda t: F.pad(t, (2, 0, 1, 3), value=0.5), [x])
    (y,), grads = netrun_forward_backward(
        netrun.op("Pad", ["X"], ["Y"], pads=[0, 0, 1, 2, 0, 0, 3, 0], value=0.5), {"X": x}, dy)
    np.testing.assert_array_equal(y, ty)
    np.testing.assert_array_equal(grads["X"], tdx)


def test_pad_errors():
    with pytest.raises(SchemaError, match="even count"):
        run_op(netrun.op("Pad", ["X"], ["Y"], pads=[1, 2, 3]), {"X": np.ones((2, 2))})
    with pytest.raises(SchemaError, match="must not be negative"):
        run_op(netrun.op("Pad", ["X"], ["Y"], pads=[0, -1, 0, 0]), {"X": np.ones((2, 2))})
    with pytest.raises(ShapeError, match="6 pads for X 2×2 with 2 dims"):
        run_op(netrun.op("Pad", ["X"], ["Y"], pads=[1] * 6), {"X": np.ones((2, 2))})
