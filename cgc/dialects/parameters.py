"""Which weights of an imported model are its parameters, by how the model reads them.

An ONNX file stores every tensor it needs as an initializer: the weights a framework trained,
and also the constants its exporter lifted out of the graph (a 0-d mask fill of -3.4e38, the
exponent 2.0 of an RMSNorm, rotary tables, masks, the 1/sqrt(d) of attention). The dynamo
exporter names them ``val_N`` like the weights, so names do not tell them apart; training all
of them moves a mask's fill value or a norm's exponent and sends the loss to NaN. A weight is
a parameter if some use reads it (through reshapes, transposes, casts, broadcasts and slices)
as a model's learned tensors are read:

* an operand of a matrix product or a convolution, stored with two axes or more;
* the scale or shift of a normalization (a batch norm's running mean and variance are not);
* the table of an embedding lookup (a gather's data, two axes or more);
* a per-channel scale or shift: a vector multiplied into or added onto an activation (a
  decomposed layer norm's or RMSNorm's scale, a bias);
* a tensor added onto an activation or joined to one (a learned position table, ViT's class
  token), unless it is a mask: one that holds values at or below ``MASK_FLOOR``; joined to
  itself or to other stored tensors alone (a rotary table's halves) it is not.

Scalars never are (0-d, or one element of any shape): no learned tensor of a real model is
one number a whole activation is scaled or shifted by, and exporters lift every literal into
one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from math import prod

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from cgc.dialects import wse
from cgc.dialects.gradients import is_float
from cgc.dialects.ir import main_function

MASK_FLOOR = -1e9
"""Values at or below this mark a tensor as an additive mask (a blocked score), not a
parameter: exporters fill masks with -inf, finfo(float32).min or -1e9 and below."""

VIEWS = (wse.ReshapeOp, wse.TransposeOp, wse.CastOp, wse.BroadcastToOp, wse.SliceOp, wse.TileOp)
"""Ops whose result holds the operand's values rearranged: a use of it is a use of them."""


def parameter_weights(module: ModuleOp, weights: Mapping[str, np.ndarray]) -> set[str]:
    """The names of the float weights of ``module``'s ``@main`` that are not frozen and that
    some use reads as a parameter (the module docstring's rules); ``weights`` holds the
    values known (a weight without them is judged by its uses alone)."""
    found = set()
    for op in main_function(module).walk():
        if isinstance(op, wse.WeightOp) and op.frozen is None and is_float(op.result):
            name = op.weight_name.data
            if prod(wse.tensor_shape(op.result)) > 1 and any(
                _reads_as_parameter(use, operand, weights.get(name))
                for use, operand in _uses(op.result)
            ):
                found.add(name)
    return found


def _uses(value: SSAValue) -> Iterator[tuple[Operation, SSAValue]]:
    """The ops that read ``value``, looking through views: each with the operand it reads
    (``value`` or a view of it)."""
    for use in value.uses:
        if isinstance(use.operation, VIEWS):
            yield from _uses(use.operation.results[0])
        else:
            yield use.operation, value


def _rank(value: SSAValue) -> int:
    return len(wse.tensor_shape(value))


def _reads_as_parameter(op: Operation, operand: SSAValue, data: np.ndarray | None) -> bool:
    """Whether ``op`` reads ``operand`` (a weight or a view of it, of values ``data`` if
    known) as a parameter."""
    if isinstance(op, wse.MatmulOp | wse.MatmulTransposeAOp | wse.ConvOp):
        return _rank(operand) >= 2
    if isinstance(op, wse.FusedMatmulOp):  # its weights, their scales, a bias
        return operand is not op.lhs
    if isinstance(op, wse.LayerNormOp):
        return operand is not op.input
    if isinstance(op, wse.BatchNormOp):
        return operand in (op.scale, op.bias)
    if isinstance(op, wse.GatherOp):
        return operand is op.data and _rank(operand) >= 2
    if isinstance(op, wse.MulOp | wse.DivOp):
        return _per_channel(op, operand)
    if isinstance(op, wse.AddOp | wse.SubOp | wse.ConcatOp):
        return _with_activation(op, operand) and not _is_mask(data)
    return False


def _with_activation(op: Operation, operand: SSAValue) -> bool:
    """Whether ``op`` combines ``operand`` with a value computed at run time (not only
    weights and constants, as a rotary table joined to itself is)."""
    return any(v is not operand and not _stored(v) for v in op.operands)


def _stored(value: SSAValue) -> bool:
    """Whether ``value`` is a weight or a constant, through views."""
    owner = value.owner
    while isinstance(owner, VIEWS):
        owner = owner.operands[0].owner
    return isinstance(owner, wse.WeightOp | wse.ConstantOp)


def _per_channel(op: wse.MulOp | wse.DivOp, operand: SSAValue) -> bool:
    """Whether ``operand`` scales the other operand of ``op`` channel by channel: a vector
    (all but its last axis of length 1) whose length is that of the other's last axis."""
    others = [v for v in op.operands if v is not operand]
    shape = wse.tensor_shape(operand)
    if not others or any(d != 1 for d in shape[:-1]) or shape[-1] < 2:
        return False
    other = wse.tensor_shape(others[0])
    return bool(other) and other[-1] == shape[-1]


def _is_mask(data: np.ndarray | None) -> bool:
    """Whether ``data`` blocks scores: some value is at or below ``MASK_FLOOR``."""
    return data is not None and data.size > 0 and float(np.min(data)) <= MASK_FLOOR
