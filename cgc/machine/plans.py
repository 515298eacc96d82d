"""Mesh kernels' plans: how each primitive runs on a rectangle of PEs, and what it costs.

A plan looks only at shapes and layouts: it decides where every operand must be and where the
results go, and counts the work (FMACs and vector-op cycles on the busiest PE) and the traffic
(wavelets per link, per PE ramp, hops) of every step. Plans are cached. The compiler's cost
queries and the simulator ask the same plans, so an estimate and a simulated run agree; the
simulator's arithmetic on the planned tiles is ``cgc.runtime.kernels``.

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
  comes from, and ``traffic.gather_traffic`` routes those flows.

A kernel's cycles split three ways, in this order of precedence: its arithmetic (compute),
bringing its operands where it needs them (arrival: relaid tensors, weights entering through
the edge), and the rest of its data movement that the arithmetic does not hide (broadcasts,
chains, gathers).
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from math import prod
from typing import Any

import numpy as np

from cgc.machine import reference
from cgc.machine.layout import Layout, Rect, grid_extent, matrix_dims
from cgc.machine.target import TRANSCENDENTAL_CYCLES, Target
from cgc.machine.traffic import (
    NO_TRAFFIC,
    Traffic,
    edge_traffic,
    gather_traffic,
    regrid_traffic,
    scattered_traffic,
)

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

Spec = tuple[tuple[int, ...], str]
"""A tensor's shape and numpy dtype name."""
Attrs = Mapping[str, Any]
"""An instruction's attributes: plain JSON values."""


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
    compute_cycles: float = 0.0
    """The part of ``cycles`` spent on arithmetic."""
    arrival_cycles: float = 0.0
    """The part of ``cycles`` spent bringing operands where the kernel needs them."""

    @property
    def movement_cycles(self) -> float:
        """The rest of ``cycles``: data movement the arithmetic does not hide."""
        return self.cycles - self.compute_cycles - self.arrival_cycles


@dataclass(frozen=True)
class Plan:
    """A kernel's decisions for one instruction."""

    inputs: tuple[Layout | None, ...]
    """The layout each operand must have when the kernel runs; ``None`` for a stream it
    consumes as it arrives."""
    outputs: tuple[Layout, ...]
    cost: Cost
    detail: dict[str, Any] = field(default_factory=dict[str, Any], hash=False, compare=False)
    """What the kernel chose, for the arithmetic and for inspection (algorithm, steps)."""


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


def _phased(
    compute: float, arrive: Traffic, traffic: Traffic, scratch_bytes: int, flops: float = 0.0
) -> Cost:
    """The cost of a kernel whose phases run one after another: its data movement
    (``traffic``, the operands' ``arrive`` included), then ``compute`` cycles of arithmetic."""
    return Cost(
        cycles=_cycles(traffic, compute),
        flops=flops,
        traffic=traffic,
        scratch_bytes=scratch_bytes,
        compute_cycles=compute,
        arrival_cycles=arrive.cycles,
    )


def _freeze(value: Any) -> Hashable:
    """A hashable copy of an attribute value."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    frozen: Hashable = value
    return frozen


def _thaw(frozen: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in frozen}


@dataclass(frozen=True)
class Request:
    """What a kernel plans for: its operands and results on a rectangle of a target."""

    target: Target
    rect: Rect
    operands: tuple[Operand, ...]
    attrs: Attrs
    results: tuple[Spec, ...]
    count_gathers: bool = True
    """Without it, the plan leaves out the data movement that is costly to work out (general
    gathers): enough to know the memory a layout needs."""


class Kernel(abc.ABC):
    """A primitive's mesh algorithm."""

    def __init__(self, name: str):
        self.name = name

    @abc.abstractmethod
    def plan(self, q: Request) -> Plan:
        """Decides layouts and counts the cost (shapes and layouts only)."""


class Elementwise(Kernel):
    """Unary, binary and ternary elementwise ops, with numpy broadcasting."""

    def plan(self, q: Request) -> Plan:
        ((shape, dtype),) = q.results
        out = Layout.on(shape, dtype, q.rect)
        inputs: list[Layout | None] = []
        traffic, arrive, scratch = NO_TRAFFIC, NO_TRAFFIC, 0
        for operand in q.operands:
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
            arrive = arrive + moved
            if moved.cycles or spread.cycles:
                scratch += aligned.tile_bytes
            inputs.append(aligned)
        per_element = OP_CYCLES.get(self.name, 1.0)
        compute = vector_cycles(out.tile_elements, per_element, dtype, q.target)
        cost = _phased(
            compute,
            arrive,
            traffic,
            scratch,
            flops=prod(shape) * (0 if self.name in ("cast", "bitcast") else 1),
        )
        return Plan(tuple(inputs), (out,), cost)


class Reduce(Kernel):
    """Sum, mean, max and min over any axes."""

    def plan(self, q: Request) -> Plan:
        (operand,), ((shape, dtype),) = q.operands, q.results
        src = operand.layout or Layout.on(operand.shape, operand.dtype, q.rect)
        axes, rank = set(q.attrs["axes"]), len(operand.shape)
        over_rows = rank >= 2 and rank - 2 in axes
        over_cols = rank >= 1 and rank - 1 in axes
        kept = tuple(1 if i in axes else d for i, d in enumerate(operand.shape))
        natural = Layout(
            kept, dtype, src.row0, src.col0, 1 if over_rows else src.h, 1 if over_cols else src.w
        )
        out = Layout.on(shape, dtype, q.rect)
        partial = natural.tile_elements * natural.words_per_element
        chain = [
            Traffic(partial * (n - 1) * m, partial, partial, partial, n - 1)
            for n, m, hit in ((src.w, src.h, over_cols), (src.h, natural.w, over_rows))
            if hit and n > 1
        ]
        settle = reshape_traffic(natural, out)
        arrive = arrival(operand, src)
        traffic = sum(chain, NO_TRAFFIC) + arrive + settle
        compute = vector_cycles(src.tile_elements, 1.0, dtype, q.target)
        combine = vector_cycles(natural.tile_elements, 1.0, dtype, q.target) * len(chain)
        cost = _phased(
            compute + combine,
            arrive,
            traffic,
            natural.tile_bytes * (1 + len(chain)),
            flops=prod(operand.shape),
        )
        return Plan((src,), (out,), cost, {"natural": natural})


def reshape_traffic(src: Layout, dst: Layout) -> Traffic:
    """Moving the elements of ``src`` (row-major) into ``dst``, a layout of the same size."""
    same_grid = (src.row0, src.col0, src.h, src.w) == (dst.row0, dst.col0, dst.h, dst.w)
    if same_grid and (src.rows, src.cols) == (dst.rows, dst.cols):
        return NO_TRAFFIC
    if src.shape == dst.shape:
        return regrid_traffic(src, dst)
    return gather_traffic(dst, [(src, np.arange(src.size))])


class Matmul(Kernel):
    """SUMMA, or the weight-streaming kernel when B arrives from MemoryX."""

    def plan(self, q: Request) -> Plan:
        a, b = q.operands
        ((shape, dtype),) = q.results
        out = Layout.on(shape, dtype, q.rect)
        k = a.shape[-1]
        nb_out = prod(shape[:-2])
        flops = 2.0 * nb_out * shape[-2] * shape[-1] * k
        if b.source == STREAM:
            return self._plan_streaming(q.target, q.rect, a, b, out, flops)
        steps = grid_extent(k, min(q.rect[2], q.rect[3]))
        a_at = Layout(a.shape, a.dtype, out.row0, out.col0, out.h, steps)
        b_at = Layout(b.shape, b.dtype, out.row0, out.col0, steps, out.w)
        mt, kb, nt = out.rt, a_at.ct, out.ct
        step_fmacs = nb_out * mt * kb * nt
        compute = step_fmacs / q.target.fmacs(dtype)
        a_words = a_at.tile_elements * a_at.words_per_element
        b_words = b_at.tile_elements * b_at.words_per_element
        broadcast = Traffic(
            steps * (a_words * out.h * (out.w - 1) + b_words * out.w * (out.h - 1)),
            steps * max(a_words * (out.w > 1), b_words * (out.h > 1)),
            steps * max(a_words, b_words),
            steps * (a_words + b_words),
            out.h - 1 + out.w - 1,
        )
        arrive = _cycles(arrival(a, a_at), arrival(b, b_at))
        step_cycles = max(compute, a_words * (out.w > 1), b_words * (out.h > 1))
        cost = Cost(
            cycles=arrive + steps * step_cycles + broadcast.max_hops,
            flops=flops,
            fmacs=steps * step_fmacs * out.pes,
            traffic=arrival(a, a_at) + arrival(b, b_at) + broadcast,
            scratch_bytes=(a_at.tile_elements + b_at.tile_elements) * out.itemsize,
            compute_cycles=steps * compute,
            arrival_cycles=arrive,
        )
        return Plan((a_at, b_at), (out,), cost, {"algorithm": "summa", "steps": steps})

    def _plan_streaming(
        self, target: Target, rect: Rect, a: Operand, b: Operand, out: Layout, flops: float
    ) -> Plan:
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
        # per chunk, the weight rows arriving beyond the arithmetic are the weights' arrival
        weights_arrive = chunks * (max(compute, weight_words) - compute) + ingress.max_hops
        cost = Cost(
            cycles=_cycles(moved) + chunks * step + ingress.max_hops + reduction.max_hops,
            flops=flops,
            fmacs=chunks * chunk_fmacs * out.h * cols,
            traffic=moved + ingress + reduction,
            # a PE multiply-accumulates each weight row as it arrives: one row of buffer
            scratch_bytes=(nt + nb_out * mt * nt) * out.itemsize,
            compute_cycles=chunks * compute,
            arrival_cycles=moved.cycles + weights_arrive,
        )
        return Plan((a_at, None), (out,), cost, {"algorithm": "stream", "steps": chunks})


class Movement(Kernel):
    """Reshape, transpose, broadcast, concat, slice, pad, im2col and one-hot."""

    def plan(self, q: Request) -> Plan:
        ((shape, dtype),) = q.results
        out = Layout.on(shape, dtype, q.rect)
        sources: list[Layout] = []
        arrive = NO_TRAFFIC
        for operand in q.operands:
            at = operand.layout if operand.source == WAFER else None
            at = at or Layout.on(operand.shape, operand.dtype, q.rect)
            arrive = arrive + arrival(operand, at)
            sources.append(at)
        moved = self._traffic(tuple(sources), out, q.attrs) if q.count_gathers else NO_TRAFFIC
        total = arrive + moved
        compute = vector_cycles(out.tile_elements, 1.0, dtype, q.target)
        cost = _phased(compute, arrive, total, out.tile_bytes)
        return Plan(tuple(sources), (out,), cost)

    def _traffic(self, sources: tuple[Layout, ...], out: Layout, attrs: Attrs) -> Traffic:
        if self.name == "reshape":
            return reshape_traffic(sources[0], out)
        index_attrs = {**attrs, "fill": -1, "value": -1}
        maps: list[tuple[Layout, np.ndarray]] = []
        for k, src in enumerate(sources):
            ids = [
                np.arange(s.size).reshape(s.shape) if i == k else np.full(s.shape, -1)
                for i, s in enumerate(sources)
            ]
            maps.append((src, self._index_map(ids, index_attrs, out.shape)))
        return gather_traffic(out, maps)

    def _index_map(self, ids: list[np.ndarray], attrs: Attrs, shape: tuple[int, ...]) -> np.ndarray:
        if self.name == "one_hot":
            return np.broadcast_to(ids[0][..., None], shape)
        return np.asarray(reference.movement(self.name, attrs, ids, shape))


class Pool(Kernel):
    """Max and average pooling: every PE receives its outputs' window taps one kernel
    position at a time and folds each into its running results."""

    def plan(self, q: Request) -> Plan:
        (operand,), ((shape, dtype),) = q.operands, q.results
        src = operand.layout or Layout.on(operand.shape, operand.dtype, q.rect)
        out = Layout.on(shape, dtype, q.rect)
        if q.count_gathers:
            taps = reference.pool_windows(np.arange(src.size).reshape(src.shape), q.attrs, -1)
            windows = gather_traffic(out, [(src, taps)])
        else:
            windows = NO_TRAFFIC
        arrive = arrival(operand, src)
        total = arrive + windows
        window = prod(q.attrs["kernel"])
        compute = vector_cycles(out.tile_elements, window, dtype, q.target)
        # the taps of one kernel position
        cost = _phased(compute, arrive, total, out.tile_bytes, flops=prod(shape) * window)
        return Plan((src,), (out,), cost)


class Col2Im(Kernel):
    """The adjoint of im2col: every image element receives the patch elements read from it
    (up to one per kernel position) and adds them up."""

    def plan(self, q: Request) -> Plan:
        (operand,), ((shape, dtype),) = q.operands, q.results
        src = operand.layout or Layout.on(operand.shape, operand.dtype, q.rect)
        out = Layout.on(shape, dtype, q.rect)
        taps = patch_taps(tuple(shape), q.attrs)
        moved = gather_traffic(out, [(src, taps)]) if q.count_gathers else NO_TRAFFIC
        arrive = arrival(operand, src)
        total = arrive + moved
        compute = vector_cycles(out.tile_elements, taps.shape[-1], dtype, q.target)
        cost = _phased(compute, arrive, total, out.tile_bytes, flops=prod(operand.shape))
        return Plan((src,), (out,), cost)


def patch_taps(image: tuple[int, ...], attrs: Attrs) -> np.ndarray:
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


class Indexed(Kernel):
    """Gathers and scatters whose indices are data.

    The plan cannot know where the addressed elements are, so it counts the expected traffic
    of addresses spread uniformly over the source (``traffic.scattered_traffic``): what a
    gather reads, or what a scatter writes, crosses the mesh once.
    """

    def plan(self, q: Request) -> Plan:
        outs = tuple(Layout.on(shape, dtype, q.rect) for shape, dtype in q.results)
        sources = tuple(op.layout or Layout.on(op.shape, op.dtype, q.rect) for op in q.operands)
        arrive = sum((arrival(op, at) for op, at in zip(q.operands, sources, strict=True)),
                     NO_TRAFFIC)  # fmt: skip
        if self.name.startswith("scatter"):
            moved = scattered_traffic(sources[2], outs[0], prod(q.operands[2].shape))
            copy = regrid_traffic(sources[0], outs[0]) if sources[0] != outs[0] else NO_TRAFFIC
            moved = moved + copy
        else:
            moved = scattered_traffic(sources[0], outs[0], prod(q.results[0][0]))
            # every result element needs its index where the result is computed
            indices = sources[1]
            beside_results = Layout.on(indices.shape, indices.dtype, outs[0].rect)
            if indices != beside_results:
                moved = moved + regrid_traffic(indices, beside_results)
        traffic = arrive + moved
        compute = vector_cycles(outs[0].tile_elements, 1.0, outs[0].dtype, q.target)
        cost = _phased(compute, arrive, traffic, outs[0].tile_bytes)
        return Plan(sources, outs, cost)


class Scan(Kernel):
    """Running sums: every PE scans its tile, then the carries run along the mesh rows or
    columns the scanned axis is split over, and every PE adds its carry."""

    def plan(self, q: Request) -> Plan:
        ((operand,), ((shape, dtype),)) = q.operands, q.results
        out = Layout.on(shape, dtype, q.rect)
        rank, axis = len(shape), q.attrs["axis"]
        chain_length = out.h if axis == rank - 2 else out.w if axis == rank - 1 else 1
        carry = out.tile_elements // max(1, out.rt if axis == rank - 2 else out.ct)
        words = carry * out.words_per_element
        chain = (
            Traffic(words * (chain_length - 1), words, words, words, chain_length - 1)
            if chain_length > 1
            else NO_TRAFFIC
        )
        arrive = arrival(operand, out)
        traffic = arrive + chain
        compute = vector_cycles(2 * out.tile_elements, 1.0, dtype, q.target)
        cost = _phased(compute, arrive, traffic, carry * out.itemsize)
        return Plan((out,), (out,), cost)


class Sort(Kernel):
    """Top-k: the sorted axis is gathered whole onto each PE of the other axis, sorted there,
    and the k results spread back to their default layout."""

    def plan(self, q: Request) -> Plan:
        (operand,) = q.operands
        src = operand.layout or Layout.on(operand.shape, operand.dtype, q.rect)
        rank, axis = len(src.shape), q.attrs["axis"]
        whole = Layout(
            src.shape, src.dtype, src.row0, src.col0,
            1 if axis == rank - 2 else src.h, 1 if axis == rank - 1 else src.w,
        )  # fmt: skip
        outs = tuple(Layout.on(shape, dtype, q.rect) for shape, dtype in q.results)
        gathered = Layout(q.results[0][0], src.dtype, whole.row0, whole.col0, whole.h, whole.w)
        spread_back = reshape_traffic(gathered, outs[0])  # once for values, once for indices
        arrive = arrival(operand, src)
        traffic = (
            arrive
            + (regrid_traffic(src, whole) if whole != src else NO_TRAFFIC)
            + spread_back
            + spread_back
        )
        n = max(2, src.shape[axis])
        compute = vector_cycles(whole.tile_elements * float(np.log2(n)), 1.0, src.dtype, q.target)
        cost = _phased(compute, arrive, traffic, whole.tile_bytes)
        return Plan((src,), outs, cost)


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
"""Every primitive's kernel, by mnemonic."""


@lru_cache(maxsize=4096)
def _cached_plan(
    name: str,
    target: Target,
    rect: Rect,
    operands: tuple[Operand, ...],
    frozen_attrs: tuple[tuple[str, Any], ...],
    results: tuple[Spec, ...],
    count_gathers: bool,
) -> Plan:
    request = Request(target, rect, operands, _thaw(frozen_attrs), results, count_gathers)
    return KERNELS[name].plan(request)


def plan(
    name: str,
    target: Target,
    rect: Sequence[int],
    operands: Sequence[Operand],
    attrs: Attrs,
    results: Sequence[tuple[Sequence[int], str]],
    count_gathers: bool = True,
) -> Plan:
    """The (cached) plan of primitive ``name`` (see ``Request``)."""
    x, y, w, h = rect
    frozen = _freeze(dict(attrs))
    assert isinstance(frozen, tuple)
    return _cached_plan(
        name,
        target,
        (x, y, w, h),
        tuple(operands),
        frozen,
        tuple((tuple(s), d) for s, d in results),
        count_gathers,
    )
