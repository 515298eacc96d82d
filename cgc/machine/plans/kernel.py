"""What every kernel plans with: operands, costs, plans, requests, and the helpers they share.

A kernel (``Kernel``) answers a ``PlanRequest`` (its operands and results on a rectangle of a
target) with a ``Plan``: the layout each operand must have, the layouts of the results, and
the ``Cost``. The families of kernels stand on this module (``plans.elementwise``,
``plans.matmul``, ``plans.movement``); ``plans`` gathers them and answers the cached queries.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from math import prod
from typing import Any

from cgc.machine.hardware.target import Target
from cgc.machine.movement.flows import movement_traffic, regrid_traffic
from cgc.machine.movement.layout import Layout, Rect
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic, edge_traffic
from cgc.machine.sparse.tiles import SparseView

WAFER, RESIDENT, STREAM = "wafer", "resident", "stream"
"""Where an operand is when a kernel starts: on the wafer in some layout; a weight resident
on the wafer that the kernel may lay out as it likes when the program loads; a weight
arriving from MemoryX through the wafer's edge."""

Spec = tuple[tuple[int, ...], str]
"""A tensor's shape and numpy dtype name."""
Attrs = Mapping[str, Any]
"""An instruction's attributes: plain JSON values."""


@dataclass(frozen=True)
class Operand:
    """What a kernel knows of an operand when it plans."""

    shape: tuple[int, ...]
    dtype: str
    source: str = WAFER
    layout: Layout | None = None
    sparse: SparseView | None = None
    """A streamed view of a sparse weight: MemoryX sends its live values only."""


@dataclass(frozen=True)
class Cost:
    """The work of one kernel on its rectangle."""

    cycles: float = 0.0
    """Critical path, in cycles."""
    flops: float = 0.0
    """Useful floating-point operations (padding excluded)."""
    fmacs: float = 0.0
    """FMACs issued, summed over all PEs (padding included): the busy time of the FMAC units."""
    traffic: Traffic = NO_TRAFFIC
    """All data movement of the kernel, as one transfer."""
    scratch_bytes: int = 0
    """Transient SRAM per PE beyond operands and results (receive buffers, moved copies)."""
    compute_cycles: float = 0.0
    """The part of ``cycles`` spent on arithmetic."""
    arrival_cycles: float = 0.0
    """The part of ``cycles`` spent bringing operands where the kernel needs them."""

    @property
    def movement_cycles(self) -> float:
        """The rest of ``cycles``: data movement the arithmetic does not hide."""
        return self.cycles - self.compute_cycles - self.arrival_cycles


@dataclass(frozen=True)
class Plan:
    """A kernel's decisions for one instruction."""

    inputs: tuple[Layout | None, ...]
    """The layout each operand must have when the kernel runs; ``None`` for a stream it
    consumes as it arrives."""
    outputs: tuple[Layout, ...]
    cost: Cost
    detail: dict[str, Any] = field(default_factory=dict[str, Any], hash=False, compare=False)
    """What the kernel chose, for the arithmetic and for inspection (algorithm, steps)."""
    resident_tiles: tuple[tuple[int, int] | None, ...] = ()
    """Per operand, where the kernel lays a resident weight out its own way rather than in
    its layout's blocks: the ``(rows, cols)`` of every matrix that each PE of the layout's
    grid holds (the layout then only names those PEs). ``None``, or no entry: the layout's
    own tile. What the weight's pin charges to the PEs' SRAM (``cost.Sram``)."""

    def resident_tile(self, index: int) -> tuple[int, int] | None:
        """The tile of operand ``index`` the kernel lays out its own way, if it does."""
        return self.resident_tiles[index] if index < len(self.resident_tiles) else None

    def input_bytes(self, index: int) -> int:
        """The bytes operand ``index`` takes on each PE of its layout's grid."""
        layout = self.inputs[index]
        assert layout is not None, "a stream takes no SRAM of its own"
        return held_bytes(layout, self.resident_tile(index))


def held_bytes(layout: Layout, tile: tuple[int, int] | None) -> int:
    """The bytes a PE of ``layout``'s grid holds of its tensor when it keeps ``tile`` of every
    matrix (``None``: the layout's own tile)."""
    if tile is None:
        return layout.tile_bytes
    return prod(layout.batch) * tile[0] * tile[1] * layout.itemsize


def vector_cycles(elements: float, per_element: float, dtype: str, target: Target) -> float:
    """Cycles for a PE to apply a vector op to ``elements`` values."""
    return elements * per_element / target.fmacs(dtype)


def arrival(operand: Operand, target: Layout) -> Traffic:
    """The traffic that brings ``operand`` to ``target`` before a kernel runs."""
    if operand.source == RESIDENT:
        return NO_TRAFFIC
    if operand.source == STREAM:
        return edge_traffic(target, inbound=True)
    assert operand.layout is not None
    if operand.layout == target:
        return NO_TRAFFIC
    if operand.layout.shape == target.shape:
        return regrid_traffic(operand.layout, target)
    raise ValueError(f"operand {operand.layout} cannot arrive as {target}")


def binding(terms: Mapping[str, float]) -> str:
    """Which of a kernel's terms (its cycles by cause) takes the most: what binds it, as a
    mesh kernel reports it in ``Plan.detail["binds"]`` (the first among equals)."""
    return max(terms, key=lambda name: terms[name])


def multicast(tile: Layout, out: Layout) -> Traffic:
    """Copies ``tile``'s blocks along the mesh rows and/or columns it spans fewer of than
    ``out``: one wavelet stream per link (the routers replicate it both ways from the tile's
    row or column), as deep as the farthest row or column of the grid from it."""
    down = out.h - 1 if tile.h == 1 and out.h > 1 else 0
    across = out.w - 1 if tile.w == 1 and out.w > 1 else 0
    if not down and not across:
        return NO_TRAFFIC
    words = tile.tile_elements * tile.words_per_element
    links = across * tile.h + down * out.w
    depth = (farthest(tile.col0, out.col0, out.w) if across else 0) + (
        farthest(tile.row0, out.row0, out.h) if down else 0
    )
    return Traffic(words * links, words, words, words, depth)


def farthest(at: int, start: int, count: int) -> int:
    """The hops from line ``at`` to the farthest of the ``count`` lines from ``start``."""
    return max(at - start, start + count - 1 - at)


def row_chain(steps: int, words: float, hops: int, rows: int) -> Traffic:
    """``steps`` partial sums of ``words`` on every PE of ``rows`` mesh rows, each summed
    along its row in a chain of ``hops`` links."""
    return Traffic(
        steps * words * hops * rows,
        steps * words * (hops > 0),
        steps * words,
        steps * words * hops,
        hops,
    )


def row_multicast(steps: int, words: float, grid: Layout) -> Traffic:
    """``steps`` blocks of ``words``, each multicast from one PE column along the rows of
    ``grid``."""
    return Traffic(
        steps * words * grid.h * (grid.w - 1),
        steps * words * (grid.w > 1),
        steps * words,
        steps * words,
        grid.w - 1,
    )


def block_words(a_at: Layout, b_at: Layout, mt: int, kb: int, nt: int) -> tuple[float, float]:
    """The wavelets of one step's blocks: A's ``mt x kb`` and B's ``kb x nt`` per matrix."""
    a_words = prod(a_at.batch) * mt * kb * a_at.words_per_element
    b_words = prod(b_at.batch) * kb * nt * b_at.words_per_element
    return a_words, b_words


def sequential_cycles(*parts: float | Traffic) -> float:
    """Adds up phases that run one after another."""
    return sum(p.cycles if isinstance(p, Traffic) else p for p in parts)


def phased_cost(
    compute: float, arrive: Traffic, traffic: Traffic, scratch_bytes: int, flops: float = 0.0
) -> Cost:
    """The cost of a kernel whose phases run one after another: its data movement
    (``traffic``, the operands' ``arrive`` included), then ``compute`` cycles of arithmetic."""
    return Cost(
        cycles=sequential_cycles(traffic, compute),
        flops=flops,
        traffic=traffic,
        scratch_bytes=scratch_bytes,
        compute_cycles=compute,
        arrival_cycles=arrive.cycles,
    )


def same_tiles(src: Layout, dst: Layout) -> bool:
    """Whether two layouts of the same elements (row-major) put every element on the same PE:
    the same grid over the same matrix view."""
    same_grid = (src.row0, src.col0, src.h, src.w) == (dst.row0, dst.col0, dst.h, dst.w)
    return same_grid and (src.rows, src.cols) == (dst.rows, dst.cols)


def reshape_traffic(src: Layout, dst: Layout) -> Traffic:
    """Moving the elements of ``src`` (row-major) into ``dst``, a layout of the same size."""
    if same_tiles(src, dst):
        return NO_TRAFFIC
    if src.shape == dst.shape:
        return regrid_traffic(src, dst)
    return movement_traffic("reshape", {}, [src], dst)


@dataclass(frozen=True)
class PlanRequest:
    """What a kernel plans for: its operands and results on a rectangle of a target."""

    target: Target
    rect: Rect
    operands: tuple[Operand, ...]
    attrs: Attrs
    results: tuple[Spec, ...]


class Kernel(abc.ABC):
    """A primitive's mesh algorithm."""

    def __init__(self, name: str):
        self.name = name

    @abc.abstractmethod
    def plan(self, q: PlanRequest) -> Plan:
        """Decides layouts and counts the cost (shapes and layouts only)."""
