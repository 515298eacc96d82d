"""Vector-Jacobian products of attention and the rotary embedding.

Fused attention's gradient is one op, ``wse.attention_grad``, which computes the probabilities
again from the query and keys (a fused kernel never stores them) and reads the forward result;
the rotary embedding's is the inverse rotation (its tables repeat their first half in their
second, so the rotation's transpose is its inverse). The tables get no gradient.
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue

from cgc.dialects import wse
from cgc.dialects.gradients.base import Grads, Rule
from cgc.dialects.ir import LocatedInserter


def _attention(op: wse.AttentionOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    inputs = [op.query, op.key, op.value, *([] if op.bias is None else [op.bias])]
    grad = wse.AttentionGradOp([*inputs, op.result, g], op)
    emit(grad)
    return list(grad.results)


def _rotary(op: wse.RotaryOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    heads, inverse = op.heads.value.data, bool(op.inverse.value.data)
    return [emit(wse.RotaryOp(g, op.cos, op.sin, heads, not inverse)), None, None]


RULES: dict[type[Operation], Rule] = {
    wse.AttentionOp: _attention,
    wse.RotaryOp: _rotary,
}
