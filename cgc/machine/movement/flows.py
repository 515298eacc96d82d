"""Exact fabric traffic of regular data movement, at a cost that does not grow with the tensors.

A data movement is an ``index_maps.IndexMap``: every combination of its digits is one read,
and every coordinate of the element read, and of the reading element, is a function of some
digits. A flow is a pair (source element, destination PE), counted once however often the PE
needs the element: the semantics of ``traffic.gather_traffic``, the per-element oracle, which
this module reproduces exactly.

Counting (``_flows``). The four PE coordinates of a flow (source row and column, destination
row and column) are ``Block`` s of coordinates. Union-find on the digits that each coordinate
ties together splits the digits into independent components; each component is enumerated
alone (an axis, a matrix row or column: never the whole tensor), giving a ``Factor``: distinct
flows per combination of the PE coordinates it touches. The flows between two PEs are the
product of the factors: a ``Term``. A component too large to enumerate (an im2col's samples
and channels tied to its windows), or cheaper to count so, is split by peeling a digit that the
source element determines: its values fall into classes by where tile ends cut the rest of the
coordinates (``index_maps.phase_classes``, in closed form: at most ``W + 1`` classes for a
digit whose coordinate's other terms span ``W``, however many values), and within a class the
flows are those of one representative shifted by whole PEs (``_peel``). The flows are then a
sum of terms.

Routing (``_Fabric``). ``Traffic`` follows from the terms without multiplying them out: the
load of a link is a prefix sum times a suffix sum of marginals (a difference array where one
factor holds both ends of a leg), PE loads and hops come from two-coordinate marginals, and
the longest path from a max-plus over the factors. The work is linear in the factors' sizes
and, per term, in the rows and columns of the mesh that the term spans.

What stays inexact: a component that no peeling brings under ``ENUMERATION_LIMIT`` digit
combinations within ``WORK_LIMIT`` (a tensor far larger than the limit whose reads tie one
axis to another irregularly, such as flattening [B, S, H] to [B, S * H] for GPT-3 sizes).
Its traffic is then ``traffic.scattered_traffic``'s estimate. Every index map of at most
``ENUMERATION_LIMIT`` digit combinations is exact. So is every movement from or into a folded
layout (``layout.Layout.fold``) whose leading coordinates are progressions of digits, their
row-major sum being one (``index_maps.matrix_coords``); a tile's repeats or a reflecting or
edge pad of a folded layout's leading axes are estimated, and the plans relay such an operand
unfolded first (``plans.movement``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache, reduce
from itertools import product
from math import prod

import numpy as np

from cgc.machine.movement.flow_counts import MESH, RawFactor, codes, decode, run_starts, sorted_sums
from cgc.machine.movement.index_maps import (
    Affine,
    Attrs,
    Block,
    Coord,
    IndexMap,
    Source,
    Structure,
    gives_axes,
    identity,
    matrix_coords,
    movement_map,
    phase_classes,
    phase_count,
)
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic, cross_distance, scattered_traffic

ENUMERATION_LIMIT = 1 << 20
"""Digit combinations one component may enumerate at once."""
WORK_LIMIT = 1 << 24
"""Digit combinations the enumerations of one index map may add up to."""
SR, SC, DR, DC = range(4)
"""The PE coordinates of a flow: source row, source column, destination row and column."""
TERM_LIMIT = 1024
"""Terms a sum of flows may hold."""
PEEL_OVERHEAD = 1 << 14
"""What one peeled class costs beyond its enumerations, in digit combinations: a component
this large or larger is peeled where that costs less than enumerating it."""
CONVOLUTION_LIMIT = 1 << 20
"""Entries a factor may have once it takes in the shifts of a peeled class; beyond, the
shifts stay a factor of their own, one term per place they apply to."""

DENSE_FACTOR = 16
"""Counting distinct integers with an array over their range rather than by sorting them
pays while the range is at most this many times their number..."""
DENSE_LIMIT = 1 << 21
"""... and the array stays this small."""


class TooLarge(Exception):
    """Counting exactly would enumerate more than the limits allow."""


# --------------------------------------------------------------------------- factors


@dataclass(frozen=True, eq=False)
class Factor:
    """Flow counts over some PE coordinates (``vars``, ascending): ``counts[k]`` flows at the
    mesh coordinates ``at[:, k]`` (``MESH`` integers; distinct columns, positive counts)."""

    vars: tuple[int, ...]
    at: np.ndarray
    counts: np.ndarray

    @property
    def size(self) -> int:
        return len(self.counts)

    @cached_property
    def total(self) -> float:
        return float(self.counts.sum())

    def coords(self, var: int) -> np.ndarray:
        """The mesh coordinate ``var`` of every entry."""
        row: np.ndarray = self.at[self.vars.index(var)]
        return row

    def same(self, other: Factor) -> bool:
        return self is other or (
            self.vars == other.vars
            and np.array_equal(self.at, other.at)
            and np.array_equal(self.counts, other.counts)
        )


Term = tuple[Factor, ...]
"""Flows as a product of factors over disjoint PE coordinates."""


def _factor(vars_: Sequence[int], at: np.ndarray, counts: np.ndarray) -> Factor:
    """The factor of entries ``at`` (columns, repeats allowed) weighing ``counts``."""
    order = np.argsort(vars_, kind="stable")
    ordered = tuple(int(vars_[i]) for i in order)
    if not len(counts):
        return Factor(ordered, np.zeros((len(order), 0), MESH), counts)
    if not ordered:
        return _scalar(float(np.sum(counts)))
    at = np.asarray(at)
    if ordered != tuple(vars_):
        at = at[order]
    code, span, low = codes(at)
    if _dense(prod(span), code.size):
        weights = np.bincount(code, weights=counts, minlength=prod(span))
        unique = np.flatnonzero(weights != 0)
        return Factor(ordered, decode(unique, span, low), weights[unique])
    firsts, weights = sorted_sums(code, counts)
    return Factor(ordered, at[:, firsts].astype(MESH, copy=False), weights)


def _dense(span: int, n: int) -> bool:
    """Whether to tell ``n`` integers in ``range(span)`` apart with an array over the range."""
    return span <= min(DENSE_FACTOR * n + (1 << 16), DENSE_LIMIT)


def _scalar(count: float) -> Factor:
    return Factor((), np.zeros((0, 1), MESH), np.array([count]))


def _marginal(f: Factor, var: int) -> Factor:
    """``f`` summed over coordinate ``var``."""
    if var not in f.vars:
        return f
    keep = [i for i, v in enumerate(f.vars) if v != var]
    return _factor([f.vars[i] for i in keep], f.at[keep], f.counts)


def _outer(factors: Sequence[Factor]) -> Factor:
    """The product of factors over disjoint coordinates, as one factor."""
    at, counts = np.zeros((0, 1), MESH), np.ones(1)
    vars_: tuple[int, ...] = ()
    for f in factors:
        at = np.concatenate([np.repeat(at, f.size, axis=1), np.tile(f.at, counts.size)])
        counts = np.outer(counts, f.counts).reshape(-1)
        vars_ = (*vars_, *f.vars)
    return _factor(vars_, at, counts)


def _canonical(term: Sequence[Factor]) -> Term:
    """The term with its scalars folded into one factor and its factors in order."""
    scale = prod(f.total for f in term if not f.vars)
    factors = sorted((f for f in term if f.vars), key=lambda f: f.vars)
    if not factors:
        return (_scalar(scale),)
    if scale != 1:
        first = factors[0]
        factors[0] = Factor(first.vars, first.at, first.counts * scale)
    return tuple(factors)


def _merge(terms: Sequence[Term]) -> list[Term]:
    """The same sum with the terms that differ from a first one in the same one factor (or
    in none) added up in that factor: each term joins the earliest group it can, found by
    hashing (hundreds of peeled terms would make comparing every pair dear)."""
    ids = _Ids()
    firsts: list[Term] = []
    positions: list[int | None] = []
    parts: list[list[Factor]] = []
    keys: dict[tuple[object, ...], list[int]] = {}
    for term in terms:
        prints = tuple(map(ids, term))
        masks = [
            (k, *(f.vars for f in term), *prints[:k], *prints[k + 1 :]) for k in range(len(term))
        ]
        found = [
            (g, k)
            for k, mask in enumerate(masks)
            for g in keys.get(mask, ())
            if positions[g] in (None, k)
        ]
        if found:
            g, k = min(found)
            positions[g] = k
            parts[g].append(term[k])
            continue
        for mask in masks:
            keys.setdefault(mask, []).append(len(firsts))
        firsts.append(term)
        positions.append(None)
        parts.append([])
    merged = []
    for first, position, rest in zip(firsts, positions, parts, strict=True):
        if position is None:
            merged.append(first)
        else:
            k = position
            merged.append((*first[:k], _sum([first[k], *rest]), *first[k + 1 :]))
    return merged


class _Ids:
    """A number for every distinct factor, equal for equal factors."""

    def __init__(self) -> None:
        self.seen: dict[int, list[tuple[Factor, int]]] = {}
        self.count = 0

    def __call__(self, f: Factor) -> int:
        alike = self.seen.setdefault(hash((f.vars, f.at.tobytes(), f.counts.tobytes())), [])
        for other, number in alike:
            if f.same(other):
                return number
        self.count += 1
        alike.append((f, self.count))
        return self.count


def _sum(parts: Sequence[Factor]) -> Factor:
    """Factors over the same coordinates, added up."""
    return _factor(
        parts[0].vars,
        np.concatenate([f.at for f in parts], axis=1),
        np.concatenate([f.counts for f in parts]),
    )


# --------------------------------------------------------------------------- counting


@dataclass(frozen=True)
class _Part:
    """A counting problem: the flows that ``digits`` enumerate, told apart by ``keys`` (the
    source element and the destination PE), where ``keys`` and ``checks`` are all valid, at
    the PE coordinates ``pes``."""

    digits: tuple[int, ...]
    keys: tuple[Coord | Block, ...]
    checks: tuple[Coord, ...]
    pes: tuple[tuple[int, Block], ...]

    @property
    def vars(self) -> tuple[int, ...]:
        return tuple(v for v, _ in self.pes)

    def size(self, sizes: Sequence[int]) -> int:
        """Digit combinations to enumerate."""
        return prod(sizes[d] for d in self.digits)

    def fix(self, digit: int, value: int) -> _Part:
        """The problem with ``digit`` held at ``value``."""
        return _Part(
            tuple(d for d in self.digits if d != digit),
            tuple(k.fix(digit, value) for k in self.keys),
            tuple(c.fix(digit, value) for c in self.checks),
            tuple((v, b.fix(digit, value)) for v, b in self.pes),
        )


class _Budget:
    """The digit combinations left to enumerate."""

    def __init__(self, left: int):
        self.left = left

    def spend(self, amount: int) -> None:
        self.left -= amount
        if self.left < 0:
            raise TooLarge


def _components(part: _Part) -> list[_Part]:
    """``part`` split into problems over disjoint digits (one without digits for the constant
    coordinates); digits that no coordinate reads are left out (they only repeat flows)."""
    parent = {d: d for d in part.digits}

    def root(d: int) -> int:
        while parent[d] != d:
            parent[d] = parent[parent[d]]
            d = parent[d]
        return d

    coords: list[Coord | Block] = [*part.keys, *part.checks, *(b for _, b in part.pes)]
    for c in coords:
        for d in c.digits[1:]:
            parent[root(d)] = root(c.digits[0])

    def group(c: Coord | Block) -> int:
        return root(c.digits[0]) if c.digits else -1

    roots = sorted({group(c) for c in coords})
    return [
        _Part(
            tuple(d for d in part.digits if r >= 0 and root(d) == r),
            tuple(k for k in part.keys if group(k) == r),
            tuple(c for c in part.checks if group(c) == r),
            tuple((v, b) for v, b in part.pes if group(b) == r),
        )
        for r in roots
    ]


def _flows(part: _Part, sizes: Sequence[int], budget: _Budget) -> list[Term]:
    """The flows of ``part``, a sum of terms over its PE coordinates: the product of its
    components' flows, each enumerated or peeled, whichever costs less."""
    terms: list[Term] = [()]
    for component in _components(part):
        size = component.size(sizes)
        large = size > min(PEEL_OVERHEAD, ENUMERATION_LIMIT)
        peeling = _peeling(component, sizes, budget) if large else None
        sums: list[Term]
        if peeling is not None and (size > ENUMERATION_LIMIT or peeling.cost < size):
            sums = _peel(component, sizes, budget, peeling)
        elif size <= ENUMERATION_LIMIT:
            budget.spend(size)
            table = _enumerate(component, sizes)
            sums = [(table,)] if table.size else []
        else:
            raise TooLarge
        terms = [_canonical((*t, *s)) for t in terms for s in sums]
        if len(terms) > TERM_LIMIT:
            raise TooLarge
    return terms


def _enumerate(part: _Part, sizes: Sequence[int]) -> Factor:
    """The distinct flows of ``part`` by PE coordinates, from every digit combination."""
    shape = tuple(sizes[d] for d in part.digits)
    grid = {
        d: np.arange(n).reshape([n if i == k else 1 for i in range(len(shape))])
        for k, (d, n) in enumerate(zip(part.digits, shape, strict=True))
    }
    valid = np.ones(shape, dtype=bool)
    for c in (*part.keys, *part.checks):
        valid &= c(grid) >= 0
    count = int(valid.sum())
    rows: np.ndarray | slice = slice(None)
    if not _injective(part, sizes):
        rows = _distinct_rows([np.broadcast_to(k(grid), shape)[valid] for k in part.keys], count)
        count = len(rows)
    at = [np.broadcast_to(b(grid), shape)[valid][rows] for _, b in part.pes]
    return _factor(part.vars, np.array(at, MESH).reshape(len(at), count), np.ones(count))


def _injective(part: _Part, sizes: Sequence[int]) -> bool:
    """Whether distinct digit combinations always read distinct source elements: every digit
    is determined by one source coordinate."""
    return all(any(k.recovers(d, sizes) for k in part.keys) for d in part.digits)


def _distinct_rows(columns: Sequence[np.ndarray], n: int) -> np.ndarray:
    """One position of each distinct row of ``columns`` (``n`` rows)."""
    code = np.zeros(n, dtype=np.int64)
    span = 1
    for column in columns:
        low = int(column.min(initial=0))
        radix = int(column.max(initial=0)) - low + 1
        if span * radix >= 1 << 62:
            code = np.unique(code, return_inverse=True)[1].reshape(-1)
            span = n
        code = code * radix + (column - low)
        span *= radix
    if not _dense(span, n):
        first: np.ndarray = np.unique(code, return_index=True)[1]
        return first
    # a scatter keeps one position per code (any one: equal keys have equal PE coordinates)
    position = np.full(span, -1, dtype=np.int64)
    position[code] = np.arange(n)
    return position[position >= 0]


@dataclass(frozen=True)
class _Class:
    """The values of a peeled digit in one phase class: a representative, and how far (in
    PEs, along each PE coordinate ``vars``) the others' flows are from its own, with how many
    values at each distance."""

    digit: int
    value: int
    vars: tuple[int, ...]
    shifts: np.ndarray
    counts: np.ndarray


@dataclass(frozen=True)
class _Peeling:
    """A digit to peel: its phase classes, and what counting them all costs, in digit
    combinations."""

    classes: list[_Class]
    cost: int


def _peel(part: _Part, sizes: Sequence[int], budget: _Budget, peeling: _Peeling) -> list[Term]:
    """The flows of a component by classes of a peeled digit: the digit is held at one value
    per phase class, and the class's flows are that value's, shifted."""
    classes = [(c, _flows(part.fix(c.digit, c.value), sizes, budget)) for c in peeling.classes]
    # the shifted factors of terms alike elsewhere merge into one, which for many classes
    # is as large as the mesh times one value's flows: past the limit, shifts stay apart
    ids, piles = _Ids(), Counter[tuple[int, ...]]()
    for c, sums in classes:
        for t in sums:
            piles[tuple(ids(f) for f in t if not set(f.vars) & set(c.vars))] += _convolution(t, c)
    apart = max(piles.values(), default=0) > CONVOLUTION_LIMIT
    terms = [s for c, sums in classes for t in sums for s in _shifted(t, c, apart)]
    terms = _merge(terms)
    if len(terms) > TERM_LIMIT:
        raise TooLarge
    return terms


def _peeling(part: _Part, sizes: Sequence[int], budget: _Budget) -> _Peeling | None:
    """The peelable digit (with its phases) whose classes cost the least to count, if any
    fits the budget."""
    best: _Peeling | None = None
    for digit in part.digits:
        if not _peelable(part, digit, sizes):
            continue
        rest = sum(p.size(sizes) for p in _components(part.fix(digit, 0)))
        blocks = [(v, b) for v, b in part.pes if digit in b.digits]
        cost = phase_count([b for _, b in blocks], digit, sizes) * (rest + PEEL_OVERHEAD)
        if cost > budget.left or (best is not None and cost >= best.cost):
            continue
        found = phase_classes([b for _, b in blocks], digit, sizes)
        if found is not None:
            vars_ = tuple(v for v, _ in blocks)
            classes = [_Class(digit, p.value, vars_, p.shifts, p.counts) for p in found]
            best = _Peeling(classes, cost)
    return best


def _peelable(part: _Part, digit: int, sizes: Sequence[int]) -> bool:
    """Whether holding ``digit`` fixed shifts the flows by whole PEs: the source element
    determines it, and it enters every coordinate as a plain term that stays in bounds."""
    coords = [*part.keys, *part.checks, *(b for _, b in part.pes)]
    inner = [c.coord if isinstance(c, Block) else c for c in coords if digit in c.digits]
    if not all(isinstance(c, Affine) and c.plain and c.always_valid(sizes) for c in inner):
        return False
    return any(isinstance(k, Affine) and k.recovers(digit, sizes) for k in part.keys)


def _shifted(term: Term, c: _Class, apart: bool) -> list[Term]:
    """The flows of all the values of class ``c``, from those of its representative: in one
    factor with the shifts unless ``apart`` or that factor would pass the limit."""
    if not c.vars:
        return [_canonical((*term, _scalar(float(c.counts.sum()))))]
    touched = [f for f in term if set(f.vars) & set(c.vars)]
    rest = [f for f in term if not set(f.vars) & set(c.vars)]
    if not apart and _convolution(term, c) <= CONVOLUTION_LIMIT:
        return [_canonical((*rest, _convolved(_outer(touched), c)))]
    return _cut(touched, rest, c)


def _convolution(term: Term, c: _Class) -> int:
    """The entries of the factor that shifts ``term`` by class ``c`` (at most)."""
    return prod(f.size for f in term if set(f.vars) & set(c.vars)) * c.counts.size


def _convolved(f: Factor, c: _Class) -> Factor:
    """``f`` at every shift of class ``c`` (shift by shift: each a sorted run)."""
    at = np.tile(f.at, c.counts.size)
    for i, var in enumerate(c.vars):
        at[f.vars.index(var)] += np.repeat(c.shifts[i].astype(MESH), f.size)
    return _factor(f.vars, at, np.outer(c.counts, f.counts).reshape(-1))


def _cut(touched: Sequence[Factor], rest: Sequence[Factor], c: _Class) -> list[Term]:
    """``_shifted`` as a sum over the values the shifted coordinates take in ``touched``: in
    each term the shifts make a factor of their own."""
    pieces = [_slices(f, [v for v in c.vars if v in f.vars]) for f in touched]
    if prod(len(p) for p in pieces) > TERM_LIMIT:
        raise TooLarge
    terms = []
    for combination in product(*pieces):
        where = {v: x for at, _ in combination for v, x in at.items()}
        moved = _factor(c.vars, c.shifts + np.array([[where[v]] for v in c.vars]), c.counts)
        terms.append(_canonical((*rest, *(f for _, f in combination), moved)))
    return terms


def _slices(f: Factor, vars_: Sequence[int]) -> list[tuple[dict[int, int], Factor]]:
    """``f`` split by the values of the coordinates ``vars_``: each value and the rest of
    ``f`` there."""
    rows = [f.vars.index(v) for v in vars_]
    others = [i for i in range(len(f.vars)) if i not in rows]
    code, span, low = codes(f.at[rows])
    order = np.argsort(code, kind="stable")
    starts = run_starts(code[order])
    if len(starts) > TERM_LIMIT:
        raise TooLarge
    keys = code[order[starts]]
    values = np.array(np.unravel_index(keys, span)) + low
    kept, rest = tuple(f.vars[i] for i in others), f.at[others]
    slices = []
    for k, pick in enumerate(np.split(order, starts[1:])):
        where = dict(zip(vars_, values[:, k].tolist(), strict=True))
        part = (
            Factor(kept, rest[:, pick], f.counts[pick]) if kept else _scalar(f.counts[pick].sum())
        )
        slices.append((where, part))
    return slices


# --------------------------------------------------------------------------- routing

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
        rows = [_marginal(f, DR) for f in term]
        cols = [_marginal(f, SC) for f in term]
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


# --------------------------------------------------------------------------- traffic


def map_traffic(index_map: IndexMap) -> Traffic:
    """The traffic of ``index_map``, routed as ``traffic.gather_traffic`` routes it and equal
    to it; for a component beyond the limits (see the module docstring), the estimate of
    every source element crossing once from a uniformly chosen PE."""
    dst, sources = index_map.dst, [s for s in index_map.sources if s.layout.size]
    if not sources or dst.size == 0 or 0 in index_map.digits:
        return NO_TRAFFIC
    exact = _exact_traffic(Structure(index_map))
    if exact is None:
        return sum((scattered_traffic(s.layout, dst, s.layout.size) for s in sources), NO_TRAFFIC)
    return exact


@lru_cache(maxsize=1 << 14)
def _exact_traffic(problem: Structure) -> Traffic | None:
    """The exact traffic of an index map (with elements), None past the limits; remembered
    by structure: the placement asks the same movement again, often elsewhere on the mesh."""
    index_map, sizes = problem.index_map, problem.index_map.digits
    sources = [s for s in index_map.sources if s.layout.size]
    budget = _Budget(WORK_LIMIT)
    try:
        terms = [t for s in sources for t in _flows(_problem(index_map, s), sizes, budget)]
    except TooLarge:
        return None
    return _routed(terms, [index_map.dst, *(s.layout for s in sources)])


def _routed(terms: Sequence[Term], grids: Sequence[Layout]) -> Traffic:
    """The traffic of flows ``terms`` among ``grids``: a destination, then the sources."""
    row0, col0 = min(g.row0 for g in grids), min(g.col0 for g in grids)
    rows, cols = max(g.row0 + g.h for g in grids), max(g.col0 + g.w for g in grids)
    fabric = _Fabric(row0, col0, rows - row0, cols - col0)
    for term in terms:
        fabric.add(term)
    return fabric.traffic(grids[1].words_per_element)


def regrid_traffic(src: Layout, dst: Layout) -> Traffic:
    """Moving a tensor between two layouts of the same shape: its rows and its columns move
    independently (two factors of the identity index map), at a cost linear in R + C and in
    the box (folding or unfolding ties the leading axes to the rows: a component of them)."""
    if (src.rect, src.fold) == (dst.rect, dst.fold):
        return NO_TRAFFIC
    coords = tuple(map(identity, range(len(dst.shape))))
    return map_traffic(IndexMap(dst.shape, dst, coords, (Source(src, coords),)))


def movement_traffic(name: str, attrs: Attrs, sources: Sequence[Layout], out: Layout) -> Traffic:
    """The traffic of data-movement op ``name`` from ``sources`` into ``out`` (see
    ``movement_map``)."""
    if out.size == 0:
        return NO_TRAFFIC
    return map_traffic(movement_map(name, attrs, sources, out))


def terms_traffic(raw: Sequence[Sequence[RawFactor]], grids: Sequence[Layout]) -> Traffic:
    """The traffic of flows counted elsewhere (``window_flows``) as a sum of products of raw
    factors, among ``grids`` (a destination, then the sources), routed as the engine's own."""
    return _routed([_canonical([_factor(*f) for f in term]) for term in raw], grids)


def _problem(index_map: IndexMap, source: Source) -> _Part:
    """Counting the flows from one source."""
    sizes = index_map.digits
    src, dst = source.layout, index_map.dst
    src_rc, dst_rc = matrix_coords(source.coords, src), matrix_coords(index_map.dst_coords, dst)
    if src_rc is None or dst_rc is None:  # only every element would tell
        raise TooLarge
    (src_row, src_col), (dst_row, dst_col) = src_rc, dst_rc
    dr, dc = Block(dst_row, dst.rt, dst.row0), Block(dst_col, dst.ct, dst.col0)
    pes = (
        (SR, Block(src_row, src.rt, src.row0)),
        (SC, Block(src_col, src.ct, src.col0)),
        (DR, dr),
        (DC, dc),
    )
    # the coordinates that the PE blocks leave unchecked: the batch's, or a folded row's
    held = index_map.dst_coords[: -1 if gives_axes(index_map.dst_coords, dst) else -2]
    checks = tuple(c for c in held if not c.always_valid(sizes))
    return _Part(tuple(range(len(sizes))), (*source.coords, dr, dc), checks, pes)
