"""The plans of elementwise ops and reductions.

* elementwise: local on aligned tiles; a broadcast operand is multicast along the mesh rows
  or columns it is missing, but a constant scalar, which the PEs' code holds;
* reductions: local reduction of each tile, then a chain reduction along the mesh rows or
  columns the reduced axes are split over.

Both keep a folded operand's layout (``layout.Layout.fold``) where that is free: an elementwise
result whose operands line up with it, a reduction over the last axis alone (a norm's, a
softmax's); elsewhere a folded operand is relaid unfolded, and its arrival counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import prod

from cgc.machine.hardware.dtypes import is_integer
from cgc.machine.hardware.target import TRANSCENDENTAL_CYCLES, Target
from cgc.machine.movement.layout import Layout, matrix_dims
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic
from cgc.machine.plans.kernel import (
    RESIDENT,
    WAFER,
    Kernel,
    Operand,
    Plan,
    PlanRequest,
    arrival,
    multicast,
    phased_cost,
    reshape_traffic,
    vector_cycles,
)

OP_CYCLES: dict[str, float] = {
    **dict.fromkeys(
        ("exp", "log", "sqrt", "reciprocal", "sigmoid", "tanh", "erf", "div", "mod", "fmod",
         "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"),
        TRANSCENDENTAL_CYCLES,
    ),
    "pow": 2 * TRANSCENDENTAL_CYCLES,
}  # fmt: skip
"""Vector cycles per element; every other elementwise op takes one."""


class Elementwise(Kernel):
    """Unary, binary and ternary elementwise ops, with numpy broadcasting."""

    def plan(self, q: PlanRequest) -> Plan:
        ((shape, dtype),) = q.results
        out = _beside(
            Layout.on(shape, dtype, q.rect, fold=_keeps_fold(q.operands, shape)), q.operands
        )
        operands = [brought(operand, out) for operand in q.operands]
        divisor = operands[1].layout.tile_elements if self.name == "div" else None
        compute = op_cycles(self.name, out.tile_elements, divisor, dtype, q.target)
        cost = phased_cost(
            compute,
            sum((o.arrival for o in operands), NO_TRAFFIC),
            sum((o.traffic for o in operands), NO_TRAFFIC),
            sum(o.scratch for o in operands),
            flops=prod(shape) * (0 if self.name in ("cast", "bitcast") else 1),
        )
        return Plan(tuple(o.layout for o in operands), (out,), cost)


@dataclass(frozen=True)
class Brought:
    """An operand brought to the tiles of a result: where it is then, and what that took."""

    layout: Layout
    arrival: Traffic
    """Its arrival in ``layout``."""
    traffic: Traffic
    """Its arrival and its multicast along the rows or columns it is missing."""
    scratch: int
    """Bytes a PE receives it into, if it moves."""


def brought(operand: Operand, out: Layout, beside: bool = False) -> Brought:
    """``operand`` brought to the tiles of ``out`` (``_aligned``), multicast along what it is
    missing but a resident scalar; with ``beside``, a resident vector of one row (a fused
    matmul's bias) is kept on every row of the grid instead, which no run multicasts."""
    at = _aligned(operand, out)
    kept = beside and operand.source == RESIDENT and at.h == 1 and not _immediate(operand)
    if kept:
        at = replace(at, row0=out.row0, h=out.h)
    moved = arrival(operand, at)
    spread = NO_TRAFFIC if kept or _immediate(operand) else multicast(at, out)
    scratch = at.tile_bytes if moved.cycles or spread.cycles else 0
    return Brought(at, moved, moved + spread, scratch)


def op_cycles(name: str, elements: int, divisor: int | None, dtype: str, target: Target) -> float:
    """Cycles for a PE to apply elementwise op ``name`` to its ``elements``; a float division
    by a divisor of fewer elements on the PE (a norm's deviation, a softmax's sum, a scalar:
    ``divisor`` of them) takes their reciprocals and multiplies by them, as a PE's division
    costs what a transcendental does and a product one cycle."""
    if name == "div" and divisor is not None and divisor < elements and not is_integer(dtype):
        return vector_cycles(divisor, OP_CYCLES[name], dtype, target) + vector_cycles(
            elements, 1.0, dtype, target
        )
    return vector_cycles(elements, OP_CYCLES.get(name, 1.0), dtype, target)


def _beside(out: Layout, operands: Sequence[Operand]) -> Layout:
    """A result on one PE, on the PE of an operand on one PE (a reduction's sum, at the middle
    of the grid: the next op multicasts it from there) rather than at the corner."""
    if out.h == 1 and out.w == 1:
        for operand in operands:
            at = operand.layout if operand.source == WAFER else None
            if at is not None and at.h == 1 and at.w == 1:
                return replace(out, row0=at.row0, col0=at.col0)
    return out


def _immediate(operand: Operand) -> bool:
    """Whether ``operand`` is a resident scalar (an epsilon, GELU's 1/sqrt(2); resident
    values do not change, as training streams its weights): every PE's code holds it as an
    immediate, as a compiled kernel does, so no run multicasts it (its bytes are charged
    once, where its layout says, as no PE's SRAM holds it)."""
    return operand.source == RESIDENT and prod(operand.shape) == 1


def _folded(operand: Operand) -> bool:
    """Whether ``operand`` is on the wafer in a folded layout."""
    return operand.source == WAFER and operand.layout is not None and operand.layout.fold


def _keeps_fold(operands: Sequence[Operand], shape: tuple[int, ...]) -> bool:
    """Whether the result stays folded: an operand of its shape arrives folded, and every
    operand's tiles line up with the folded result's (``_aligned``)."""
    arrives_folded = any(_folded(op) and op.shape == shape for op in operands)
    return arrives_folded and all(_rows_align(op.shape, shape) for op in operands)


def _rows_align(operand: tuple[int, ...], result: tuple[int, ...]) -> bool:
    """Whether ``operand`` broadcast to ``result`` has the folded result's rows, or one row
    that a tile array of the same rank broadcasts (a bias, a scale: rank at most 2)."""
    lead = (1,) * (len(result) - len(operand)) + operand[:-1]
    return lead == result[:-1] or (len(operand) <= 2 and prod(lead) == 1)


def _aligned(operand: Operand, out: Layout) -> Layout:
    """An operand as the result's tiles need it: on the result's grid, its rows (or columns)
    on the result's where it has them, else on one row (column) multicast along the rest: the
    one it is on already, if it lies on one inside the grid (a reduction's result, on the
    middle one), else the grid's first."""
    _, rows, cols = matrix_dims(operand.shape, out.fold)
    h = out.h if rows == out.rows else 1
    w = out.w if cols == out.cols else 1
    at = operand.layout if operand.source == WAFER else None
    row0, col0 = out.row0, out.col0
    if at is not None and h == 1 and at.h == 1 and out.row0 <= at.row0 < out.row0 + out.h:
        row0 = at.row0
    if at is not None and w == 1 and at.w == 1 and out.col0 <= at.col0 < out.col0 + out.w:
        col0 = at.col0
    return Layout(operand.shape, operand.dtype, row0, col0, h, w, out.fold)


class Reduce(Kernel):
    """Sum, mean, max and min over any axes."""

    def plan(self, q: PlanRequest) -> Plan:
        (operand,), ((shape, dtype),) = q.operands, q.results
        axes, rank = set(q.attrs["axes"]), len(operand.shape)
        # a folded operand stays folded for the last axis alone (a norm's, a softmax's)
        fold = axes == {rank - 1} and _folded(operand)
        src = operand.layout if fold or not _folded(operand) else None
        src = src or Layout.on(operand.shape, operand.dtype, q.rect)
        over_rows = rank >= 2 and rank - 2 in axes
        over_cols = rank >= 1 and rank - 1 in axes
        kept = tuple(1 if i in axes else d for i, d in enumerate(operand.shape))
        # the partial sums meet at the middle row and column: half the grid's depth
        natural = Layout(
            kept,
            dtype,
            src.row0 + (src.h - 1) // 2 if over_rows else src.row0,
            src.col0 + (src.w - 1) // 2 if over_cols else src.col0,
            1 if over_rows else src.h,
            1 if over_cols else src.w,
            fold,
        )
        out = _at_root(Layout.on(shape, dtype, q.rect, fold), natural)
        partial = natural.tile_elements * natural.words_per_element
        lines = [
            (n, m)
            for n, m, hit in ((src.w, src.h, over_cols), (src.h, natural.w, over_rows))
            if hit and n > 1
        ]
        chain = [centre_chain(partial, n, m) for n, m in lines]
        settle = reshape_traffic(natural, out)
        arrive = arrival(operand, src)
        traffic = sum(chain, NO_TRAFFIC) + arrive + settle
        compute = vector_cycles(src.tile_elements, 1.0, dtype, q.target)
        # the middle PE of a chain adds the partials from both its sides
        adds = sum(2 if n > 2 else 1 for n, _ in lines)
        combine = vector_cycles(natural.tile_elements, adds, dtype, q.target)
        cost = phased_cost(
            compute + combine,
            arrive,
            traffic,
            natural.tile_bytes * (1 + len(chain)),
            flops=prod(operand.shape),
        )
        return Plan((src,), (out,), cost, {"natural": natural})


def centre_chain(words: float, line: int, lines: int) -> Traffic:
    """Partial sums of ``words`` on each of ``line`` PEs of ``lines`` mesh lines, summed along
    each line in two chains that meet at its middle PE: every link carries one stream, the
    middle PE takes in both, and the farther end is ``line // 2`` hops away."""
    both = 2 if line > 2 else 1
    return Traffic(words * (line - 1) * lines, words, words, both * words, line // 2)


def _at_root(out: Layout, natural: Layout) -> Layout:
    """A reduction's result where its partial sums met, if it has one column (row) there:
    then it stays on the middle column (row) of the grid, which is as near every PE as any
    (the next op multicasts it from there), instead of settling at the corner."""
    col = natural.col0 if out.w == 1 and natural.w == 1 else out.col0
    row = natural.row0 if out.h == 1 and natural.h == 1 else out.row0
    return replace(out, row0=row, col0=col)
