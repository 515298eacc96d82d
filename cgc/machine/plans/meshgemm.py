"""MeshGEMM: Cannon's algorithm on the mesh with an interleaved ring (WaferLLM, OSDI'25).

The result lies on a square ``s x s`` grid of the rectangle, as do A and B (the contraction
cut in ``s`` blocks). Cannon's algorithm first skews the operands so that PE ``(r, c)`` holds
A's and B's contraction block ``(pos(r) + pos(c)) mod s``; then ``s`` steps each multiply the
blocks a PE holds into its result block, while every block of A moves one position along its
mesh row's ring and every block of B one along its column's ring, so that each PE gets the
next contraction block.

Cannon's ring on a line of PEs has a wrap-around link as long as the line, whose latency every
step pays. MeshGEMM interleaves the ring instead: the even positions of the line forwards,
then the odd ones backwards (``0, 2, 4, ..., 5, 3, 1``), so that ring neighbours are at most
two hops apart and each link carries one block per direction per step. Each PE holds two
blocks of each operand: it multiplies the current ones while the next ones arrive, so a step
takes the longer of its arithmetic and its shift, plus the shift's two hops of flight.
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil, prod

import numpy as np

from cgc.machine.hardware.target import WAVELET_BYTES
from cgc.machine.movement.layout import Layout, grid_extent, matrix_dims
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic, route
from cgc.machine.plans.kernel import (
    RESIDENT,
    WAFER,
    Cost,
    Operand,
    Plan,
    PlanRequest,
    arrival,
    binding,
    block_words,
    sequential_cycles,
)


def plan_meshgemm(
    q: PlanRequest,
    a: Operand,
    b: Operand,
    fold: bool,
    flops: float,
    arrive: bool = True,
    interleaved: bool = True,
) -> Plan:
    """MeshGEMM of ``a @ b`` on the largest square grid of ``q.rect`` that leaves no PE of
    the result, of A or of B empty; A and the result ``fold`` or not, as the matmul chose.
    A and B arrive in plain block layouts on that grid and the kernel skews them itself,
    except where the skew is free: a resident operand is laid out skewed when the program
    loads, and a B streaming in down its columns lands on its skewed rows as cheaply as on
    its plain ones (A's skew moves blocks between columns, which a stream cannot). Without
    ``arrive``, the plan leaves out the operands' arrival, the dearest part to count: a
    bound from below on its cycles, with the same SRAM. Without ``interleaved``, the plan is
    Cannon's own, on the plain ring whose wrap-around link every step waits for: the planner
    never picks it (the interleaved ring moves the same blocks over shorter paths), but it is
    the baseline WaferLLM measures MeshGEMM against."""
    ((shape, dtype),) = q.results
    _, m, n = matrix_dims(shape, fold)
    k = a.shape[-1]
    x, y, width, height = q.rect
    side = mesh_side(m, n, k, min(width, height))
    out = Layout(tuple(shape), dtype, y, x, side, side, fold)
    a_at = Layout(a.shape, a.dtype, y, x, side, side, fold)
    b_at = Layout(b.shape, b.dtype, y, x, side, side)
    mt, kb, nt = out.rt, a_at.ct, out.ct
    step_fmacs = prod(out.batch) * mt * kb * nt
    compute = step_fmacs / q.target.fmacs(dtype)
    a_words, b_words = block_words(a_at, b_at, mt, kb, nt)
    skew = skew_traffic(
        side, a_words * (a.source != RESIDENT), b_words * (b.source == WAFER), interleaved
    )
    shift = shift_traffic(side, a_words, b_words, interleaved)
    busiest = max(shift.max_link, shift.max_inject, shift.max_eject)
    step = max(compute, busiest) + shift.max_hops
    moved = (arrival(a, a_at), arrival(b, b_at)) if arrive else (NO_TRAFFIC, NO_TRAFFIC)
    arrive_cycles = sequential_cycles(*moved)
    shifts = side - 1  # the last step's blocks go nowhere
    cost = Cost(
        cycles=arrive_cycles + skew.cycles + shifts * step + compute,
        flops=flops,
        fmacs=side * step_fmacs * out.pes,
        traffic=moved[0] + moved[1] + skew + _repeated(shift, shifts),
        # the blocks being multiplied and the next ones arriving, of each operand
        scratch_bytes=2 * ceil((a_words + b_words) * WAVELET_BYTES),
        compute_cycles=side * compute,
        arrival_cycles=arrive_cycles,
    )
    terms = {
        "arrival": arrive_cycles,
        "the skew": skew.cycles,
        "arithmetic": side * compute,
        "the shifts through the ramps and links": shifts * busiest,
        "the shifts' flight": shifts * shift.max_hops,
    }
    algorithm = "meshgemm" if interleaved else "cannon"
    return Plan(
        (a_at, b_at), (out,), cost, {"algorithm": algorithm, "steps": side, "binds": binding(terms)}
    )


def mesh_side(m: int, n: int, k: int, available: int) -> int:
    """The side of the largest square grid, at most ``available``, over which the result's
    ``m`` rows, its ``n`` columns and the ``k`` of the contraction all split with no PE left
    empty (the contraction's blocks must match the grid both ways)."""
    side = available
    while (fit := min(grid_extent(m, side), grid_extent(n, side), grid_extent(k, side))) < side:
        side = fit
    return side


def ring_line(position: np.ndarray, side: int) -> np.ndarray:
    """The place on a line of ``side`` PEs of each ``position`` of the interleaved ring: the
    even places forwards, then the odd ones backwards."""
    forward = (side + 1) // 2
    return np.where(position < forward, 2 * position, 2 * (side - 1 - position) + 1)


def ring_position(place: np.ndarray, side: int) -> np.ndarray:
    """The ring position of each ``place`` on the line (the inverse of ``ring_line``)."""
    return np.where(place % 2 == 0, place // 2, side - 1 - place // 2)


def shift_traffic(side: int, a_words: float, b_words: float, interleaved: bool = True) -> Traffic:
    """One step's shift on a ``side x side`` grid: every PE sends its block of A (``a_words``)
    to its row's previous ring position and its block of B to its column's. Either ring covers
    ``2 (side - 1)`` hops of a line and every link carries one block in each direction; the
    interleaved ring's longest path is two hops, the plain ring's wrap-around the line."""
    if side == 1:
        return NO_TRAFFIC
    return Traffic(
        wavelet_hops=2 * (side - 1) * side * (a_words + b_words),
        max_link=max(a_words, b_words),
        max_inject=a_words + b_words,
        max_eject=a_words + b_words,
        max_hops=min(2, side - 1) if interleaved else side - 1,
    )


def skew_traffic(side: int, a_words: float, b_words: float, interleaved: bool = True) -> Traffic:
    """Cannon's skew on a ``side x side`` grid, from the plain block layouts: along row ``r``
    A's block ``j`` goes to ring position ``j - pos(r)``; down column ``c`` B's block ``i``
    to ring position ``i - pos(c)``. An operand of no words stays put. B's skew is A's
    transposed, on the column links where A's is on the row links, so one routing of A's
    blocks per grid side counts both."""
    rows, both = _row_skew(side, interleaved)
    if not rows.max_hops or not (a_words or b_words):
        return NO_TRAFFIC
    # a PE that keeps its block neither sends nor receives one: its ramps carry both
    # operands' blocks only where both move
    ramp = a_words + b_words if both else max(a_words, b_words)
    return Traffic(
        wavelet_hops=(a_words + b_words) * rows.wavelet_hops,
        max_link=max(a_words, b_words) * rows.max_link,
        max_inject=ramp,
        max_eject=ramp,
        max_hops=rows.max_hops,
    )


@lru_cache(maxsize=256)
def _row_skew(side: int, interleaved: bool) -> tuple[Traffic, bool]:
    """A's skew in blocks (routed PE by PE, ``side**2`` flows), and whether some PE moves both
    its block of A and its block of B; on the interleaved ring or the plain one."""
    lines = np.arange(side)
    row, block = np.repeat(lines, side), np.tile(lines, side)
    if interleaved:
        dest = ring_line((block - ring_position(row, side)) % side, side)
    else:
        dest = (block - row) % side
    moves = (dest != block).reshape(side, side)
    return route(row, block, row, dest, np.ones(side * side), 1.0), bool((moves & moves.T).any())


def _repeated(step: Traffic, times: int) -> Traffic:
    """``times`` transfers like ``step``, each overlapped with a step's arithmetic: their
    loads add up, their time of flight counts once."""
    return Traffic(
        times * step.wavelet_hops,
        times * step.max_link,
        times * step.max_inject,
        times * step.max_eject,
        step.max_hops if times else 0,
    )
