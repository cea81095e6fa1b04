"""`load_model` for every model format, chosen by file extension."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from netrun.errors import NetrunError, ParseError
from netrun.model.caffe2_compat import from_caffe2
from netrun.model.model import Model, model_from_netdef
from netrun.model.yaml_model import model_from_yaml_file
from netrun.proto.io import load_netdef
from netrun.util.registry import registrar

# Loaders by file extension: path, options -> Model. Formats defined above this layer (Caffe's
# .prototxt) register themselves with `register_format`.
Loader = Callable[..., Model]
LOADERS: dict[str, Loader] = {}


# Decorator: `fn(path, **options) -> Model` loads model files with the suffixes named.
register_format = registrar(LOADERS, "model format")


@register_format(".yaml", ".yml")
def _load_yaml(path: Path, **options) -> Model:
    return model_from_yaml_file(path, **options)


@register_format(".pbtxt", ".txt", ".pb")   # .txt: x.pb.txt; .pb: Caffe2 binary protobuf
def _load_netdef(path: Path, **options) -> Model:
    # Caffe2's formats: the net may carry arguments only Caffe2 reads (model-zoo nets do)
    net = from_caffe2(load_netdef(str(path)))
    return model_from_netdef(net, source_path=str(path), **options)


def load_model(path: str | Path, data_inputs: list[str] | None = None, **options) -> Model:
    """Load a model file: layer/ops YAML, a NetDef (.pbtxt, binary .pb or NetDef YAML), Caffe
    .prototxt, ONNX (.onnx, weights from its initializers).

    `data_inputs` names the data blobs of a bare NetDef (default: its first external input,
    as Caffe2 predict nets list it); the other external inputs that no op writes are params.
    Other options go to the format's loader (Caffe: stages, level, input_shapes).
    """
    path = Path(path)
    loader = LOADERS.get(path.suffix.lower())
    if loader is None:
        raise NetrunError(f"{path}: unknown model format '{path.suffix}'; use one of "
                          f"{', '.join(LOADERS)}")
    if not path.is_file():
        raise ParseError("no such model file", str(path))
    if data_inputs is not None:
        options["data_inputs"] = data_inputs
    return loader(path, **options)
