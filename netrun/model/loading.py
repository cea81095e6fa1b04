"""`load_model` for every model format, chosen by file extension."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from netrun.errors import NetrunError, ParseError
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


@register_format(".pbtxt", ".txt")   # .txt: x.pb.txt
def _load_pbtxt(path: Path, **options) -> Model:
    return model_from_netdef(load_netdef(str(path)), source_path=str(path), **options)


def load_model(path: str | Path, data_inputs: list[str] | None = None, **options) -> Model:
    """Load a model file: layer/ops YAML, a NetDef (.pbtxt or NetDef YAML), Caffe .prototxt.

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
