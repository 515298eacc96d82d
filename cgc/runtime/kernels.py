"""The arithmetic of the mesh kernels, on tile arrays.

A kernel's plan (``cgc.machine.plans``) decides where every operand is and where the results
go; this module computes the results there, one numpy operation per mesh step over all PEs:

* elementwise ops on aligned tiles, broadcast operands broadcast along the grid;
* reductions of every tile, then across the grid rows or columns;
* matmuls as SUMMA steps (every PE of a grid row multiplies the same block of A, every PE of
  a grid column the same block of B), or as the weight-streaming kernel's per-column GEMMs
  whose partial sums reduce along the rows; the other algorithms (split-K, MeshGEMM, the
  streaming kernel on a resident B) add the same products in another order, and are
  computed as SUMMA's;
* everything else (data movement, pooling, gathers, scatters, scans, top-k) on the logical
  arrays, with the results laid out as planned: the plan counted their traffic, and the
  numbers do not depend on the route;
* but im2col, whose result stays its image (``Patches``) until a kernel other than a matmul
  or a filter gradient reads it: those multiply the patches made in the cheapest order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod
from typing import Any

import numpy as np

from cgc.machine import plans, reference
from cgc.machine.hardware import dtypes
from cgc.machine.plans import Attrs, Plan
from cgc.runtime.patches import Patches
from cgc.runtime.tiles import DistTensor

Value = DistTensor | np.ndarray
"""An operand as a kernel gets it: tiles in the planned layout, or a logical array for a
stream it consumes as it arrives."""


def accumulator(dtype: str | np.dtype) -> np.dtype:
    """The type sums of ``dtype`` accumulate in: float32 for float16, whose own precision
    would round every partial sum (the FMAC units accumulate half precision in single, as
    numpy does); bfloat16 and the rest accumulate in their own type, as ml_dtypes does."""
    dt = dtypes.dtype(dtype)
    return np.dtype(np.float32) if dt == np.float16 else dt


def _batch_aligned(tiles: np.ndarray, rank: int) -> np.ndarray:
    """Inserts size-1 batch axes after the two grid axes so that tile arrays of tensors of
    different ranks broadcast against each other."""
    missing = rank - tiles.ndim
    if missing <= 0:
        return tiles
    return tiles.reshape(*tiles.shape[:2], *([1] * missing), *tiles.shape[2:])


def _tiles(value: Value) -> DistTensor:
    assert isinstance(value, DistTensor), "a kernel on tiles got a logical array"
    return value


def _elementwise(name: str, plan: Plan, values: Sequence[Value], attrs: Attrs) -> list[DistTensor]:
    out = plan.outputs[0]
    dists = [_tiles(v) for v in values]
    if name in reference.INTEGER_DIVISIONS and dtypes.is_integer(out.dtype):
        # on the logical divisor: the tiles' padding holds zeros
        reference.check_divisor(name, dists[1].gather(), out.shape)
    # every element's result depends on that element alone: on the logical arrays when they
    # are at hand (the same numbers as on the tiles, whose padding no one reads)
    logical = all(d.has_array for d in dists)
    if logical:
        operands = [d.gather() for d in dists]
    else:
        rank = len(out.tile_shape())
        operands = [_batch_aligned(d.tiles, rank) for d in dists]
    with np.errstate(all="ignore"):
        if name in reference.UNARY:
            result = reference.UNARY[name](operands[0])
        elif name in reference.BINARY:
            result = reference.BINARY[name](operands[0], operands[1])
        elif name == "select":
            result = np.where(operands[0], operands[1], operands[2])
        elif name == "bitcast":  # a copy only to make it contiguous; ascontiguousarray
            source = operands[0]  # would turn a scalar into a vector
            result = (source if source.flags.c_contiguous else source.copy()).view(out.dtype)
        else:
            result = reference.cast(
                operands[0], dtypes.dtype(out.dtype), attrs.get("saturate", True)
            )
        # padding may hold values (NaN, inf) that do not cast cleanly; they are never read
        result = result.astype(out.dtype, copy=False)
    if logical:
        return [DistTensor(out, array=_full(result, out.shape))]
    return [DistTensor(out, np.ascontiguousarray(np.broadcast_to(result, out.tile_shape())))]


def _full(array: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """``array`` broadcast to ``shape``, copied only if broadcasting made it bigger."""
    if array.shape == tuple(shape):
        return array
    return np.ascontiguousarray(np.broadcast_to(array, shape))


_COMBINE: dict[str, np.ufunc] = {
    "reduce_sum": np.add,
    "reduce_mean": np.add,
    "reduce_max": np.maximum,
    "reduce_min": np.minimum,
    "reduce_prod": np.multiply,
}
"""The elementwise step of each reduction."""


def _reduce(name: str, plan: Plan, values: Sequence[Value], attrs: Attrs) -> list[DistTensor]:
    """Every PE reduces its tile, then the partial results combine across the grid rows or
    columns; on the logical array, each matrix axis split as the grid splits it."""
    value = _tiles(values[0])
    src, out = value.layout, plan.outputs[0]
    rank = len(src.shape)
    combine = _COMBINE[name]
    array = value.gather()
    if name in ("reduce_sum", "reduce_mean", "reduce_prod"):
        array = array.astype(accumulator(array.dtype), copy=False)
    axes = sorted(attrs["axes"])
    split = {rank - 2: src.rt, rank - 1: src.ct}
    across = tuple(a for a in axes if a in split)
    with np.errstate(all="ignore"):
        part = combine.reduce(array, axis=tuple(a for a in axes if a not in split), keepdims=True)
        for axis in across:
            part = _per_pe(combine, part, axis, split[axis])
        if across:
            part = combine.reduce(part, axis=across, keepdims=True)
        if name == "reduce_mean":
            part = part / prod(src.shape[a] for a in axes)
    return [DistTensor(out, array=part.astype(out.dtype, copy=False).reshape(out.shape))]


def _per_pe(combine: np.ufunc, array: np.ndarray, axis: int, per_pe: int) -> np.ndarray:
    """The partial results of the PEs along ``axis``, each over its ``per_pe`` elements."""
    size = array.shape[axis]
    if per_pe <= 1:
        return array
    # along the last axis numpy's reductions loop over the runs, each a few elements
    short = per_pe <= _SHORT and axis == array.ndim - 1
    if short and combine is np.add and array.dtype in _PAIRWISE:
        return _short_sums(array, per_pe)
    if size % per_pe == 0:
        split = array.reshape(*array.shape[:axis], size // per_pe, per_pe, *array.shape[axis + 1 :])
        return combine.reduce(split, axis=axis + 1)
    return combine.reduceat(array, np.arange(0, size, per_pe), axis=axis)


_PAIRWISE = (np.dtype(np.float32), np.dtype(np.float64))
"""The types whose sums numpy adds pairwise, in the order ``_short_sums`` follows."""
_SHORT = 7
"""The longest run numpy's reduce and reduceat both add one element after another (from 8
elements they add pairwise)."""


def _short_sums(array: np.ndarray, per_pe: int) -> np.ndarray:
    """The sums of the runs of ``per_pe`` elements along the last axis of ``array`` (the last
    run may be shorter), bit for bit as ``_per_pe``'s numpy reduction adds them (but for
    which NaN a sum of NaNs gives), in ``per_pe`` whole-array steps rather than a loop over
    the runs."""
    size = array.shape[-1]
    whole = size - size % per_pe
    if whole == size:  # numpy's reduce: 0, then every element in turn
        total = np.zeros((*array.shape[:-1], size // per_pe), array.dtype)
        for k in range(per_pe):
            total += array[..., k::per_pe]
        return total
    # numpy's reduceat: the first element plus the others added in turn
    out = np.empty((*array.shape[:-1], whole // per_pe + 1), array.dtype)
    rest = array[..., 1:whole:per_pe].copy()
    for k in range(2, per_pe):
        rest += array[..., k:whole:per_pe]
    np.add(rest, array[..., 0:whole:per_pe], out=out[..., :-1])
    out[..., -1:] = np.add.reduceat(array[..., whole:], [0], axis=-1)
    return out


def _matmul(name: str, plan: Plan, values: Sequence[Value], attrs: Attrs) -> list[DistTensor]:
    a = _tiles(values[0])
    if plan.detail["algorithm"] in ("stream", "stream-sparse"):  # zeros add nothing
        weights = values[1]
        assert isinstance(weights, np.ndarray)
        # every PE multiply-accumulates the weight rows of its column and the chain along
        # each mesh row sums the partials: over all PEs and chunks, one GEMM of the
        # activations with the weights
        return [_product(plan, a, _right(a, weights))]
    # SUMMA's steps each add one block of A's columns times one block of B's rows on every
    # PE; stacked along the grid, all steps of all PEs are one GEMM of the matrices (their
    # padding is zero, so it adds nothing)
    return [_product(plan, a, _right(a, _tiles(values[1])))]


def _right(a: DistTensor, b: Value) -> np.ndarray:
    """A matmul's ``b`` as matrices, its rows in the order of ``a``'s patches if ``a`` is
    patches not made yet (``Patches.filter_rows``): ordered once per tensor, so that a
    resident weight's rows are ordered once for all the runs of its artifact
    (``cgc.runtime.memoryx.Derived``)."""
    patches = a.deferred
    if not isinstance(patches, Patches):
        return b if isinstance(b, np.ndarray) else _matrices(b)
    if isinstance(b, np.ndarray):  # a stream
        return patches.filter_rows(b)
    return b.derived(("taps first", patches.taps), lambda: _made(patches.filter_rows(_matrices(b))))


def _made(matrix: np.ndarray) -> np.ndarray:
    """``matrix`` with its elements made if it is one value broadcast (a weight declared
    without data stands in as zeros that take no memory): numpy's matmul would copy it for
    every product."""
    return np.ascontiguousarray(matrix) if matrix.size > 1 and not any(matrix.strides) else matrix


def _fused_matmul(name: str, plan: Plan, values: Sequence[Value], attrs: Attrs) -> list[DistTensor]:
    """The matmul with its weights scaled by columns, then the epilogue on the product and
    the extras, on the logical arrays (each step the numbers its elementwise kernel gives)."""
    count = attrs["scales"]
    a = _tiles(values[0])
    scales = [_array(v).reshape(-1) for v in values[2 : 2 + count]]
    # a row order scales alike: the columns' scales apply to the ordered rows
    product = _product(plan, a, reference.scaled_columns(_right(a, values[1]), scales))
    out = plan.outputs[0]
    extras = [_array(v) for v in values[2 + count :]]
    result = reference.epilogue(
        attrs["epilogue"], [product.gather(), *extras], dtypes.dtype(out.dtype)
    )
    return [DistTensor(out, array=_full(result, out.shape))]


def _array(value: Value) -> np.ndarray:
    """The logical array of an operand."""
    return value.gather() if isinstance(value, DistTensor) else value


def _product(plan: Plan, a: DistTensor, b: np.ndarray) -> DistTensor:
    """``a @ b`` in the accumulator type of the result, laid out as planned; patches not made
    yet are made in their cheapest order, ``b``'s rows ordered alike already (``_right``)."""
    out = plan.outputs[0]
    wide = accumulator(out.dtype)
    patches = a.deferred
    if isinstance(patches, Patches):
        product = patches.times(b, wide)
    else:
        product = _matrices(a).astype(wide, copy=False) @ b.astype(wide, copy=False)
    return DistTensor(out, array=product.astype(out.dtype, copy=False).reshape(out.shape))


def _filter_gradient(
    name: str, plan: Plan, values: Sequence[Value], attrs: Attrs
) -> list[DistTensor]:
    """``a^T @ b``: on patches not made yet, from the patches in their cheapest order;
    otherwise on the logical arrays."""
    a = values[0]
    patches = a.deferred if isinstance(a, DistTensor) else None
    if not isinstance(patches, Patches):
        return _logical(name, plan, values, attrs)
    b = values[1]
    right = _array(b)
    out = plan.outputs[0]
    product = patches.transposed_times(right).astype(out.dtype, copy=False)
    return [DistTensor(out, array=product.reshape(out.shape))]


def _im2col(name: str, plan: Plan, values: Sequence[Value], attrs: Attrs) -> list[DistTensor]:
    """The patches, kept as the image they read until a kernel asks for them."""
    image = values[0]
    array = _array(image)
    return [DistTensor(plan.outputs[0], recipe=Patches(array, attrs))]


def _matrices(value: DistTensor) -> np.ndarray:
    """The logical array as its layout's batch of matrices ``[*batch, R, C]``."""
    lay = value.layout
    return value.gather().reshape(*lay.batch, lay.rows, lay.cols)


def _logical(name: str, plan: Plan, values: Sequence[Value], attrs: Attrs) -> list[DistTensor]:
    """Computes on the logical arrays and lays the results out as planned."""
    arrays = [_array(v) for v in values]
    outs = reference.evaluate_all(
        name, attrs, arrays, [(layout.shape, layout.dtype) for layout in plan.outputs]
    )
    return [DistTensor.scatter(a, layout) for a, layout in zip(outs, plan.outputs, strict=True)]


Runner = Callable[[str, Plan, Sequence[Value], Attrs], list[DistTensor]]

_ON_TILES: dict[type[plans.Kernel], Runner] = {
    plans.Elementwise: _elementwise,
    plans.Reduce: _reduce,
    plans.Matmul: _matmul,
    plans.FusedMatmul: _fused_matmul,
}
"""Kernel families whose arithmetic runs on the tiles; the rest run on logical arrays."""

_ON_PATCHES: dict[str, Runner] = {"im2col": _im2col, "matmul_transpose_a": _filter_gradient}
"""Primitives that make or read patches not made yet."""


def run(name: str, plan: Plan, values: Sequence[Value], attrs: dict[str, Any]) -> list[DistTensor]:
    """The results of primitive ``name``, laid out as ``plan`` says; ``values[k]`` is in
    ``plan.inputs[k]`` (a logical array for a stream)."""
    runner = _ON_PATCHES.get(name) or _ON_TILES.get(type(plans.KERNELS[name]), _logical)
    return runner(name, plan, values, attrs)
