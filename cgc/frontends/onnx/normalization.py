"""ONNX softmax-like ops and normalizations."""

from __future__ import annotations

from math import prod

from cgc.dialects import wse
from cgc.frontends.onnx.importer import (
    Importer,
    Node,
    NodeError,
    OpImporter,
    axis_of,
    bad_attr,
    register,
    shape_of,
)


def softmax_like(cls: type[wse.SoftmaxOp | wse.LogSoftmaxOp]) -> OpImporter:
    """Softmax and LogSoftmax, with the coerce-to-2-D semantics before opset 13."""

    def run(im: Importer, node: Node) -> list:
        x = im.value(node, 0)
        shape = shape_of(x)
        if not shape:
            raise NodeError("the input must have rank >= 1")
        default = -1 if im.opset >= 13 else 1
        axis = axis_of(int(node.attr("axis", default)), len(shape))
        if im.opset >= 13 or axis == len(shape) - 1:
            return [im.emit(cls(x, axis))]
        # Before opset 13 the input is coerced to 2-D at ``axis``.
        flat = im.emit(wse.ReshapeOp(x, (prod(shape[:axis]), prod(shape[axis:]))))
        y = im.emit(cls(flat, 1))
        return [im.emit(wse.ReshapeOp(y, shape))]

    return run


register("Softmax")(softmax_like(wse.SoftmaxOp))
register("LogSoftmax")(softmax_like(wse.LogSoftmaxOp))


@register("BatchNormalization")
def _batch_norm(im: Importer, node: Node) -> list:
    training = int(node.attr("training_mode", 0))
    if training:
        raise bad_attr("training_mode", training, " (inference only)")
    x, scale, bias, mean, var = (im.value(node, i) for i in range(5))
    epsilon = float(node.attr("epsilon", 1e-5))
    return [im.emit(wse.BatchNormOp(x, scale, bias, mean, var, epsilon))]


@register("LayerNormalization")
def _layer_norm(im: Importer, node: Node) -> list:
    x, scale = im.value(node, 0), im.value(node, 1)
    bias = im.optional(node, 2)
    axis = axis_of(int(node.attr("axis", -1)), len(shape_of(x)))
    epsilon = float(node.attr("epsilon", 1e-5))
    return [im.emit(wse.LayerNormOp(x, scale, bias, axis, epsilon))]
