"""What moving data on the mesh costs.

Data movement between layouts is routed dimension-ordered (along the row first, then down the
column). ``Routes`` counts, exactly and without a Python loop over PEs or elements, the
wavelets every link carries, what every PE injects and ejects, and the longest path; the
cycles of a transfer follow from those counts. The flows of a data movement between layouts
(a relayout, a reshape, a transpose, the windows of a convolution) are counted in ``flows``,
exactly and at a cost independent of the element count; ``gather_traffic`` is its
per-element oracle.

A tensor between two layers' rectangles crosses on parallel lanes (``lane_ends``), one per row
or column the rectangles share, and, between rectangles side by side, one from each of as many
of the source's other rows as the target has columns, turning onto the target's nearest row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import prod

import numpy as np

from cgc.machine.movement.layout import Layout, Rect


@dataclass(frozen=True)
class Traffic:
    """What a transfer puts on the fabric, counted in wavelets."""

    wavelet_hops: float = 0.0
    """Sum over wavelets of the links each crosses (the energy of the transfer)."""
    max_link: float = 0.0
    """Wavelets on the busiest link direction."""
    max_inject: float = 0.0
    """Wavelets the busiest PE sends."""
    max_eject: float = 0.0
    """Wavelets the busiest PE receives."""
    max_hops: int = 0
    """Longest path in hops (the latency of the first wavelet)."""

    @property
    def cycles(self) -> float:
        """A link, a ramp in and a ramp out each move one wavelet per cycle; the transfer takes
        as long as its busiest one plus the time of flight along the longest path."""
        if not self.wavelet_hops and not self.max_inject:
            return 0.0
        return max(self.max_link, self.max_inject, self.max_eject) + self.max_hops

    def __add__(self, other: Traffic) -> Traffic:
        """Two transfers one after the other."""
        return Traffic(
            self.wavelet_hops + other.wavelet_hops,
            self.max_link + other.max_link,
            self.max_inject + other.max_inject,
            self.max_eject + other.max_eject,
            self.max_hops + other.max_hops,
        )


NO_TRAFFIC = Traffic()


class Routes:
    """Flows added a batch at a time, routed along the source row and then down the
    destination column, over a fixed box of the mesh.

    Link loads come from difference arrays over the box, so the work is linear in the number
    of flows plus the box's area, and any number of batches fits in the same memory.
    """

    DIRECTIONS = ((True, True), (True, False), (False, True), (False, False))
    """(along a row, forward): east, west, south, north."""

    def __init__(self, row0: int, col0: int, rows: int, cols: int):
        self.row0, self.col0 = row0, col0
        self.rows, self.cols = rows + 1, cols + 1  # one more for the end of the last link
        size = self.rows * self.cols
        self.diffs = [np.zeros(size) for _ in self.DIRECTIONS]
        self.injected, self.ejected = np.zeros(size), np.zeros(size)
        self.hops = 0.0
        self.max_hops = 0

    def add(
        self,
        src_r: np.ndarray,
        src_c: np.ndarray,
        dst_r: np.ndarray,
        dst_c: np.ndarray,
        counts: np.ndarray | float,
    ) -> None:
        """Adds ``counts[k]`` elements from PE ``(src_r[k], src_c[k])`` to PE
        ``(dst_r[k], dst_c[k])`` (absolute mesh coordinates inside the box)."""
        moving = (src_r != dst_r) | (src_c != dst_c)
        if not moving.any():
            return
        sr, sc, dr, dc = (
            np.asarray(a)[moving].astype(np.int64) for a in (src_r, src_c, dst_r, dst_c)
        )
        n = np.broadcast_to(np.asarray(counts, dtype=np.float64), moving.shape)[moving]
        sr, dr, sc, dc = sr - self.row0, dr - self.row0, sc - self.col0, dc - self.col0
        size = self.rows * self.cols

        def deltas(r: np.ndarray, c: np.ndarray, amounts: np.ndarray) -> np.ndarray:
            return np.bincount(r * self.cols + c, weights=amounts, minlength=size)

        for diff, (along_row, forward) in zip(self.diffs, self.DIRECTIONS, strict=True):
            if along_row:
                pick = dc > sc if forward else dc < sc
                lo, hi = (sc, dc) if forward else (dc, sc)
                diff += deltas(sr[pick], lo[pick], n[pick]) - deltas(sr[pick], hi[pick], n[pick])
            else:
                pick = dr > sr if forward else dr < sr
                lo, hi = (sr, dr) if forward else (dr, sr)
                diff += deltas(lo[pick], dc[pick], n[pick]) - deltas(hi[pick], dc[pick], n[pick])
        hops = np.abs(dr - sr) + np.abs(dc - sc)
        self.hops += float((n * hops).sum())
        self.max_hops = max(self.max_hops, int(hops.max()))
        self.injected += deltas(sr, sc, n)
        self.ejected += deltas(dr, dc, n)

    def link_loads(self) -> np.ndarray:
        """Elements on every link: ``[direction, row, col]`` over the box (one more row and
        column), in ``DIRECTIONS`` order; ``[d, r, c]`` is the link leaving PE ``(r, c)`` of
        the box east or south, or arriving there from the east or south going west or
        north."""
        return np.stack(
            [
                np.cumsum(diff.reshape(self.rows, self.cols), axis=1 if along_row else 0)
                for diff, (along_row, _) in zip(self.diffs, self.DIRECTIONS, strict=True)
            ]
        )

    def traffic(self, words: float) -> Traffic:
        """The traffic of everything added, ``words`` wavelets per element."""
        if not self.max_hops:
            return NO_TRAFFIC
        load = float(self.link_loads().max(initial=0))
        return Traffic(
            wavelet_hops=self.hops * words,
            max_link=load * words,
            max_inject=float(self.injected.max()) * words,
            max_eject=float(self.ejected.max()) * words,
            max_hops=self.max_hops,
        )


def route(
    src_r: np.ndarray,
    src_c: np.ndarray,
    dst_r: np.ndarray,
    dst_c: np.ndarray,
    counts: np.ndarray,
    words: float,
) -> Traffic:
    """The traffic of one set of flows, ``counts[k]`` elements from PE ``(src_r[k],
    src_c[k])`` to PE ``(dst_r[k], dst_c[k])`` (see ``Routes``)."""
    if not len(src_r):
        return NO_TRAFFIC
    r0 = int(min(np.min(src_r), np.min(dst_r)))
    c0 = int(min(np.min(src_c), np.min(dst_c)))
    rows = int(max(np.max(src_r), np.max(dst_r))) - r0 + 1
    cols = int(max(np.max(src_c), np.max(dst_c))) - c0 + 1
    routes = Routes(r0, c0, rows, cols)
    routes.add(src_r, src_c, dst_r, dst_c, counts)
    return routes.traffic(words)


def _pe_of_flat(layout: Layout, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mesh ``(row, col)`` of the PE holding each logical flat index."""
    j = flat % layout.cols
    i = (flat // layout.cols) % layout.rows
    return layout.row_pe(i), layout.col_pe(j)


GATHER_CHUNK = 1 << 22
"""Index entries ``gather_traffic`` handles at once (it bounds the memory it needs)."""


def gather_traffic(dst: Layout, sources: Sequence[tuple[Layout, np.ndarray]]) -> Traffic:
    """A general data movement into ``dst``, counted element by element: the exact oracle
    that ``flows`` reproduces without the per-element cost (plans use ``flows``; this one is
    for tests and small tensors).

    For each ``(src, index)``, ``index`` has ``dst.size`` rows (row-major over ``dst``); row
    ``k`` lists the elements of ``src`` that result element ``k`` needs, ``-1`` for none. A
    source element needed several times on one PE travels there once.

    The work goes in chunks of whole grid rows of ``dst``, so that every PE's needs are in
    one chunk.
    """
    if dst.size == 0 or not sources:
        return NO_TRAFFIC
    grids = [dst, *(src for src, _ in sources)]
    row0, col0 = min(g.row0 for g in grids), min(g.col0 for g in grids)
    routes = Routes(
        row0,
        col0,
        max(g.row0 + g.h for g in grids) - row0,
        max(g.col0 + g.w for g in grids) - col0,
    )
    for src, index in sources:
        needed = index.reshape(prod(dst.batch), dst.rows, dst.cols, -1)
        per_row = needed[:, :1].size
        step = dst.rt * max(1, GATHER_CHUNK // max(1, per_row * dst.rt))
        for start in range(0, dst.rows, step):
            routes.add(*_chunk_flows(dst, src, needed, start, start + step))
    return routes.traffic(sources[0][0].words_per_element)


def _chunk_flows(
    dst: Layout, src: Layout, needed: np.ndarray, start: int, stop: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(src_r, src_c, dst_r, dst_c, elements)`` per pair of PEs: the distinct source
    elements that the PEs holding the matrix rows ``start:stop`` of ``dst`` need
    (``needed`` is ``[batch, R, C, k]``)."""
    part = needed[:, start:stop]
    rows = dst.row_pe(np.arange(start, min(stop, dst.rows))) - dst.row0
    cols = dst.col_pe(np.arange(dst.cols)) - dst.col0
    pe = (rows[:, None] * dst.w + cols[None, :])[None, :, :, None]
    keep = part >= 0
    wanted = distinct(part[keep].astype(np.int64) * dst.pes + np.broadcast_to(pe, part.shape)[keep])
    src_r, src_c = _pe_of_flat(src, wanted // dst.pes)
    src_pe = (src_r - src.row0) * src.w + (src_c - src.col0)
    pairs, counts = np.unique(src_pe * dst.pes + wanted % dst.pes, return_counts=True)
    src_pe, dst_pe = pairs // dst.pes, pairs % dst.pes
    return (
        src.row0 + src_pe // src.w,
        src.col0 + src_pe % src.w,
        dst.row0 + dst_pe // dst.w,
        dst.col0 + dst_pe % dst.w,
        counts,
    )


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of an integer array (numpy's ``unique`` without counts takes
    a hashing path that is far slower than sorting)."""
    ordered = np.sort(values, axis=None)
    first = np.empty(ordered.shape, dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]


def _blocks(n: int, per: int) -> tuple[np.ndarray, np.ndarray]:
    """The first index of each block of ``per`` consecutive indices among ``n``, and how many
    indices the block holds (the last may hold fewer): one entry per PE, never per element."""
    firsts = np.arange(0, n, max(per, 1))
    return firsts, np.minimum(per, n - firsts)


@lru_cache(maxsize=1024)
def edge_traffic(layout: Layout, inbound: bool) -> Traffic:
    """A tensor entering the grid from (or leaving it through) the north edge of its columns:
    each column's elements flow down (or up) that column from (or to) the row above the grid."""
    first_rows, row_n = _blocks(layout.rows, layout.rt)
    first_cols, col_n = _blocks(layout.cols, layout.ct)
    rows, cols = layout.row_pe(first_rows), layout.col_pe(first_cols)
    edge = np.full(len(rows) * len(cols), layout.row0 - 1)
    pe_r, pe_c = np.repeat(rows, len(cols)), np.tile(cols, len(rows))
    counts = np.outer(row_n, col_n).ravel() * prod(layout.batch)
    if inbound:
        return route(edge, pe_c, pe_r, pe_c, counts, layout.words_per_element)
    return route(pe_r, pe_c, edge, pe_c, counts, layout.words_per_element)


def _spread(start: int, count: int, total: int) -> np.ndarray:
    """Share of a uniform choice over ``count`` PEs from ``start``, on an axis of ``total``."""
    share = np.zeros(total)
    share[start : start + count] = 1.0 / count
    return share


def _mean_distance(p: np.ndarray, q: np.ndarray) -> float:
    """E|a - b| for positions a ~ p and b ~ q drawn independently."""
    positions = np.arange(len(p))
    return float((np.abs(positions[:, None] - positions[None, :]) * np.outer(p, q)).sum())


def cross_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The sum of ``a[p] * b[q] * |p - q|`` over all ``p`` and ``q``."""
    position = np.arange(len(a))
    mass, moment = np.cumsum(a), np.cumsum(position * a)
    below = position * mass - moment
    above = (moment[-1] - moment) - position * (mass[-1] - mass)
    return float(np.dot(b, below + above))


def scattered_traffic(src: Layout, dst: Layout, elements: int) -> Traffic:
    """The expected traffic of ``elements`` values whose addresses are data: each comes from a
    PE of ``src`` chosen uniformly and goes to its owner in ``dst``, routed XY.

    Link loads follow from the two marginal distributions along rows and columns: the
    eastward load on a link is (what starts at or west of it) x (the share that ends east of
    it), and likewise westward and along the columns.
    """
    if src.rect == dst.rect and src.pes == 1:
        return NO_TRAFFIC
    rows = max(src.row0 + src.h, dst.row0 + dst.h)
    cols = max(src.col0 + src.w, dst.col0 + dst.w)
    words = elements * src.words_per_element
    src_r, dst_r = _spread(src.row0, src.h, rows), _spread(dst.row0, dst.h, rows)
    src_c, dst_c = _spread(src.col0, src.w, cols), _spread(dst.col0, dst.w, cols)

    def busiest(origin: np.ndarray, target: np.ndarray) -> float:
        before, after = np.cumsum(origin)[:-1], 1 - np.cumsum(target)[:-1]
        behind, ahead = 1 - np.cumsum(origin)[:-1], np.cumsum(target)[:-1]
        return float(np.max(np.maximum(before * after, behind * ahead), initial=0.0))

    # a row's links carry the traffic of that row's sources; a column's, of its destinations
    along_rows = busiest(src_c, dst_c) * words / src.h
    along_cols = busiest(src_r, dst_r) * words / dst.w
    mean_hops = _mean_distance(src_r, dst_r) + _mean_distance(src_c, dst_c)
    return Traffic(
        wavelet_hops=words * mean_hops,
        max_link=max(along_rows, along_cols),
        max_inject=words / src.pes,
        max_eject=words / dst.pes,
        max_hops=_extent(src.row0, src.h, dst.row0, dst.h)
        + _extent(src.col0, src.w, dst.col0, dst.w)
        - 2,
    )


def _extent(start_a: int, size_a: int, start_b: int, size_b: int) -> int:
    """How many mesh rows (or columns) two spans cover together, gaps included."""
    return max(start_a + size_a, start_b + size_b) - min(start_a, start_b)


def overlap(a: Rect, b: Rect) -> bool:
    """Whether two rectangles share a PE."""
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    return ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah


def lane_ends(source: Rect, target: Rect) -> tuple[np.ndarray, ...]:
    """``(src_row, src_col, dst_row, dst_col)`` of every lane from rectangle ``source`` to
    rectangle ``target`` (disjoint).

    Rectangles side by side get a straight lane across each row they share, and a lane from
    each of as many of the source's other rows as the target has columns: those leave the
    source's facing column on their own rows and arrive on the target's nearest row in distinct
    columns, so that no two lanes share a link (along a row, lanes are on their own rows; down
    a column, on their own columns, above or below the target). Diagonal neighbours share no
    row, so all their lanes are of the second kind. Rectangles one above the other get a
    straight lane down each column they share.
    """
    sx, sy, sw, sh = source
    tx, ty, tw, th = target
    if sx + sw <= tx or tx + tw <= sx:  # side by side
        src_col, dst_col = (sx + sw - 1, tx) if tx >= sx + sw else (sx, tx + tw - 1)
        shared = np.arange(max(sy, ty), min(sy + sh, ty + th))
        above = _corner_lanes(np.arange(sy, min(sy + sh, ty)), tx, tw, ty)
        below = _corner_lanes(np.arange(max(sy, ty + th), sy + sh), tx, tw, ty + th - 1)
        src_rows = np.concatenate([shared, above[0], below[0]])
        dst_cols = np.concatenate([np.full_like(shared, dst_col), above[1], below[1]])
        dst_rows = np.concatenate([shared, above[2], below[2]])
        return src_rows, np.full_like(src_rows, src_col), dst_rows, dst_cols
    # one above the other: their columns overlap, as the rectangles are disjoint
    src_row, dst_row = (sy + sh - 1, ty) if ty >= sy + sh else (sy, ty + th - 1)
    shared = np.arange(max(sx, tx), min(sx + sw, tx + tw))
    return np.full_like(shared, src_row), shared, np.full_like(shared, dst_row), shared


def _corner_lanes(rows: np.ndarray, first: int, width: int, dst_row: int) -> tuple[np.ndarray, ...]:
    """``(src_row, dst_col, dst_row)`` of lanes from source ``rows`` that the target does not
    have, spread over them, to the columns ``first`` onwards of a target ``width`` wide, each
    its own, ending on the target's row ``dst_row``."""
    lanes = np.arange(min(len(rows), width))
    count = max(len(lanes), 1)
    return (
        rows[lanes * len(rows) // count],
        first + lanes * width // count,
        np.full_like(lanes, dst_row),
    )


DECIMALS = 6
"""Wavelets on a link are rounded to this many decimals before their ceiling: a load is a sum
of shares, and adding and taking away the shares of the lanes before it along its line leaves
a rounding error that would otherwise push a whole number of wavelets to the next one."""


def busiest_links(rects: Sequence[Rect], edges: Sequence[tuple[int, int, int]]) -> np.ndarray:
    """Per tensor ``(producer, consumer, wavelets)`` between rectangles (as
    ``lowering.tensor_edges`` lists them), the wavelets on the busiest link its lanes cross,
    counting the lanes of every tensor that share the link.

    Each lane carries an equal share of its tensor's wavelets along its row, then down its
    column (``Routes``), so along a row (or a column), in one direction, the load is a step
    function of the position; its maximum over each lane's span is a range query over the
    steps. The work is in the number of lanes, not in the area of the mesh.
    """
    busiest = np.zeros(len(edges))
    if not len(edges):
        return busiest
    ends = [lane_ends(rects[producer], rects[consumer]) for producer, consumer, _ in edges]
    lanes = np.array([len(e[0]) for e in ends])
    wavelets = np.array([w for _, _, w in edges], dtype=np.float64)
    tensor = np.repeat(np.arange(len(edges)), lanes)
    share = np.repeat(wavelets / lanes, lanes)
    src_r, src_c, dst_r, dst_c = (
        np.concatenate([e[k] for e in ends]).astype(np.int64) for k in range(4)
    )
    span = max(max(x + w, y + h) for x, y, w, h in rects) + 1
    # a segment per lane and axis it moves along: (direction, line) as one key, its first
    # link and the one past its last; along the row first, then down the destination column
    along = [
        (src_c != dst_c, (dst_c < src_c) * span + src_r, src_c, dst_c),
        (src_r != dst_r, (2 + (dst_r < src_r)) * span + dst_c, src_r, dst_r),
    ]
    line = np.concatenate([key[m] for m, key, _, _ in along])
    lo = np.concatenate([np.minimum(a, b)[m] for m, _, a, b in along])
    hi = np.concatenate([np.maximum(a, b)[m] for m, _, a, b in along])
    owner = np.concatenate([tensor[m] for m, *_ in along])
    amount = np.concatenate([share[m] for m, *_ in along])
    if not len(line):
        return busiest
    points, where = np.unique(
        np.concatenate([line * span + lo, line * span + hi]), return_inverse=True
    )
    load = np.cumsum(np.bincount(where, np.concatenate([amount, -amount]), len(points)))
    # each line starts from nothing (no rounding left over from the line before)
    first = np.flatnonzero(np.r_[True, points[1:] // span != points[:-1] // span])
    load -= np.repeat(np.r_[0.0, load[first[1:] - 1]], np.diff(np.r_[first, len(points)]))
    starts, stops = where[: len(line)], where[len(line) :]
    bounds = np.empty(2 * len(line), dtype=np.int64)
    bounds[0::2], bounds[1::2] = starts, stops
    np.maximum.at(busiest, owner, np.maximum.reduceat(load, bounds)[0::2])
    return np.ceil(np.round(busiest, DECIMALS))
