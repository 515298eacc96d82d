"""The plans of data movement, pooling, col2im, gathers and scatters, scans and top-k.

Data movement (reshape, transpose, broadcast, concat, slice, pad, im2col, one-hot, pooling
windows, col2im): ``flows`` counts exactly the flows that the op's index map makes, at a cost
that does not grow with the tensors (``window_flows`` counts im2col's faster, by tap ranges,
listing its reads up to ``flows.ENUMERATION_LIMIT``). A folded operand is read where it is; a
reshape's result is folded where that moves nothing, and the windows of a folded channels-last
image are folded (each PE reads its own pixels' halo). Where the indices are data (gathers,
scatters), the plan counts the traffic of addresses spread uniformly.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np

from cgc.machine import reference
from cgc.machine.movement.flows import movement_traffic, regrid_traffic
from cgc.machine.movement.index_maps import POOLS
from cgc.machine.movement.layout import Layout, Rect, matrix_dims
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic, scattered_traffic
from cgc.machine.movement.window_flows import im2col_traffic
from cgc.machine.plans.kernel import (
    WAFER,
    Attrs,
    Kernel,
    Plan,
    PlanRequest,
    arrival,
    multicast,
    phased_cost,
    reshape_traffic,
    same_tiles,
    vector_cycles,
)
from cgc.machine.reference.data_movement import window_counts


class Movement(Kernel):
    """Reshape, transpose, concat, slice, pad, reverse, tile and im2col."""

    def plan(self, q: PlanRequest) -> Plan:
        ((shape, dtype),) = q.results
        sources: list[Layout] = []
        arrive = NO_TRAFFIC
        for operand in q.operands:
            at = operand.layout if operand.source == WAFER else None
            if at is not None and at.fold and not _reads_folded(self.name, q.attrs):
                at = None
            at = at or Layout.on(operand.shape, operand.dtype, q.rect)
            arrive = arrive + arrival(operand, at)
            sources.append(at)
        if self.name == "reshape":
            out = _reshaped(sources[0], shape, dtype, q.rect)
            moved = reshape_traffic(sources[0], out)
        else:
            out = Layout.on(shape, dtype, q.rect, fold=_windows_fold(self.name, q.attrs, sources))
            moved = (
                im2col_traffic(q.attrs, sources[0], out)
                if self.name == "im2col"
                else movement_traffic(self.name, q.attrs, sources, out)
            )
        total = arrive + moved
        compute = vector_cycles(out.tile_elements, 1.0, dtype, q.target)
        cost = phased_cost(compute, arrive, total, out.tile_bytes)
        return Plan(tuple(sources), (out,), cost)


def _reads_folded(name: str, attrs: Attrs) -> bool:
    """Whether ``flows`` counts op ``name`` reading a folded layout exactly: every leading
    coordinate of its reads is a progression of a digit (not a tile's repeats, nor a
    reflecting or edge pad's), so a folded operand stays where it is."""
    return name != "tile" and (name != "pad" or attrs.get("mode", "constant") == "constant")


def _reshaped(src: Layout, shape: tuple[int, ...], dtype: str, rect: Rect) -> Layout:
    """A reshape's result: folded where that leaves every element where it is and the
    unfolded layout would not (a matmul's rows back to the samples' tokens or an image's
    pixels, the last axis unchanged)."""
    out = Layout.on(shape, dtype, rect)
    folded = Layout.on(shape, dtype, rect, fold=True)
    return folded if same_tiles(src, folded) and not same_tiles(src, out) else out


def _windows_fold(name: str, attrs: Attrs, sources: Sequence[Layout]) -> bool:
    """Whether windows over a folded channels-last image are laid out folded: their rows
    then follow the image's pixels, and each PE reads the halo of its own block."""
    return name in ("im2col", *POOLS) and attrs.get("channels_last", False) and sources[0].fold


class Broadcast(Kernel):
    """broadcast_to and one_hot: the source arrives laid out as the result sees it (its rows on
    the result's rows, its columns on the result's columns, where it has them), then the
    routers copy it along the mesh rows or columns it is missing, one stream a link, as an
    elementwise op's broadcast operand; every PE makes its part of the result there."""

    def plan(self, q: PlanRequest) -> Plan:
        (operand,), ((shape, dtype),) = q.operands, q.results
        out = Layout.on(shape, dtype, q.rect)
        src = operand.layout if operand.source == WAFER else None
        src = src or Layout.on(operand.shape, operand.dtype, q.rect)
        arrive = arrival(operand, src)
        seen = _as_seen(operand.shape, shape, self.name == "one_hot")
        aligned = Layout(
            seen,
            operand.dtype,
            out.row0,
            out.col0,
            out.h if matrix_dims(seen)[1] == out.rows else 1,
            out.w if matrix_dims(seen)[2] == out.cols else 1,
        )
        spread = reshape_traffic(src, aligned) + multicast(aligned, out)
        compute = vector_cycles(out.tile_elements, 1.0, dtype, q.target)
        cost = phased_cost(compute, arrive, arrive + spread, aligned.tile_bytes)
        return Plan((src,), (out,), cost)


def _as_seen(source: tuple[int, ...], result: tuple[int, ...], one_hot: bool) -> tuple[int, ...]:
    """The source's shape as the result sees it: one-hot indices gain the depth axis (of one);
    a broadcast source gains leading axes of one."""
    if one_hot:
        return (*source, 1)
    return (1,) * (len(result) - len(source)) + tuple(source)


class Pool(Kernel):
    """Max and average pooling: every PE receives its outputs' window taps one kernel
    position at a time and folds each into its running results."""

    def plan(self, q: PlanRequest) -> Plan:
        (operand,), ((shape, dtype),) = q.operands, q.results
        src = operand.layout or Layout.on(operand.shape, operand.dtype, q.rect)
        out = Layout.on(shape, dtype, q.rect, fold=_windows_fold(self.name, q.attrs, [src]))
        windows = movement_traffic(self.name, q.attrs, [src], out)
        arrive = arrival(operand, src)
        total = arrive + windows
        window = prod(q.attrs["kernel"])
        compute = vector_cycles(out.tile_elements, window, dtype, q.target)
        # the taps of one kernel position
        cost = phased_cost(compute, arrive, total, out.tile_bytes, flops=prod(shape) * window)
        return Plan((src,), (out,), cost)


class Col2Im(Kernel):
    """The adjoint of im2col: every image element receives the patch elements read from it
    (up to one per kernel position) and adds them up."""

    def plan(self, q: PlanRequest) -> Plan:
        (operand,), ((shape, dtype),) = q.operands, q.results
        src = operand.layout or Layout.on(operand.shape, operand.dtype, q.rect)
        out = Layout.on(shape, dtype, q.rect)
        moved = movement_traffic(self.name, q.attrs, [src], out)
        arrive = arrival(operand, src)
        total = arrive + moved
        taps = most_taps(tuple(shape), q.attrs)
        compute = vector_cycles(out.tile_elements, taps, dtype, q.target)
        cost = phased_cost(compute, arrive, total, out.tile_bytes, flops=prod(operand.shape))
        return Plan((src,), (out,), cost)


def most_taps(image: tuple[int, ...], attrs: Attrs) -> int:
    """The most patch elements that one image element receives (at least one): the product
    over the spatial axes of the most window positions that read one position."""
    if not prod(image):
        return 1
    last = attrs.get("channels_last", False)
    spatial = image[1:-1] if last else image[2:]
    kernel, strides, pads, dilations = (
        attrs[k] for k in ("kernel", "strides", "pads", "dilations")
    )
    most = 1
    counts = window_counts(spatial, kernel, strides, pads, dilations)
    for i, (size, k, outs) in enumerate(zip(spatial, kernel, counts, strict=True)):
        low = pads[i]
        at = strides[i] * np.arange(outs)[:, None] + dilations[i] * np.arange(k)[None, :] - low
        most *= int(np.bincount(at[(at >= 0) & (at < size)], minlength=size).max())
    return max(1, most)


def patch_taps(image: tuple[int, ...], attrs: Attrs) -> np.ndarray:
    """``[*image, taps]``: the flat indices of the patch elements read from each image
    element (-1 where an element has fewer taps than the most-read one). Per element, so only
    for small images: the index map of the per-element oracle ``traffic.gather_traffic``."""
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

    def plan(self, q: PlanRequest) -> Plan:
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
        cost = phased_cost(compute, arrive, traffic, outs[0].tile_bytes)
        return Plan(sources, outs, cost)


class Scan(Kernel):
    """Running sums: every PE scans its tile, then the carries run along the mesh rows or
    columns the scanned axis is split over, and every PE adds its carry."""

    def plan(self, q: PlanRequest) -> Plan:
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
        cost = phased_cost(compute, arrive, traffic, carry * out.itemsize)
        return Plan((out,), (out,), cost)


class Sort(Kernel):
    """Top-k: the sorted axis is gathered whole onto each PE of the other axis, sorted there,
    and the k results spread back to their default layout."""

    def plan(self, q: PlanRequest) -> Plan:
        (operand,) = q.operands
        rank, axis = len(operand.shape), q.attrs["axis"]
        src = operand.layout or Layout.on(operand.shape, operand.dtype, q.rect)
        # a folded operand stays folded for the last axis (its rows are whole rows), and is
        # relaid unfolded for any other, as for a reduction
        fold = src.fold and axis == rank - 1
        if src.fold and not fold:
            src = Layout.on(operand.shape, operand.dtype, q.rect)
        whole = Layout(
            src.shape, src.dtype, src.row0, src.col0,
            1 if axis == rank - 2 else src.h, 1 if axis == rank - 1 else src.w, fold,
        )  # fmt: skip
        outs = tuple(Layout.on(shape, dtype, q.rect, fold) for shape, dtype in q.results)
        gathered = Layout(
            q.results[0][0], src.dtype, whole.row0, whole.col0, whole.h, whole.w, fold
        )
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
        cost = phased_cost(compute, arrive, traffic, whole.tile_bytes)
        return Plan((src,), outs, cost)
