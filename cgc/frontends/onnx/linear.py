"""ONNX matrix products: Gemm, MatMul and their relatives."""

from __future__ import annotations

from cgc.dialects import wse
from cgc.frontends.onnx.importer import (
    Importer,
    Node,
    NodeError,
    register,
    shape_of,
)


@register("Gemm")
def _gemm(im: Importer, node: Node) -> list:
    a, b = im.value(node, 0), im.value(node, 1)
    if node.attr("transA", 0):
        a = im.emit(wse.TransposeOp(a, (1, 0)))
    if node.attr("transB", 0):
        b = im.emit(wse.TransposeOp(b, (1, 0)))
    y = im.emit(wse.MatmulOp(a, b))
    alpha = float(node.attr("alpha", 1.0))
    if alpha != 1.0:
        y = im.emit(wse.MulOp(y, im.scalar(alpha, y)))
    c = im.optional(node, 2)
    if c is not None:
        beta = float(node.attr("beta", 1.0))
        if beta != 1.0:
            c = im.emit(wse.MulOp(c, im.scalar(beta, c)))
        y = im.emit(wse.AddOp(y, c))
    return [y]


@register("MatMul")
def _matmul(im: Importer, node: Node) -> list:
    a, b = im.value(node, 0), im.value(node, 1)
    sa, sb = shape_of(a), shape_of(b)
    if not sa or not sb:
        raise NodeError(f"operands of shapes {sa} and {sb} need rank >= 1")
    if len(sa) >= 2 and len(sb) >= 2:
        return [im.emit(wse.MatmulOp(a, b))]
    if len(sa) == 1:
        a = im.emit(wse.ReshapeOp(a, (1, sa[0])))
    if len(sb) == 1:
        b = im.emit(wse.ReshapeOp(b, (sb[0], 1)))
    y = im.emit(wse.MatmulOp(a, b))
    *batch, rows, cols = shape_of(y)
    shape = [*batch]
    if len(sa) > 1:
        shape.append(rows)
    if len(sb) > 1:
        shape.append(cols)
    return [im.emit(wse.ReshapeOp(y, shape))]
