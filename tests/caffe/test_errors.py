"""Bad prototxt: errors carry file:line:column and the layer name; unsupported layers and
fields are all listed at once."""
from __future__ import annotations

import pytest

import netrun
from netrun.errors import NetrunError, ParseError
from tests.caffe.helpers import net_from_text

HEAD = ('layer { name: "data" type: "Input" top: "data" '
        'input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }\n')


def _error(tmp_path, text: str, **options) -> ParseError:
    with pytest.raises(ParseError) as err:
        net_from_text(tmp_path, text, **options)
    return err.value


def test_syntax_error_has_file_line_column(tmp_path):
    err = _error(tmp_path, HEAD + 'layer { name: "c" type: "ReLU" bottom "data" top: "c" }\n')
    assert (err.line, err.column) == (2, 39)
    assert str(err).startswith(f"{tmp_path / 'net.prototxt'}:2:39: missing ':'")


def test_unsupported_layers_are_listed_all_at_once(tmp_path):
    text = HEAD + """layer { name: "crop" type: "Crop" bottom: "data" bottom: "data" top: "crop" }
layer { name: "am" type: "ArgMax" bottom: "crop" top: "am" }
layer { name: "conv" type: "Convolutoin" bottom: "data" top: "conv" }
layer { name: "ok" type: "ReLU" bottom: "data" top: "ok" }
"""
    err = _error(tmp_path, text)
    message = str(err)
    assert message.startswith("3 problems in Caffe net")
    path = tmp_path / "net.prototxt"
    assert f"{path}:2:22: layer 'crop': type 'Crop' is not supported" in message
    assert f"{path}:3:20: layer 'am': type 'ArgMax' is not supported" in message
    assert (f"{path}:4:22: layer 'conv': type 'Convolutoin' is not supported, did you mean "
            f"'Convolution'?") in message
    assert (err.file, err.line, err.column) == (str(path), 2, 22)


def test_unsupported_fields_and_values_name_the_layer(tmp_path):
    text = HEAD + """layer { name: "c" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 4 kernel_size: 3 frobnicate: 2 } }
layer { name: "p" type: "Pooling" bottom: "c" top: "p"
  pooling_param { pool: STOCHASTIC kernel_size: 2 } }
layer { name: "d" type: "Dropout" bottom: "c" top: "d" blobs { data: 1 } }
"""
    message = str(_error(tmp_path, text))
    path = tmp_path / "net.prototxt"
    assert f"{path}:3:52: layer 'c' (Convolution): field 'frobnicate' is not supported" in message
    assert (f"{path}:5:19: layer 'p' (Pooling): pool: STOCHASTIC is not supported "
            f"(supported: MAX, AVE)") in message
    assert f"{path}:6:56: layer 'd' (Dropout): field 'blobs' is not supported" in message


def test_shape_errors_name_the_layer_and_shapes(tmp_path):
    text = HEAD + """layer { name: "a" type: "Convolution" bottom: "data" top: "a"
  convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "data" top: "sum" }
"""
    err = _error(tmp_path, text)
    assert (err.line, err.column) == (4, 1)
    assert ("layer 'sum' (Eltwise): bottom 1 has shape 1×3×8×8 but bottom 0 has 1×4×6×6"
            in str(err))


def test_missing_bottom_and_reused_top(tmp_path):
    err = _error(tmp_path, HEAD + 'layer { name: "r" type: "ReLU" bottom: "dta" top: "r" }\n')
    assert "layer 'r' (ReLU): bottom 'dta' is not produced by any earlier layer in the TRAIN " \
           "phase, did you mean 'data'?" in str(err)
    assert (err.line, err.column) == (2, 32)
    text = HEAD + """layer { name: "r" type: "ReLU" bottom: "data" top: "x" }
layer { name: "s" type: "Sigmoid" bottom: "data" top: "x" }"""
    assert "top 'x' is already produced by another layer" in str(_error(tmp_path, text))


def test_bad_values_and_rules(tmp_path):
    text = HEAD + """layer { name: "c" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: "four" kernel_size: 3 } }
layer { name: "r" type: "ReLU" bottom: "data" top: "r" include { phase: TRAIN }
  exclude { phase: TEST } }"""
    message = str(_error(tmp_path, text))
    assert "layer 'c' (Convolution): 'num_output' must be an integer, got 'four'" in message
    assert "layer 'r' (ReLU): give include rules or exclude rules, not both" in message


def test_a_solver_is_not_a_net(tmp_path):
    (tmp_path / "solver.prototxt").write_text('net: "n.prototxt"\nbase_lr: 0.1\n')
    with pytest.raises(NetrunError, match="is a Caffe solver, not a net"):
        netrun.load_model(tmp_path / "solver.prototxt")


def test_data_layer_with_an_unknown_source_needs_a_shape(tmp_path):
    text = """layer { name: "d" type: "Data" top: "data" top: "label"
  data_param { source: "my_lmdb" batch_size: 4 } }"""
    assert "pass input_shapes={'data': (C, H, W)}" in str(_error(tmp_path, text))
    model = net_from_text(tmp_path, text, input_shapes={"data": (3, 10, 10)})
    assert model.inputs["data"].shape == (3, 10, 10)


def test_a_net_without_layers(tmp_path):
    err = _error(tmp_path, 'name: "x"\n')
    assert str(err).startswith(f"{tmp_path / 'net.prototxt'}:1:1: net 'x' has no layers")


def test_ill_typed_layer_fields(tmp_path):
    text = HEAD + 'layer { name: 7 type: "ReLU" bottom: "data" top: "r" }\n'
    assert "'name' must be a quoted string, got 7" in str(_error(tmp_path, text))
