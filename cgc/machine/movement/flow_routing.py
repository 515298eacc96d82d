"""Routing flows given as terms onto the fabric, without multiplying them out.

The load of a link is a prefix sum times a suffix sum of marginals (a difference array where
one factor holds both ends of a leg), PE loads and hops come from two-coordinate marginals, and
the longest path from a max-plus over the factors (``routed_traffic``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from itertools import product
from math import prod

import numpy as np

from cgc.machine.movement.flow_factors import DC, DR, SC, SR, Factor, Term, marginal
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic, cross_distance

Axis = tuple[tuple[int, ...], int, int]
"""An axis of a dense array: the PE coordinates it indexes (equal where several), its first
mesh row or column, its length."""
NO_AXIS: Axis = ((), 0, 1)


def _project(f: Factor, axes: Sequence[Axis]) -> np.ndarray:
    """``f`` summed onto dense ``axes`` (of length 1 where ``f`` has none of an axis's
    coordinates), keeping the entries whose coordinates on each axis agree."""
    keep: np.ndarray | None = None
    flat = np.zeros(f.size, dtype=np.int64)
    shape: list[int] = []
    for vars_, origin, extent in axes:
        mine = [f.coords(v) for v in vars_ if v in f.vars]
        shape.append(extent if mine else 1)
        if not mine:
            continue
        for other in mine[1:]:
            agree = other == mine[0]
            keep = agree if keep is None else keep & agree
        flat *= extent
        flat += mine[0]
        flat -= origin
    counts = f.counts
    if keep is not None:
        flat, counts = flat[keep], counts[keep]
    summed = np.bincount(flat, weights=counts, minlength=prod(shape))
    return summed.reshape(shape)


class _Fabric:
    """Link, ramp and hop counts of flows given as terms, over a box of the mesh (routed along
    the source row, then down the destination column, as ``traffic.Routes``)."""

    def __init__(self, row0: int, col0: int, rows: int, cols: int):
        self.row0, self.col0 = row0, col0
        self.along_rows = np.zeros((2, rows, cols))
        """Eastward and westward loads: ``[_, row, column the link leaves eastward]``."""
        self.along_cols = np.zeros((2, cols, rows))
        """Southward and northward loads: ``[_, column, row the link leaves southward]``."""
        self.sent = np.zeros((rows, cols))
        self.received = np.zeros((rows, cols))
        self.hops = 0.0
        self.longest = 0

    def add(self, term: Term) -> None:
        """Adds the flows of ``term``, each count over only the rows and columns it spans (a
        term of a peeled class lies on a few PE rows of a wafer-wide box)."""
        box = _Window.of(term)
        rows = [marginal(f, DR) for f in term]
        cols = [marginal(f, SC) for f in term]
        east, south = self._at(box, (SR,), (SC, DC)), self._at(box, (DC,), (SR, DR))
        self.along_rows[(0, *east)] += box.legs(rows, SR, SC, DC)
        self.along_rows[(1, *east)] += box.legs(rows, SR, DC, SC)
        self.along_cols[(0, *south)] += box.legs(cols, DC, SR, DR)
        self.along_cols[(1, *south)] += box.legs(cols, DC, DR, SR)
        staying = box.plane(term, (SR, DR), (SC, DC))
        on = self._at(box, (SR, DR), (SC, DC))
        self.sent[self._at(box, (SR,), (SC,))] += box.plane(term, (SR,), (SC,))
        self.sent[on] -= staying
        self.received[self._at(box, (DR,), (DC,))] += box.plane(term, (DR,), (DC,))
        self.received[on] -= staying
        self.hops += box.distance(term, SR, DR) + box.distance(term, SC, DC)
        self.longest = max(self.longest, _longest(term))

    def _at(
        self, box: _Window, first: tuple[int, ...], second: tuple[int, ...]
    ) -> tuple[slice, slice]:
        """Where an array of the window over the coordinates ``first`` and then ``second``
        lies in the fabric's arrays over the same (mesh rows or columns) axes."""
        base = {SR: self.row0, DR: self.row0, SC: self.col0, DC: self.col0}
        (rows, r0, height), (cols, c0, width) = box.axis(*first), box.axis(*second)
        r0, c0 = r0 - base[rows[0]], c0 - base[cols[0]]
        return slice(r0, r0 + height), slice(c0, c0 + width)

    def traffic(self, words: float) -> Traffic:
        """The traffic of everything added, ``words`` wavelets per element."""
        if not self.longest:
            return NO_TRAFFIC
        link = max(float(self.along_rows.max()), float(self.along_cols.max()))
        return Traffic(
            wavelet_hops=self.hops * words,
            max_link=link * words,
            max_inject=float(self.sent.max()) * words,
            max_eject=float(self.received.max()) * words,
            max_hops=self.longest,
        )


@dataclass(frozen=True)
class _Window:
    """The mesh rows and columns that a term's flows start or end on: ``spans`` gives the
    first value and the count of the values of each PE coordinate (an axis over several
    coordinates, such as a leg's two ends, covers them all)."""

    spans: dict[int, tuple[int, int]]

    @classmethod
    def of(cls, term: Term) -> _Window:
        low = {v: int(f.coords(v).min()) for f in term for v in f.vars}
        return cls({v: (low[v], int(f.coords(v).max()) - low[v] + 1) for f in term for v in f.vars})

    def axis(self, *vars_: int) -> Axis:
        """The dense axis along which the coordinates ``vars_`` run: all their values."""
        low = min(self.spans[v][0] for v in vars_)
        high = max(sum(self.spans[v]) for v in vars_)
        return (vars_, low, high - low)

    def legs(self, factors: Sequence[Factor], line: int, start: int, end: int) -> np.ndarray:
        """``[line, x]``: the flows on mesh line ``line`` (a row or column) whose leg from
        ``start`` to ``end`` crosses the link between ``x`` and ``x + 1``: ``start <= x <
        end`` (eastward or southward when ``start`` is where the leg begins, westward or
        northward when it is where the leg ends); ``factors`` are summed over the
        coordinate the leg does not depend on."""
        across = self.axis(line)
        first = next(f for f in factors if start in f.vars)
        last = next(f for f in factors if end in f.vars)
        if first is last:
            load = self._joint_legs(first, line, start, end)
        else:
            both = self.axis(start, end)
            before = np.cumsum(_project(first, [across, ((start,), *both[1:])]), axis=1)
            ends = _project(last, [across, ((end,), *both[1:])])
            load = before * (ends.sum(axis=1, keepdims=True) - np.cumsum(ends, axis=1))
        for f in factors:
            if f is not first and f is not last:
                load = load * _project(f, [across, NO_AXIS])
        return load

    def _joint_legs(self, f: Factor, line: int, start: int, end: int) -> np.ndarray:
        """``legs`` of a factor holding both ends: a difference array along the line."""
        _, origin, length = self.axis(start, end)
        a, b = f.coords(start) - origin, f.coords(end) - origin
        pick = a < b
        if line in f.vars:
            lines, height = f.coords(line)[pick] - self.spans[line][0], self.spans[line][1]
        else:
            lines, height = np.zeros(int(pick.sum()), dtype=np.int64), 1
        width = length + 1
        weights = f.counts[pick]
        ups = np.bincount(lines * width + a[pick], weights, minlength=height * width)
        downs = np.bincount(lines * width + b[pick], weights, minlength=height * width)
        return np.cumsum((ups - downs).reshape(height, width), axis=1)[:, :length]

    def plane(self, term: Term, rows: tuple[int, ...], cols: tuple[int, ...]) -> np.ndarray:
        """``[row, col]``: the flows whose coordinates ``rows`` all equal ``row`` and whose
        ``cols`` all equal ``col``."""
        axes = [self.axis(*rows), self.axis(*cols)]
        return reduce(np.multiply, [_project(f, axes) for f in term])

    def distance(self, term: Term, u: int, v: int) -> float:
        """The sum over flows of ``|u - v|``."""
        fu = next(f for f in term if u in f.vars)
        fv = next(f for f in term if v in f.vars)
        scale = prod(f.total for f in term if f is not fu and f is not fv)
        if fu is fv:
            return scale * float(np.sum(fu.counts * np.abs(fu.coords(u) - fu.coords(v))))
        both = self.axis(u, v)
        a = _project(fu, [((u,), *both[1:])])
        b = _project(fv, [((v,), *both[1:])])
        return scale * cross_distance(a, b)


def _longest(term: Term) -> int:
    """The most hops of a flow of ``term``: ``|dr - sr| + |dc - sc|`` is the largest of four
    signed sums, and a sum over disjoint factors is largest where each part is."""
    best = 0
    for row_sign, col_sign in product((1, -1), repeat=2):
        weight = {SR: -row_sign, DR: row_sign, SC: -col_sign, DC: col_sign}
        best = max(best, sum(_highest(f, weight) for f in term if f.vars))
    return best


def _highest(f: Factor, weight: dict[int, int]) -> int:
    """The largest weighted sum of an entry's coordinates."""
    total = np.zeros(f.size, dtype=np.int64)
    for v in f.vars:
        total += weight[v] * f.coords(v)
    return int(total.max())


def routed_traffic(terms: Sequence[Term], grids: Sequence[Layout]) -> Traffic:
    """The traffic of flows ``terms`` among ``grids``: a destination, then the sources."""
    row0, col0 = min(g.row0 for g in grids), min(g.col0 for g in grids)
    rows, cols = max(g.row0 + g.h for g in grids), max(g.col0 + g.w for g in grids)
    fabric = _Fabric(row0, col0, rows - row0, cols - col0)
    for term in terms:
        fabric.add(term)
    return fabric.traffic(grids[1].words_per_element)
