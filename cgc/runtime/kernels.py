"""Mesh kernels: how each primitive runs on a rectangle of PEs, and what it costs.

A kernel has two halves. ``plan`` looks only at shapes and layouts: it decides where every
operand must be, where the results go, and counts the work (FMACs and vector-op cycles on the
busiest PE) and the traffic (wavelets per link, per PE ramp, hops) of every step. Plans are
cached; the compiler's cost model calls the same functions, so an estimate and a simulated
run agree. ``run`` does the arithmetic on the tile arrays, one numpy operation per mesh step
over all PEs.

The kernels:

* elementwise: local on aligned tiles; a broadcast operand is multicast along the mesh rows
  or columns it is missing;
* reductions: local reduction of each tile, then a chain reduction along the mesh rows or
  columns the reduced axes are split over;
* matmul: SUMMA (step ``s`` broadcasts A's column block ``s`` along the rows and B's row block
  ``s`` down the columns, then every PE multiply-accumulates), or, when B streams in from
  MemoryX, the weight-streaming kernel (each column receives its rows of B from the north
  edge and multicasts them down; every PE forms partial sums that a chain reduction along
  the row lands in the output layout);
* data movement (reshape, transpose, broadcast, concat, slice, pad, im2col, one-hot, pooling
  windows): the op applied to arrays of element indices says where every result element
  comes from, and ``layout.gather_traffic`` routes those flows.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from math import prod

import numpy as np

from cgc import dtypes
from cgc.runtime import reference
from cgc.runtime.layout import (
    NO_TRAFFIC,
    DistTensor,
    Layout,
    Rect,
    Traffic,
    edge_traffic,
    gather_traffic,
    grid_extent,
    matrix_dims,
    regrid_traffic,
    scattered_traffic,
)
from cgc.runtime.machine import TRANSCENDENTAL_CYCLES, Target

WAFER, RESIDENT, STREAM = "wafer", "resident", "stream"
"""Where an operand is when a kernel starts: on the wafer in some layout; a weight resident
on the wafer that the kernel may lay out as it likes when the program loads; a weight
arriving from MemoryX through the wafer's edge."""

OP_CYCLES: dict[str, float] = {
    **dict.fromkeys(
        ("exp", "log", "sqrt", "reciprocal", "sigmoid", "tanh", "erf", "div", "mod", "fmod",
         "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"),
        TRANSCENDENTAL_CYCLES,
    ),
    "pow": 2 * TRANSCENDENTAL_CYCLES,
}  # fmt: skip
"""Vector cycles per element; every other elementwise op takes one."""


@dataclass(frozen=True)
class Operand:
    """What a kernel knows of an operand when it plans."""

    shape: tuple[int, ...]
    dtype: str
    source: str = WAFER
    layout: Layout | None = None


@dataclass(frozen=True)
class Cost:
    """The work of one kernel on its rectangle."""

    cycles: float = 0.0
    """Critical path, in cycles."""
    flops: float = 0.0
    """Useful floating-point operations (padding excluded)."""
    fmacs: float = 0.0
    """FMACs issued, summed over all PEs (padding included): the busy time of the FMAC units."""
    traffic: Traffic = NO_TRAFFIC
    """All data movement of the kernel, as one transfer."""
    scratch_bytes: int = 0
    """Transient SRAM per PE beyond operands and results (receive buffers, moved copies)."""


@dataclass(frozen=True)
class Plan:
    """A kernel's decisions for one instruction."""

    inputs: tuple[Layout | None, ...]
    """The layout each operand must have when the kernel runs; ``None`` for a stream it
    consumes as it arrives."""
    outputs: tuple[Layout, ...]
    cost: Cost
    detail: dict = field(default_factory=dict, hash=False, compare=False)
    """What the kernel chose, for inspection (algorithm, steps, grid)."""


def vector_cycles(elements: float, per_element: float, dtype: str, target: Target) -> float:
    """Cycles for a PE to apply a vector op to ``elements`` values."""
    return elements * per_element / target.fmacs(dtype)


def arrival(operand: Operand, target: Layout) -> Traffic:
    """The traffic that brings ``operand`` to ``target`` before a kernel runs."""
    if operand.source == RESIDENT:
        return NO_TRAFFIC
    if operand.source == STREAM:
        return edge_traffic(target, inbound=True)
    assert operand.layout is not None
    if operand.layout == target:
        return NO_TRAFFIC
    if operand.layout.shape == target.shape:
        return regrid_traffic(operand.layout, target)
    raise ValueError(f"operand {operand.layout} cannot arrive as {target}")


def multicast(tile: Layout, out: Layout) -> Traffic:
    """Copies ``tile``'s blocks along the mesh rows and/or columns it spans fewer of than
    ``out``: one wavelet stream per link (the routers replicate), as deep as the grid."""
    down = out.h - 1 if tile.h == 1 and out.h > 1 else 0
    across = out.w - 1 if tile.w == 1 and out.w > 1 else 0
    if not down and not across:
        return NO_TRAFFIC
    words = tile.tile_elements * tile.words_per_element
    links = across * tile.h + down * out.w
    return Traffic(words * links, words, words, words, down + across)


def _cycles(*parts: float | Traffic) -> float:
    """Adds up phases that run one after another."""
    return sum(p.cycles if isinstance(p, Traffic) else p for p in parts)


def _freeze(value):
    """A hashable copy of an attribute value."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(frozen) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in frozen}


class Kernel(abc.ABC):
    """A primitive's mesh algorithm."""

    def __init__(self, name: str):
        self.name = name

    @abc.abstractmethod
    def plan(
        self,
        target: Target,
        rect: Rect,
        operands: Sequence[Operand],
        attrs: dict,
        results: Sequence[tuple[tuple[int, ...], str]],
        count_gathers: bool = True,
    ) -> Plan:
        """Decides layouts and counts the cost (shapes and layouts only). Without
        ``count_gathers`` the plan leaves out the data movement that is costly to work out
        (general gathers): enough to know the memory a layout needs."""

    @abc.abstractmethod
    def run(
        self, plan: Plan, values: Sequence[DistTensor | np.ndarray], attrs: dict
    ) -> list[DistTensor]:
        """Computes the results; ``values[k]`` is in ``plan.inputs[k]`` (a logical array for a
        stream)."""


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


class Elementwise(Kernel):
    """Unary, binary and ternary elementwise ops, with numpy broadcasting."""

    def plan(self, target, rect, operands, attrs, results, count_gathers=True):
        ((shape, dtype),) = results
        out = Layout.on(shape, dtype, rect)
        inputs, traffic, scratch = [], NO_TRAFFIC, 0
        for operand in operands:
            _, rows, cols = matrix_dims(operand.shape)
            aligned = Layout(
                operand.shape,
                operand.dtype,
                out.row0,
                out.col0,
                out.h if rows == out.rows else 1,
                out.w if cols == out.cols else 1,
            )
            moved = arrival(operand, aligned)
            spread = multicast(aligned, out)
            traffic = traffic + moved + spread
            if moved.cycles or spread.cycles:
                scratch += aligned.tile_bytes
            inputs.append(aligned)
        per_element = OP_CYCLES.get(self.name, 1.0)
        compute = vector_cycles(out.tile_elements, per_element, dtype, target)
        cost = Cost(
            cycles=_cycles(traffic, compute),
            flops=prod(shape) * (0 if self.name in ("cast", "bitcast") else 1),
            traffic=traffic,
            scratch_bytes=scratch,
        )
        return Plan(tuple(inputs), (out,), cost)

    def run(self, plan, values, attrs):
        out = plan.outputs[0]
        rank = len(out.tile_shape())
        tiles = [_batch_aligned(v.tiles, rank) for v in values]
        with np.errstate(all="ignore"):
            if self.name in reference.UNARY:
                result = reference.UNARY[self.name](tiles[0])
            elif self.name in reference.BINARY:
                result = reference.BINARY[self.name](tiles[0], tiles[1])
            elif self.name == "select":
                result = np.where(tiles[0], tiles[1], tiles[2])
            elif self.name == "bitcast":
                result = np.ascontiguousarray(tiles[0]).view(out.dtype)
            else:
                result = reference.cast(
                    tiles[0], dtypes.dtype(out.dtype), attrs.get("saturate", True)
                )
            # padding may hold values (NaN, inf) that do not cast cleanly; they are never read
            result = np.broadcast_to(result.astype(out.dtype, copy=False), out.tile_shape())
        return [DistTensor(out, np.ascontiguousarray(result))]


class Reduce(Kernel):
    """Sum, mean, max and min over any axes."""

    def plan(self, target, rect, operands, attrs, results, count_gathers=True):
        (operand,), ((shape, dtype),) = operands, results
        src = operand.layout or Layout.on(operand.shape, operand.dtype, rect)
        axes, rank = set(attrs["axes"]), len(operand.shape)
        over_rows = rank >= 2 and rank - 2 in axes
        over_cols = rank >= 1 and rank - 1 in axes
        kept = tuple(1 if i in axes else d for i, d in enumerate(operand.shape))
        natural = Layout(
            kept, dtype, src.row0, src.col0, 1 if over_rows else src.h, 1 if over_cols else src.w
        )
        out = Layout.on(shape, dtype, rect)
        partial = natural.tile_elements * natural.words_per_element
        chain = [
            Traffic(partial * (n - 1) * m, partial, partial, partial, n - 1)
            for n, m, hit in ((src.w, src.h, over_cols), (src.h, natural.w, over_rows))
            if hit and n > 1
        ]
        settle = _reshape_traffic(natural, out)
        traffic = sum(chain, NO_TRAFFIC) + arrival(operand, src) + settle
        compute = vector_cycles(src.tile_elements, 1.0, dtype, target)
        combine = vector_cycles(natural.tile_elements, 1.0, dtype, target) * len(chain)
        cost = Cost(
            cycles=_cycles(traffic, compute, combine),
            flops=prod(operand.shape),
            traffic=traffic,
            scratch_bytes=natural.tile_bytes * (1 + len(chain)),
        )
        return Plan((src,), (out,), cost, {"natural": natural})

    def run(self, plan, values, attrs):
        (value,) = values
        src, natural, out = value.layout, plan.detail["natural"], plan.outputs[0]
        rank, nb = len(src.shape), len(src.batch)
        identity = reference.REDUCE_IDENTITY[self.name]
        combine = reference.REDUCE["reduce_sum" if self.name == "reduce_mean" else self.name]
        # Tile axes are [grid row, grid col, *batch, rt, ct]; the matrix axes of a tensor of
        # rank r are r-2 (rows, split over grid rows) and r-1 (columns, over grid columns).
        tile_axis = {a: 2 + a for a in range(rank - 2)} | {rank - 2: 2 + nb, rank - 1: 3 + nb}
        mesh_axis = {rank - 2: 0, rank - 1: 1}
        axes = attrs["axes"]
        tiles = value.masked(identity)
        if self.name in ("reduce_sum", "reduce_mean", "reduce_prod"):
            tiles = tiles.astype(accumulator(tiles.dtype), copy=False)
        with np.errstate(all="ignore"):
            part = combine(tiles, axis=tuple(tile_axis[a] for a in axes), keepdims=True)
            across = tuple(mesh_axis[a] for a in axes if a in mesh_axis)
            if across:
                part = combine(part, axis=across, keepdims=True)
            if self.name == "reduce_mean":
                part = part / prod(src.shape[a] for a in axes)
        reduced = DistTensor(natural, part.astype(out.dtype, copy=False))
        if natural == out:
            return [reduced]
        return [DistTensor.scatter(reduced.gather().reshape(out.shape), out)]


def _reshape_traffic(src: Layout, dst: Layout) -> Traffic:
    """Moving the elements of ``src`` (row-major) into ``dst``, a layout of the same size."""
    same_grid = (src.row0, src.col0, src.h, src.w) == (dst.row0, dst.col0, dst.h, dst.w)
    if same_grid and (src.rows, src.cols) == (dst.rows, dst.cols):
        return NO_TRAFFIC
    if src.shape == dst.shape:
        return regrid_traffic(src, dst)
    return gather_traffic(dst, [(src, np.arange(src.size))])


class Matmul(Kernel):
    """SUMMA, or the weight-streaming kernel when B arrives from MemoryX."""

    def plan(self, target, rect, operands, attrs, results, count_gathers=True):
        a, b = operands
        ((shape, dtype),) = results
        out = Layout.on(shape, dtype, rect)
        k = a.shape[-1]
        nb_out = prod(shape[:-2])
        flops = 2.0 * nb_out * shape[-2] * shape[-1] * k
        if b.source == STREAM:
            return self._plan_streaming(target, rect, a, b, out, flops)
        steps = grid_extent(k, min(rect[2], rect[3]))
        a_at = Layout(a.shape, a.dtype, out.row0, out.col0, out.h, steps)
        b_at = Layout(b.shape, b.dtype, out.row0, out.col0, steps, out.w)
        mt, kb, nt = out.rt, a_at.ct, out.ct
        step_fmacs = nb_out * mt * kb * nt
        compute = step_fmacs / target.fmacs(dtype)
        a_words = a_at.tile_elements * a_at.words_per_element
        b_words = b_at.tile_elements * b_at.words_per_element
        broadcast = Traffic(
            steps * (a_words * out.h * (out.w - 1) + b_words * out.w * (out.h - 1)),
            steps * max(a_words * (out.w > 1), b_words * (out.h > 1)),
            steps * max(a_words, b_words),
            steps * (a_words + b_words),
            out.h - 1 + out.w - 1,
        )
        traffic = arrival(a, a_at) + arrival(b, b_at) + broadcast
        step_cycles = max(compute, a_words * (out.w > 1), b_words * (out.h > 1))
        cost = Cost(
            cycles=_cycles(arrival(a, a_at), arrival(b, b_at))
            + steps * step_cycles
            + broadcast.max_hops,
            flops=flops,
            fmacs=steps * step_fmacs * out.pes,
            traffic=traffic,
            scratch_bytes=(a_at.tile_elements + b_at.tile_elements) * out.itemsize,
        )
        return Plan((a_at, b_at), (out,), cost, {"algorithm": "summa", "steps": steps})

    def _plan_streaming(self, target, rect, a, b, out, flops):
        k = a.shape[-1]
        cols = grid_extent(k, rect[2])
        a_at = Layout(a.shape, a.dtype, out.row0, out.col0, out.h, cols)
        mt, kb, nt = out.rt, a_at.ct, out.ct
        nb_out = prod(out.batch)
        chunk_fmacs = nb_out * mt * kb * nt
        compute = chunk_fmacs / target.fmacs(out.dtype)
        weight_words = prod(b.shape[:-2]) * kb * nt * out.words_per_element
        partial_words = nb_out * mt * nt * out.words_per_element
        chunks = out.w
        reduce_hops = cols - 1
        ingress = Traffic(
            chunks * weight_words * cols * out.h,
            chunks * weight_words,
            chunks * weight_words,
            chunks * weight_words,
            out.h,
        )
        reduction = Traffic(
            chunks * partial_words * reduce_hops * out.h,
            chunks * partial_words * (reduce_hops > 0),
            chunks * partial_words,
            chunks * partial_words * reduce_hops,
            reduce_hops,
        )
        moved = arrival(a, a_at)
        step = max(compute, weight_words, partial_words * (reduce_hops > 0))
        cost = Cost(
            cycles=_cycles(moved) + chunks * step + ingress.max_hops + reduction.max_hops,
            flops=flops,
            fmacs=chunks * chunk_fmacs * out.h * cols,
            traffic=moved + ingress + reduction,
            # a PE multiply-accumulates each weight row as it arrives: one row of buffer
            scratch_bytes=(nt + nb_out * mt * nt) * out.itemsize,
        )
        return Plan((a_at, None), (out,), cost, {"algorithm": "stream", "steps": chunks})

    def run(self, plan, values, attrs):
        if plan.detail["algorithm"] == "stream":
            return [self._run_streaming(plan, values[0], values[1])]
        a, b = values
        out = plan.outputs[0]
        rank = len(out.tile_shape())
        # Every PE of grid row i multiplies the same block of A's column s, every PE of grid
        # column j the same block of B's row s: one mesh step over all PEs is one GEMM of the
        # blocks stacked along the grid.
        wide = accumulator(out.dtype)
        at = _stack_grid_rows(np.moveaxis(_batch_aligned(a.masked(0), rank), 1, 0))
        bt = _stack_grid_cols(_batch_aligned(b.masked(0), rank))
        at, bt = at.astype(wide, copy=False), bt.astype(wide, copy=False)
        acc = at[0] @ bt[0]
        for s in range(1, plan.detail["steps"]):
            acc += at[s] @ bt[s]
        return [DistTensor(out, _unstack(acc.astype(out.dtype, copy=False), out))]

    @staticmethod
    def _run_streaming(plan, a: DistTensor, weights: np.ndarray) -> DistTensor:
        out, a_at = plan.outputs[0], plan.inputs[0]
        cols, kb, nt = a_at.w, a_at.ct, out.ct
        lead = weights.shape[:-2]
        k, n = weights.shape[-2:]
        wide = accumulator(out.dtype)
        padded = np.zeros((*lead, cols * kb, out.w * nt), dtype=wide)
        padded[..., :k, :n] = weights
        blocks = padded.reshape(*lead, cols, kb, out.w, nt)
        nl = len(lead)
        blocks = np.moveaxis(blocks, (nl, nl + 2), (0, 1))  # [cols, w, *lead, kb, nt]
        rank = len(out.tile_shape())
        # [cols, *batch, h * mt, kb]: the activations of each grid column, stacked over rows
        at = _stack_grid_rows(np.moveaxis(_batch_aligned(a.masked(0), rank), 1, 0)).astype(
            wide, copy=False
        )
        chunks = []
        for c in range(out.w):
            # every PE multiply-accumulates the weight rows of its column (one batched GEMM
            # over the grid columns), then the chain along each row sums the partials
            weight_rows = _batch_aligned(blocks[:, c][:, None], rank)[:, 0]
            chunks.append((at @ weight_rows).sum(axis=0))
        stacked = np.stack(chunks, axis=-2).astype(out.dtype, copy=False)  # [*batch, h * mt, w, nt]
        return DistTensor(out, _unstack(stacked.reshape(*stacked.shape[:-2], -1), out))


def _stack_grid_rows(tiles: np.ndarray) -> np.ndarray:
    """``[n, h, *batch, mt, kt]`` to ``[n, *batch, h * mt, kt]``."""
    moved = np.moveaxis(tiles, 1, -3)
    return moved.reshape(*moved.shape[:-3], -1, moved.shape[-1])


def _stack_grid_cols(tiles: np.ndarray) -> np.ndarray:
    """``[n, w, *batch, kt, nt]`` to ``[n, *batch, kt, w * nt]``."""
    moved = np.moveaxis(tiles, 1, -2)
    return moved.reshape(*moved.shape[:-2], -1)


def _unstack(matrix: np.ndarray, out: Layout) -> np.ndarray:
    """``[*batch, h * mt, w * nt]`` back to the tile array ``[h, w, *batch, mt, nt]``."""
    nb = matrix.ndim - 2
    blocks = matrix.reshape(*matrix.shape[:-2], out.h, out.rt, out.w, out.ct)
    tiles = np.moveaxis(blocks, (nb, nb + 2), (0, 1))
    return np.ascontiguousarray(np.broadcast_to(tiles, out.tile_shape()), dtype=out.dtype)


class Movement(Kernel):
    """Reshape, transpose, broadcast, concat, slice, pad, im2col and one-hot."""

    def plan(self, target, rect, operands, attrs, results, count_gathers=True):
        ((shape, dtype),) = results
        out = Layout.on(shape, dtype, rect)
        sources = []
        arrive = NO_TRAFFIC
        for operand in operands:
            at = operand.layout if operand.source == WAFER else None
            at = at or Layout.on(operand.shape, operand.dtype, rect)
            arrive = arrive + arrival(operand, at)
            sources.append(at)
        moved = self._traffic(tuple(sources), out, attrs) if count_gathers else NO_TRAFFIC
        total = arrive + moved
        compute = vector_cycles(out.tile_elements, 1.0, dtype, target)
        cost = Cost(cycles=_cycles(total, compute), traffic=total, scratch_bytes=out.tile_bytes)
        return Plan(tuple(sources), (out,), cost)

    def _traffic(self, sources: tuple[Layout, ...], out: Layout, attrs: dict) -> Traffic:
        if self.name == "reshape":
            return _reshape_traffic(sources[0], out)
        index_attrs = {**attrs, "fill": -1, "value": -1}
        maps = []
        for k, src in enumerate(sources):
            ids = [
                np.arange(s.size).reshape(s.shape) if i == k else np.full(s.shape, -1)
                for i, s in enumerate(sources)
            ]
            maps.append((src, self._index_map(ids, index_attrs, out.shape)))
        return gather_traffic(out, maps)

    def _index_map(self, ids: list[np.ndarray], attrs: dict, shape) -> np.ndarray:
        if self.name == "one_hot":
            return np.broadcast_to(ids[0][..., None], shape)
        return np.asarray(reference.movement(self.name, attrs, ids, shape))

    def run(self, plan, values, attrs):
        out = plan.outputs[0]
        arrays = [v.gather() for v in values]
        result = reference.evaluate(self.name, attrs, arrays, out.shape, out.dtype)
        return [DistTensor.scatter(result, out)]


class Pool(Kernel):
    """Max and average pooling: every PE receives its outputs' window taps one kernel
    position at a time and folds each into its running results."""

    def plan(self, target, rect, operands, attrs, results, count_gathers=True):
        (operand,), ((shape, dtype),) = operands, results
        src = operand.layout or Layout.on(operand.shape, operand.dtype, rect)
        out = Layout.on(shape, dtype, rect)
        if count_gathers:
            taps = reference.pool_windows(np.arange(src.size).reshape(src.shape), attrs, -1)
            windows = gather_traffic(out, [(src, taps)])
        else:
            windows = NO_TRAFFIC
        total = arrival(operand, src) + windows
        window = prod(attrs["kernel"])
        compute = vector_cycles(out.tile_elements, window, dtype, target)
        cost = Cost(
            cycles=_cycles(total, compute),
            flops=prod(shape) * window,
            traffic=total,
            scratch_bytes=out.tile_bytes,  # the taps of one kernel position
        )
        return Plan((src,), (out,), cost)

    def run(self, plan, values, attrs):
        out = plan.outputs[0]
        result = reference.evaluate(self.name, attrs, [values[0].gather()], out.shape, out.dtype)
        return [DistTensor.scatter(result, out)]


class Col2Im(Kernel):
    """The adjoint of im2col: every image element receives the patch elements read from it
    (up to one per kernel position) and adds them up."""

    def plan(self, target, rect, operands, attrs, results, count_gathers=True):
        (operand,), ((shape, dtype),) = operands, results
        src = operand.layout or Layout.on(operand.shape, operand.dtype, rect)
        out = Layout.on(shape, dtype, rect)
        taps = patch_taps(tuple(shape), attrs)
        moved = gather_traffic(out, [(src, taps)]) if count_gathers else NO_TRAFFIC
        total = arrival(operand, src) + moved
        compute = vector_cycles(out.tile_elements, taps.shape[-1], dtype, target)
        cost = Cost(
            cycles=_cycles(total, compute),
            flops=prod(operand.shape),
            traffic=total,
            scratch_bytes=out.tile_bytes,
        )
        return Plan((src,), (out,), cost)

    def run(self, plan, values, attrs):
        return _logical_run(self.name, plan, values, attrs)


def patch_taps(image: tuple[int, ...], attrs: dict) -> np.ndarray:
    """``[*image, taps]``: the flat indices of the patch elements read from each image
    element (-1 where an element has fewer taps than the most-read one)."""
    sources = reference.im2col_sources(image, attrs).ravel()
    inside = np.flatnonzero(sources >= 0)
    order = inside[np.argsort(sources[inside], kind="stable")]
    counts = np.bincount(sources[inside], minlength=prod(image))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    taps = np.full((prod(image), max(1, int(counts.max(initial=0)))), -1, dtype=np.int64)
    rank = np.arange(order.size) - np.repeat(starts, counts)
    taps[np.repeat(np.arange(prod(image)), counts), rank] = order
    return taps.reshape(*image, -1)


def _logical_run(name: str, plan: Plan, values, attrs: dict) -> list[DistTensor]:
    """Computes on the logical arrays and lays the results out as planned."""
    arrays = [v.gather() if isinstance(v, DistTensor) else v for v in values]
    outs = reference.evaluate_all(
        name, attrs, arrays, [(layout.shape, layout.dtype) for layout in plan.outputs]
    )
    return [DistTensor.scatter(a, layout) for a, layout in zip(outs, plan.outputs, strict=True)]


class Indexed(Kernel):
    """Gathers and scatters whose indices are data.

    The plan cannot know where the addressed elements are, so it counts the expected traffic
    of addresses spread uniformly over the source (``layout.scattered_traffic``): what a gather
    reads, or what a scatter writes, crosses the mesh once.
    """

    def plan(self, target, rect, operands, attrs, results, count_gathers=True):
        outs = tuple(Layout.on(shape, dtype, rect) for shape, dtype in results)
        sources = tuple(op.layout or Layout.on(op.shape, op.dtype, rect) for op in operands)
        arrive = sum((arrival(op, at) for op, at in zip(operands, sources, strict=True)),
                     NO_TRAFFIC)  # fmt: skip
        if self.name.startswith("scatter"):
            moved = scattered_traffic(sources[2], outs[0], prod(operands[2].shape))
            copy = regrid_traffic(sources[0], outs[0]) if sources[0] != outs[0] else NO_TRAFFIC
            moved = moved + copy
        else:
            moved = scattered_traffic(sources[0], outs[0], prod(results[0][0]))
            # every result element needs its index where the result is computed
            indices = sources[1]
            beside_results = Layout.on(indices.shape, indices.dtype, outs[0].rect)
            if indices != beside_results:
                moved = moved + regrid_traffic(indices, beside_results)
        traffic = arrive + moved
        compute = vector_cycles(outs[0].tile_elements, 1.0, outs[0].dtype, target)
        cost = Cost(
            cycles=_cycles(traffic, compute),
            traffic=traffic,
            scratch_bytes=outs[0].tile_bytes,
        )
        return Plan(sources, outs, cost)

    def run(self, plan, values, attrs):
        return _logical_run(self.name, plan, values, attrs)


class Scan(Kernel):
    """Running sums: every PE scans its tile, then the carries run along the mesh rows or
    columns the scanned axis is split over, and every PE adds its carry."""

    def plan(self, target, rect, operands, attrs, results, count_gathers=True):
        ((operand,), ((shape, dtype),)) = operands, results
        out = Layout.on(shape, dtype, rect)
        rank, axis = len(shape), attrs["axis"]
        chain_length = out.h if axis == rank - 2 else out.w if axis == rank - 1 else 1
        carry = out.tile_elements // max(1, out.rt if axis == rank - 2 else out.ct)
        words = carry * out.words_per_element
        chain = (
            Traffic(words * (chain_length - 1), words, words, words, chain_length - 1)
            if chain_length > 1
            else NO_TRAFFIC
        )
        traffic = arrival(operand, out) + chain
        compute = vector_cycles(2 * out.tile_elements, 1.0, dtype, target)
        cost = Cost(cycles=_cycles(traffic, compute), traffic=traffic,
                    scratch_bytes=carry * out.itemsize)  # fmt: skip
        return Plan((out,), (out,), cost)

    def run(self, plan, values, attrs):
        return _logical_run(self.name, plan, values, attrs)


class Sort(Kernel):
    """Top-k: the sorted axis is gathered whole onto each PE of the other axis, sorted there,
    and the k results spread back to their default layout."""

    def plan(self, target, rect, operands, attrs, results, count_gathers=True):
        (operand,) = operands
        src = operand.layout or Layout.on(operand.shape, operand.dtype, rect)
        rank, axis = len(src.shape), attrs["axis"]
        whole = Layout(
            src.shape, src.dtype, src.row0, src.col0,
            1 if axis == rank - 2 else src.h, 1 if axis == rank - 1 else src.w,
        )  # fmt: skip
        outs = tuple(Layout.on(shape, dtype, rect) for shape, dtype in results)
        gathered = Layout(results[0][0], src.dtype, whole.row0, whole.col0, whole.h, whole.w)
        spread_back = _reshape_traffic(gathered, outs[0])  # once for values, once for indices
        traffic = (
            arrival(operand, src)
            + (regrid_traffic(src, whole) if whole != src else NO_TRAFFIC)
            + spread_back
            + spread_back
        )
        n = max(2, src.shape[axis])
        compute = vector_cycles(whole.tile_elements * np.log2(n), 1.0, src.dtype, target)
        cost = Cost(cycles=_cycles(traffic, compute), traffic=traffic,
                    scratch_bytes=whole.tile_bytes)  # fmt: skip
        return Plan((src,), outs, cost)

    def run(self, plan, values, attrs):
        return _logical_run(self.name, plan, values, attrs)


KERNELS: dict[str, Kernel] = {
    **{name: Elementwise(name) for name in (*reference.UNARY, *reference.BINARY)},
    "select": Elementwise("select"),
    "cast": Elementwise("cast"),
    "bitcast": Elementwise("bitcast"),
    **{name: Reduce(name) for name in reference.REDUCE},
    "matmul": Matmul("matmul"),
    **{name: Movement(name) for name in (*reference.MOVEMENT, "one_hot")},
    "max_pool": Pool("max_pool"),
    "avg_pool": Pool("avg_pool"),
    "argmax_pool": Pool("argmax_pool"),
    "col2im": Col2Im("col2im"),
    **{
        name: Indexed(name)
        for name in ("gather", "gather_elements", "gather_nd", "scatter_elements", "scatter_nd")
    },
    "cumsum": Scan("cumsum"),
    "cumprod": Scan("cumprod"),
    "topk": Sort("topk"),
}


@lru_cache(maxsize=4096)
def _cached_plan(name, target, rect, operands, frozen_attrs, results, count_gathers) -> Plan:
    return KERNELS[name].plan(target, rect, operands, _thaw(frozen_attrs), results, count_gathers)


def plan(
    name: str,
    target: Target,
    rect: Rect,
    operands: Sequence[Operand],
    attrs: dict,
    results: Sequence[tuple[Sequence[int], str]],
    count_gathers: bool = True,
) -> Plan:
    """The (cached) plan of primitive ``name`` (see ``Kernel.plan``)."""
    return _cached_plan(
        name,
        target,
        tuple(rect),
        tuple(operands),
        _freeze(attrs),
        tuple((tuple(s), d) for s, d in results),
        count_gathers,
    )
