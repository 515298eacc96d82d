"""The layers as the placement sees them: their works, heights and timings on rectangles.

``LayerTimings`` times a layer on a candidate rectangle once (its stage time and its SRAM per
PE, ``cgc.machine.timing.cost``), keeps every layer's current height and the heights a strip
may give it, and checks whether rectangles pack onto the mesh with the links between them
keeping up. The searches (``balance``, ``strips``, ``placer``) stand on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from math import ceil, inf

import numpy as np

from cgc.dialects.lowering import LayerWork, layer_graph, tensor_edges
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import Target
from cgc.machine.movement.layout import Rect, grid_extent, matrix_dims
from cgc.machine.movement.traffic import busiest_links, lane_ends
from cgc.machine.program.bytecode import Opcode, Program
from cgc.machine.sparse.tiles import live_only
from cgc.machine.timing.cost import LayerCost, LayerCosts
from cgc.passes.place_layers.packing import pack_skyline, pack_strips

STAGE_TIME_TOLERANCE = 0.01
"""The bisections on the stage time stop within this fraction of the best time."""
RESIDENT = (Opcode.WEIGHT, Opcode.CONSTANT, Opcode.CACHE)
"""The instructions of what a layer keeps on its rectangle."""
HEIGHT_SPLITS = 32
"""A layer's rows may be split up to this many ways in a strip..."""
HEIGHT_MULTIPLES = 8
"""... or multiplied up to this many times."""
BOUND_SLACK = 1 - 1e-9
"""The lower bounds give way by this factor, so that no rounding rules out a rectangle that
meets a stage time exactly (the time of the slowest layer on the whole width is one)."""


def useful_rows(work: Program) -> int:
    """The most matrix rows any tensor that a layer's work computes or reads has: more mesh
    rows than that hold nothing (weights aside; a strip may still give a layer more rows, for
    a kernel that uses them)."""
    return max([1, *(rows for rows, _ in _matrices(work))])  # an empty tensor takes a row


def tile_widths(work: Program, low: int, high: int) -> set[int]:
    """The widths from ``low`` to ``high`` at which a tensor that a layer's work computes or
    reads changes its columns per PE: ``ceil(C / k)`` for its ``C`` columns, the fewest
    columns on which it takes ``k`` per PE (one more column gives no tile fewer)."""
    widths = np.arange(max(low, 1), high + 1)
    found: set[int] = set()
    for _, columns in _matrices(work):
        per_pe = -(-columns // widths)
        fewer = per_pe < -(-columns // np.maximum(widths - 1, 1))
        found.update(widths[fewer | (widths == 1)].tolist())
    return found


def spanned_width(columns: set[int], width: int) -> int:
    """The fewest PE columns across which tensors of ``columns`` matrix columns split as they
    do across ``width``: the most any of them spans (``grid_extent``), at least one."""
    return max([1, *(grid_extent(c, width) for c in columns)])


def _matrices(work: Program, resident: bool = False) -> set[tuple[int, int]]:
    """The matrix rows and columns of every tensor that ``work`` computes or reads, weights
    and constants aside unless ``resident``."""
    found: set[tuple[int, int]] = set()
    kept: set[int] = set()
    for ins in work.instructions:
        if ins.opcode in (Opcode.WEIGHT, Opcode.CONSTANT) and not resident:
            kept.update(ins.results)
        if ins.opcode == Opcode.FREE:
            continue
        for register in (*ins.operands, *ins.results):
            if register not in kept:
                _, rows, columns = matrix_dims(work.registers[register][0])
                found.add((rows, columns))
    return found


def with_sparse_weights(work: Program, live: Mapping[str, int]) -> Program:
    """``work`` with the sparse weights it reads, of ``live`` live values each."""
    shapes = {
        ins.attrs["name"]: work.registers[ins.results[0]][0]
        for ins in work.instructions
        if ins.opcode == Opcode.WEIGHT and ins.attrs["name"] in live
    }
    if not shapes:
        return work
    return replace(work, sparse=live_only({n: live[n] for n in shapes}, shapes))


class LayerTimings:
    """A module's layers, from their works (one-layer programs, ``cgc.dialects.lowering``):
    every layer's height and the heights it may take, its cost on a rectangle (timed once per
    width at its height), and the checks that rectangles pack and their links keep up."""

    def __init__(
        self, works: Sequence[LayerWork], target: Target, live: Mapping[str, int] | None = None
    ):
        self.works = [with_sparse_weights(work.program, live or {}) for work in works]
        self.columns = [{c for _, c in _matrices(work, resident=True)} for work in self.works]
        """Per layer, the matrix columns of its tensors, weights and constants included."""
        self.target = target
        self.count = len(works)
        self.costs = LayerCosts(target)
        self.tensors = tensor_edges(layer_graph(works))
        """``(producer, consumer, wavelets)`` of every tensor between layers, as routed."""
        pairs: Counter[tuple[int, int]] = Counter()
        for a, b, w in self.tensors:
            pairs[a, b] += w
        self.edges = [(a, b, w) for (a, b), w in pairs.items()]
        """The same, summed between two layers: their tensors cross on the same lanes."""
        self.widths_timed: list[dict[int, float]] = [{} for _ in range(self.count)]
        """Per layer, the widths timed so far (at its height) and their cycles."""
        self.heights = [self._initial_height(i) for i in range(self.count)]
        self.initial_heights = list(self.heights)
        """Every layer's rows before the search: the tallest height its rows split from."""
        self.height_choices = [self._height_choices(i) for i in range(self.count)]
        """Per layer, the heights a strip may give it, lowest first."""
        whole = [self.cost(i, self.rect(i, self.target.cols)) for i in range(self.count)]
        self.flops = [cost.flops for cost in whole]
        """Every layer's FLOPs (the same on any rectangle)..."""
        self.host_cycles = [self.io_cycles(cost) for cost in whole]
        """... and the cycles of its host I/O (the same bytes on any rectangle)."""
        self.peaks = [self._peak_flops_per_pe(work) for work in self.works]
        """Every layer's FLOPs a PE does per cycle at most."""

    def cost(self, index: int, rect: Rect) -> LayerCost:
        """Layer ``index`` alone on ``rect``: its SRAM and its stage time. Timed on the
        fewest columns across which its every tensor splits as on ``rect``'s
        (``spanned_width``): a kernel sees the width only through its tensors' splits, so the
        columns past them change nothing, and the many widths between two of a layer's tile
        widths cost one timing."""
        x, y, width, height = rect
        spanned = spanned_width(self.columns[index], width)
        return self.costs(self.works[index], 0, (x, y, spanned, height))

    def stage_cycles(self, cost: LayerCost) -> float:
        """A layer's stage time: its kernels, or its inputs from and outputs to the host if
        they take longer (the host sends the next sample while the layer computes this one:
        ``cgc.machine.timing.pipeline``)."""
        return max(cost.cycles, self.io_cycles(cost))

    def io_cycles(self, cost: LayerCost) -> float:
        """The cycles of a layer's inputs from and outputs to the host."""
        return cost.host_bytes / self.target.io_bytes_per_s * self.target.clock_hz

    def fits(self, cost: LayerCost) -> bool:
        """Whether every PE of the layer's rectangle holds its share."""
        return cost.sram_bytes_per_pe <= self.target.sram_bytes_per_pe

    def rect(self, index: int, width: int) -> Rect:
        """A rectangle of ``width`` columns and layer ``index``'s height, at the origin."""
        return (0, 0, width, self.heights[index])

    def cycles(self, index: int, width: int) -> float:
        """Layer ``index``'s stage time on ``width`` columns of its height."""
        timed = self.widths_timed[index]
        if width not in timed:
            timed[width] = self.stage_cycles(self.cost(index, self.rect(index, width)))
        return timed[width]

    def layer_name(self, index: int) -> str:
        return self.works[index].layers[0].name

    def fewest_pes(self, index: int, limit: float) -> float:
        """The fewest PEs on which layer ``index`` may take at most ``limit``: its FLOPs at
        every PE's peak within the limit; infinite if its host I/O alone (the same bytes on
        any rectangle) takes longer."""
        if self.host_cycles[index] > limit:
            return inf
        if not self.flops[index]:
            return 0.0
        return self.flops[index] / (self.peaks[index] * limit) * BOUND_SLACK

    def _peak_flops_per_pe(self, work: Program) -> int:
        """The most FLOPs a PE does per cycle on ``work``'s types: the 16-bit rate if it has
        16-bit floats, else the 32-bit one."""
        half = any(dtypes.is_float(dtypes.dtype(d)) and dtypes.dtype(d).itemsize <= 2
                   for _, d in work.registers)  # fmt: skip
        return self.target.peak_flops_per_pe_per_cycle("float16" if half else "float32")

    def _initial_height(self, index: int) -> int:
        """The layer's rows: its useful rows, doubled while its SRAM does not fit on that many
        rows of the whole mesh's width."""
        t = self.target
        height = min(useful_rows(self.works[index]), t.rows)
        while height < t.rows and not self.fits(self.cost(index, (0, 0, t.cols, height))):
            height = min(2 * height, t.rows)
        return height

    def _height_choices(self, index: int) -> list[int]:
        """The heights a strip may give layer ``index``: its rows split ``k`` ways (the heights
        that change its tiles), whole multiples of them, then doublings up to the mesh's rows
        (for kernels that use more rows than a tensor has: a matmul splitting its contraction,
        a GEMV its matrix's rows)."""
        base, rows = self.initial_heights[index], self.target.rows
        shorter = {ceil(base / k) for k in range(1, HEIGHT_SPLITS + 1)}
        taller = {base * m for m in range(2, HEIGHT_MULTIPLES + 1) if base * m <= rows}
        doubled = {min(base * HEIGHT_MULTIPLES << d, rows) for d in range(rows.bit_length())}
        return sorted(shorter | taller | {h for h in doubled if h > base})

    def set_height(self, index: int, height: int) -> int | None:
        """Gives layer ``index`` ``height`` rows; returns its narrowest width there."""
        self.heights[index] = height
        self.widths_timed[index] = {}
        return self.narrowest_width(index)

    def set_heights(self, heights: list[int]) -> None:
        """Gives the layers ``heights`` (forgetting the timings of those whose rows change)."""
        for index, height in enumerate(heights):
            if self.heights[index] != height:
                self.heights[index] = height
                self.widths_timed[index] = {}

    def narrowest_width(self, index: int) -> int | None:
        """The fewest columns (of the layer's height) on which it fits, if any.

        The search gallops up from the columns its weights and largest tensor alone need,
        then bisects: most layers fit close to that bound, and narrow candidates are the
        cheap ones to time.
        """
        cols, height = self.target.cols, self.heights[index]
        if not self.fits(self.cost(index, self.rect(index, cols))):
            return None
        least = ceil(self._least_sram_bytes(index) / (height * self.target.sram_bytes_per_pe))
        lo = probe = min(max(least, 1), cols)
        while probe < cols and not self.fits(self.cost(index, self.rect(index, probe))):
            lo, probe = probe + 1, min(cols, 2 * probe)
        hi = probe
        while lo < hi:
            mid = (lo + hi) // 2
            if self.fits(self.cost(index, self.rect(index, mid))):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _least_sram_bytes(self, index: int) -> int:
        """A lower bound of the SRAM layer ``index`` needs on any rectangle: what it keeps
        resident and its largest tensor (without padding)."""
        work = self.works[index]
        largest = max(
            (work.tensor_bytes(r) for ins in work.instructions
             if ins.opcode not in RESIDENT for r in ins.results),
            default=0,
        )  # fmt: skip
        return self.resident_bytes(index) + largest

    def resident_bytes(self, index: int) -> int:
        """The bytes layer ``index`` keeps on its rectangle from one run to the next: its
        weights (a sparse one's live values), constants and key-value caches."""
        work = self.works[index]
        held = 0
        for ins in work.instructions:
            if ins.opcode not in RESIDENT:
                continue
            size = work.tensor_bytes(ins.results[0])
            sparse = work.sparse.get(ins.attrs.get("name", ""))
            if ins.opcode == Opcode.WEIGHT and sparse is not None:
                size = min(size, sparse.live * size // sparse.size)
            held += size
        return held

    def packed(self, widths: Sequence[int], limit: float = float("inf")) -> list[Rect] | None:
        """The layers' rectangles of ``widths`` and their heights on the mesh: strips aligned
        where they fit so; else strips from the mesh's edge; else the skyline; in each case
        only if no tensor between layers needs more than ``limit`` cycles on its lanes."""
        sizes = [(w, self.heights[i]) for i, w in enumerate(widths)]
        rows, cols = self.target.rows, self.target.cols
        for packing in (
            lambda: pack_strips(sizes, rows, cols),
            lambda: pack_strips(sizes, rows, cols, aligned=False),
            lambda: pack_skyline(sizes, rows, cols),
        ):
            rects = packing()
            if rects is not None and self.links_keep_up(rects, limit):
                return rects
        return None

    def links_keep_up(self, rects: list[Rect], limit: float) -> bool:
        """Whether no layer's busiest input link, the routes sharing it added up as routed,
        takes over ``limit`` cycles; the tensors between two layers alone on their lanes bound
        it from below, and rule most rectangles out first."""
        alone = (w / len(lane_ends(rects[a], rects[b])[0]) for a, b, w in self.edges)
        if any(load > limit for load in alone):
            return False
        return bool(busiest_links(rects, self.tensors).max(initial=0) <= limit)

    def slowest_layer_cycles(self, rects: list[Rect]) -> float:
        """The stage time of the slowest layer on ``rects``."""
        return max(self.stage_cycles(self.cost(i, (0, 0, *r[2:]))) for i, r in enumerate(rects))

    def placement_cycles(self, rects: list[Rect]) -> float:
        """The stage time of the layers on ``rects``: their slowest layer's, or their busiest
        link's."""
        return max([self.slowest_layer_cycles(rects), *busiest_links(rects, self.tensors)])
