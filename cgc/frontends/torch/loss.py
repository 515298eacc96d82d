"""Lowerings of the core ATen ops that losses decompose to: ``gather`` (what
``F.cross_entropy`` becomes under torch's default decompositions: ``_log_softmax``, ``gather``
of each sample's label, a masked sum over the count of samples not ignored) and
``nll_loss_forward`` / ``nll_loss2d_forward`` (what it stays when they are kept whole).

An ``nll_loss`` of a ``log_softmax`` over the class axis, without class weights, becomes the
composite ``wse.softmax_cross_entropy`` of the scores: one op whose batch reduction the
compiler can read, which is what lets its gradients be split over systems and micro-batches.
Other ``nll_loss`` nodes pick each sample's entry with a class mask and a select, as the ONNX
frontend's NegativeLogLikelihoodLoss does.
"""

from __future__ import annotations

from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, shape_of
from cgc.frontends.formulas import class_mask
from cgc.frontends.torch.lowering import Lowering, register

REDUCTIONS = ("none", "mean", "sum")
"""torch's reduction enum (``torch.nn._reduction``), by its value."""


@register("aten.gather.default")
def _gather(
    lw: Lowering, x: SSAValue, dim: int, index: SSAValue, sparse_grad: bool = False
) -> SSAValue:
    """``torch.gather``: one element of ``x`` per index along ``dim``."""
    shape, index_shape = shape_of(x), shape_of(index)
    if len(index_shape) != len(shape):
        raise NodeError(f"the index has rank {len(index_shape)}, the input {len(shape)}")
    axis = dim % len(shape) if shape else 0
    # torch lets the index be smaller than the input on the other axes; GatherElements not
    if any(i != s for d, (i, s) in enumerate(zip(index_shape, shape, strict=True)) if d != axis):
        raise NodeError(
            f"an index of shape {index_shape} smaller than the input {shape} off axis {axis} "
            "is not supported"
        )
    return lw.emit(wse.GatherElementsOp(lw.tensor(x), index, axis))


@register("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")
def _nll_loss(
    lw: Lowering,
    log_probs: SSAValue,
    labels: SSAValue,
    weight: SSAValue | None,
    reduction: int,
    ignore_index: int,
) -> tuple[SSAValue, SSAValue]:
    """``(loss, total_weight)``: the negative log-likelihood of each sample's label, reduced
    as ``reduction`` says, and the weight the mean divides by."""
    if reduction not in range(len(REDUCTIONS)):
        raise NodeError(f"unknown reduction {reduction}")
    kind = REDUCTIONS[reduction]
    log_probs = lw.tensor(log_probs)
    shape = shape_of(log_probs)
    if len(shape) == 1:  # one sample without a batch axis
        log_probs = lw.emit(wse.ReshapeOp(log_probs, (1, *shape)))
        labels = lw.emit(wse.ReshapeOp(labels, (1,)))
        shape = shape_of(log_probs)
    if shape_of(labels) != (shape[0], *shape[2:]):
        raise NodeError(f"the labels' shape {shape_of(labels)} does not match the input's {shape}")
    mask = class_mask(lw, labels, shape[1], ignore_index)
    picked_weight = _picked(lw, mask, _class_weights(lw, weight, len(shape), log_probs))
    total_weight = lw.emit(wse.ReduceSumOp(picked_weight, list(range(len(shape) - 1)), False))
    scores = _log_softmax_input(log_probs)
    if scores is not None and weight is None:
        loss = lw.emit(wse.SoftmaxCrossEntropyOp(scores, labels, None, kind, ignore_index))
        return loss, total_weight
    loss = lw.emit(wse.MulOp(lw.emit(wse.NegOp(_picked(lw, mask, log_probs))), picked_weight))
    if kind == "none":
        return loss, total_weight
    total = lw.emit(wse.ReduceSumOp(loss, list(range(len(shape) - 1)), False))
    if kind == "sum":
        return total, total_weight
    return lw.emit(wse.DivOp(total, total_weight)), total_weight


def _log_softmax_input(log_probs: SSAValue) -> SSAValue | None:
    """The scores of a ``log_softmax`` over axis 1 that made ``log_probs``, if one did."""
    op = log_probs.owner
    if isinstance(op, wse.LogSoftmaxOp) and op.axis.value.data == 1:
        return op.operands[0]
    return None


def _class_weights(lw: Lowering, weight: SSAValue | None, rank: int, like: SSAValue) -> SSAValue:
    """The class weights shaped to lie along axis 1 of the scores (1 for every class when
    there are none)."""
    if weight is None:
        return lw.scalar(1, like)
    classes = shape_of(weight)
    return lw.emit(wse.ReshapeOp(lw.tensor(weight), (1, *classes, *[1] * (rank - 2))))


def _picked(lw: Lowering, mask: SSAValue, values: SSAValue) -> SSAValue:
    """Per sample, the sum over the class axis of ``values`` where ``mask`` holds: the value
    at its label (0 for an ignored sample)."""
    zero = lw.scalar(0, values)
    return lw.emit(wse.ReduceSumOp(lw.emit(wse.SelectOp(mask, values, zero)), [1], False))
