"""The vocabulary every family of vector-Jacobian products builds on.

A rule, ``rule(op, emit, g) -> grads``, takes the op, a ``LocatedInserter`` that builds the
backward ops where the op stands, and the gradient ``g`` of the op's first result; it gives one
gradient per operand, ``None`` where none flows (indices, conditions, the operand of
``wse.stop_gradient``). Gradients flow only through floats (``is_float``); an operand that
numpy broadcasting stretched gets the sum of its copies' gradients (``unbroadcast``). An op, or
a case of one, without a rule is a ``CgcError`` naming the node (``not_differentiable``).

Nothing here imports another module of the package: every family builds on it.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type, Float64Type
from xdsl.ir import Operation, SSAValue

from cgc.dialects import wse
from cgc.dialects.ir import LocatedInserter
from cgc.errors import CgcError

Grads = list[SSAValue | None]
"""One gradient per operand of an op, ``None`` where none flows."""

Rule = Callable[..., Grads]
"""A vector-Jacobian product: ``rule(op, emit, grad_of_result) -> grad per operand``."""


def is_float(value: SSAValue) -> bool:
    """Whether gradients flow through ``value``."""
    return isinstance(
        wse.element_type(value), BFloat16Type | Float16Type | Float32Type | Float64Type
    )


def unbroadcast(emit: LocatedInserter, g: SSAValue, shape: tuple[int, ...]) -> SSAValue:
    """Sums ``g`` over the axes along which a value of ``shape`` was broadcast."""
    gshape = wse.tensor_shape(g)
    if gshape == shape:
        return g
    lead = len(gshape) - len(shape)
    axes = [*range(lead)] + [
        i for i in range(lead, len(gshape)) if shape[i - lead] == 1 and gshape[i] != 1
    ]
    summed = emit(wse.ReduceSumOp(g, axes, True)) if axes else g
    return emit(wse.ReshapeOp(summed, shape))


def not_differentiable(op: Operation, what: str) -> CgcError:
    """The error for ``op``, which has no gradient in the case ``what``, naming its node."""
    where = wse.location_name(op)
    return CgcError(
        f"autodiff: {op.name}{f' (node {where})' if where else ''} has no gradient yet ({what})"
    )
