"""MeshGEMV: a one-row result times a resident matrix on the whole rectangle (after
WaferLLM's MeshGEMV, OSDI'25, the GEMV of its decode).

SUMMA keeps a ``[1, K]`` vector's result on one PE row, so its arithmetic runs on that row
alone. MeshGEMV spreads the matrix over every PE instead: its ``K`` rows over the mesh rows,
its ``N`` columns over the mesh columns, so each PE multiply-accumulates a ``K/h x N/w``
block. The vector and the result lie on the grid's middle row, split over its columns, as
a reduction leaves them (``plan_elementwise.centre_chain``), so that one GEMV's result is
the next one's vector where it stands.

The kernel has three parts:

- **The turn**: every mesh row needs the vector's block that matches its rows of the
  matrix. The middle row's PEs that hold the block send it up or down their column to that
  row, which multicasts it along itself. A resident matrix is laid out when the program
  loads, so the kernel chooses which of its row blocks each mesh row keeps: rows far from
  the middle get blocks from the middle columns, whose multicasts are short, and rows near
  it the blocks from the edges (``turn_flight``), about one side of the grid in all.
- **The arithmetic**: a PE multiply-accumulates each element of its block of the vector
  into a row of its matrix block as it arrives, so the turn's wavelets and the arithmetic
  overlap.
- **The reduction**: the partial results sum down each column in two chains that meet at
  the middle row, half a side deep.

WaferLLM keeps the vector replicated on every PE between layers and so pays no turn; cgc's
layouts hold each element once, so its GEMV pays the turn where WaferLLM's AllReduce pays
its broadcast back (``docs/fidelity.md``).
"""

from __future__ import annotations

from functools import lru_cache
from math import prod

import numpy as np

from cgc.machine.movement.layout import Layout, grid_extent
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic
from cgc.machine.plans.elementwise import centre_chain
from cgc.machine.plans.kernel import (
    RESIDENT,
    Cost,
    Operand,
    Plan,
    PlanRequest,
    arrival,
    binding,
    sequential_cycles,
    vector_cycles,
)


def plan_gemv(q: PlanRequest, a: Operand, b: Operand, fold: bool, flops: float) -> Plan:
    """MeshGEMV of ``a @ b`` for a result of one matrix row and an unbatched resident ``b``,
    A and the result folded or not as the matmul chose."""
    ((shape, dtype),) = q.results
    k, n = a.shape[-1], shape[-1]
    x, y, width, height = q.rect
    rows, cols = grid_extent(k, height), grid_extent(n, width)
    middle = y + (rows - 1) // 2
    out = Layout(tuple(shape), dtype, middle, x, 1, cols, fold)
    a_at = Layout(a.shape, a.dtype, middle, x, 1, grid_extent(k, width), fold)
    b_at = Layout(b.shape, b.dtype, y, x, rows, cols)
    turn = turn_traffic(a_at, b_at)
    compute = b_at.rt * b_at.ct / q.target.fmacs(dtype)
    partial = out.ct * out.words_per_element
    chain = centre_chain(partial, rows, cols) if rows > 1 else NO_TRAFFIC
    # the middle PE adds the partial sums from both its sides
    combine = vector_cycles(out.ct, 2 if rows > 2 else 1, dtype, q.target) * (rows > 1)
    moved = arrival(a, a_at)
    arrive = sequential_cycles(moved)
    busiest = max(turn.max_link, turn.max_inject, turn.max_eject)
    cost = Cost(
        cycles=arrive + max(compute, busiest) + turn.max_hops + chain.cycles + combine,
        flops=flops,
        fmacs=b_at.rt * b_at.ct * b_at.pes,
        traffic=moved + turn + chain,
        # the vector's block, the partial result and the partial arriving from a neighbour
        scratch_bytes=b_at.rt * a_at.itemsize + 2 * out.ct * out.itemsize,
        compute_cycles=compute,
        arrival_cycles=arrive,
    )
    terms = {
        "arrival": arrive,
        "arithmetic": compute,
        "the turn through the ramps and links": busiest,
        "the turn's flight": turn.max_hops,
        "the reduction": chain.cycles + combine,
    }
    detail = {"algorithm": "meshgemv", "steps": 1, "binds": binding(terms)}
    return Plan((a_at, b_at), (out,), cost, detail)


def turn_traffic(a_at: Layout, b_at: Layout) -> Traffic:
    """The turn of the vector (``a_at``, one mesh row) onto the mesh rows of the matrix
    (``b_at``): each mesh row takes the vector's elements of its row block, from the PEs of
    ``a_at`` that hold them, down (or up) their columns and then along the row to every
    column of ``b_at``. Each element goes down one column and along one row; a column's
    links carry at most the block of its PE of ``a_at``, a row's its row block."""
    if b_at.pes == 1 and a_at.pes == 1:
        return NO_TRAFFIC
    per_row = b_at.rt * a_at.words_per_element
    per_column = a_at.ct * a_at.words_per_element
    k = a_at.cols
    middle = a_at.row0 - b_at.row0
    down = np.abs(np.arange(b_at.h) - middle)
    return Traffic(
        wavelet_hops=float(a_at.words_per_element * (down.sum() * b_at.rt + k * (b_at.w - 1))),
        max_link=max(per_row * (b_at.w > 1), per_column * (b_at.h > 1)),
        max_inject=per_column,
        max_eject=per_row,
        max_hops=turn_flight(b_at.h, middle, k, b_at.rt, a_at.ct, b_at.w),
    )


@lru_cache(maxsize=256)
def turn_flight(rows: int, middle: int, k: int, rt: int, ct: int, cols: int) -> int:
    """The hops of the turn's longest path, with the row blocks given to the mesh rows so
    that it is shortest: the ``rows`` mesh rows' distances from the ``middle`` one in
    ascending order, paired with the row blocks' multicasts along a row in descending order
    (the pairing that minimises the largest sum). There are as many row blocks of ``rt``
    elements of ``k`` as mesh rows (``grid_extent`` leaves no row empty)."""
    down = np.sort(np.abs(np.arange(rows) - middle))
    along = np.sort(_spans(k, rt, ct, cols))[::-1]
    return int((down + along).max())


def _spans(k: int, rt: int, ct: int, cols: int) -> np.ndarray:
    """For each of the ``ceil(k / rt)`` row blocks of ``rt`` elements, the hops of its
    multicast along a row of ``cols`` PEs: from the farthest of the PE columns whose blocks
    of ``ct`` elements hold a part of it, to the farther end of the row (a column past the
    row's end reaches it from there)."""
    first = np.arange(0, k, rt)
    ends = np.stack([first, np.minimum(first + rt, k) - 1]) // ct
    reach: np.ndarray = np.maximum(ends, cols - 1 - ends).max(axis=0)
    return reach


def gemv_applies(out: Layout, b: Operand) -> bool:
    """Whether MeshGEMV is a rival: a result of one matrix row, and one resident matrix (which
    the kernel lays out its own way as the program loads)."""
    return out.rows == 1 and b.source == RESIDENT and prod(b.shape[:-2]) == 1
