"""Elementwise ONNX ops: math, activations, logic, comparisons, casts."""

from __future__ import annotations

import numpy as np

from cgc.dialects import wse
from cgc.frontends.onnx.importer import Importer, Node, NodeError, OpImporter, register


def unary(cls: type[wse.UnaryOp]) -> OpImporter:
    """The importer of an op that maps to one unary WSE op."""

    def run(im: Importer, node: Node) -> list:
        return [im.emit(cls(im.value(node, 0)))]

    return run


def binary(cls: type[wse.BinaryOp]) -> OpImporter:
    """The importer of an op that maps to one broadcasting binary WSE op."""

    def run(im: Importer, node: Node) -> list:
        return [im.emit(cls(im.value(node, 0), im.value(node, 1)))]

    return run


UNARY = {"Erf": wse.ErfOp, "Relu": wse.ReluOp, "Sigmoid": wse.SigmoidOp, "Tanh": wse.TanhOp}
BINARY = {"Add": wse.AddOp, "Sub": wse.SubOp, "Mul": wse.MulOp, "Div": wse.DivOp}

for _op_type, _cls in UNARY.items():
    register(_op_type)(unary(_cls))
for _op_type, _cls in BINARY.items():
    register(_op_type)(binary(_cls))


@register("Identity")
def _identity(im: Importer, node: Node) -> list:
    return [im.entry(node, 0)]


@register("Dropout")
def _dropout(im: Importer, node: Node) -> list:
    if im.opset >= 12:
        training = im.optional_static(node, 2)
        if training is not None and bool(np.ravel(training)[0]):
            raise NodeError("input training_mode=true is not supported (inference only)")
    return [im.entry(node, 0)]
