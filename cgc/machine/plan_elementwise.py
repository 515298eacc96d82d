"""The plans of elementwise ops and reductions.

* elementwise: local on aligned tiles; a broadcast operand is multicast along the mesh rows
  or columns it is missing;
* reductions: local reduction of each tile, then a chain reduction along the mesh rows or
  columns the reduced axes are split over.
"""

from __future__ import annotations

from math import prod

from cgc.machine.kernel import (
    Kernel,
    Plan,
    Request,
    arrival,
    multicast,
    phased_cost,
    reshape_traffic,
    vector_cycles,
)
from cgc.machine.layout import Layout, matrix_dims
from cgc.machine.target import TRANSCENDENTAL_CYCLES
from cgc.machine.traffic import NO_TRAFFIC, Traffic

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
        cost = phased_cost(
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
        cost = phased_cost(
            compute + combine,
            arrive,
            traffic,
            natural.tile_bytes * (1 + len(chain)),
            flops=prod(operand.shape),
        )
        return Plan((src,), (out,), cost, {"natural": natural})
