"""ONNX losses."""

from __future__ import annotations

from cgc.dialects import wse
from cgc.frontends.onnx.importer import Importer, Node, bad_attr, register


@register("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(im: Importer, node: Node) -> list:
    reduction = node.attr("reduction", "mean")
    if reduction not in wse.SoftmaxCrossEntropyOp.REDUCTIONS:
        raise bad_attr("reduction", reduction)
    ignore_index = node.attr("ignore_index", None)
    scores, labels = im.value(node, 0), im.value(node, 1)
    weights = im.optional(node, 2)
    loss = im.emit(
        wse.SoftmaxCrossEntropyOp(
            scores,
            labels,
            weights,
            reduction,
            None if ignore_index is None else int(ignore_index),
        )
    )
    outputs = node.proto.output
    if len(outputs) > 1 and outputs[1] in im.used:
        return [loss, im.emit(wse.LogSoftmaxOp(scores, 1))]
    return [loss]
