"""A model: its init/train/test/predict nets, data inputs and parameters.

Nets do not depend on the batch size: per-example input shapes live in `Model.inputs` and
the batch is added when shapes are inferred (`Model.input_specs`, `Model.infer_shapes`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from netrun.core.schema import TensorSpec
from netrun.core.shape_inference import count_params, infer_shapes
from netrun.errors import NetrunError, ShapeError, suggest
from netrun.proto.defs import NetDef


@dataclass
class Param:
    """A learnable (or running-statistic) blob, its shape and its solver multipliers."""

    name: str
    shape: tuple[int, ...] | None = None   # None: unknown (a NetDef file without an init net)
    layer: str = ""
    role: str = "weight"                   # weight | bias | scale | running_mean | running_var
    lr_mult: float = 1.0
    decay_mult: float = 1.0
    trainable: bool = True                 # False for BN running stats: saved, never updated


NETS = ("init", "train", "test", "predict")


@dataclass
class Model:
    """Nets and metadata of one model. `inputs` are per-example specs (None: shape unknown)."""

    name: str
    init_net: NetDef
    train_net: NetDef
    predict_net: NetDef
    inputs: dict[str, TensorSpec | None] = field(default_factory=dict)
    params: list[Param] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)      # what the predict net produces
    loss: str | None = None
    metrics: list[str] = field(default_factory=list)
    source_path: str | None = None
    labels: list[str] = field(default_factory=list)       # inputs the predict net does not read
    # Test-mode forward ops plus loss and metrics (Caffe's TEST phase); the train net if None.
    test_net: NetDef | None = None

    def net(self, which: str) -> NetDef:
        """One of the nets by name: init, train, test or predict."""
        if which not in NETS:
            raise NetrunError(f"unknown net '{which}'{suggest(which, NETS)}; use one of "
                              f"{', '.join(NETS)}")
        if which == "test":
            return self.test_net or self.train_net
        return getattr(self, f"{which}_net")

    @property
    def data_inputs(self) -> list[str]:
        """Inputs that the predict net reads (everything but labels)."""
        return [n for n in self.inputs if n not in self.labels]

    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.params]

    def input_specs(self, batch_size: int = 1,
                    overrides: Mapping[str, TensorSpec] | None = None) -> dict[str, TensorSpec]:
        """Full specs (batch first) of the inputs and known params; overrides are full shapes."""
        specs = {p.name: TensorSpec(p.shape) for p in self.params if p.shape is not None}
        for name, spec in self.inputs.items():
            if spec is not None:
                specs[name] = TensorSpec((batch_size, *spec.shape), spec.dtype)
        specs.update(overrides or {})
        return specs

    def infer_shapes(self, net: str = "predict", batch_size: int = 1,
                     overrides: Mapping[str, TensorSpec] | None = None):
        """Shape and cost inference of one net (see netrun.core.shape_inference.NetShapes)."""
        return infer_shapes(self.net(net), self.input_specs(batch_size, overrides))

    def param_count(self, overrides: Mapping[str, TensorSpec] | None = None) -> int:
        """Number of parameter elements (running statistics included, as Caffe counts them)."""
        specs = self.input_specs(1, overrides)
        missing = [p.name for p in self.params if p.name not in specs]
        if missing:
            raise ShapeError(f"the shape of parameter '{missing[0]}' is unknown (no init net "
                             f"creates it); pass --input {missing[0]}=D1,D2,...")
        return count_params(specs, self.param_names)


def model_from_netdef(net: NetDef, source_path: str | None = None,
                      data_inputs: list[str] | None = None) -> Model:
    """A model around one NetDef with no init net: it serves as train and predict net."""
    written = {b for o in net.ops for b in o.outputs}
    external = [b for b in net.external_inputs if b not in written]
    if not external:  # no external_input list: every blob read before it is written
        seen: set[str] = set()
        for o in net.ops:
            external += [b for b in o.inputs if b not in seen and b not in external]
            seen.update(o.outputs)
    data = list(data_inputs) if data_inputs is not None else external[:1]
    unknown = [d for d in data if d not in external]
    if unknown:
        raise NetrunError(f"net '{net.name}' has no external input '{unknown[0]}'"
                          f"{suggest(unknown[0], external)}")
    params = [Param(b) for b in external if b not in data]
    outputs = list(net.external_outputs) or (list(net.ops[-1].outputs[:1]) if net.ops else [])
    return Model(name=net.name or Path(source_path or "model").stem,
                 init_net=NetDef(f"{net.name}_init" if net.name else "init"),
                 train_net=net, predict_net=net, inputs={d: None for d in data},
                 params=params, outputs=outputs, source_path=source_path)
