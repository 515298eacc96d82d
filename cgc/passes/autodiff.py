"""Reverse-mode automatic differentiation of the layers of ``@main``.

The first result of ``@main`` is the loss. For every forward layer, in reverse order, whose
results carry a gradient, the pass appends a backward layer ``<name>.grad`` that

* takes the gradients of the forward layer's results (summing the contributions of all their
  users) and the activations it needs: inputs of the forward layer, and values computed inside
  it, which the forward layer now also yields (they stay on the wafer, as in the real system);
* creates again the weights its vector-Jacobian products use (so in weight-streaming mode they
  stream a second time, in the order the backward kernels consume them);
* differentiates the forward body op by op in reverse, summing the gradients of values used
  several times (a parameter used twice gets both contributions);
* streams the gradient of every trainable weight out (``ws.stream_gradient``) and yields the
  gradients of the forward layer's inputs to the earlier backward layers.

The seed is ``loss_scale``: 1 on one system; with K systems whose losses are means over their
slice of the batch it is 1/K, so that SwarmX's sum of the K gradients is the gradient of the
mean over the global batch. Gradients stop at integer and boolean values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod

import numpy as np
from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import Float16Type, Float32Type, Float64Type, ModuleOp
from xdsl.ir import Block, BlockArgument, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from cgc.dialects import ws, wse
from cgc.dialects.ir import Emitter, main_function
from cgc.errors import CgcError

Grads = list[SSAValue | None]


def is_float(value: SSAValue) -> bool:
    """Whether gradients flow through ``value``."""
    return isinstance(wse.element_type(value), Float16Type | Float32Type | Float64Type)


def unbroadcast(emit: Emitter, g: SSAValue, shape: tuple[int, ...]) -> SSAValue:
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


def _same_shape(op: Operation, emit: Emitter, grads: Sequence[SSAValue]) -> Grads:
    """Unbroadcasts one gradient per operand."""
    return [
        unbroadcast(emit, g, wse.tensor_shape(v)) for g, v in zip(grads, op.operands, strict=True)
    ]


def _binary(op: Operation, emit: Emitter, g: SSAValue) -> Grads:
    a, b = op.operands
    y = op.results[0]
    if isinstance(op, wse.AddOp):
        return _same_shape(op, emit, [g, g])
    if isinstance(op, wse.SubOp):
        return _same_shape(op, emit, [g, emit(wse.NegOp(g))])
    if isinstance(op, wse.MulOp):
        return _same_shape(op, emit, [emit(wse.MulOp(g, b)), emit(wse.MulOp(g, a))])
    if isinstance(op, wse.DivOp):
        ga = emit(wse.DivOp(g, b))
        return _same_shape(op, emit, [ga, emit(wse.NegOp(emit(wse.MulOp(ga, y))))])
    if isinstance(op, wse.PowOp):
        one = emit.constant(1, wse.element_type(b))
        ga = emit(wse.MulOp(g, emit(wse.MulOp(b, emit(wse.PowOp(a, emit(wse.SubOp(b, one))))))))
        gb = emit(wse.MulOp(g, emit(wse.MulOp(y, emit(wse.LogOp(a))))))
        return _same_shape(op, emit, [ga, gb])
    # max / min: the gradient goes to the operand that won; ties go to the left one.
    loses = emit(wse.GreaterOp(b, a) if isinstance(op, wse.MaxOp) else wse.GreaterOp(a, b))
    zero = emit.constant(0, wse.element_type(g))
    return _same_shape(
        op, emit, [emit(wse.SelectOp(loses, zero, g)), emit(wse.SelectOp(loses, g, zero))]
    )


def _unary(op: Operation, emit: Emitter, g: SSAValue) -> Grads:
    x, y = op.operands[0], op.results[0]
    elt = wse.element_type(x)

    def const(value: float) -> SSAValue:
        return emit.constant(value, elt)

    def where_positive(positive: SSAValue, other: Callable[[SSAValue], SSAValue]) -> SSAValue:
        zero = const(0)
        return emit(wse.SelectOp(emit(wse.GreaterOp(x, zero)), positive, other(zero)))

    def negative_part(zero: SSAValue) -> SSAValue:
        return emit(wse.SelectOp(emit(wse.GreaterOp(zero, x)), emit(wse.NegOp(g)), zero))

    def erf() -> SSAValue:
        bell = emit(wse.ExpOp(emit(wse.NegOp(emit(wse.MulOp(x, x))))))
        return emit(wse.MulOp(g, emit(wse.MulOp(const(2 / np.sqrt(np.pi)), bell))))

    rules: dict[type[Operation], Callable[[], SSAValue]] = {
        wse.NegOp: lambda: emit(wse.NegOp(g)),
        wse.ExpOp: lambda: emit(wse.MulOp(g, y)),
        wse.LogOp: lambda: emit(wse.DivOp(g, x)),
        wse.SqrtOp: lambda: emit(wse.DivOp(emit(wse.MulOp(g, const(0.5))), y)),
        wse.ReciprocalOp: lambda: emit(wse.NegOp(emit(wse.MulOp(g, emit(wse.MulOp(y, y)))))),
        wse.ReluOp: lambda: where_positive(g, lambda zero: zero),
        wse.AbsOp: lambda: where_positive(g, negative_part),
        wse.SigmoidOp: lambda: emit(wse.MulOp(g, emit(wse.MulOp(y, emit(wse.SubOp(const(1), y)))))),
        wse.TanhOp: lambda: emit(wse.MulOp(g, emit(wse.SubOp(const(1), emit(wse.MulOp(y, y)))))),
        wse.ErfOp: erf,
    }
    return [rules[type(op)]()]


def _kept(emit: Emitter, op: wse.ReduceOp, g: SSAValue) -> SSAValue:
    """A reduction's gradient broadcast back to the input's shape."""
    shape = wse.tensor_shape(op.input)
    kept = tuple(1 if i in op.axis_list else d for i, d in enumerate(shape))
    return emit(wse.BroadcastToOp(emit(wse.ReshapeOp(g, kept)), shape))


_DIFFERENTIABLE_REDUCTIONS = (wse.ReduceSumOp, wse.ReduceMeanOp, wse.ReduceMaxOp, wse.ReduceMinOp)


def _reduce(op: wse.ReduceOp, emit: Emitter, g: SSAValue) -> Grads:
    spread = _kept(emit, op, g)
    shape, elt = wse.tensor_shape(op.input), wse.element_type(op.input)
    if isinstance(op, wse.ReduceSumOp):
        return [spread]
    if isinstance(op, wse.ReduceMeanOp):
        count = prod(shape[a] for a in op.axis_list)
        return [emit(wse.MulOp(spread, emit.constant(1 / count, elt)))]
    # max / min: shared evenly among the elements that attain it (torch.amax's rule)
    reached = _kept(emit, op, op.result)
    hit = emit(
        wse.SelectOp(
            emit(wse.EqualOp(op.input, reached)), emit.constant(1, elt), emit.constant(0, elt)
        )
    )
    ties = emit(wse.ReduceSumOp(hit, list(op.axis_list), True))
    return [emit(wse.MulOp(spread, emit(wse.DivOp(hit, ties))))]


def _swap_last(emit: Emitter, v: SSAValue) -> SSAValue:
    rank = len(wse.tensor_shape(v))
    return emit(wse.TransposeOp(v, [*range(rank - 2), rank - 1, rank - 2]))


def _matmul(op: wse.MatmulOp, emit: Emitter, g: SSAValue) -> Grads:
    a, b = op.lhs, op.rhs
    ga = emit(wse.MatmulOp(g, _swap_last(emit, b)))
    gb = emit(wse.MatmulOp(_swap_last(emit, a), g))
    return _same_shape(op, emit, [ga, gb])


def _shape_op(op: Operation, emit: Emitter, g: SSAValue) -> Grads:
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


def _along(emit: Emitter, v: SSAValue, axis: int, start: int, stop: int) -> SSAValue:
    """``v[start:stop]`` along ``axis``."""
    shape = wse.tensor_shape(v)
    starts = [start if i == axis else 0 for i in range(len(shape))]
    limits = [stop if i == axis else d for i, d in enumerate(shape)]
    return emit(wse.SliceOp(v, starts, limits, [1] * len(shape)))


def _zeros_around(emit: Emitter, v: SSAValue, axis: int, before: int, after: int) -> SSAValue:
    """``v`` with zeros before and after it along ``axis``."""
    if not before and not after:
        return v
    rank = len(wse.tensor_shape(v))
    low = [before if i == axis else 0 for i in range(rank)]
    high = [after if i == axis else 0 for i in range(rank)]
    return emit(wse.PadOp(v, low, high))


def _pad(op: wse.PadOp, emit: Emitter, g: SSAValue) -> Grads:
    """Axis by axis in reverse (numpy pads them in order): the middle part, plus what each
    padded element read, put back where it read it."""
    mode, shape = op.mode.data, wse.tensor_shape(op.input)
    for axis in reversed(range(len(shape))):
        low, high = op.low.get_values()[axis], op.high.get_values()[axis]
        g = _unpad_axis(op, emit, g, axis, (shape[axis], low, high, mode))
    return [g]


def _unpad_axis(op: wse.PadOp, emit: Emitter, g: SSAValue, axis: int, geometry) -> SSAValue:
    n, low, high, mode = geometry
    if (
        min(low, high) < 0
        or (mode == "reflect" and max(low, high) > n - 1)
        or (mode == "wrap" and max(low, high) > n)
    ):
        raise _not_differentiable(op, f"{mode} padding of {low}, {high} around {n} elements")
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


def _slice(op: wse.SliceOp, emit: Emitter, g: SSAValue) -> Grads:
    """Each element back at the place it was taken from, zeros elsewhere, axis by axis."""
    shape = wse.tensor_shape(op.input)
    starts = op.starts.get_values()
    for axis, step in enumerate(op.strides.get_values()):
        if step < 1:
            raise _not_differentiable(op, "slices with negative strides")
        g = _unslice_axis(emit, g, axis, shape[axis], starts[axis], step)
    return [g]


def _unslice_axis(emit: Emitter, g: SSAValue, axis: int, n: int, start: int, step: int):
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


def _concat(op: wse.ConcatOp, emit: Emitter, g: SSAValue) -> Grads:
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


def _select(op: wse.SelectOp, emit: Emitter, g: SSAValue) -> Grads:
    zero = emit.constant(0, wse.element_type(g))
    on_true = emit(wse.SelectOp(op.cond, g, zero))
    on_false = emit(wse.SelectOp(op.cond, zero, g))
    return [
        None,
        unbroadcast(emit, on_true, wse.tensor_shape(op.true_value)),
        unbroadcast(emit, on_false, wse.tensor_shape(op.false_value)),
    ]


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


def _im2col(op: wse.Im2ColOp, emit: Emitter, g: SSAValue) -> Grads:
    image = wse.tensor_shape(op.input)
    group, last = op.group.value.data, op.is_channels_last
    return [emit(wse.Col2ImOp(g, image, *_window_args(op), group, last))]


def _channels_front(emit: Emitter, v: SSAValue, channels_last: bool) -> SSAValue:
    """``v`` as (C, N, *spatial), from (N, C, *spatial) or (N, *spatial, C)."""
    rank = len(wse.tensor_shape(v))
    perm = [rank - 1, 0, *range(1, rank - 1)] if channels_last else [1, 0, *range(2, rank)]
    return emit(wse.TransposeOp(v, perm))


def _avg_pool(op: wse.AvgPoolOp, emit: Emitter, g: SSAValue) -> Grads:
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


def _max_pool(op: wse.MaxPoolOp, emit: Emitter, g: SSAValue) -> Grads:
    """Each output's gradient goes to its window's first maximum (torch's rule)."""
    x, last = op.input, op.is_channels_last
    rank = len(wse.tensor_shape(x))
    to_front = [0, rank - 1, *range(1, rank - 1)]
    x_nchw = emit(wse.TransposeOp(x, to_front)) if last else x
    g_nchw = emit(wse.TransposeOp(g, to_front)) if last else g
    where = emit(wse.ArgMaxPoolOp(x_nchw, *_window_args(op), 0))
    picked = prod(wse.tensor_shape(where))
    shape = wse.tensor_shape(x_nchw)
    flat = _scatter_add(
        emit,
        (prod(shape),),
        emit(wse.ReshapeOp(where, (picked, 1))),
        emit(wse.ReshapeOp(g_nchw, (picked,))),
    )
    grad = emit(wse.ReshapeOp(flat, shape))
    back = [int(i) for i in np.argsort(to_front)]
    return [emit(wse.TransposeOp(grad, back)) if last else grad]


def _scatter_add(emit: Emitter, shape, indices: SSAValue, updates: SSAValue) -> SSAValue:
    """Zeros of ``shape`` with ``updates`` added at ``indices`` (ScatterND)."""
    zeros = emit(wse.BroadcastToOp(emit.constant(0, wse.element_type(updates)), shape))
    return emit(wse.ScatterNDOp(zeros, indices, updates, "add"))


def _wrapped(emit: Emitter, indices: SSAValue, size: int) -> SSAValue:
    """Negative indices counted from the end."""
    elt = wse.element_type(indices)
    negative = emit(wse.GreaterOp(emit.constant(0, elt), indices))
    return emit(wse.SelectOp(negative, emit(wse.AddOp(indices, emit.constant(size, elt))), indices))


def _gather(op: wse.GatherOp, emit: Emitter, g: SSAValue) -> Grads:
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
    front = _scatter_add(emit, (data[axis], *rest), flat, updates)
    back = [*range(1, axis + 1), 0, *range(axis + 1, len(data))]
    return [emit(wse.TransposeOp(front, back)), None]


def _gather_elements(op: wse.GatherElementsOp, emit: Emitter, g: SSAValue) -> Grads:
    data, axis = wse.tensor_shape(op.data), op.axis.value.data
    zeros = emit(wse.BroadcastToOp(emit.constant(0, wse.element_type(g)), data))
    indices = _wrapped(emit, op.indices, data[axis])
    return [emit(wse.ScatterElementsOp(zeros, indices, g, axis, "add")), None]


def _math(op: Operation, emit: Emitter, g: SSAValue) -> Grads:
    """The trigonometric and hyperbolic functions and their inverses; the rounding functions
    and sign are flat almost everywhere (gradient 0, as in torch)."""
    x, y = op.operands[0], op.results[0]
    elt = wse.element_type(x)

    def const(value: float) -> SSAValue:
        return emit.constant(value, elt)

    def square(v: SSAValue) -> SSAValue:
        return emit(wse.MulOp(v, v))

    def over(denominator: SSAValue) -> SSAValue:
        return emit(wse.DivOp(g, denominator))

    def root(v: SSAValue) -> SSAValue:
        return emit(wse.SqrtOp(v))

    rules: dict[type[Operation], Callable[[], SSAValue]] = {
        wse.SinOp: lambda: emit(wse.MulOp(g, emit(wse.CosOp(x)))),
        wse.CosOp: lambda: emit(wse.NegOp(emit(wse.MulOp(g, emit(wse.SinOp(x)))))),
        wse.TanOp: lambda: emit(wse.MulOp(g, emit(wse.AddOp(const(1), square(y))))),
        wse.AsinOp: lambda: over(root(emit(wse.SubOp(const(1), square(x))))),
        wse.AcosOp: lambda: emit(wse.NegOp(over(root(emit(wse.SubOp(const(1), square(x))))))),
        wse.AtanOp: lambda: over(emit(wse.AddOp(const(1), square(x)))),
        wse.SinhOp: lambda: emit(wse.MulOp(g, emit(wse.CoshOp(x)))),
        wse.CoshOp: lambda: emit(wse.MulOp(g, emit(wse.SinhOp(x)))),
        wse.AsinhOp: lambda: over(root(emit(wse.AddOp(square(x), const(1))))),
        wse.AcoshOp: lambda: over(root(emit(wse.SubOp(square(x), const(1))))),
        wse.AtanhOp: lambda: over(emit(wse.SubOp(const(1), square(x)))),
    }
    if type(op) in rules:
        return [rules[type(op)]()]
    return [emit(wse.BroadcastToOp(const(0), wse.tensor_shape(x)))]  # sign, floor, ceil, round


def _stop(op: Operation, emit: Emitter, g: SSAValue) -> Grads:
    return [None]


def _reverse(op: wse.ReverseOp, emit: Emitter, g: SSAValue) -> Grads:
    return [emit(wse.ReverseOp(g, list(op.axes.get_values())))]


def _tile(op: wse.TileOp, emit: Emitter, g: SSAValue) -> Grads:
    """The sum of the gradients of every copy."""
    shape, repeats = wse.tensor_shape(op.input), list(op.repeats.get_values())
    split = [d for r, n in zip(repeats, shape, strict=True) for d in (r, n)]
    copies = emit(wse.ReshapeOp(g, split))
    summed = emit(wse.ReduceSumOp(copies, list(range(0, 2 * len(shape), 2)), False))
    return [summed]


def _cumsum(op: wse.CumSumOp, emit: Emitter, g: SSAValue) -> Grads:
    """Each element adds to the running sums after it (before it, run in reverse)."""
    axis, exclusive = op.axis.value.data, bool(op.exclusive.value.data)
    return [emit(wse.CumSumOp(g, axis, exclusive, not op.reverse.value.data))]


def _reduce_prod(op: wse.ReduceProdOp, emit: Emitter, g: SSAValue) -> Grads:
    """The product of the other elements, as the exclusive running products from both ends
    (exact where elements are zero, unlike ``y / x``)."""
    x, axes = op.input, sorted(op.axis_list)
    shape = wse.tensor_shape(x)
    rest = [i for i in range(len(shape)) if i not in axes]
    moved = emit(wse.TransposeOp(x, rest + axes))
    kept, count = [shape[i] for i in rest], prod(shape[i] for i in axes)
    flat = emit(wse.ReshapeOp(moved, (*kept, count)))
    last = len(kept)
    before = emit(wse.CumProdOp(flat, last, True, False))
    after = emit(wse.CumProdOp(flat, last, True, True))
    others = emit(wse.MulOp(before, after))
    others = emit(wse.ReshapeOp(others, [*kept, *(shape[i] for i in axes)]))
    others = emit(wse.TransposeOp(others, [int(i) for i in np.argsort(rest + axes)]))
    return [emit(wse.MulOp(others, _kept(emit, op, g)))]


def _gather_nd(op: wse.GatherNDOp, emit: Emitter, g: SSAValue) -> Grads:
    if op.batch_dims.value.data:
        raise _not_differentiable(op, "gather_nd with batch_dims")
    data = wse.tensor_shape(op.data)
    return [_scatter_add(emit, data, op.indices, g), None]


def _scatter(op: wse.ScatterElementsOp | wse.ScatterNDOp, emit: Emitter, g: SSAValue) -> Grads:
    """``data`` keeps the gradient where it was not overwritten (all of it for ``add``); the
    updates get the gradient at the places they went to."""
    reduction = op.reduction.data
    if reduction not in ("none", "add"):
        raise _not_differentiable(op, f"scatter with reduction {reduction}")
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


def _topk(op: wse.TopKOp, emit: Emitter, g: SSAValue) -> Grads:
    """The values' gradients go back to the elements they were taken from."""
    shape, axis = wse.tensor_shape(op.input), op.axis.value.data
    zeros = emit(wse.BroadcastToOp(emit.constant(0, wse.element_type(g)), shape))
    return [emit(wse.ScatterElementsOp(zeros, op.results[1], g, axis, "add"))]


def _col2im(op: wse.Col2ImOp, emit: Emitter, g: SSAValue) -> Grads:
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


def _not_differentiable(op: Operation, what: str) -> CgcError:
    where = wse.location_name(op)
    return CgcError(
        f"autodiff: {op.name}{f' (node {where})' if where else ''} has no gradient yet ({what})"
    )


RULES: dict[type[Operation], Callable[..., Grads]] = {
    **{cls: _binary for cls in (wse.AddOp, wse.SubOp, wse.MulOp, wse.DivOp, wse.PowOp,
                                 wse.MaxOp, wse.MinOp)},
    **{cls: _unary for cls in wse.UNARY_OPS},
    **{cls: _reduce for cls in _DIFFERENTIABLE_REDUCTIONS},
    wse.MatmulOp: _matmul,
    **{cls: _shape_op for cls in (wse.ReshapeOp, wse.TransposeOp, wse.BroadcastToOp,
                                   wse.CastOp)},
    wse.PadOp: _pad,
    wse.SliceOp: _slice,
    wse.ConcatOp: _concat,
    wse.SelectOp: _select,
    wse.Im2ColOp: _im2col,
    wse.AvgPoolOp: _avg_pool,
    wse.MaxPoolOp: _max_pool,
    wse.GatherOp: _gather,
    wse.GatherElementsOp: _gather_elements,
    **{cls: _math for cls in wse.MATH_OPS if cls not in (wse.NotOp, wse.BitwiseNotOp)},
    wse.StopGradientOp: _stop,
    wse.ReverseOp: _reverse,
    wse.TileOp: _tile,
    wse.CumSumOp: _cumsum,
    wse.ReduceProdOp: _reduce_prod,
    wse.GatherNDOp: _gather_nd,
    wse.ScatterElementsOp: _scatter,
    wse.ScatterNDOp: _scatter,
    wse.TopKOp: _topk,
    wse.Col2ImOp: _col2im,
}  # fmt: skip
"""Vector-Jacobian products: ``rule(op, emit, grad_of_result) -> grad per operand``."""


class Differentiator:
    """Appends the backward layers of one function."""

    def __init__(self, fn: func.FuncOp, patterns: Sequence[str], seed: float):
        self.fn = fn
        self.patterns = [re.compile(p) for p in patterns]
        self.seed = seed
        self.block = fn.body.block
        self.needs: set[SSAValue] = set()
        self.inner: dict[wse.LayerOp, set[SSAValue]] = {}
        self.partials: dict[SSAValue, list[SSAValue]] = {}
        self.trained: set[str] = set()

    def trainable(self, op: Operation) -> bool:
        """Whether ``op`` is a weight the pass differentiates with respect to."""
        if not isinstance(op, wse.WeightOp) or op.frozen is not None or not is_float(op.result):
            return False
        name = op.weight_name.data
        return not self.patterns or any(p.fullmatch(name) for p in self.patterns)

    @property
    def ret(self) -> func.ReturnOp:
        """The function's return."""
        ret = self.block.last_op
        assert isinstance(ret, func.ReturnOp)
        return ret

    def run(self) -> set[str]:
        """Differentiates; returns the names of the weights that receive gradients."""
        ret = self.ret
        if any(isinstance(op, ws.StreamGradientOp) for op in self.fn.walk()):
            raise CgcError("autodiff: @main already streams gradients; differentiate once")
        if not ret.arguments:
            raise CgcError("autodiff: @main returns nothing; its first result must be the loss")
        loss = ret.arguments[0]
        if wse.tensor_shape(loss) != () or not is_float(loss):
            raise CgcError(
                f"autodiff: the first output must be a scalar float loss, not "
                f"{wse.tensor_shape(loss)} {wse.element_type(loss)}"
            )
        layers = [op for op in self.block.ops if isinstance(op, wse.LayerOp)]
        for layer in layers:
            self._forward(layer)
        if loss not in self.needs:
            raise CgcError(
                "autodiff: no trainable parameter reaches the loss"
                + (f" (patterns {[p.pattern for p in self.patterns]})" if self.patterns else "")
            )
        for layer in reversed(layers):
            self._backward(layer, loss)
        return self.trained

    def _forward(self, layer: wse.LayerOp) -> None:
        """Marks the values inside ``layer`` that depend on a trainable weight."""
        body = layer.body.block
        inner: set[SSAValue] = {
            a for a, v in zip(body.args, layer.inputs, strict=True) if v in self.needs
        }
        for op in body.ops:
            if isinstance(op, wse.YieldOp):
                for result, value in zip(layer.results, op.values, strict=True):
                    if value in inner:
                        self.needs.add(result)
            elif isinstance(op, wse.StopGradientOp):
                continue
            elif self.trainable(op) or any(v in inner for v in op.operands):
                # Ops without a rule still carry the dependence: if a gradient reaches one,
                # _vjp reports it instead of silently dropping it.
                inner.update(r for r in op.results if is_float(r))
        self.inner[layer] = inner

    def _backward(self, layer: wse.LayerOp, loss: SSAValue) -> None:
        seeded = [
            (i, r) for i, r in enumerate(layer.results)
            if r in self.needs and (r is loss or self.partials.get(r))
        ]  # fmt: skip
        if not seeded:
            return
        body = layer.body.block
        grad_block = Block()
        builder = Builder(InsertPoint.at_end(grad_block))
        args: list[SSAValue] = []

        def arg_for(value: SSAValue) -> SSAValue:
            args.append(value)
            return grad_block.insert_arg(value.type, len(grad_block.args))

        cot: dict[SSAValue, SSAValue] = {}
        yielded = body.last_op
        assert isinstance(yielded, wse.YieldOp)
        for index, result in seeded:
            producer = yielded.values[index].owner
            emit = Emitter(builder.insert, producer if isinstance(producer, Operation) else layer)
            if result is loss:
                g = emit.constant(self.seed, wse.element_type(loss))
            else:
                parts = [arg_for(p) for p in self.partials[result]]
                g = parts[0]
                for part in parts[1:]:
                    g = emit(wse.AddOp(g, part))
            _accumulate(cot, yielded.values[index], g, emit)
        inner = self.inner[layer]
        for op in reversed(list(body.ops)):
            self._vjp(op, cot, inner, Emitter(builder.insert, op))
        outputs = [(v, cot[a]) for a, v in zip(body.args, layer.inputs, strict=True) if a in cot]
        builder.insert(wse.YieldOp(*[g for _, g in outputs]))
        saved = self._capture(layer, grad_block, arg_for)
        grad_layer = wse.LayerOp(
            f"{layer.layer_name.data}.grad",
            args,
            [g.type for _, g in outputs],
            Region(grad_block),
        )
        grad_layer.location = layer.location
        Rewriter.insert_op(grad_layer, InsertPoint.before(self.ret))
        if saved:
            self._save(layer, saved)
        for (value, _), result in zip(outputs, grad_layer.results, strict=True):
            self.partials.setdefault(value, []).append(result)

    def _vjp(self, op: Operation, cot: dict, inner: set[SSAValue], emit: Emitter) -> None:
        if isinstance(op, wse.YieldOp) or not op.results or op.results[0] not in cot:
            return
        g = cot[op.results[0]]
        if self.trainable(op):
            assert isinstance(op, wse.WeightOp)
            perm = None if op.perm is None else list(op.perm.get_values())
            emit(ws.StreamGradientOp(op.weight_name.data, g, perm))
            self.trained.add(op.weight_name.data)
            return
        if not any(v in inner for v in op.operands):
            return
        rule = RULES.get(type(op))
        if rule is None:
            raise _not_differentiable(op, "no vector-Jacobian product")
        for operand, grad in zip(op.operands, rule(op, emit, g), strict=True):
            if grad is not None and operand in inner:
                _accumulate(cot, operand, grad, emit)

    def _capture(self, layer: wse.LayerOp, grad_block: Block, arg_for) -> list[SSAValue]:
        """Rewires the backward body's uses of forward values: weights and constants are
        created again, forward inputs and computed values come in as arguments. Returns the
        computed values the forward layer must now also yield."""
        body = layer.body.block
        yielded = body.last_op
        assert isinstance(yielded, wse.YieldOp)
        results = dict(zip(yielded.values, layer.results, strict=True))
        saved: list[SSAValue] = []
        replacements: dict[SSAValue, SSAValue] = {}
        ops = list(grad_block.ops)
        for op in ops:
            for value in op.operands:
                if value in replacements or not _defined_in(value, body):
                    continue
                owner = value.owner
                if isinstance(owner, wse.WeightOp | wse.ConstantOp):
                    clone = owner.clone()
                    Rewriter.insert_op(clone, InsertPoint.before(ops[0]))
                    replacements[value] = clone.results[0]
                elif isinstance(value, BlockArgument):
                    replacements[value] = arg_for(layer.inputs[value.index])
                elif value in results:  # already a result of the forward layer
                    replacements[value] = arg_for(results[value])
                else:
                    saved.append(value)
                    replacements[value] = arg_for(value)
        for old, new in replacements.items():
            old.replace_uses_with_if(new, lambda use: use.operation.parent_block() is grad_block)
        return saved

    def _save(self, layer: wse.LayerOp, saved: list[SSAValue]) -> None:
        """Makes ``layer`` also yield ``saved``; the backward layer's arguments that stood for
        them take the new results."""
        body = layer.body.block
        yielded = body.last_op
        assert isinstance(yielded, wse.YieldOp)
        values = [*yielded.values, *saved]
        Rewriter.replace_op(yielded, wse.YieldOp(*values))
        grown = wse.LayerOp(
            layer.layer_name.data,
            list(layer.inputs),
            [v.type for v in values],
            layer.detach_region(layer.body),
            layer.rect,
        )
        grown.location = layer.location
        Rewriter.insert_op(grown, InsertPoint.before(layer))
        count = len(layer.results)
        for old, new in zip(layer.results, grown.results[:count], strict=True):
            old.replace_all_uses_with(new)
        for value, new in zip(saved, grown.results[count:], strict=True):
            value.replace_uses_with_if(new, lambda use: not _inside(use.operation, grown))
        self.inner[grown] = self.inner.pop(layer)
        Rewriter.erase_op(layer)


def _defined_in(value: SSAValue, block: Block) -> bool:
    if isinstance(value, BlockArgument):
        return value.block is block
    return value.owner.parent_block() is block


def _inside(op: Operation, ancestor: Operation) -> bool:
    parent = op.parent_op()
    while parent is not None:
        if parent is ancestor:
            return True
        parent = parent.parent_op()
    return False


def _accumulate(cot: dict[SSAValue, SSAValue], value: SSAValue, g: SSAValue, emit: Emitter):
    cot[value] = emit(wse.AddOp(cot[value], g)) if value in cot else g


@dataclass(frozen=True)
class AutodiffPass(ModulePass):
    """Appends backward layers that stream the gradients of the trainable weights."""

    name = "autodiff"

    trainable: tuple[str, ...] = ()
    """Regular expressions matched in full against weight names; empty: every weight that
    is not frozen and holds floats."""
    loss_scale: float = 1.0
    """The seed of the backward pass."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        Differentiator(main_function(op), self.trainable, self.loss_scale).run()
