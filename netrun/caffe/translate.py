"""Caffe NetParameter (prototxt) -> netrun Model with init, train, test and predict nets.

The TRAIN phase gives the train net and the TEST phase the test net (layers chosen by their
include/exclude rules, with the given stages and level). The predict net is the TEST phase
without loss and metric layers (Caffe's deploy net). Parameters are named `<layer>_w`/`_b`
(BatchNorm: `_mean`, `_var`, `_factor`), or by `param { name }` when shared; a layer of the
same name in both phases shares its parameters, as Caffe's test net shares the train net's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from netrun.caffe.context import LayerContext
from netrun.caffe.fields import Fields, Problems, Skip
from netrun.caffe.fillers import filler_op
from netrun.caffe.layers import LAYERS
from netrun.caffe.layers.data import DataLayer
from netrun.caffe.phase import PhaseTranslator
from netrun.caffe.v1 import layer_messages
from netrun.core.schema import TensorSpec
from netrun.errors import NetrunError, suggest
from netrun.model import Model, Param, register_format
from netrun.proto.defs import NetDef, OperatorDef
from netrun.proto.textformat import Message, parse_file

PHASES = ("TRAIN", "TEST")
NET_FIELDS = ("name", "layer", "layers", "input", "input_shape", "input_dim", "state",
              "force_backward", "debug_info", "profile_info", "profile_iter",
              "profile_rank", "profile_iter_end")
SOLVER_FIELDS = ("base_lr", "lr_policy", "max_iter", "train_net", "test_iter", "solver_mode")


@dataclass
class CaffeModel(Model):
    """A Model translated from Caffe, with what weight import and training need besides."""

    data_layers: list[DataLayer] = field(default_factory=list)
    layer_params: dict[str, list[str]] = field(default_factory=dict)   # layer -> param blobs
    blob_names: dict[str, dict[str, str]] = field(default_factory=dict)  # net -> Caffe -> ours


class ModelTranslator:
    """Owns what the phases share: parameters and their init ops, inputs, problems."""

    def __init__(self, msg: Message, stages: Sequence[str] = (), level: int = 0,
                 input_shapes: dict[str, Sequence[int]] | None = None):
        self.source = msg.source
        self.problems = Problems(msg.source)
        self.net = Fields(msg, "net")
        name = msg.get("name")
        self.name = name if isinstance(name, str) and name else Path(self.file or "net").stem
        self.stages, self.level = set(stages), level
        try:
            self.net.get("name", "", "str")
            state = self.net.sub("state")
            self.stages |= set(state.get_all("stage", "str"))
            self.level = level or state.get("level", 0)   # an explicit level wins
            state.ignore("phase")   # the phase is ours to choose: both are translated
        except Skip as e:
            self.problems.add(e.problem.message, e.problem.position)
        self.input_shapes = {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
        self.layers = layer_messages(msg, self.problems)
        self.net.ignore("layer", "layers")
        self.reserved = {n for f, _ in self.layers for key in ("bottom", "top")
                         for n in f.value.get_all(key) if isinstance(n, str)}
        self.params: dict[str, Param] = {}
        self.init_ops: list[OperatorDef] = []
        self.layer_params: dict[str, list[str]] = {}
        self.train_params: set[str] = set()
        self.inputs: dict[str, TensorSpec] = {}
        self.class_labels: set[str] = set()
        self.data_layers: list[DataLayer] = []

    @property
    def file(self) -> str | None:
        """The prototxt's path, if it came from a file."""
        return self.source.file if self.source else None

    @property
    def param_names(self) -> set[str]:
        """Names of the parameter blobs made so far."""
        return set(self.params)

    # Shared state the phases fill -------------------------------------------------------
    def declare_input(self, t: LayerContext, name: str, shape: tuple[int, ...],
                      dtype: str) -> TensorSpec:
        """Record a model input (per-example shape; `input_shapes` overrides it)."""
        shape = self.input_shapes.get(name, shape)
        old = self.inputs.get(name)
        if old is not None and tuple(old.shape) != tuple(shape):
            raise t.skip(f"top '{name}' holds examples of shape {TensorSpec(shape)} here but "
                         f"{old} in the other phase")
        self.inputs[name] = spec = TensorSpec(tuple(shape), old.dtype if old else dtype)
        return spec

    def param(self, t: LayerContext, i: int, suffix: str, shape: tuple[int, ...], role: str,
              filler: Fields | None, default: dict | None, trainable: bool) -> str:
        """Parameter blob i of layer t (see LayerContext.param)."""
        specs = t.f.subs("param")
        spec = specs[i] if i < len(specs) else Fields(None, t.f.label)
        name = spec.get("name", "", "str") or f"{t.name}_{suffix}"
        lr_mult, decay_mult = spec.get("lr_mult", 1.0), spec.get("decay_mult", 1.0)
        spec.ignore("share_mode")
        owned = self.layer_params.setdefault(t.name, [])
        if i >= len(owned):
            owned.append(name)
        if t.train:
            self.train_params.add(name)
        old = self.params.get(name)
        if old is not None:
            if filler is not None:   # Caffe fills a shared blob once, by its first owner
                filler.ignore_all()
            if tuple(old.shape) != shape:
                raise t.skip(f"parameter '{name}' (shared with layer '{old.layer}') has shape "
                             f"{TensorSpec(old.shape)} there but {TensorSpec(shape)} here", "param")
            return name
        if name in self.reserved:
            raise t.skip(f"parameter blob '{name}' has the name of a blob of the net; name it "
                         f"with param {{ name: ... }}", "param")
        self.init_ops.append(filler_op(filler, name, shape, default))
        self.params[name] = Param(name, shape, t.name, role, lr_mult, decay_mult,
                                  trainable and lr_mult != 0)
        return name

    # Translation ------------------------------------------------------------------------
    def translate(self) -> CaffeModel:
        """Both phases, then the Model; every problem found is raised at once."""
        if not self.layers and not self.net.has("input"):
            self.problems.add(f"net '{self.name}' has no layers", self.net.position("name"))
        for f, _ in self.layers:
            type_ = f.value.get("type")
            if isinstance(type_, str) and type_ not in LAYERS:
                name = f.value.get("name", "?")
                self.problems.add(f"layer '{name}': type '{type_}' is not supported"
                                  f"{suggest(type_, LAYERS)}", f.value.field("type").position)
            elif not isinstance(type_, str):
                self.problems.add(f"layer '{f.value.get('name', '?')}': missing 'type'",
                                  f.position)
        phases = {p: self._phase(p) for p in PHASES}
        for dotted, f in self.net.unread():
            self.problems.add(f"net field '{dotted}' is not supported", f.position)
        self.problems.raise_if_any(f"Caffe net {self.file or self.name}")
        return self._assemble(phases["TRAIN"], phases["TEST"])

    def _phase(self, phase: str) -> PhaseTranslator:
        p = PhaseTranslator(self, phase)
        self._legacy_inputs(p)
        for f, fields in self.layers:
            type_ = f.value.get("type")
            try:
                if not self._included(fields, phase):
                    continue
            except Skip as e:
                self.problems.add(e.problem.message, e.problem.position)
                continue
            p.run_layer(fields, type_ if isinstance(type_, str) else "")
        return p

    def _included(self, f: Fields, phase: str) -> bool:
        """Caffe's NetStateRule check: any include rule met, and no exclude rule met."""
        include, exclude = f.subs("include"), f.subs("exclude")
        if include and exclude:
            raise f.skip("give include rules or exclude rules, not both", f.position("exclude"))
        if include:
            return any(self._meets(r, phase) for r in include)
        return not any(self._meets(r, phase) for r in exclude)

    def _meets(self, rule: Fields, phase: str) -> bool:
        if rule.get("phase", phase, "enum") != phase:
            return False
        if self.level < rule.get("min_level", self.level) or \
                self.level > rule.get("max_level", self.level):
            return False
        if any(s not in self.stages for s in rule.get_all("stage", "str")):
            return False
        return not any(s in self.stages for s in rule.get_all("not_stage", "str"))

    def _legacy_inputs(self, p: PhaseTranslator) -> None:
        """NetParameter's own `input:` with `input_shape { dim }` or groups of 4 `input_dim`."""
        try:
            names = self.net.get_all("input", "str")
            shapes = [s.get_all("dim", "int") for s in self.net.subs("input_shape")]
            dims = self.net.get_all("input_dim", "int")
        except Skip as e:   # a mistyped value: reported once, with the layers' problems
            self.problems.add(e.problem.message, e.problem.position)
            return
        if not names and not shapes and not dims:
            return
        if dims and not shapes:
            shapes = [dims[k:k + 4] for k in range(0, len(dims), 4)]
        if len(shapes) != len(names) or any(not s for s in shapes):
            if names:
                self.problems.add(f"the net declares {len(names)} input(s) but "
                                  f"{len(shapes)} shape(s)", self.net.position("input"))
            return
        t = LayerContext(p, self.net, "input", "Input", [], names)
        try:
            for i, shape in enumerate(shapes):
                t.input(i, shape)
        except Skip as e:
            self.problems.add(e.problem.message, e.problem.position)
            p.poisoned.update(names)
            return
        p._commit(t, [])

    # Assembly ---------------------------------------------------------------------------
    def _assemble(self, train: PhaseTranslator, test: PhaseTranslator) -> CaffeModel:
        name = self.name
        predict_ops, outputs = _predict(test)
        read = {b for o in predict_ops for b in o.inputs}
        labels = [n for n in self.inputs if n not in read]
        data = [n for n in self.inputs if n not in labels]
        for n in self.class_labels:
            self.inputs[n] = TensorSpec(self.inputs[n].shape, "int32")
        params = list(self.params.values())
        for p in params:
            p.trainable = p.trainable and p.name in self.train_params
        names = [p.name for p in params]
        nets = {}
        for phase, label in ((train, "train"), (test, "test")):
            loss = phase.total_loss()
            heads = ([loss] if loss else []) + phase.metrics
            nets[label] = (NetDef(f"{name}_{label}", phase.ops, list(self.inputs) + names,
                                  heads or list(outputs)), loss, phase)
        train_loss, test_loss = nets["train"][1], nets["test"][1]
        if train_loss and test_loss and train_loss != test_loss:
            raise NetrunError(f"{self.file}: the TRAIN loss is blob '{train_loss}' but the "
                              f"TEST loss is '{test_loss}'; netrun needs one name")
        predict_params = [n for n in names if n in read]
        blobs = read | {b for o in predict_ops for b in o.outputs}
        return CaffeModel(
            name=name, init_net=NetDef(f"{name}_init", list(self.init_ops), [], names),
            train_net=nets["train"][0], test_net=nets["test"][0],
            predict_net=NetDef(f"{name}_predict", predict_ops, data + predict_params, outputs),
            inputs=dict(self.inputs), params=params, outputs=outputs, loss=train_loss,
            metrics=list(test.metrics), source_path=self.file, labels=labels,
            data_layers=self.data_layers, layer_params=dict(self.layer_params),
            blob_names={"train": dict(train.cur), "test": dict(test.cur),
                        "predict": {k: v for k, v in test.cur.items() if v in blobs}})


def _predict(test: PhaseTranslator) -> tuple[list[OperatorDef], list[str]]:
    """Ops and outputs of the predict net: the TEST phase without loss and metric layers
    (and whatever depends on them); outputs are the tops no later layer reads."""
    tainted: set[str] = set()
    kept = []
    for r in test.records:
        if r.head or any(b in tainted for b in r.bottoms):
            tainted.update(r.tops)
            continue
        kept.append(r)
    outputs: list[str] = []
    for k, r in enumerate(kept):
        if r.data:
            continue
        later = {b for q in kept[k + 1:] for b in q.bottoms}
        outputs += [t for t in r.tops if t not in later and t not in outputs]
    keep = {id(o) for r in kept for o in r.ops}
    # StopGradient copies (propagate_down: false) sit outside the records: keep the ones
    # that kept ops read.
    read = {b for r in kept for o in r.ops for b in o.inputs}
    keep |= {id(o) for o in test.ops if o.type == "StopGradient" and o.outputs[0] in read}
    return [o for o in test.ops if id(o) in keep], outputs


@register_format(".prototxt")
def load_caffe_model(path: str | Path, stages: Sequence[str] = (), level: int = 0,
                     input_shapes: dict[str, Sequence[int]] | None = None,
                     data_inputs: list[str] | None = None) -> CaffeModel:
    """Translate a Caffe net prototxt (`layer {}` or legacy V1 `layers {}`) into a Model.

    `stages` and `level` select layers by their include/exclude rules (with the file's own
    `state`); `input_shapes` gives per-example shapes for data layers whose shape netrun
    cannot tell from their source. `data_inputs` is accepted for load_model's signature; a
    prototxt names its own inputs.
    """
    msg = parse_file(path)
    if not msg.has("layer") and not msg.has("layers") and any(msg.has(k) for k in SOLVER_FIELDS):
        raise NetrunError(f"{path} is a Caffe solver, not a net: train it with "
                          f"`netrun train {path}` (netrun.caffe.solver_to_config)")
    model = ModelTranslator(msg, stages, level, input_shapes).translate()
    if data_inputs is not None:
        unknown = [d for d in data_inputs if d not in model.inputs]
        if unknown:
            raise NetrunError(f"{path}: the net has no input '{unknown[0]}'"
                              f"{suggest(unknown[0], model.inputs)}")
    return model
