"""Vector-Jacobian products of the indexed ops: gathers, scatters, scans and top-k.

A gather's gradient is scattered back with ``add`` to the places it read (repeated indices
sum, as for embeddings; negative indices count from the end). A scatter's ``data`` keeps the
gradient where it was not overwritten (all of it for ``add``) and the updates get the gradient
at the places they went to; other reductions have no rule, nor has ``gather_nd`` with batch
dims. ``cumsum`` runs the other way; top-k's values send their gradient back to the elements
they were taken from. The indices get none.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from xdsl.ir import Operation, SSAValue

from cgc.dialects import wse
from cgc.dialects.gradients.base import Grads, Rule, not_differentiable
from cgc.dialects.ir import LocatedInserter


def scatter_add(
    emit: LocatedInserter, shape: Sequence[int], indices: SSAValue, updates: SSAValue
) -> SSAValue:
    """Zeros of ``shape`` with ``updates`` added at ``indices`` (ScatterND)."""
    zeros = emit(wse.BroadcastToOp(emit.constant(0, wse.element_type(updates)), shape))
    return emit(wse.ScatterNDOp(zeros, indices, updates, "add"))


def _wrapped(emit: LocatedInserter, indices: SSAValue, size: int) -> SSAValue:
    """Negative indices counted from the end."""
    elt = wse.element_type(indices)
    negative = emit(wse.GreaterOp(emit.constant(0, elt), indices))
    return emit(wse.SelectOp(negative, emit(wse.AddOp(indices, emit.constant(size, elt))), indices))


def _gather(op: wse.GatherOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    """Each gathered slice's gradient added back to the slice it came from (embeddings:
    repeated tokens sum)."""
    data, axis = wse.tensor_shape(op.data), op.axis.value.data
    index_shape = wse.tensor_shape(op.indices)
    q = len(index_shape)
    rest = (*data[:axis], *data[axis + 1 :])
    grank = len(wse.tensor_shape(g))
    perm = [*range(axis, axis + q), *range(axis), *range(axis + q, grank)]
    updates = emit(wse.ReshapeOp(emit(wse.TransposeOp(g, perm)), (prod(index_shape), *rest)))
    flat = emit(wse.ReshapeOp(_wrapped(emit, op.indices, data[axis]), (prod(index_shape), 1)))
    front = scatter_add(emit, (data[axis], *rest), flat, updates)
    back = [*range(1, axis + 1), 0, *range(axis + 1, len(data))]
    return [emit(wse.TransposeOp(front, back)), None]


def _gather_elements(op: wse.GatherElementsOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    data, axis = wse.tensor_shape(op.data), op.axis.value.data
    zeros = emit(wse.BroadcastToOp(emit.constant(0, wse.element_type(g)), data))
    indices = _wrapped(emit, op.indices, data[axis])
    return [emit(wse.ScatterElementsOp(zeros, indices, g, axis, "add")), None]


def _gather_nd(op: wse.GatherNDOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    if op.batch_dims.value.data:
        raise not_differentiable(op, "gather_nd with batch_dims")
    data = wse.tensor_shape(op.data)
    return [scatter_add(emit, data, op.indices, g), None]


def _scatter(
    op: wse.ScatterElementsOp | wse.ScatterNDOp, emit: LocatedInserter, g: SSAValue
) -> Grads:
    """``data`` keeps the gradient where it was not overwritten (all of it for ``add``); the
    updates get the gradient at the places they went to."""
    reduction = op.reduction.data
    if reduction not in ("none", "add"):
        raise not_differentiable(op, f"scatter with reduction {reduction}")
    if isinstance(op, wse.ScatterElementsOp):
        axis = op.axis.value.data
        picked = emit(wse.GatherElementsOp(g, op.indices, axis))
    else:
        picked = emit(wse.GatherNDOp(g, op.indices, 0))
    kept = g
    if reduction == "none":
        zeros = emit(
            wse.BroadcastToOp(emit.constant(0, wse.element_type(g)), wse.tensor_shape(op.updates))
        )
        if isinstance(op, wse.ScatterElementsOp):
            kept = emit(wse.ScatterElementsOp(g, op.indices, zeros, op.axis.value.data, "none"))
        else:
            kept = emit(wse.ScatterNDOp(g, op.indices, zeros, "none"))
    return [kept, None, picked]


def _cumsum(op: wse.CumSumOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    """Each element adds to the running sums after it (before it, run in reverse)."""
    axis, exclusive = op.axis.value.data, bool(op.exclusive.value.data)
    return [emit(wse.CumSumOp(g, axis, exclusive, not op.reverse.value.data))]


def _topk(op: wse.TopKOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    """The values' gradients go back to the elements they were taken from."""
    shape, axis = wse.tensor_shape(op.input), op.axis.value.data
    zeros = emit(wse.BroadcastToOp(emit.constant(0, wse.element_type(g)), shape))
    return [emit(wse.ScatterElementsOp(zeros, op.results[1], g, axis, "add"))]


RULES: dict[type[Operation], Rule] = {
    wse.GatherOp: _gather,
    wse.GatherElementsOp: _gather_elements,
    wse.GatherNDOp: _gather_nd,
    wse.ScatterElementsOp: _scatter,
    wse.ScatterNDOp: _scatter,
    wse.CumSumOp: _cumsum,
    wse.TopKOp: _topk,
}
"""The rules of this family, by op."""
