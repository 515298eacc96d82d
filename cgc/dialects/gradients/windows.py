"""Vector-Jacobian products of the window ops: im2col, col2im and pooling.

``im2col`` and ``col2im`` are each other's transpose, so each one's gradient is the other
(same kernel, strides, pads, dilations, groups and layout). Average pooling spreads each
output's gradient, over its window's count (with or without the padding, as the op counts),
evenly over the window's taps; max pooling gives it to the window's first maximum (torch's
rule). Both layouts, channels first and channels last, are handled.
"""

from __future__ import annotations

from math import prod

import numpy as np
from xdsl.ir import Operation, SSAValue

from cgc.dialects import wse
from cgc.dialects.gradients.base import Grads, Rule
from cgc.dialects.gradients.indexing import scatter_add
from cgc.dialects.ir import LocatedInserter


def _window_args(
    op: wse.PoolOp | wse.PatchOp,
) -> tuple[list[int], list[int], list[int], list[int]]:
    """The op's kernel, strides, pads and dilations."""
    return (
        list(op.kernel.get_values()),
        list(op.strides.get_values()),
        list(op.pads.get_values()),
        list(op.dilations.get_values()),
    )


def _im2col(op: wse.Im2ColOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    image = wse.tensor_shape(op.input)
    group, last = op.group.value.data, op.is_channels_last
    return [emit(wse.Col2ImOp(g, image, *_window_args(op), group, last))]


def _col2im(op: wse.Col2ImOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    return [
        emit(
            wse.Im2ColOp(
                g,
                *_window_args(op),
                op.group.value.data,
                bool(op.channels_last.value.data),
            )
        )
    ]


def _channels_front(emit: LocatedInserter, v: SSAValue, channels_last: bool) -> SSAValue:
    """``v`` as (C, N, *spatial), from (N, C, *spatial) or (N, *spatial, C)."""
    rank = len(wse.tensor_shape(v))
    perm = [rank - 1, 0, *range(1, rank - 1)] if channels_last else [1, 0, *range(2, rank)]
    return emit(wse.TransposeOp(v, perm))


def _avg_pool(op: wse.AvgPoolOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    """Each output's gradient, over its window's count, spread over the window's taps."""
    x, elt = op.input, wse.element_type(g)
    args, last = _window_args(op), op.is_channels_last
    taps = prod(args[0])
    if op.count_include_pad.value.data:
        share = emit(wse.MulOp(g, emit.constant(1 / taps, elt)))
    else:  # the real taps of each window: taps x the mean of ones, padding counted as zero
        ones = emit(wse.BroadcastToOp(emit.constant(1, elt), wse.tensor_shape(x)))
        filled = emit(wse.AvgPoolOp(ones, *args, True, last))
        count = emit(wse.MulOp(filled, emit.constant(taps, elt)))
        share = emit(wse.DivOp(g, count))
    front = _channels_front(emit, share, last)
    c, rows = wse.tensor_shape(front)[0], prod(wse.tensor_shape(front)[1:])
    column = emit(wse.ReshapeOp(front, (c, rows, 1)))
    patches = emit(wse.BroadcastToOp(column, (c, rows, taps)))
    return [emit(wse.Col2ImOp(patches, wse.tensor_shape(x), *args, c, last))]


def _max_pool(op: wse.MaxPoolOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    """Each output's gradient goes to its window's first maximum (torch's rule)."""
    x, last = op.input, op.is_channels_last
    rank = len(wse.tensor_shape(x))
    to_front = [0, rank - 1, *range(1, rank - 1)]
    x_nchw = emit(wse.TransposeOp(x, to_front)) if last else x
    g_nchw = emit(wse.TransposeOp(g, to_front)) if last else g
    where = emit(wse.ArgMaxPoolOp(x_nchw, *_window_args(op), 0))
    picked = prod(wse.tensor_shape(where))
    shape = wse.tensor_shape(x_nchw)
    flat = scatter_add(
        emit,
        (prod(shape),),
        emit(wse.ReshapeOp(where, (picked, 1))),
        emit(wse.ReshapeOp(g_nchw, (picked,))),
    )
    grad = emit(wse.ReshapeOp(flat, shape))
    back = [int(i) for i in np.argsort(to_front)]
    return [emit(wse.TransposeOp(grad, back)) if last else grad]


RULES: dict[type[Operation], Rule] = {
    wse.Im2ColOp: _im2col,
    wse.Col2ImOp: _col2im,
    wse.AvgPoolOp: _avg_pool,
    wse.MaxPoolOp: _max_pool,
}
"""The rules of this family, by op."""
