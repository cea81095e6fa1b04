"""A netrun model as a Caffe NetParameter in text format (`netrun convert MODEL OUT.prototxt`).

`net="predict"` writes a deploy file: one Input layer per data input (batch `batch`), then
the predict net's layers. `net="train"` writes a train_val file: the data layers (Caffe's own
Data/ImageData/HDF5Data layers when the model came from a prototxt that had them, else one
Input layer standing in for the data, which says so in a comment), then the train net's
layers; the layers only one phase has (Accuracy, say) carry `include { phase }`, and the
loss layers carry the loss_weight that makes Caffe's objective the model's loss.

Blob names stay netrun's where Caffe allows: an op that overwrites its input stays in place,
a blob written twice otherwise gets a fresh name for its later version. Parameters keep
their lr_mult and decay_mult in `param { }` (statistics that are saved but not trained:
lr_mult 0), and a parameter that several layers use is named there so Caffe shares it.
Everything that has no Caffe layer is listed at once in a CaffeExportError.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from netrun.caffe.export_layers import (
    CONVERTERS,
    LOSS_LAYERS,
    CaffeLayer,
    Inexpressible,
    ParamRef,
    filler_message,
)
from netrun.core.shape_inference import OpShapes, infer_shapes
from netrun.errors import NetrunError
from netrun.model import Model
from netrun.proto.defs import NetDef, OperatorDef
from netrun.proto.textformat import Enum, Message, format_message, format_string
from netrun.util.names import unique_name
from netrun.version import __version__

NETS = ("predict", "train")
# netrun ops that compute a Caffe loss layer's top, and which of their outputs it is.
LOSS_OPS = {"SoftmaxWithLoss": 1}


class CaffeExportError(NetrunError):
    """A model with ops that no Caffe layer computes; `problems` lists every one."""

    def __init__(self, message: str, problems: list[str]):
        super().__init__(message)
        self.problems = problems


@dataclass
class CaffeNet:
    """A model as Caffe layers: what the prototxt and the caffemodel are written from."""

    name: str
    kind: str                        # "deploy" or "train_val"
    layers: list[CaffeLayer]
    notes: list[str] = field(default_factory=list)
    params: dict = field(default_factory=dict)     # netrun Param by name

    def text(self, source: str | None = None) -> str:
        """The prototxt: a header comment (what netrun could not say exactly), then the net."""
        title = (f"{self.name}: a Caffe {self.kind} net written by netrun {__version__}"
                 + (f" from {source}" if source else "") + ".")
        # Every line goes through _wrap, which splits at any whitespace: a name holding a
        # newline cannot end the comment early.
        header = [f"# {line}" for note in (title, *self.notes) for line in _wrap(note)]
        owners: dict[str, set[str]] = defaultdict(set)
        for layer in self.layers:
            for ref in layer.params:
                if ref.blob:
                    owners[ref.blob].add(layer.name)
        body = "".join(f"layer {{\n{format_message(self._message(layer, owners), 2)}}}\n"
                       for layer in self.layers)
        return "\n".join(header) + f"\nname: {format_string(self.name)}\n" + body

    def weight_layers(self) -> list[CaffeLayer]:
        """The layers that own parameter blobs, each name once (a caffemodel's layers)."""
        seen: set[str] = set()
        out = []
        for layer in self.layers:
            if layer.params and layer.name not in seen:
                seen.add(layer.name)
                out.append(layer)
        return out

    def _message(self, layer: CaffeLayer, owners: dict[str, set[str]]) -> Message:
        m = Message().add("name", layer.name).add("type", layer.type)
        for b in layer.bottoms:
            m.add("bottom", b)
        for t in layer.tops:
            m.add("top", t)
        if layer.phase:
            m.add("include", Message().add("phase", Enum(layer.phase)))
        if layer.loss_weight is not None:
            m.add("loss_weight", float(layer.loss_weight))
        for spec in self._param_specs(layer, owners):
            m.add("param", spec)
        for flows in layer.propagate_down or []:
            m.add("propagate_down", flows)
        for name, value in layer.body:
            if name == "batch_norm_param" and layer.global_stats is not None:
                value = Message([*Message().add("use_global_stats", layer.global_stats).fields,
                                 *value.fields])
            if not isinstance(value, Message) or len(value):
                m.add(name, value)
        return m

    def _param_specs(self, layer: CaffeLayer, owners: dict[str, set[str]]) -> list[Message]:
        specs = []
        for ref in layer.params:
            spec = Message()
            if ref.blob and len(owners[ref.blob]) > 1:
                spec.add("name", ref.blob)
            if ref.statistic:
                lr, decay = 0.0, 0.0
            else:
                p = self.params[ref.blob]
                lr, decay = (p.lr_mult if p.trainable else 0.0), p.decay_mult
            spec.add("lr_mult", _number(lr))
            if decay != 1.0:
                spec.add("decay_mult", _number(decay))
            specs.append(spec)
        while specs and list(specs[-1]) == [("lr_mult", 1)]:   # Caffe's default
            specs.pop()
        return specs


def _number(v: float) -> int | float:
    """An integral multiplier as an int (`lr_mult: 2`, as Caffe's own files write it)."""
    return int(v) if float(v).is_integer() else float(v)


def _wrap(note: str, width: int = 96) -> list[str]:
    lines, line = [], ""
    for word in note.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = "  " + word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line] if line else lines


# One phase ------------------------------------------------------------------------------
class PhaseWriter:
    """Converts one net, as one Caffe phase, into layers (see export_layers for the ops).

    Keeps what the converters ask about: each netrun blob's current Caffe name, aliases
    (ops with no layer), which op reads which blob version, and the folds planned up front
    (a transposed or all-zero InnerProduct operand, the loss as a weighted sum)."""

    def __init__(self, model: Model, net: NetDef, phase: str, batch: int, deploy: bool,
                 fillers: bool, taken_layer_names: Sequence[str] = ()):
        self.model, self.net, self.phase, self.deploy = model, net, phase, deploy
        self.ops = list(net.ops)
        self.params = {p.name: p for p in model.params}
        self.fills = ({o.outputs[0]: o for o in model.init_net.ops if o.outputs}
                      if fillers else None)
        self.shapes = infer_shapes(net, model.input_specs(batch))
        self.keep = set(net.external_outputs)
        self.current: dict[str, str] = {n: n for n in model.inputs}   # netrun -> Caffe blob
        self.taken: set[str] = set(model.inputs)                       # Caffe blob names used
        self.aliases: dict[str, tuple[str, str, bool]] = {}            # blob -> (blob, Caffe, stop)
        self.layer_names: set[str] = set(taken_layer_names)
        self.layers: list[CaffeLayer] = []
        self.problems: list[str] = []
        self.claimed: set[int] = set()
        self.transposed: dict[str, str] = {}       # FC weight blob -> the parameter it transposes
        self.zero_biases: set[str] = set()         # FC bias blobs the net fills with zeros
        self.loss_weights: dict[str, float] = {}   # loss layer top -> its weight in the loss
        self.floor_pools: list[str] = []
        self.moving_averages: list[str] = []
        self.unfilled: list[str] = []
        self.coefficients: dict[int, tuple[list[str], list[float]]] = {}   # Sum -> Eltwise
        self._at = 0
        self._index()
        if not deploy and model.loss:
            self._plan_loss(model.loss)
        self._plan_folds()

    # What converters ask -----------------------------------------------------------------
    def is_param(self, blob: str) -> bool:
        """Whether `blob` is a parameter of the model (not an activation)."""
        return blob in self.params and blob not in self.current

    def param(self, blob: str, statistic: bool = False) -> ParamRef:
        """A parameter as a layer blob; an operand computed in the net cannot be one."""
        if not self.is_param(blob):
            raise Inexpressible(f"'{blob}' is computed in the net, but the Caffe layer keeps "
                                f"it as a parameter")
        return ParamRef(blob, statistic=statistic or not self.params[blob].trainable
                        and self.params[blob].role.startswith("running"))

    def filler(self, msg: Message, key: str, blob: str) -> None:
        """Add the Caffe filler of parameter `blob` (train_val files only)."""
        if self.fills is None or blob not in self.params:
            return
        fill = self.fills.get(blob)
        filler = filler_message(fill) if fill is not None else None
        if filler is None:
            self.unfilled.append(blob)
        else:
            msg.add(key, filler)

    def shapes_of(self, index: int) -> OpShapes:
        """Shape inference's record of op `index`."""
        return self.shapes.ops[index]

    def is_read(self, op: OperatorDef, blob: str) -> bool:
        """Whether a later op, or the net's caller, reads this output of `op`."""
        return bool(self.readers.get((self._at, blob))) or (
            blob in self.keep and self.last_writer.get(blob) == self._at)

    def sole_reader(self, op: OperatorDef, blob: str) -> tuple[int, OperatorDef] | None:
        """The one later op that reads this output of the current op (once), if only it does."""
        return self._only_reader(self._at, blob)

    def eltwise_terms(self, op: OperatorDef) -> tuple[list[str], list[float] | None]:
        """The bottoms of the current Sum and Eltwise's coeff (None: all 1)."""
        bottoms, coeffs = self.coefficients.get(self._at, (list(op.inputs), None))
        return bottoms, coeffs

    def untouched(self, blob: str, until: int) -> bool:
        """Whether no op after the current one and before op `until` reads or writes `blob`."""
        return not any(blob in o.inputs or blob in o.outputs
                       for o in self.ops[self._at + 1:until])

    def claim(self, index: int) -> None:
        """Op `index` is folded into the current layer: it gets no layer of its own."""
        self.claimed.add(index)

    def alias(self, blob: str, of: str, stop: bool = False) -> None:
        """`blob` is `of` under another name (an op with no layer); `stop`: no gradient."""
        source, caffe, stopped = self._bottom(of)
        self.aliases[blob] = (source, caffe, stopped or stop)

    def note_floor(self, layer: str, size, got, caffe) -> None:
        """A Pooling layer that needs round_mode: FLOOR."""
        self.floor_pools.append(f"{layer} ({size[0]}×{size[1]} -> {got[0]}×{got[1]}, "
                                f"not {caffe[0]}×{caffe[1]})")

    def note_moving_average(self, layer: str) -> None:
        """A BatchNorm from netrun's SpatialBN (its statistics accumulate differently)."""
        self.moving_averages.append(layer)

    def add(self, type: str, op: OperatorDef, bottoms: Sequence[str], tops: Sequence[str],
            body: Message, params: Sequence[ParamRef] = (), name: str | None = None,
            global_stats: bool | None = None, loss_scale: float = 1.0) -> CaffeLayer:
        """Add a layer reading and writing netrun blobs; returns it with Caffe names."""
        resolved = [self._bottom(b) for b in bottoms]      # may raise: no name taken yet
        layer_name = self._layer_name(name or op.name or tops[0])
        caffe_tops, in_place = [], []
        for k, top in enumerate(tops):
            same = k < len(resolved) and resolved[k][0] == top and top in self.current
            caffe_tops.append(self.current[top] if same else
                              self._fresh(top if top not in self.taken else f"{top}_{layer_name}"))
            in_place.append(same)
        for top, caffe in zip(tops, caffe_tops):
            self.aliases.pop(top, None)
            self.current[top] = caffe
        layer = CaffeLayer(layer_name, type, [c for _, c, _ in resolved], caffe_tops, body,
                           list(params), global_stats, in_place=tuple(in_place))
        if self.phase == "TRAIN" and not self.deploy and any(s for _, _, s in resolved):
            layer.propagate_down = [not s for _, _, s in resolved]
        if type in LOSS_LAYERS:
            weight = self.loss_weights.get(tops[0], 0.0) * loss_scale
            layer.loss_weight = None if weight == 1.0 else weight
        self.layers.append(layer)
        return layer

    # The walk ----------------------------------------------------------------------------
    def run(self) -> "PhaseWriter":
        """Convert every op not folded into another; problems are collected, not raised."""
        for i, op in enumerate(self.ops):
            if i in self.claimed:
                continue
            self._at = i
            convert = CONVERTERS.get(op.type)
            try:
                if convert is None:
                    raise Inexpressible("no Caffe layer computes it")
                convert(self, op, self.shapes.ops[i])
            except (Inexpressible, NetrunError) as e:
                self.problems.append(f"op {op.label}: {e}")
                for out in op.outputs:        # readers are converted as if it were there
                    self.current.setdefault(out, out)
        return self

    def outputs(self) -> list[str]:
        """The Caffe names of the net's external outputs."""
        return [self.current.get(b, b) for b in self.net.external_outputs]

    # Internals ---------------------------------------------------------------------------
    def _index(self) -> None:
        writer: dict[str, int] = {}
        self.sources: list[list[int]] = []
        self.readers: dict[tuple[int, str], list[int]] = defaultdict(list)
        for i, op in enumerate(self.ops):
            self.sources.append([writer.get(b, -1) for b in op.inputs])
            for b in op.inputs:
                self.readers[(writer.get(b, -1), b)].append(i)
            for out in op.outputs:
                writer[out] = i
        self.last_writer = writer

    def _only_reader(self, index: int, blob: str) -> tuple[int, OperatorDef] | None:
        readers = self.readers.get((index, blob), [])
        if len(readers) != 1 or (blob in self.keep and self.last_writer.get(blob) == index):
            return None
        return readers[0], self.ops[readers[0]]

    def _source(self, index: int, k: int) -> tuple[int, OperatorDef] | None:
        j = self.sources[index][k] if k < len(self.sources[index]) else -1
        return (j, self.ops[j]) if j >= 0 else None

    def _plan_folds(self) -> None:
        """InnerProduct's transpose: true and bias_term: false, and Eltwise's coeff, which
        translation spelled as a Transpose of the weight and a zero fill feeding the FC op,
        and as Scale ops feeding a Sum."""
        for i, op in enumerate(self.ops):
            if op.type == "Sum" and i not in self.claimed:
                self._plan_coefficients(i, op)
            if op.type != "FC" or len(op.inputs) < 3:
                continue
            src = self._source(i, 1)
            if src and src[1].type == "Transpose" and self._only_reader(src[0], op.inputs[1]) \
                    and list(src[1].args.get("axes") or []) == [1, 0] \
                    and self.is_param(src[1].inputs[0]):
                self.claimed.add(src[0])
                self.transposed[op.inputs[1]] = src[1].inputs[0]
            src = self._source(i, 2)
            if src and src[1].type == "ConstantFill" and not src[1].inputs \
                    and src[1].args.get("value", 0.0) == 0 \
                    and self._only_reader(src[0], op.inputs[2]):
                self.claimed.add(src[0])
                self.zero_biases.add(op.inputs[2])

    def _plan_coefficients(self, j: int, op: OperatorDef) -> None:
        bottoms, coeffs, folded = [], [], []
        for k, blob in enumerate(op.inputs):
            src = self._source(j, k)
            if src and src[1].type == "Scale" and self._only_reader(src[0], blob) and not any(
                    src[1].inputs[0] in o.outputs for o in self.ops[src[0] + 1:j]):
                bottoms.append(src[1].inputs[0])
                coeffs.append(float(src[1].args.get("scale", 1.0)))
                folded.append(src[0])
            else:
                bottoms.append(blob)
                coeffs.append(1.0)
        if folded and len(op.inputs) > 1:
            self.claimed.update(folded)
            self.coefficients[j] = (bottoms, coeffs)

    def _plan_loss(self, loss: str) -> None:
        """Loss layers' weights: the loss is one of their tops, or a (scaled) sum of them."""
        j = self.last_writer.get(loss)
        if j is None:
            return
        op = self.ops[j]
        if LOSS_OPS.get(op.type) is not None and op.outputs[LOSS_OPS[op.type]] == loss:
            self.loss_weights[loss] = 1.0
            return
        weights: dict[str, float] = defaultdict(float)
        folded = []
        for k, blob in enumerate(op.inputs if op.type == "Sum" else []):
            src = self._source(j, k)
            scale = 1.0
            if src and src[1].type == "Scale" and self._only_reader(src[0], blob):
                scale = float(src[1].args.get("scale", 1.0))
                folded.append(src[0])
                blob, src = src[1].inputs[0], self._source(src[0], 0)
            if not (src and LOSS_OPS.get(src[1].type) is not None
                    and src[1].outputs[LOSS_OPS[src[1].type]] == blob):
                break
            weights[blob] += scale
        else:
            if op.type == "Sum":
                self.claimed.update([j, *folded])
                self.loss_weights = dict(weights)
                return
        self.problems.append(f"the loss '{loss}' comes from op {op.label}; a Caffe net's loss "
                             f"is a weighted sum of loss layers' tops (SoftmaxWithLoss)")

    def _bottom(self, blob: str) -> tuple[str, str, bool]:
        """(netrun blob, Caffe blob, gradient stopped) that a layer reading `blob` reads."""
        if blob in self.aliases:
            return self.aliases[blob]
        if blob in self.current:
            return blob, self.current[blob], False
        if blob in self.params:
            raise Inexpressible(f"it reads parameter '{blob}' as data; Caffe layers keep "
                                f"parameters inside")
        raise Inexpressible(f"it reads '{blob}', which no Caffe layer before it writes")

    def _fresh(self, base: str) -> str:
        return unique_name(base, self.taken)

    def _layer_name(self, base: str) -> str:
        return unique_name(base, self.layer_names)


# Inputs and data layers -----------------------------------------------------------------
def _shape_message(dims: Sequence[int]) -> Message:
    m = Message()
    for d in dims:
        m.add("dim", int(d))
    return m


def _input_layer(name: str, model: Model, inputs: Sequence[str], batch: int,
                 phase: str | None = None) -> CaffeLayer:
    p = Message()
    for n in inputs:
        p.add("shape", _shape_message((batch, *model.inputs[n].shape)))
    return CaffeLayer(name, "Input", [], list(inputs), Message().add("input_param", p),
                      phase=phase)


def _transform(transform: dict) -> Message:
    m = Message()
    for key, kind in (("scale", float), ("mirror", bool), ("crop_size", int), ("mean_file", str)):
        if key in transform:
            m.add(key, kind(transform[key]))
    for v in transform.get("mean_value") or []:
        m.add("mean_value", float(v))
    return m


def _data_layer(d) -> tuple[CaffeLayer, str | None]:
    """A Caffe data layer from a translated one (netrun.caffe.DataLayer), and for a Data
    layer the backend it was given."""
    body, note = Message(), None
    if d.transform:
        body.add("transform_param", _transform(d.transform))
    p = Message().add("source", d.source or "").add("batch_size", int(d.batch_size or 1))
    if d.type == "Data":
        # netrun tells the backend from the database's files; Caffe needs it said.
        backend = "LEVELDB" if "leveldb" in (d.source or "").lower() else "LMDB"
        p.add("backend", Enum(backend))
        if d.params.get("color"):
            p.add("force_encoded_color", True)
        body.add("data_param", p)
        note = f"{d.name} ({d.phase}): {backend}"
    elif d.type == "ImageData":
        for key in ("root_folder", "new_height", "new_width", "is_color", "shuffle"):
            if key in d.params:
                p.add(key, d.params[key])
        body.add("image_data_param", p)
    else:
        body.add("hdf5_data_param", p)
    return CaffeLayer(d.name, d.type, [], list(d.tops), body, phase=d.phase), note


def _data_layers(model: Model, batch: int, phases: Sequence[str]
                 ) -> tuple[list[CaffeLayer], list[str]]:
    """The data layers of a train_val file, and notes about them."""
    layers, notes, backends = [], [], []
    data = [d for d in getattr(model, "data_layers", []) if d.phase in phases]
    for d in data:
        layer, backend = _data_layer(d)
        layers.append(layer)
        if backend:
            backends.append(backend)
    if backends:
        notes.append("Data layer backend told from the source name (netrun reads the "
                     "database's own files): " + ", ".join(backends) + ".")
    missing = {ph: [n for n in model.inputs if not any(n in d.tops for d in data
                                                       if d.phase == ph)] for ph in phases}
    groups = ([(None, missing[phases[0]])] if all(missing[ph] == missing[phases[0]]
                                                  for ph in phases)
              else [(ph, missing[ph]) for ph in phases])
    for phase, names in groups:
        if names:
            suffix = f"_{phase.lower()}" if phase else ""
            layers.append(_input_layer(f"input{suffix}", model, names, batch, phase))
            notes.append(f"Input layer 'input{suffix}' stands for the data ({', '.join(names)}"
                         f", batch {batch}): the model names no data source. Put a Data layer "
                         f"there to train in Caffe.")
    return layers, notes


# Phases together --------------------------------------------------------------------------
def _mergeable(a: CaffeLayer, b: CaffeLayer, bottoms: list[str]) -> bool:
    """Whether TEST layer b (bottoms renamed) is TRAIN layer a, Caffe's phase aside."""
    return (a.type == b.type and a.bottoms == bottoms and a.body == b.body
            and a.params == b.params and a.loss_weight == b.loss_weight
            and len(a.tops) == len(b.tops) and not (a.global_stats and b.global_stats is False))


class _Unmergeable(Exception):
    """A TEST layer reads a blob version that the TRAIN layers overwrote in place."""


def merge_phases(train: list[CaffeLayer], test: list[CaffeLayer],
                 inputs: Sequence[str]) -> list[CaffeLayer]:
    """One layer list for both phases: a TEST layer equal to the TRAIN layer of its name is
    that layer (no include rule); the others carry include { phase }. TEST-only layers go
    after the last shared layer before them, with their blobs renamed to TRAIN's. Where
    that cannot be done (a TEST layer reads a version TRAIN overwrote in place), the phases
    are written apart."""
    try:
        return _merged(train, test, inputs)
    except _Unmergeable:
        for layer in train:
            layer.phase = "TRAIN"
        for layer in test:
            layer.phase = "TEST"
        return _phase_defaults(train + test)


def _merged(train: list[CaffeLayer], test: list[CaffeLayer],
            inputs: Sequence[str]) -> list[CaffeLayer]:
    by_name = {layer.name: k for k, layer in enumerate(train)}
    rename: dict[str, str] = {}          # TEST blob (latest version) -> TRAIN blob
    dead: set[str] = set()               # TEST blobs whose TRAIN version is overwritten
    train_tops = {t for layer in train for t in layer.tops} | set(inputs)
    shared: dict[int, CaffeLayer] = {}
    after: dict[int, list[CaffeLayer]] = defaultdict(list)
    anchor = -1
    for layer in test:
        bottoms = [rename.get(b, b) for b in layer.bottoms]
        reads_dead = any(b in dead for b in layer.bottoms)
        k = by_name.get(layer.name)
        if k is not None and k not in shared and not reads_dead \
                and _mergeable(train[k], layer, bottoms):
            shared[k] = layer
            anchor = max(anchor, k)
            for i, (top, mine) in enumerate(zip(layer.tops, train[k].tops)):
                if train[k].in_place[i] and not layer.in_place[i]:
                    dead.add(layer.bottoms[i])       # TRAIN overwrote it; TEST kept it
                rename[top] = mine
                dead.discard(top)
            a, b = train[k].global_stats, layer.global_stats
            train[k].global_stats = None if (a, b) == (False, True) else a
            continue
        if reads_dead:
            raise _Unmergeable(layer.name)
        tops = []
        for i, top in enumerate(layer.tops):
            new = bottoms[i] if layer.in_place[i] else (
                _unused(f"{top}_test", train_tops) if top in train_tops else top)
            train_tops.add(new)
            rename[top] = new
            dead.discard(top)
            tops.append(new)
        layer.bottoms, layer.tops, layer.phase = bottoms, tops, "TEST"
        layer.propagate_down = None
        after[anchor].append(layer)
    out = list(after[-1])
    for k, layer in enumerate(train):
        if k not in shared:
            layer.phase = "TRAIN"
        out.append(layer)
        out += after[k]
    return _phase_defaults(out)


def _phase_defaults(layers: list[CaffeLayer]) -> list[CaffeLayer]:
    """Drop use_global_stats where it is its phase's default (TRAIN: false, TEST: true)."""
    for layer in layers:
        if layer.phase and layer.global_stats == (layer.phase == "TEST"):
            layer.global_stats = None
    return layers


def _unused(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


# Entry point ------------------------------------------------------------------------------
def to_caffe(model: Model, net: str = "predict", batch: int = 1) -> CaffeNet:
    """The model's predict net as a deploy net, or its train (and test) net as train_val."""
    if net not in NETS:
        raise NetrunError(f"a Caffe prototxt holds a deploy net (predict) or a train_val net "
                          f"with both phases (train), not '{net}'")
    unknown = [n for n, spec in model.inputs.items() if spec is None]
    if unknown or not model.inputs:
        raise NetrunError(f"model '{model.name}' gives no shape for its input(s) "
                          f"{', '.join(unknown) or '(none declared)'}; a Caffe net declares "
                          f"them (convert from a model YAML or prototxt that has them)")
    if net == "predict":
        names = list(model.data_inputs)
        inputs = [_input_layer(n, model, [n], batch) for n in names]
        writer = PhaseWriter(model, model.predict_net, "TEST", batch, deploy=True,
                             fillers=False, taken_layer_names=names).run()
        writers, layers, notes = [writer], inputs + writer.layers, []
    else:
        phases = ("TRAIN", "TEST") if model.test_net is not None else ("TRAIN",)
        data, notes = _data_layers(model, batch, phases)
        taken = [d.name for d in data]
        writers = [PhaseWriter(model, model.net(p.lower()), p, batch, deploy=False,
                               fillers=True, taken_layer_names=taken).run() for p in phases]
        layers = writers[0].layers
        if len(writers) == 2:
            layers = merge_phases(layers, writers[1].layers, list(model.inputs))
        else:
            for layer in layers:
                if layer.global_stats is False:
                    layer.global_stats = None
        layers = data + layers
    problems = list(dict.fromkeys(p for w in writers for p in w.problems))
    if problems:
        raise CaffeExportError(
            f"model '{model.name}' cannot be written as a Caffe net; {len(problems)} "
            f"problem(s):\n  - " + "\n  - ".join(problems), problems)
    return CaffeNet(model.name, "deploy" if net == "predict" else "train_val", layers,
                    _notes(writers) + notes, {p.name: p for p in model.params})


def _notes(writers: list[PhaseWriter]) -> list[str]:
    floors = list(dict.fromkeys(n for w in writers for n in w.floor_pools))
    bns = list(dict.fromkeys(n for w in writers for n in w.moving_averages))
    unfilled = list(dict.fromkeys(n for w in writers for n in w.unfilled))
    notes = []
    if floors:
        notes.append("round_mode: FLOOR on Pooling " + ", ".join(floors) + ": netrun pools "
                     "these in floor mode; BVLC Caffe reads round_mode (2017 on), older Caffe "
                     "rounds up and gets other sizes.")
    if bns:
        notes.append("BatchNorm " + ", ".join(bns) + ": netrun's SpatialBN; moving_average_"
                     "fraction is its momentum. Caffe accumulates the statistics as a "
                     "normalized moving sum with the unbiased variance, netrun as a moving "
                     "average: outputs and training steps agree, the statistics that training "
                     "accumulates differ slightly. The caffemodel holds them with factor 1.")
    if unfilled:
        notes.append("No Caffe filler says the initial values of " + ", ".join(unfilled)
                     + "; take them from a caffemodel (netrun convert --weights).")
    return notes
