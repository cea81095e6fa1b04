"""Loss layers and Accuracy. A loss top gets Caffe's loss_weight (1 by default for types
ending in "Loss"); the phase sums the weighted losses into the model's one loss blob."""
from __future__ import annotations

from netrun.caffe.context import LayerContext
from netrun.caffe.fields import Fields
from netrun.caffe.layers.registry import axis_of, count, layer

NORMALIZATIONS = ("FULL", "VALID", "BATCH_SIZE", "NONE")


def _normalization(t: LayerContext, p: Fields, default: str) -> str:
    """LossParameter's normalization (or the legacy `normalize` flag)."""
    if p.has("normalization"):
        return p.enum("normalization", default, NORMALIZATIONS)
    if p.has("normalize"):
        return "VALID" if p.get("normalize", True) else "BATCH_SIZE"
    return default


def _class_scores(t: LayerContext, param: Fields, field: str) -> int:
    """The class axis of bottom 0, which must have no dims after it (N×C or N×C×1×1)."""
    shape = t.shape(0)
    axis = axis_of(t, param.get("axis", 1), len(shape), field)
    if count(shape[axis + 1:]) != 1:
        raise t.skip(f"scores of shape {'×'.join(map(str, shape))} have positions after the "
                     f"class axis {axis} (a per-pixel loss); not supported", field)
    if count(t.shape(1)) != count(shape[:axis]):
        raise t.skip(f"the labels hold {count(t.shape(1))} values for "
                     f"{count(shape[:axis])} examples")
    return axis


@layer("SoftmaxWithLoss")
def softmax_with_loss(t: LayerContext) -> None:
    """SoftmaxWithLoss: softmax + cross-entropy over valid labels (second top: the probs)."""
    t.counts(2, (1, 2))
    t.head = True
    loss_p, soft_p = t.f.sub("loss_param"), t.f.sub("softmax_param")
    soft_p.ignore("engine")
    axis = _class_scores(t, soft_p, "softmax_param")
    norm = _normalization(t, loss_p, "VALID")
    ignore = loss_p.get("ignore_label", None, "int")
    # netrun's loss divides by the number of counted labels (VALID); without an ignored
    # label that is also the batch size (FULL, BATCH_SIZE) for N×C scores.
    if norm == "NONE" or (norm != "VALID" and ignore is not None):
        raise t.skip(f"normalization {norm}{' with ignore_label' if ignore is not None else ''}"
                     f" is not supported (VALID is, and FULL/BATCH_SIZE without ignore_label)",
                     "loss_param")
    args = {"axis": axis} if axis != 1 else {}
    if ignore is not None:
        args["ignore_label"] = ignore
    prob = t.top(1) if t.ntop == 2 else t.tmp("prob")
    t.add("SoftmaxWithLoss", [t.bottoms[0], t.class_label(1)], [prob, t.top(0)], **args)


@layer("EuclideanLoss")
def euclidean_loss(t: LayerContext) -> None:
    """1/(2N)·Σ‖a − b‖²: per-example halved squared distances, averaged."""
    t.counts(2, 1)
    t.head = True
    if count(t.shape(0)) != count(t.shape(1)):
        raise t.skip(f"the bottoms hold {count(t.shape(0))} and {count(t.shape(1))} values")
    dist = t.tmp("dist")
    t.add("SquaredL2Distance", t.bottoms, dist)
    t.add("AveragedLoss", [dist], t.top())


@layer("SigmoidCrossEntropyLoss")
def sigmoid_cross_entropy_loss(t: LayerContext) -> None:
    """Σ cross-entropy(sigmoid(x), target) / N (BATCH_SIZE, Caffe's default for this layer),
    or / count (VALID, FULL): the mean over all elements, times count/N for BATCH_SIZE."""
    t.counts(2, 1)
    t.head = True
    norm = _normalization(t, t.f.sub("loss_param"), "BATCH_SIZE")
    if norm == "NONE":
        raise t.skip("normalization NONE is not supported", "loss_param")
    ce, mean = t.tmp("ce"), t.tmp("mean")
    t.add("SigmoidCrossEntropyWithLogits", t.bottoms, ce)     # mean over the last axis
    if norm == "BATCH_SIZE":
        t.add("AveragedLoss", [ce], mean)
        t.add("Scale", [mean], t.top(), scale=float(count(t.shape(0)[1:])))
    else:
        t.add("AveragedLoss", [ce], t.top())


@layer("ContrastiveLoss")
def contrastive_loss(t: LayerContext) -> None:
    """Siamese pairs (a, b) with similarity labels: the ContrastiveLoss op."""
    t.counts(3, 1)
    t.head = True
    p = t.f.sub("contrastive_loss_param")
    t.add("ContrastiveLoss", t.bottoms, t.top(), margin=p.get("margin", 1.0),
          legacy_version=int(p.get("legacy_version", False)))


@layer("MultinomialLogisticLoss")
def multinomial_logistic_loss(t: LayerContext) -> None:
    """−Σ log(max(p[label], 1e-20)) / N over probabilities p."""
    t.counts(2, 1)
    t.head = True
    _class_scores(t, Fields(None, ""), "loss_param")
    nll = t.tmp("nll")
    t.add("LabelCrossEntropy", [t.bottoms[0], t.class_label(1)], nll)
    t.add("AveragedLoss", [nll], t.top())


@layer("Accuracy")
def accuracy(t: LayerContext) -> None:
    """Top-k accuracy over the labels that are not ignore_label (a metric of the model)."""
    t.counts(2, 1)
    t.head = True
    p = t.f.sub("accuracy_param")
    _class_scores(t, p, "accuracy_param")
    args = {"top_k": p.get("top_k", 1)}
    if p.has("ignore_label"):
        args["ignore_label"] = p.get("ignore_label", -1)
    t.add("Accuracy", [t.bottoms[0], t.class_label(1)], t.top(), **args)
    t.metrics.append(0)
