"""ONNX losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

SoftmaxCrossEntropyLoss becomes the composite ``wse.softmax_cross_entropy`` (its optional
log_prob output a ``wse.log_softmax`` over the class axis). NegativeLogLikelihoodLoss picks
each sample's entry with a class mask (labels compared with the class positions) and a select,
so the gradient reaches its input; samples whose label is ``ignore_index`` (or outside the
classes) pick nothing and weigh nothing.
"""

from __future__ import annotations

from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, dtype_of, shape_of
from cgc.frontends.formulas import class_mask
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr

REDUCTIONS = ("mean", "sum", "none")


def reduction_of(node: Node) -> str:
    """The ``reduction`` attribute: mean (the default), sum or none."""
    reduction = node.attr("reduction", "mean")
    if reduction not in REDUCTIONS:
        raise bad_attr("reduction", reduction, " (expected mean, sum or none)")
    return reduction


def loss_inputs(im: Importer, node: Node) -> tuple[SSAValue, SSAValue, SSAValue | None]:
    """The scores (N, C, d1, ...), the labels (N, d1, ...) of integers and the optional class
    weights (C,) of a loss node."""
    scores, labels = im.value(node, 0), im.value(node, 1)
    weights = im.optional(node, 2)
    shape, label_shape = shape_of(scores), shape_of(labels)
    if len(shape) < 2:
        raise NodeError(f"the input needs shape (N, C, ...), got {shape}")
    if label_shape != (shape[0], *shape[2:]):
        raise NodeError(f"the labels' shape {label_shape} does not match the input's {shape}")
    if dtype_of(labels).name not in ("int32", "int64"):
        raise NodeError("the labels must be int32 or int64")
    if weights is not None and shape_of(weights) != (shape[1],):
        raise NodeError(f"the weights must have shape ({shape[1]},), got {shape_of(weights)}")
    return scores, labels, weights


def picked(im: Importer, mask: SSAValue, values: SSAValue) -> SSAValue:
    """The sum over the class axis of ``values`` where ``mask`` holds: per sample, the value at
    its label (0 for an ignored sample)."""
    zero = im.scalar(0, values)
    return im.emit(wse.ReduceSumOp(im.emit(wse.SelectOp(mask, values, zero)), [1], False))


def negative_log_likelihood(
    im: Importer,
    log_probs: SSAValue,
    labels: SSAValue,
    weights: SSAValue | None,
    reduction: str,
    ignore_index: int | None,
) -> SSAValue:
    """``-log_probs[n, label[n], ...]`` per sample, times the label's class weight, reduced;
    a mean divides by the sum of the weights of the samples not ignored."""
    shape = shape_of(log_probs)
    rank = len(shape)
    mask = class_mask(im, labels, shape[1], ignore_index)
    loss = im.emit(wse.NegOp(picked(im, mask, log_probs)))
    weight = None
    if weights is not None:
        per_class = im.emit(wse.ReshapeOp(weights, (1, shape[1], *[1] * (rank - 2))))
        weight = picked(im, mask, per_class)
        loss = im.emit(wse.MulOp(loss, weight))
    elif ignore_index is not None and reduction == "mean":
        weight = picked(im, mask, im.scalar(1, log_probs))
    if reduction == "none":
        return loss
    axes = list(range(rank - 1))
    total = im.emit(wse.ReduceSumOp(loss, axes, False))
    if reduction == "sum":
        return total
    if weight is None:
        return im.emit(wse.ReduceMeanOp(loss, axes, False))
    return im.emit(wse.DivOp(total, im.emit(wse.ReduceSumOp(weight, axes, False))))


def ignore_index_of(node: Node) -> int | None:
    """The optional ``ignore_index`` attribute."""
    ignore_index = node.attr("ignore_index", None)
    return None if ignore_index is None else int(ignore_index)


@register("NegativeLogLikelihoodLoss")
def _negative_log_likelihood(im: Importer, node: Node) -> list:
    reduction = reduction_of(node)
    log_probs, labels, weights = loss_inputs(im, node)
    return [
        negative_log_likelihood(im, log_probs, labels, weights, reduction, ignore_index_of(node))
    ]


@register("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(im: Importer, node: Node) -> list:
    reduction = reduction_of(node)
    scores, labels, weights = loss_inputs(im, node)
    ignore_index = ignore_index_of(node)
    loss = im.emit(wse.SoftmaxCrossEntropyOp(scores, labels, weights, reduction, ignore_index))
    outputs = node.proto.output
    if len(outputs) > 1 and outputs[1] in im.used:
        return [loss, im.emit(wse.LogSoftmaxOp(scores, 1))]
    return [loss]
