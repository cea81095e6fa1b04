"""Legacy V1 nets (`layers { type: CONVOLUTION ... }`) brought to the current `layer {}` form.

V1 layers name their type with an enum, give learning-rate and decay multipliers as repeated
`blobs_lr` / `weight_decay`, share parameters by `param: "name"`, and (older still) keep the
data transformation inside the data layer's own parameters. Converted messages keep the
source positions of their fields, so errors still point into the file.
"""
from __future__ import annotations

from netrun.caffe.fields import Fields, Problems
from netrun.proto.textformat import Field, Message

# V1LayerParameter.LayerType -> LayerParameter.type (caffe.proto; by name and by number).
V1_TYPES = {
    "ABSVAL": (35, "AbsVal"), "ACCURACY": (1, "Accuracy"), "ARGMAX": (30, "ArgMax"),
    "BNLL": (2, "BNLL"), "CONCAT": (3, "Concat"), "CONTRASTIVE_LOSS": (37, "ContrastiveLoss"),
    "CONVOLUTION": (4, "Convolution"), "DATA": (5, "Data"),
    "DECONVOLUTION": (39, "Deconvolution"), "DROPOUT": (6, "Dropout"),
    "DUMMY_DATA": (32, "DummyData"), "EUCLIDEAN_LOSS": (7, "EuclideanLoss"),
    "ELTWISE": (25, "Eltwise"), "EXP": (38, "Exp"), "FLATTEN": (8, "Flatten"),
    "HDF5_DATA": (9, "HDF5Data"), "HDF5_OUTPUT": (10, "HDF5Output"),
    "HINGE_LOSS": (28, "HingeLoss"), "IM2COL": (11, "Im2col"), "IMAGE_DATA": (12, "ImageData"),
    "INFOGAIN_LOSS": (13, "InfogainLoss"), "INNER_PRODUCT": (14, "InnerProduct"),
    "LRN": (15, "LRN"), "MEMORY_DATA": (29, "MemoryData"),
    "MULTINOMIAL_LOGISTIC_LOSS": (16, "MultinomialLogisticLoss"), "MVN": (34, "MVN"),
    "POOLING": (17, "Pooling"), "POWER": (26, "Power"), "RELU": (18, "ReLU"),
    "SIGMOID": (19, "Sigmoid"), "SIGMOID_CROSS_ENTROPY_LOSS": (27, "SigmoidCrossEntropyLoss"),
    "SILENCE": (36, "Silence"), "SOFTMAX": (20, "Softmax"), "SOFTMAX_LOSS": (21, "SoftmaxWithLoss"),
    "SPLIT": (22, "Split"), "SLICE": (33, "Slice"), "TANH": (23, "TanH"),
    "WINDOW_DATA": (24, "WindowData"), "THRESHOLD": (31, "Threshold"),
}
V1_NUMBERS = {number: name for number, name in V1_TYPES.values()}
# Old data layers kept the transformation among their own parameters.
_TRANSFORM_KEYS = ("scale", "mean_file", "crop_size", "mirror")
_DATA_PARAMS = ("data_param", "image_data_param", "window_data_param")
_V1_ONLY = ("blobs_lr", "weight_decay", "param", "blob_share_mode", "type")


def layer_messages(net: Message, problems: Problems) -> list[tuple[Field, Fields]]:
    """Each layer of the net as (its field in the net, tracked LayerParameter-form fields)."""
    current = [f for f in net.fields if f.name == "layer"]
    legacy = [f for f in net.fields if f.name == "layers"]
    if current and legacy:
        problems.add("the net mixes 'layer' and legacy 'layers' entries; use one form",
                     legacy[0].position)
    out = []
    for f in current + legacy:
        if not isinstance(f.value, Message):
            problems.add(f"'{f.name}' must be a message {{ ... }}", f.position)
            continue
        msg = f.value if f.name == "layer" else upgrade(f.value)
        name = msg.get("name", "?")
        converted = Field(f.name, msg, f.position, f.value_position)
        out.append((converted, Fields(msg, f"layer '{name}' ({msg.get('type', '?')})",
                                      f.position)))
    return out


def upgrade(v1: Message) -> Message:
    """A V1LayerParameter as a LayerParameter (positions kept)."""
    fields: list[Field] = []
    type_field = v1.field("type")
    if type_field is not None:
        fields.append(type_field._replace(value=v1_type_name(type_field.value)))
    lrs, decays, names = v1.get_all("blobs_lr"), v1.get_all("weight_decay"), v1.get_all("param")
    anchor = v1.field("blobs_lr") or v1.field("weight_decay") or v1.field("param")
    for i in range(max(len(lrs), len(decays), len(names))):
        spec = Message([], anchor.position if anchor else None, v1.source)
        if i < len(names):
            spec.fields.append(Field("name", names[i], anchor.position if anchor else None))
        if i < len(lrs):
            spec.fields.append(Field("lr_mult", lrs[i], anchor.position if anchor else None))
        if i < len(decays):
            spec.fields.append(Field("decay_mult", decays[i], anchor.position if anchor else None))
        fields.append(Field("param", spec, anchor.position if anchor else None))
    transform: list[Field] = []
    for f in v1.fields:
        if f.name in _V1_ONLY:
            if f.name == "blob_share_mode":
                fields.append(f)   # reported as unsupported by the translator
            continue
        if f.name in _DATA_PARAMS and isinstance(f.value, Message):
            moved = [g for g in f.value.fields if g.name in _TRANSFORM_KEYS]
            transform += moved
            kept = Message([g for g in f.value.fields if g.name not in _TRANSFORM_KEYS],
                           f.value.start, f.value.source)
            f = f._replace(value=kept)
        fields.append(f)
    if transform:
        fields.append(Field("transform_param", Message(transform, transform[0].position,
                                                       v1.source), transform[0].position))
    return Message(fields, v1.start, v1.source)


def v1_type_name(value) -> str:
    """The LayerParameter type of a V1 enum (CONVOLUTION or 4 -> "Convolution")."""
    if isinstance(value, int) and value in V1_NUMBERS:
        return V1_NUMBERS[value]
    if isinstance(value, str) and value.upper() in V1_TYPES:
        return V1_TYPES[value.upper()][1]
    return str(value)
