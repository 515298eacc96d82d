"""Vector-Jacobian products of the shape ops: the elements moved, repeated or padded.

Each gradient element goes back to the place its element came from: reshape, transpose and
reverse are undone, broadcast and tile sum the copies, a slice goes back among zeros (strided
slices too; negative strides have no rule) and concat's gradient is cut into its inputs'.
Padding follows numpy.pad axis by axis: a ``constant`` pad drops the border; ``edge``,
``reflect`` and ``wrap`` add what each padded element read back onto the element it read (a pad
wider than those modes allow, or a negative one, has no rule). A cast casts the gradient back
to the input's type.
"""

from __future__ import annotations

import numpy as np
from xdsl.ir import Operation, SSAValue

from cgc.dialects import wse
from cgc.dialects.gradients.base import Grads, Rule, not_differentiable, unbroadcast
from cgc.dialects.ir import LocatedInserter


def _shape_op(op: Operation, emit: LocatedInserter, g: SSAValue) -> Grads:
    x = op.operands[0]
    shape = wse.tensor_shape(x)
    if isinstance(op, wse.ReshapeOp):
        return [emit(wse.ReshapeOp(g, shape))]
    if isinstance(op, wse.TransposeOp):
        return [emit(wse.TransposeOp(g, [int(i) for i in np.argsort(op.perm.get_values())]))]
    if isinstance(op, wse.BroadcastToOp):
        return [unbroadcast(emit, g, shape)]
    assert isinstance(op, wse.CastOp)
    return [emit(wse.CastOp(g, wse.element_type(x)))]


def _reverse(op: wse.ReverseOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    return [emit(wse.ReverseOp(g, list(op.axes.get_values())))]


def _tile(op: wse.TileOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    """The sum of the gradients of every copy."""
    shape, repeats = wse.tensor_shape(op.input), list(op.repeats.get_values())
    split = [d for r, n in zip(repeats, shape, strict=True) for d in (r, n)]
    copies = emit(wse.ReshapeOp(g, split))
    summed = emit(wse.ReduceSumOp(copies, list(range(0, 2 * len(shape), 2)), False))
    return [summed]


def _along(emit: LocatedInserter, v: SSAValue, axis: int, start: int, stop: int) -> SSAValue:
    """``v[start:stop]`` along ``axis``."""
    shape = wse.tensor_shape(v)
    starts = [start if i == axis else 0 for i in range(len(shape))]
    limits = [stop if i == axis else d for i, d in enumerate(shape)]
    return emit(wse.SliceOp(v, starts, limits, [1] * len(shape)))


def _zeros_around(
    emit: LocatedInserter, v: SSAValue, axis: int, before: int, after: int
) -> SSAValue:
    """``v`` with zeros before and after it along ``axis``."""
    if not before and not after:
        return v
    rank = len(wse.tensor_shape(v))
    low = [before if i == axis else 0 for i in range(rank)]
    high = [after if i == axis else 0 for i in range(rank)]
    return emit(wse.PadOp(v, low, high))


def _pad(op: wse.PadOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    """Axis by axis in reverse (numpy pads them in order): the middle part, plus what each
    padded element read, put back where it read it."""
    mode, shape = op.mode.data, wse.tensor_shape(op.input)
    for axis in reversed(range(len(shape))):
        low, high = op.low.get_values()[axis], op.high.get_values()[axis]
        g = _unpad_axis(op, emit, g, axis, (shape[axis], low, high, mode))
    return [g]


def _unpad_axis(
    op: wse.PadOp,
    emit: LocatedInserter,
    g: SSAValue,
    axis: int,
    geometry: tuple[int, int, int, str],
) -> SSAValue:
    """The gradient of the padding of ``axis``: ``geometry`` is the axis's length, the pads
    before and after it, and the mode."""
    n, low, high, mode = geometry
    if (
        min(low, high) < 0
        or (mode == "reflect" and max(low, high) > n - 1)
        or (mode == "wrap" and max(low, high) > n)
    ):
        raise not_differentiable(op, f"{mode} padding of {low}, {high} around {n} elements")
    total = _along(emit, g, axis, low, low + n)
    if mode == "constant":
        return total
    sides = [(_along(emit, g, axis, 0, low), low, True)] if low else []
    if high:
        sides.append((_along(emit, g, axis, low + n, low + n + high), high, False))
    for part, width, before in sides:
        if mode == "edge":  # every padded element read the edge element
            piece, at = emit(wse.ReduceSumOp(part, [axis], True)), 0 if before else n - 1
        elif mode == "reflect":  # mirrored about the edge element, which is not repeated
            piece, at = emit(wse.ReverseOp(part, [axis])), 1 if before else n - 1 - width
        else:  # wrap: the elements from the other end, in order
            piece, at = part, n - width if before else 0
        size = wse.tensor_shape(piece)[axis]
        total = emit(wse.AddOp(total, _zeros_around(emit, piece, axis, at, n - at - size)))
    return total


def _slice(op: wse.SliceOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    """Each element back at the place it was taken from, zeros elsewhere, axis by axis."""
    shape = wse.tensor_shape(op.input)
    starts = op.starts.get_values()
    for axis, step in enumerate(op.strides.get_values()):
        if step < 1:
            raise not_differentiable(op, "slices with negative strides")
        g = _unslice_axis(emit, g, axis, shape[axis], starts[axis], step)
    return [g]


def _unslice_axis(
    emit: LocatedInserter, g: SSAValue, axis: int, n: int, start: int, step: int
) -> SSAValue:
    """``g`` (the elements ``start, start + step, ...`` along ``axis``) spread over ``n``."""
    shape = list(wse.tensor_shape(g))
    taken = shape[axis]
    if step > 1 and taken:  # element i goes to i * step: a unit axis padded to the step
        spread = emit(wse.ReshapeOp(g, [*shape[: axis + 1], 1, *shape[axis + 1 :]]))
        spread = _zeros_around(emit, spread, axis + 1, 0, step - 1)
        g = emit(wse.ReshapeOp(spread, [*shape[:axis], taken * step, *shape[axis + 1 :]]))
        taken = min(taken * step, n - start)
        g = _along(emit, g, axis, 0, taken)
    return _zeros_around(emit, g, axis, start, n - start - taken)


def _concat(op: wse.ConcatOp, emit: LocatedInserter, g: SSAValue) -> Grads:
    axis, out = op.axis.value.data, wse.tensor_shape(op.result)
    grads: Grads = []
    offset = 0
    for v in op.inputs:
        size = wse.tensor_shape(v)[axis]
        starts = [offset if i == axis else 0 for i in range(len(out))]
        limits = [offset + size if i == axis else d for i, d in enumerate(out)]
        grads.append(emit(wse.SliceOp(g, starts, limits, [1] * len(out))))
        offset += size
    return grads


RULES: dict[type[Operation], Rule] = {
    **{cls: _shape_op for cls in (wse.ReshapeOp, wse.TransposeOp, wse.BroadcastToOp,
                                   wse.CastOp)},
    wse.ReverseOp: _reverse,
    wse.TileOp: _tile,
    wse.PadOp: _pad,
    wse.SliceOp: _slice,
    wse.ConcatOp: _concat,
}  # fmt: skip
"""The rules of this family, by op."""
