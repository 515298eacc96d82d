"""Flow counts as factors: ``Factor``, ``Term`` and their algebra.

A ``Factor`` holds flow counts over some of a flow's PE coordinates (``SR``, ``SC``, ``DR``,
``DC``: source row and column, destination row and column); a ``Term``, a product of factors
over disjoint coordinates. ``flows`` counts a data movement's flows as a sum of terms and
``flow_routing`` routes them; the functions here build, sum, multiply and merge factors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from math import prod

import numpy as np

from cgc.machine.movement.flow_counts import MESH, codes, decode, sorted_sums

SR, SC, DR, DC = range(4)
"""The PE coordinates of a flow: source row, source column, destination row and column."""

DENSE_FACTOR = 16
"""Counting distinct integers with an array over their range rather than by sorting them
pays while the range is at most this many times their number..."""
DENSE_LIMIT = 1 << 21
"""... and the array stays this small."""


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


def make_factor(vars_: Sequence[int], at: np.ndarray, counts: np.ndarray) -> Factor:
    """The factor of entries ``at`` (columns, repeats allowed) weighing ``counts``."""
    order = np.argsort(vars_, kind="stable")
    ordered = tuple(int(vars_[i]) for i in order)
    if not len(counts):
        return Factor(ordered, np.zeros((len(order), 0), MESH), counts)
    if not ordered:
        return scalar_factor(float(np.sum(counts)))
    at = np.asarray(at)
    if ordered != tuple(vars_):
        at = at[order]
    code, span, low = codes(at)
    if dense(prod(span), code.size):
        weights = np.bincount(code, weights=counts, minlength=prod(span))
        unique = np.flatnonzero(weights != 0)
        return Factor(ordered, decode(unique, span, low), weights[unique])
    firsts, weights = sorted_sums(code, counts)
    return Factor(ordered, at[:, firsts].astype(MESH, copy=False), weights)


def dense(span: int, n: int) -> bool:
    """Whether to tell ``n`` integers in ``range(span)`` apart with an array over the range."""
    return span <= min(DENSE_FACTOR * n + (1 << 16), DENSE_LIMIT)


def scalar_factor(count: float) -> Factor:
    return Factor((), np.zeros((0, 1), MESH), np.array([count]))


def marginal(f: Factor, var: int) -> Factor:
    """``f`` summed over coordinate ``var``."""
    if var not in f.vars:
        return f
    keep = [i for i, v in enumerate(f.vars) if v != var]
    return make_factor([f.vars[i] for i in keep], f.at[keep], f.counts)


def outer(factors: Sequence[Factor]) -> Factor:
    """The product of factors over disjoint coordinates, as one factor."""
    at, counts = np.zeros((0, 1), MESH), np.ones(1)
    vars_: tuple[int, ...] = ()
    for f in factors:
        at = np.concatenate([np.repeat(at, f.size, axis=1), np.tile(f.at, counts.size)])
        counts = np.outer(counts, f.counts).reshape(-1)
        vars_ = (*vars_, *f.vars)
    return make_factor(vars_, at, counts)


def canonical(term: Sequence[Factor]) -> Term:
    """The term with its scalars folded into one factor and its factors in order."""
    scale = prod(f.total for f in term if not f.vars)
    factors = sorted((f for f in term if f.vars), key=lambda f: f.vars)
    if not factors:
        return (scalar_factor(scale),)
    if scale != 1:
        first = factors[0]
        factors[0] = Factor(first.vars, first.at, first.counts * scale)
    return tuple(factors)


def merge_terms(terms: Sequence[Term]) -> list[Term]:
    """The same sum with the terms that differ from a first one in the same one factor (or
    in none) added up in that factor: each term joins the earliest group it can, found by
    hashing (hundreds of peeled terms would make comparing every pair dear)."""
    ids = FactorIds()
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
            merged.append((*first[:k], sum_factors([first[k], *rest]), *first[k + 1 :]))
    return merged


class FactorIds:
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


def sum_factors(parts: Sequence[Factor]) -> Factor:
    """Factors over the same coordinates, added up."""
    return make_factor(
        parts[0].vars,
        np.concatenate([f.at for f in parts], axis=1),
        np.concatenate([f.counts for f in parts]),
    )
