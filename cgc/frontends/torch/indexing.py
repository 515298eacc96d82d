"""Lowerings of the core ATen ops that address elements by index: scatters (``gather`` is
in ``loss``),
advanced indexing (``index.Tensor``, ``index_put``), running sums and products, ``topk``,
``sort``, ``flip`` and ``repeat``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    axis_of,
    broadcast,
    cast,
    dtype_of,
    reshape,
    select,
    shape_of,
    slice_axes,
)
from cgc.frontends.formulas import top_k
from cgc.frontends.torch.lowering import Lowering, register

SCATTER_REDUCTIONS = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}
"""``scatter_reduce``'s reductions as the WSE scatter's."""


def _axis(x: SSAValue, dim: int) -> int:
    return axis_of(dim, max(len(shape_of(x)), 1), "dim")


def _restore(lw: Lowering, y: SSAValue, scalar: bool) -> SSAValue:
    return reshape(lw, y, []) if scalar else y


def _nonnegative(lw: Lowering, index: SSAValue, size: int) -> SSAValue:
    """Indices with negative ones counted from the end (``-1``: the last)."""
    index = cast(lw, index, "int64")
    zero = lw.constant(np.array(0, dtype=np.int64))
    negative = lw.emit(wse.GreaterOp(zero, index))
    wrapped = lw.emit(wse.AddOp(index, lw.constant(np.array(size, dtype=np.int64))))
    return select(lw, negative, wrapped, index)


def _lift(lw: Lowering, x: SSAValue) -> SSAValue:
    return reshape(lw, x, [1]) if not shape_of(x) else x


def _scatter(
    lw: Lowering, x: SSAValue, dim: int, index: SSAValue, src: SSAValue | float, reduction: str
) -> SSAValue:
    """``x`` with ``src`` written (or reduced) along ``dim`` at ``index``; only the part of
    ``src`` that ``index`` covers is read, as torch does."""
    scalar = not shape_of(x)
    data, index = _lift(lw, x), _lift(lw, index)
    axis = _axis(data, dim)
    shape = shape_of(index)
    if isinstance(src, SSAValue):
        updates = _lift(lw, lw.tensor(src))
        updates = slice_axes(lw, updates, {a: (0, n) for a, n in enumerate(shape)}, None)
    else:
        updates = broadcast(lw, lw.tensor(src), shape)
    index = _nonnegative(lw, index, shape_of(data)[axis])
    y = lw.emit(wse.ScatterElementsOp(data, index, updates, axis, reduction))
    return _restore(lw, y, scalar)


@register("aten.scatter.src", "aten.scatter.value")
def _scatter_set(
    lw: Lowering, x: SSAValue, dim: int, index: SSAValue, src: SSAValue | float
) -> SSAValue:
    return _scatter(lw, x, dim, index, src, "none")


@register("aten.scatter_add.default")
def _scatter_add(lw: Lowering, x: SSAValue, dim: int, index: SSAValue, src: SSAValue) -> SSAValue:
    return _scatter(lw, x, dim, index, src, "add")


@register("aten.scatter_reduce.two")
def _scatter_reduce(
    lw: Lowering,
    x: SSAValue,
    dim: int,
    index: SSAValue,
    src: SSAValue,
    reduce: str,
    include_self: bool = True,
) -> SSAValue:
    if reduce not in SCATTER_REDUCTIONS:
        raise NodeError(f"reduce={reduce!r} is not supported (sum, prod, amax or amin)")
    if not include_self:
        raise NodeError("include_self=False is not supported")
    return _scatter(lw, x, dim, index, src, SCATTER_REDUCTIONS[reduce])


def _index_tuples(
    lw: Lowering, x: SSAValue, indices: Sequence[SSAValue | None]
) -> tuple[SSAValue, int]:
    """Advanced indices on the leading axes of ``x`` as one tensor of index tuples (the
    indices broadcast together, stacked on a last axis), and how many axes they address."""
    shape = shape_of(x)
    depth = len(indices)
    if any(i is None for i in indices):
        raise NodeError("indexing with None (a full slice) before an index is not supported")
    for i in indices:
        if i is not None and dtype_of(i) == np.bool_:
            raise NodeError("boolean masks as indices are not supported (data-dependent shape)")
    together = np.broadcast_shapes(*(shape_of(i) for i in indices))  # type: ignore[arg-type]
    parts = []
    for axis, index in enumerate(indices):
        assert index is not None
        index = _nonnegative(lw, index, shape[axis])
        parts.append(reshape(lw, broadcast(lw, index, together), [*together, 1]))
    tuples = parts[0] if depth == 1 else lw.emit(wse.ConcatOp(parts, len(together)))
    return tuples, depth


def _trim(indices: Sequence[SSAValue | None]) -> list[SSAValue | None]:
    """The indices without trailing Nones (full slices after the last index)."""
    kept = list(indices)
    while kept and kept[-1] is None:
        kept.pop()
    return kept


@register("aten.index.Tensor")
def _index(lw: Lowering, x: SSAValue, indices: Sequence[SSAValue | None]) -> SSAValue:
    kept = _trim(indices)
    present = [i for i, index in enumerate(kept) if index is not None]
    if len(present) == 1 and dtype_of(kept[present[0]]) != np.bool_:  # type: ignore[arg-type]
        axis = present[0]
        index = _nonnegative(lw, kept[axis], shape_of(x)[axis])  # type: ignore[arg-type]
        return lw.emit(wse.GatherOp(x, index, axis))
    tuples, _ = _index_tuples(lw, x, kept)
    return lw.emit(wse.GatherNDOp(x, tuples, 0))


@register("aten.index_put.default")
def _index_put(
    lw: Lowering,
    x: SSAValue,
    indices: Sequence[SSAValue | None],
    values: SSAValue,
    accumulate: bool = False,
) -> SSAValue:
    tuples, depth = _index_tuples(lw, x, _trim(indices))
    target = [*shape_of(tuples)[:-1], *shape_of(x)[depth:]]
    updates = broadcast(lw, lw.tensor(values, dtype_of(x).name), target)
    return lw.emit(wse.ScatterNDOp(x, tuples, updates, "add" if accumulate else "none"))


@register("aten.cumsum.default", "aten.cumprod.default")
def _cumulative(lw: Lowering, x: SSAValue, dim: int, **_: object) -> SSAValue:
    assert lw.node is not None
    op = wse.CumProdOp if "cumprod" in str(lw.node.target) else wse.CumSumOp
    scalar = not shape_of(x)
    value = _lift(lw, lw.tensor(x))
    return _restore(lw, lw.emit(op(value, _axis(value, dim), False, False)), scalar)


@register("aten.topk.default")
def _topk(
    lw: Lowering, x: SSAValue, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
) -> tuple:
    scalar = not shape_of(x)
    value = _lift(lw, x)
    values, indices = top_k(lw, value, _axis(value, dim), k, largest)
    return _restore(lw, values, scalar), _restore(lw, indices, scalar)


@register("aten.sort.default", "aten.sort.stable")
def _sort(
    lw: Lowering, x: SSAValue, *args: object, stable: bool | None = None, **kwargs: object
) -> tuple:
    """All of the axis, in order: a top-k of its length (the lower index first among
    equals, as a stable sort)."""
    dim, descending = _sort_args(args, kwargs)
    scalar = not shape_of(x)
    value = _lift(lw, x)
    axis = _axis(value, dim)
    n = shape_of(value)[axis]
    values, indices = top_k(lw, value, axis, n, descending)
    return _restore(lw, values, scalar), _restore(lw, indices, scalar)


def _sort_args(args: Sequence[object], kwargs: dict[str, object]) -> tuple[int, bool]:
    """``(dim, descending)`` of ``sort.default(dim, descending)`` and ``sort.stable``'s
    keyword-only ones."""
    dim = args[0] if args else kwargs.get("dim", -1)
    descending = args[1] if len(args) > 1 else kwargs.get("descending", False)
    return int(dim), bool(descending)  # type: ignore[call-overload]


@register("aten.flip.default")
def _flip(lw: Lowering, x: SSAValue, dims: Sequence[int]) -> SSAValue:
    if not shape_of(x) or not dims:
        return x
    axes = sorted({_axis(x, d) for d in dims})
    return lw.emit(wse.ReverseOp(x, axes))


@register("aten.repeat.default")
def _repeat(lw: Lowering, x: SSAValue, repeats: Sequence[int]) -> SSAValue:
    shape = shape_of(x)
    lead = len(repeats) - len(shape)
    x = reshape(lw, x, [1] * lead + list(shape))
    if not repeats:
        return x
    return lw.emit(wse.TileOp(x, list(repeats)))
