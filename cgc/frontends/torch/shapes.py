"""Lowerings of the core ATen ops that move, copy or create data: views and reshapes,
permutations, broadcasting, slicing and selection, concatenation, padding, casts and the
factory ops of constants."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from math import prod

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    axis_of,
    broadcast,
    cast,
    reshape,
    shape_of,
    slice_axes,
    transpose,
)
from cgc.frontends.torch.lowering import Lowering, register


@register("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def _view(lw: Lowering, x: SSAValue, size: Sequence[int]) -> SSAValue:
    shape = list(size)
    if shape.count(-1) == 1:
        known = prod(d for d in shape if d != -1)
        shape[shape.index(-1)] = prod(shape_of(x)) // max(known, 1)
    if prod(shape) != prod(shape_of(x)):
        raise NodeError(f"cannot view shape {list(shape_of(x))} as {list(size)}")
    return reshape(lw, x, shape)


@register("aten.permute.default")
def _permute(lw: Lowering, x: SSAValue, dims: Sequence[int]) -> SSAValue:
    rank = len(shape_of(x))
    return transpose(lw, x, [axis_of(d, rank, "dims") for d in dims])


@register("aten.t.default")
def _t(lw: Lowering, x: SSAValue) -> SSAValue:
    return transpose(lw, x, list(range(len(shape_of(x))))[::-1])


@register("aten.transpose.int")
def _transpose(lw: Lowering, x: SSAValue, dim0: int, dim1: int) -> SSAValue:
    rank = len(shape_of(x))
    perm = list(range(rank))
    a, b = axis_of(dim0, rank, "dim0"), axis_of(dim1, rank, "dim1")
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(lw, x, perm)


@register("aten.expand.default")
def _expand(lw: Lowering, x: SSAValue, size: Sequence[int]) -> SSAValue:
    shape = shape_of(x)
    lead = len(size) - len(shape)
    target = [shape[i - lead] if d == -1 else d for i, d in enumerate(size)]
    return broadcast(lw, reshape(lw, x, [1] * lead + list(shape)), target)


@register("aten.unsqueeze.default")
def _unsqueeze(lw: Lowering, x: SSAValue, dim: int) -> SSAValue:
    shape = list(shape_of(x))
    shape.insert(axis_of(dim, len(shape) + 1, "dim"), 1)
    return reshape(lw, x, shape)


@register("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default")
def _squeeze(lw: Lowering, x: SSAValue, dims: int | Sequence[int] | None = None) -> SSAValue:
    shape = shape_of(x)
    if dims is None:
        dims = range(len(shape))
    elif isinstance(dims, int):
        dims = [dims]
    axes = {axis_of(d, len(shape), "dim") for d in dims} if shape else set()
    return reshape(lw, x, [d for i, d in enumerate(shape) if not (i in axes and d == 1)])


@register("aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default")
def _clone(lw: Lowering, x: SSAValue, **_: object) -> SSAValue:
    return x


@register("aten._to_copy.default", "aten.to.dtype")
def _to_copy(lw: Lowering, x: SSAValue, *args: object, **_: object) -> SSAValue:
    return cast(lw, x, lw.result_dtype())


@register("aten.slice.Tensor")
def _slice(
    lw: Lowering,
    x: SSAValue,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> SSAValue:
    shape = shape_of(x)
    axis = axis_of(dim, len(shape), "dim")
    if step < 1:
        raise NodeError(f"step={step} is not supported (positive steps only)")
    begin, stop, _ = slice(start, end).indices(shape[axis])
    return slice_axes(lw, x, {axis: (begin, max(begin, stop))}, {axis: step})


@register("aten.select.int")
def _select(lw: Lowering, x: SSAValue, dim: int, index: int) -> SSAValue:
    shape = shape_of(x)
    axis = axis_of(dim, len(shape), "dim")
    if not -shape[axis] <= index < shape[axis]:
        raise NodeError(f"index {index} is out of range for size {shape[axis]}")
    index %= shape[axis]
    part = slice_axes(lw, x, {axis: (index, index + 1)}, None)
    return reshape(lw, part, [d for i, d in enumerate(shape) if i != axis])


@register("aten.cat.default")
def _cat(lw: Lowering, tensors: Sequence[SSAValue], dim: int = 0) -> SSAValue:
    parts = [lw.tensor(t) for t in tensors if prod(shape_of(t)) or len(shape_of(t)) > 1]
    if len(parts) == 1:
        return parts[0]
    return lw.emit(wse.ConcatOp(parts, axis_of(dim, len(shape_of(parts[0])), "dim")))


@register("aten.split_with_sizes.default")
def _split(lw: Lowering, x: SSAValue, sizes: Sequence[int], dim: int = 0) -> tuple:
    axis = axis_of(dim, len(shape_of(x)), "dim")
    bounds = np.cumsum([0, *sizes]).tolist()
    return tuple(
        slice_axes(lw, x, {axis: (int(a), int(b))}, None) for a, b in itertools.pairwise(bounds)
    )


@register("aten.constant_pad_nd.default")
def _pad(lw: Lowering, x: SSAValue, pad: Sequence[int], value: float = 0) -> SSAValue:
    rank = len(shape_of(x))
    low, high = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        low[rank - 1 - i], high[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if min(low + high) < 0:
        raise NodeError(f"negative padding {list(pad)} is not supported")
    return lw.emit(wse.PadOp(x, low, high, float(value)))


@register("aten.full.default")
def _full(lw: Lowering, size: Sequence[int], fill: float, **_: object) -> SSAValue:
    return lw.constant(np.full(list(size), fill, dtype=lw.result_dtype()))


@register("aten.scalar_tensor.default")
def _scalar_tensor(lw: Lowering, value: float, **_: object) -> SSAValue:
    return lw.constant(np.array(value, dtype=lw.result_dtype()))


@register("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default")
def _full_like(lw: Lowering, x: SSAValue, fill: float | None = None, **_: object) -> SSAValue:
    assert lw.node is not None
    if fill is None:
        fill = 1 if "ones" in str(lw.node.target) else 0
    return broadcast(lw, lw.tensor(fill), shape_of(x))


@register("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def _arange(lw: Lowering, *bounds: float, **_: object) -> SSAValue:
    return lw.constant(np.arange(*bounds, dtype=lw.result_dtype()))


@register("aten.embedding.default")
def _embedding(lw: Lowering, weight: SSAValue, indices: SSAValue, *_: object) -> SSAValue:
    return lw.emit(wse.GatherOp(weight, indices, 0))


@register("aten.index_select.default")
def _index_select(lw: Lowering, x: SSAValue, dim: int, index: SSAValue) -> SSAValue:
    """The elements at ``index`` along ``dim``; a scalar ``x`` is one element along dim 0."""
    if not shape_of(x):
        return reshape(lw, lw.emit(wse.GatherOp(reshape(lw, x, [1]), index, 0)), [])
    return lw.emit(wse.GatherOp(x, index, axis_of(dim, len(shape_of(x)), "dim")))


@register("aten.copy.default")
def _copy(lw: Lowering, x: SSAValue, src: SSAValue, non_blocking: bool = False) -> SSAValue:
    """``src`` broadcast to ``x``'s shape in ``x``'s type (the functional ``copy_``)."""
    return broadcast(lw, cast(lw, src, wse.numpy_dtype(wse.element_type(x))), shape_of(x))


@register("aten.diagonal.default")
def _diagonal(lw: Lowering, x: SSAValue, offset: int = 0, dim1: int = 0, dim2: int = 1) -> SSAValue:
    """The diagonal of the ``dim1``-``dim2`` planes as a last axis: the two axes moved last
    and flattened, and the diagonal's flat positions gathered."""
    shape = shape_of(x)
    a, b = axis_of(dim1, len(shape), "dim1"), axis_of(dim2, len(shape), "dim2")
    rest = [i for i in range(len(shape)) if i not in (a, b)]
    n, m = shape[a], shape[b]
    rows = np.arange(max(min(n, m - offset) if offset >= 0 else min(n + offset, m), 0))
    first_row, first_col = (0, offset) if offset >= 0 else (-offset, 0)
    flat = (rows + first_row) * m + rows + first_col
    planes = transpose(lw, x, [*rest, a, b])
    planes = reshape(lw, planes, [*(shape[i] for i in rest), n * m])
    index = lw.constant(flat.astype(np.int64))
    return lw.emit(wse.GatherOp(planes, index, len(rest)))


@register("aten.sym_size.int")
def _sym_size(lw: Lowering, x: SSAValue, dim: int) -> int:
    """A symbolic size, evaluated: the batch the program is lowered at, or a fixed size."""
    shape = shape_of(x)
    return shape[axis_of(dim, len(shape), "dim")]


@register("aten._assert_tensor_metadata.default")
def _assert_metadata(lw: Lowering, x: SSAValue, *_: object, **__: object) -> None:
    """A check torch.export leaves behind (of a dtype a cast produced): nothing to run."""
    return None
