"""Schema validation of OperatorDefs: counts, argument names, types, values, in-place rules."""
from __future__ import annotations

import pytest

import netrun
from netrun.core.schema import REQUIRED, Arg, TensorSpec, register_schema
from netrun.errors import SchemaError

register_schema("TestSchemaOp", inputs=(1, 2), outputs=1,
                args=[Arg("size", "int", 3), Arg("mode", "str", "a", allowed=("a", "b")),
                      Arg("scale", "float", 1.0), Arg("dims", "ints", ()), Arg("need", "int", REQUIRED)],
                inplace=((0, 0),), shape_fn=lambda args, ins: [ins[0]])


def verify(**kw):
    o = netrun.op("TestSchemaOp", kw.pop("inputs", ["X"]), kw.pop("outputs", ["Y"]), **kw)
    return netrun.get_schema("TestSchemaOp").verify(o)


def test_defaults_applied_and_types_coerced():
    args = verify(need=1, scale=2, dims=4)
    assert args.size == 3 and args.mode == "a" and args.scale == 2.0 and args.dims == [4]
    assert isinstance(args.scale, float)


@pytest.mark.parametrize("kw, message", [
    (dict(need=1, sise=2), "unknown argument 'sise', did you mean 'size'"),
    (dict(need=1, size="big"), "argument 'size' must be an integer, got 'big'"),
    (dict(need=1, size=2.5), "argument 'size' must be an integer"),
    (dict(need=1, mode="c"), "allowed values are 'a', 'b'"),
    (dict(need=1, dims=["x"]),
     "argument 'dims' must be a list of integers, got 'x' among its values"),
    (dict(), "missing required argument 'need'"),
    (dict(need=1, inputs=[]), "takes 1 to 2 input"),
    (dict(need=1, inputs=["X", "W", "b"]), "takes 1 to 2 input"),
    (dict(need=1, outputs=["Y", "Z"]), "makes 1 output"),
    (dict(need=1, inputs=["X", "W"], outputs=["W"]), "may not be written in place"),
])
def test_rejections_name_the_op_and_argument(kw, message):
    with pytest.raises(SchemaError, match=message) as err:
        verify(**kw)
    assert "TestSchemaOp" in str(err.value)


def test_in_place_pair_allowed():
    assert verify(need=1, inputs=["X"], outputs=["X"]).need == 1


def test_bools_become_ints_and_tensor_spec_sizes():
    o = netrun.op("Relu", ["X"], ["Y"], flag=True)
    assert o.args["flag"] == 1 and isinstance(o.args["flag"], int)
    spec = TensorSpec((2, 3, 4), "float32")
    assert spec.size == 24 and spec.nbytes == 96 and str(spec) == "2×3×4"
