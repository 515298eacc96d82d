"""The derivative semantics of the ``wse`` ops: each differentiable op's vector-Jacobian
product, as ``wse`` ops that compute it.

The ``autodiff`` pass looks an op's rule up (``rule_for``) and lets it build, in the backward
layer, the ops that give each operand its gradient. The rules are grouped by op family, each
module on top of ``base``; this package gathers them into ``RULES`` and re-exports the
vocabulary:

- ``base``: ``Grads``, ``Rule``, ``is_float``, ``unbroadcast`` and ``not_differentiable``;
- ``elementwise``: unary and binary math, ``select``, ``stop_gradient``, reductions, matmul;
- ``shape``: reshape, transpose, broadcast, cast, reverse, tile, pad, slice, concat;
- ``indexing``: gathers, scatters, ``cumsum`` and top-k;
- ``windows``: im2col, col2im, average and max pooling;
- ``attention``: fused attention and the rotary embedding.

Ops that are not here have no gradient (integer and logic ops, comparisons, the composites that
``decompose`` lowers before autodiff, ...): reaching one is a ``CgcError`` naming the node.
"""

from __future__ import annotations

from xdsl.ir import Operation

from cgc.dialects.gradients import attention, elementwise, indexing, shape, windows
from cgc.dialects.gradients.base import Grads, Rule, is_float, not_differentiable, unbroadcast

__all__ = ["RULES", "Grads", "Rule", "is_float", "not_differentiable", "rule_for", "unbroadcast"]

RULES: dict[type[Operation], Rule] = {
    **elementwise.RULES,
    **shape.RULES,
    **indexing.RULES,
    **windows.RULES,
    **attention.RULES,
}
"""Vector-Jacobian products: ``rule(op, emit, grad_of_result) -> grad per operand``."""


def rule_for(op: Operation) -> Rule:
    """The vector-Jacobian product of ``op``; a ``CgcError`` naming the node if it has none."""
    rule = RULES.get(type(op))
    if rule is None:
        raise not_differentiable(op, "no vector-Jacobian product")
    return rule
