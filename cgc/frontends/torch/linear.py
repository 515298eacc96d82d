"""Lowerings of the core ATen ops that multiply matrices: ``mm``, ``addmm``, ``bmm`` and
``convolution`` (transposed convolutions are not lowered yet)."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    add,
    add_channel_bias,
    mul,
    reshape,
    shape_of,
    transpose,
)
from cgc.frontends.torch.lowering import Lowering, register


@register("aten.mm.default", "aten.bmm.default")
def _mm(lw: Lowering, a: SSAValue, b: SSAValue) -> SSAValue:
    return lw.emit(wse.MatmulOp(lw.tensor(a), lw.tensor(b)))


@register("aten.addmm.default")
def _addmm(
    lw: Lowering, bias: SSAValue, a: SSAValue, b: SSAValue, beta: float = 1, alpha: float = 1
) -> SSAValue:
    """``beta * bias + alpha * (a @ b)``."""
    product = _mm(lw, a, b)
    if alpha != 1:
        product = mul(lw, product, lw.tensor(alpha))
    if beta == 0:
        return product
    bias = lw.tensor(bias)
    return add(lw, product, bias if beta == 1 else mul(lw, bias, lw.tensor(beta)))


@register("aten.linear.default")
def _linear(lw: Lowering, x: SSAValue, weight: SSAValue, bias: SSAValue | None = None):
    """``x @ weight.T + bias`` on rows of any rank (``capture`` keeps it whole); a vector
    ``x`` is one row, a vector ``weight`` one output that the result leaves out."""
    rows, outputs = shape_of(x), shape_of(weight)
    matrix = reshape(lw, lw.tensor(weight), (1, outputs[0]) if len(outputs) == 1 else outputs)
    lhs = reshape(lw, lw.tensor(x), (1, rows[0])) if len(rows) == 1 else lw.tensor(x)
    product = _mm(lw, lhs, transpose(lw, matrix, [1, 0]))
    product = reshape(lw, product, (*rows[:-1], *outputs[:-1]))
    return product if bias is None else add(lw, product, lw.tensor(bias))


@register("aten.convolution.default")
def _convolution(
    lw: Lowering,
    x: SSAValue,
    weight: SSAValue,
    bias: SSAValue | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> SSAValue:
    if transposed:
        raise NodeError("transposed convolution is not supported yet")
    spatial = len(shape_of(x)) - 2
    pads = [int(p) for p in padding] * 2 if len(padding) == spatial else list(padding)
    y = lw.emit(
        wse.ConvOp(lw.tensor(x), lw.tensor(weight), list(stride), pads, list(dilation), groups)
    )
    return add_channel_bias(lw, y, None if bias is None else lw.tensor(bias))
