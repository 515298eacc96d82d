"""The arithmetic of the mesh kernels, on tile arrays.

A kernel's plan (``cgc.machine.plans``) decides where every operand is and where the results
go; this module computes the results there, one numpy operation per mesh step over all PEs:

* elementwise ops on aligned tiles, broadcast operands broadcast along the grid;
* reductions of every tile, then across the grid rows or columns;
* matmuls as SUMMA steps (every PE of a grid row multiplies the same block of A, every PE of
  a grid column the same block of B), or as the weight-streaming kernel's per-column GEMMs
  whose partial sums reduce along the rows;
* everything else (data movement, pooling, gathers, scatters, scans, top-k) on the logical
  arrays, with the results laid out as planned: the plan counted their traffic, and the
  numbers do not depend on the route.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod
from typing import Any

import numpy as np

from cgc.machine import dtypes, plans, reference
from cgc.machine.layout import Layout
from cgc.machine.plans import Attrs, Plan
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
    rank = len(out.tile_shape())
    tiles = [_batch_aligned(_tiles(v).tiles, rank) for v in values]
    with np.errstate(all="ignore"):
        if name in reference.UNARY:
            result = reference.UNARY[name](tiles[0])
        elif name in reference.BINARY:
            result = reference.BINARY[name](tiles[0], tiles[1])
        elif name == "select":
            result = np.where(tiles[0], tiles[1], tiles[2])
        elif name == "bitcast":
            result = np.ascontiguousarray(tiles[0]).view(out.dtype)
        else:
            result = reference.cast(tiles[0], dtypes.dtype(out.dtype), attrs.get("saturate", True))
        # padding may hold values (NaN, inf) that do not cast cleanly; they are never read
        result = np.broadcast_to(result.astype(out.dtype, copy=False), out.tile_shape())
    return [DistTensor(out, np.ascontiguousarray(result))]


def _reduce(name: str, plan: Plan, values: Sequence[Value], attrs: Attrs) -> list[DistTensor]:
    value = _tiles(values[0])
    src, natural, out = value.layout, plan.detail["natural"], plan.outputs[0]
    rank, nb = len(src.shape), len(src.batch)
    identity = reference.REDUCE_IDENTITY[name]
    combine = reference.REDUCE["reduce_sum" if name == "reduce_mean" else name]
    # Tile axes are [grid row, grid col, *batch, rt, ct]; the matrix axes of a tensor of
    # rank r are r-2 (rows, split over grid rows) and r-1 (columns, over grid columns).
    tile_axis = {a: 2 + a for a in range(rank - 2)} | {rank - 2: 2 + nb, rank - 1: 3 + nb}
    mesh_axis = {rank - 2: 0, rank - 1: 1}
    axes = attrs["axes"]
    tiles = value.masked(identity)
    if name in ("reduce_sum", "reduce_mean", "reduce_prod"):
        tiles = tiles.astype(accumulator(tiles.dtype), copy=False)
    with np.errstate(all="ignore"):
        part = combine(tiles, axis=tuple(tile_axis[a] for a in axes), keepdims=True)
        across = tuple(mesh_axis[a] for a in axes if a in mesh_axis)
        if across:
            part = combine(part, axis=across, keepdims=True)
        if name == "reduce_mean":
            part = part / prod(src.shape[a] for a in axes)
    reduced = DistTensor(natural, part.astype(out.dtype, copy=False))
    if natural == out:
        return [reduced]
    return [DistTensor.scatter(reduced.gather().reshape(out.shape), out)]


def _matmul(name: str, plan: Plan, values: Sequence[Value], attrs: Attrs) -> list[DistTensor]:
    if plan.detail["algorithm"] in ("stream", "stream-sparse"):  # zeros add nothing
        weights = values[1]
        assert isinstance(weights, np.ndarray)
        return [_streaming_matmul(plan, _tiles(values[0]), weights)]
    a, b = _tiles(values[0]), _tiles(values[1])
    out = plan.outputs[0]
    rank = len(out.tile_shape())
    # SUMMA's steps each add one block of A's columns times one block of B's rows on every
    # PE; stacked along the grid, all steps of all PEs are one GEMM of the padded matrices
    # (padding is zero, so it adds nothing)
    wide = accumulator(out.dtype)
    at = _padded_matrix(_batch_aligned(a.masked(0), rank)).astype(wide, copy=False)
    bt = _padded_matrix(_batch_aligned(b.masked(0), rank)).astype(wide, copy=False)
    return [DistTensor(out, _unstack((at @ bt).astype(out.dtype, copy=False), out))]


def _streaming_matmul(plan: Plan, a: DistTensor, weights: np.ndarray) -> DistTensor:
    """Every PE multiply-accumulates the weight rows of its column and the chain along each
    mesh row sums the partials: over all PEs and chunks, one GEMM of the activations (their
    padding zero) with the weights padded to the grid."""
    out, a_at = plan.outputs[0], plan.inputs[0]
    assert a_at is not None
    k, n = weights.shape[-2:]
    wide = accumulator(out.dtype)
    rank = len(out.tile_shape())
    at = _padded_matrix(_batch_aligned(a.masked(0), rank))[..., :k].astype(wide, copy=False)
    product = at @ weights.astype(wide, copy=False)
    padded = np.zeros((*product.shape[:-2], product.shape[-2], out.w * out.ct), dtype=out.dtype)
    padded[..., :n] = product
    return DistTensor(out, _unstack(padded, out))


def _padded_matrix(tiles: np.ndarray) -> np.ndarray:
    """Tiles ``[h, w, *batch, rt, ct]`` as the padded matrices ``[*batch, h * rt, w * ct]``."""
    moved = np.moveaxis(tiles, (0, 1), (-4, -2))
    return moved.reshape(*moved.shape[:-4], moved.shape[-4] * moved.shape[-3], -1)


def _unstack(matrix: np.ndarray, out: Layout) -> np.ndarray:
    """``[*batch, h * mt, w * nt]`` back to the tile array ``[h, w, *batch, mt, nt]``."""
    nb = matrix.ndim - 2
    blocks = matrix.reshape(*matrix.shape[:-2], out.h, out.rt, out.w, out.ct)
    tiles = np.moveaxis(blocks, (nb, nb + 2), (0, 1))
    return np.ascontiguousarray(np.broadcast_to(tiles, out.tile_shape()), dtype=out.dtype)


def _logical(name: str, plan: Plan, values: Sequence[Value], attrs: Attrs) -> list[DistTensor]:
    """Computes on the logical arrays and lays the results out as planned."""
    arrays = [v.gather() if isinstance(v, DistTensor) else v for v in values]
    outs = reference.evaluate_all(
        name, attrs, arrays, [(layout.shape, layout.dtype) for layout in plan.outputs]
    )
    return [DistTensor.scatter(a, layout) for a, layout in zip(outs, plan.outputs, strict=True)]


Runner = Callable[[str, Plan, Sequence[Value], Attrs], list[DistTensor]]

_ON_TILES: dict[type[plans.Kernel], Runner] = {
    plans.Elementwise: _elementwise,
    plans.Reduce: _reduce,
    plans.Matmul: _matmul,
}
"""Kernel families whose arithmetic runs on the tiles; the rest run on logical arrays."""


def run(name: str, plan: Plan, values: Sequence[Value], attrs: dict[str, Any]) -> list[DistTensor]:
    """The results of primitive ``name``, laid out as ``plan`` says; ``values[k]`` is in
    ``plan.inputs[k]`` (a logical array for a stream)."""
    runner = _ON_TILES.get(type(plans.KERNELS[name]), _logical)
    return runner(name, plan, values, attrs)
