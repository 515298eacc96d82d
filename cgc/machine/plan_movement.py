"""The plans of data movement, pooling, col2im, gathers and scatters, scans and top-k.

Data movement (reshape, transpose, broadcast, concat, slice, pad, im2col, one-hot, pooling
windows): the op applied to arrays of element indices (``reference``) says where every result
element comes from, and ``traffic.gather_traffic`` routes those flows. Where the indices are
data (gathers, scatters), the plan counts the traffic of addresses spread uniformly.
"""

from __future__ import annotations

from math import prod

import numpy as np

from cgc.machine import reference
from cgc.machine.kernel import (
    WAFER,
    Attrs,
    Kernel,
    Plan,
    Request,
    arrival,
    phased_cost,
    reshape_traffic,
    vector_cycles,
)
from cgc.machine.layout import Layout
from cgc.machine.traffic import (
    NO_TRAFFIC,
    Traffic,
    gather_traffic,
    regrid_traffic,
    scattered_traffic,
)


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
        cost = phased_cost(compute, arrive, total, out.tile_bytes)
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
        cost = phased_cost(compute, arrive, total, out.tile_bytes, flops=prod(shape) * window)
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
        cost = phased_cost(compute, arrive, total, out.tile_bytes, flops=prod(operand.shape))
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
        cost = phased_cost(compute, arrive, traffic, outs[0].tile_bytes)
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
        cost = phased_cost(compute, arrive, traffic, carry * out.itemsize)
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
        cost = phased_cost(compute, arrive, traffic, whole.tile_bytes)
        return Plan((src,), outs, cost)
