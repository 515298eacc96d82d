"""Exact fabric traffic of regular data movement, at a cost that does not grow with the tensors.

A data movement is an ``index_maps.IndexMap``: every combination of its digits is one read,
and every coordinate of the element read, and of the reading element, is a function of some
digits. A flow is a pair (source element, destination PE), counted once however often the PE
needs the element: the semantics of ``traffic.gather_traffic``, the per-element oracle, which
this module reproduces exactly.

Counting (``_flows``). The four PE coordinates of a flow (source row and column, destination row
and column) are ``Block`` s of coordinates. Union-find on the digits that each coordinate ties
together splits the digits into independent components; each component is enumerated alone (an
axis, a matrix row or column: never the whole tensor), giving a ``Factor`` (``flow_factors``):
distinct flows per combination of the PE coordinates it touches. The flows between two PEs are
the product of the factors: a ``Term``. A component too large to enumerate (an im2col's samples
and channels tied to its windows), or cheaper to count so, is split by peeling a digit that the
source element determines: its values fall into classes by where tile ends cut the rest of the
coordinates (``index_maps.phase_classes``, in closed form: at most ``W + 1`` classes for a digit
whose coordinate's other terms span ``W``, however many values), and within a class the flows
are those of one representative shifted by whole PEs (``_peel``). The flows are then a sum of
terms.

Routing (``flow_routing``). ``Traffic`` follows from the terms without multiplying them out: the
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
from functools import lru_cache
from itertools import product
from math import prod

import numpy as np

from cgc.machine.movement.flow_counts import MESH, RawFactor, codes, run_starts
from cgc.machine.movement.flow_factors import (
    DC,
    DR,
    SC,
    SR,
    Factor,
    FactorIds,
    Term,
    canonical,
    dense,
    make_factor,
    merge_terms,
    outer,
    scalar_factor,
)
from cgc.machine.movement.flow_routing import routed_traffic
from cgc.machine.movement.index_maps import (
    Affine,
    Attrs,
    Block,
    Coord,
    IndexedSource,
    IndexMap,
    Structure,
    gives_axes,
    identity,
    matrix_coords,
    movement_map,
    phase_classes,
    phase_count,
)
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic, scattered_traffic

ENUMERATION_LIMIT = 1 << 20
"""Digit combinations one component may enumerate at once."""
WORK_LIMIT = 1 << 24
"""Digit combinations the enumerations of one index map may add up to."""
TERM_LIMIT = 1024
"""Terms a sum of flows may hold."""
PEEL_OVERHEAD = 1 << 14
"""What one peeled class costs beyond its enumerations, in digit combinations: a component
this large or larger is peeled where that costs less than enumerating it."""
CONVOLUTION_LIMIT = 1 << 20
"""Entries a factor may have once it takes in the shifts of a peeled class; beyond, the
shifts stay a factor of their own, one term per place they apply to."""


class TooLarge(Exception):
    """Counting exactly would enumerate more than the limits allow."""


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
        terms = [canonical((*t, *s)) for t in terms for s in sums]
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
    return make_factor(part.vars, np.array(at, MESH).reshape(len(at), count), np.ones(count))


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
    if not dense(span, n):
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
    ids, piles = FactorIds(), Counter[tuple[int, ...]]()
    for c, sums in classes:
        for t in sums:
            piles[tuple(ids(f) for f in t if not set(f.vars) & set(c.vars))] += _convolution(t, c)
    apart = max(piles.values(), default=0) > CONVOLUTION_LIMIT
    terms = [s for c, sums in classes for t in sums for s in _shifted(t, c, apart)]
    terms = merge_terms(terms)
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
        return [canonical((*term, scalar_factor(float(c.counts.sum()))))]
    touched = [f for f in term if set(f.vars) & set(c.vars)]
    rest = [f for f in term if not set(f.vars) & set(c.vars)]
    if not apart and _convolution(term, c) <= CONVOLUTION_LIMIT:
        return [canonical((*rest, _convolved(outer(touched), c)))]
    return _cut(touched, rest, c)


def _convolution(term: Term, c: _Class) -> int:
    """The entries of the factor that shifts ``term`` by class ``c`` (at most)."""
    return prod(f.size for f in term if set(f.vars) & set(c.vars)) * c.counts.size


def _convolved(f: Factor, c: _Class) -> Factor:
    """``f`` at every shift of class ``c`` (shift by shift: each a sorted run)."""
    at = np.tile(f.at, c.counts.size)
    for i, var in enumerate(c.vars):
        at[f.vars.index(var)] += np.repeat(c.shifts[i].astype(MESH), f.size)
    return make_factor(f.vars, at, np.outer(c.counts, f.counts).reshape(-1))


def _cut(touched: Sequence[Factor], rest: Sequence[Factor], c: _Class) -> list[Term]:
    """``_shifted`` as a sum over the values the shifted coordinates take in ``touched``: in
    each term the shifts make a factor of their own."""
    pieces = [_slices(f, [v for v in c.vars if v in f.vars]) for f in touched]
    if prod(len(p) for p in pieces) > TERM_LIMIT:
        raise TooLarge
    terms = []
    for combination in product(*pieces):
        where = {v: x for at, _ in combination for v, x in at.items()}
        moved = make_factor(c.vars, c.shifts + np.array([[where[v]] for v in c.vars]), c.counts)
        terms.append(canonical((*rest, *(f for _, f in combination), moved)))
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
            Factor(kept, rest[:, pick], f.counts[pick])
            if kept
            else scalar_factor(f.counts[pick].sum())
        )
        slices.append((where, part))
    return slices


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
    return routed_traffic(terms, [index_map.dst, *(s.layout for s in sources)])


def regrid_traffic(src: Layout, dst: Layout) -> Traffic:
    """Moving a tensor between two layouts of the same shape: its rows and its columns move
    independently (two factors of the identity index map), at a cost linear in R + C and in
    the box (folding or unfolding ties the leading axes to the rows: a component of them)."""
    if (src.rect, src.fold) == (dst.rect, dst.fold):
        return NO_TRAFFIC
    coords = tuple(map(identity, range(len(dst.shape))))
    return map_traffic(IndexMap(dst.shape, dst, coords, (IndexedSource(src, coords),)))


def movement_traffic(name: str, attrs: Attrs, sources: Sequence[Layout], out: Layout) -> Traffic:
    """The traffic of data-movement op ``name`` from ``sources`` into ``out`` (see
    ``movement_map``)."""
    if out.size == 0:
        return NO_TRAFFIC
    return map_traffic(movement_map(name, attrs, sources, out))


def terms_traffic(raw: Sequence[Sequence[RawFactor]], grids: Sequence[Layout]) -> Traffic:
    """The traffic of flows counted elsewhere (``window_flows``) as a sum of products of raw
    factors, among ``grids`` (a destination, then the sources), routed as the engine's own."""
    return routed_traffic([canonical([make_factor(*f) for f in term]) for term in raw], grids)


def _problem(index_map: IndexMap, source: IndexedSource) -> _Part:
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
