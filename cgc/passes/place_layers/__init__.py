"""Places every layer on its own rectangle of PEs: the pipelined execution mode.

All weights stay on the wafer and every layer runs at once on its own rectangle, so the
slowest layer (stage) sets the pipeline's throughput. A layer's tensors spread their matrix
rows over the rectangle's rows, so the balanced widths keep a rectangle no taller than the
most rows any of its tensors has (unless it needs more PEs to hold its weights): a layer of
56-row activations gets 56 rows, not the mesh's 994; the strips below may give it fewer, or
more for a kernel that uses them. The rectangles, in pipeline order, stack into vertical
strips of the mesh (``packing``), top to bottom in one strip and bottom to top in
the next, each strip starting level with the end of the one before, so that a layer's producer
sits against it. Where strips do not fit (a few wide, short layers make their strips wide and
empty), each rectangle goes to the highest free place nearest the one before (a skyline packing).

The widths balance the stages: the placement bisects on the stage time, giving every layer
the fewest columns on which it takes no longer (and on which its SRAM holds its share) and
keeping the smallest time whose rectangles still pack onto the mesh, no layer's busiest input
link (the routes sharing it added up, as routed) slower than it. Then it chooses the heights:
it bisects again below that time over strips of one width, as many as fit the mesh, in which
every layer takes the fewest rows of its ladder that keep it within the time (its rows split
``k`` ways, or multiplied for a matmul that splits its contraction over groups of rows), the
two ends of a tensor whose lanes fall behind that time rising a rung at a time (more rows are
more lanes to the next strip), and takes those strips if they beat the balanced widths;
strips that keep the time of the slowest layer on the whole width beat any, so when some do
the balance does not run and the strips' search starts from that time. Last, strips of
different widths: one width wastes the columns a layer's tiles leave (a 512-column matmul
takes 3 columns a PE on 171 to 255 of them), so a bisection below the time found so far gives
every run of consecutive layers its own strip width, the runs and widths that take the fewest
columns (dynamic programming), among widths near the strips' and those at which the slowest
layer's tiles change. The columns left over then widen the strips, and a layer on its
ladder's lowest rung that keeps the time on fewer rows gives them up.

Timing a layer on a rectangle is the placement's cost, so it skips the timings that cannot
change its answer: no layer computes faster than its PEs at peak, after its host I/O, which
bounds from below the columns or rows that can keep a time; a rung on which a layer missed a
time on more columns is not timed on fewer; and the layer that last missed a time on every
rung of a width is timed first on the next.

A stage's time is its kernels and its host I/O, each the machine's answer for the layer's
work on the candidate rectangle (``cgc.machine.timing.cost``), the engine the simulator runs, so the
compiler's estimate is the time a run takes. A model that does not fit raises
``DoesNotFitError`` naming the layers that do not.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from math import ceil, inf, sqrt

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import IntAttr, ModuleOp
from xdsl.passes import ModulePass

from cgc.dialects import wse
from cgc.dialects.ir import main_function, module_sparse_weights, module_target
from cgc.dialects.lowering import LayerWork, layer_graph, layer_works, tensor_edges
from cgc.errors import DoesNotFitError
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import Target
from cgc.machine.hardware.units import human_bytes
from cgc.machine.movement.layout import Rect, matrix_dims
from cgc.machine.movement.traffic import busiest_links, lane_ends
from cgc.machine.program.bytecode import Opcode, Program
from cgc.machine.sparse.tiles import live_only
from cgc.machine.timing.cost import LayerCost, LayerCosts
from cgc.passes.place_layers.packing import pack, pack_runs, pack_skyline

BALANCE_TOLERANCE = 0.01
"""The bisection on the stage time stops within this fraction of the best time."""
LADDER_SPLITS = 32
"""A layer's rows may be split up to this many ways in a strip..."""
SETTLE_SPLITS = 64
"""... and, once the stage time is found, up to this many ways (``Placer._settled``)."""
LADDER_MULTIPLES = 8
"""... or multiplied up to this many times."""
ROUNDING = 1 - 1e-9
"""The lower bounds give way by this factor, so that no rounding rules out a rectangle that
meets a stage time exactly (the time of the slowest layer on the whole width is one)."""
STRIP_SPEEDUP = 4.0
"""The strips' search looks for stage times down to this fraction of the balanced one..."""
STRIP_WIDTHS_TRIED = 12
"""... on this many strip widths per stage time, the nearest the last that worked: a time no
width near it meets costs a timing of every layer on each (the placement's own time)."""
LANE_RAISES = 16
"""The layers at the ends of tensors whose lanes fall behind the stage time rise a rung of
their ladders at most this many times before strips of a width give up: a stage time low
enough to need a finer ladder leaves short layers few lanes to their neighbours."""
MIXED_RANGE = 1.5
"""Strips of different widths take widths within this factor of the last strips of one width
that worked."""

Strips = tuple[list[Rect], list[int]]
"""The rectangles of the layers, and their heights (steps of their ladders)."""


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


def _matrices(work: Program) -> set[tuple[int, int]]:
    """The matrix rows and columns of every tensor that ``work`` computes or reads, weights
    and constants aside."""
    found: set[tuple[int, int]] = set()
    resident: set[int] = set()
    for ins in work.instructions:
        if ins.opcode in (Opcode.WEIGHT, Opcode.CONSTANT):
            resident.update(ins.results)
        if ins.opcode == Opcode.FREE:
            continue
        for register in (*ins.operands, *ins.results):
            if register not in resident:
                _, rows, columns = matrix_dims(work.registers[register][0])
                found.add((rows, columns))
    return found


def _sparse(work: Program, live: Mapping[str, int]) -> Program:
    """``work`` with the sparse weights it reads, of ``live`` live values each."""
    shapes = {
        ins.attrs["name"]: work.registers[ins.results[0]][0]
        for ins in work.instructions
        if ins.opcode == Opcode.WEIGHT and ins.attrs["name"] in live
    }
    if not shapes:
        return work
    return replace(work, sparse=live_only({n: live[n] for n in shapes}, shapes))


class Placer:
    """Chooses the rectangles of a module's layers, from their works (one-layer programs,
    ``cgc.dialects.lowering``)."""

    def __init__(
        self, works: Sequence[LayerWork], target: Target, live: Mapping[str, int] | None = None
    ):
        self.works = [_sparse(work.program, live or {}) for work in works]
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

    def cost(self, index: int, rect: Rect) -> LayerCost:
        """Layer ``index`` alone on ``rect``: its SRAM and its stage time."""
        return self.costs(self.works[index], 0, rect)

    def stage_cycles(self, cost: LayerCost) -> float:
        """A layer's stage time: its kernels, and its inputs from and outputs to the host."""
        return cost.cycles + self._host_cycles(cost)

    def _host_cycles(self, cost: LayerCost) -> float:
        return cost.host_bytes / self.target.io_bytes_per_s * self.target.clock_hz

    def fits(self, cost: LayerCost) -> bool:
        """Whether every PE of the layer's rectangle holds its share."""
        return cost.sram_bytes_per_pe <= self.target.sram_bytes_per_pe

    def place(self) -> list[Rect]:
        """The rectangle of every layer, in layer order."""
        if not self.count:
            return []
        self.heights = [self._height(i) for i in range(self.count)]
        self.bases = list(self.heights)
        """Every layer's rows before the search: the tallest rung its rows split from."""
        self.ladders = [self._ladder(i) for i in range(self.count)]
        whole = [self.cost(i, self._rect(i, self.target.cols)) for i in range(self.count)]
        self.flops = [cost.flops for cost in whole]
        """Every layer's FLOPs (the same on any rectangle)..."""
        self.host_cycles = [self._host_cycles(cost) for cost in whole]
        """... and the cycles of its host I/O (the same bytes on any rectangle)."""
        self.peaks = [self._peak(work) for work in self.works]
        """Every layer's FLOPs a PE does per cycle at most."""
        self.lowest_known: dict[tuple[int, int], tuple[float, int]] = {}
        self.rung_times: dict[tuple[int, int], dict[int, float]] = {}
        """Per layer and rung of its ladder, its stage time (infinite where it does not fit)
        on each width it was timed on."""
        """Per layer and strip width, the last stage time asked and its ladder step."""
        cols = self.target.cols
        self.strip_widths = sorted({cols // n for n in range(1, cols + 1)})
        """The strips' widths worth trying: ``cols // n``, each for the most strips it fits."""
        self.strip_width = cols
        """The width of the last strips that kept the stage time."""
        self.killers: list[int] = []
        """The layers that missed a stage time on every rung of some width, latest first."""
        least = [self._narrowest(i) for i in range(self.count)]
        if any(w is None for w in least):
            raise self._shortfall([i for i, w in enumerate(least) if w is None])
        narrowest = self._packable([w for w in least if w is not None])
        found = self._strips_beating_balance()
        if found is None:
            widths, limit = self._balance(narrowest)
            found = self._strips(limit, self._strips_within)
            if found is None:
                rects = self._pack(widths, limit) or self._pack(widths)
                assert rects is not None
                found = (rects, list(self.heights)), limit
        (rects, heights), _ = self._mixed(found)
        self._restore(heights)
        return self._settled(self._widen(rects))

    def _strips_beating_balance(self) -> tuple[Strips, float] | None:
        """The strips and their stage time, if some keep every layer within its time on the
        whole width at its height: no balanced widths can beat that time (more columns take no
        longer, as the balance assumes), so the balance need not run, and the strips' search
        starts there."""
        fast = max(self.cycles(i, self.target.cols) for i in range(self.count))
        found = self._strips_within(fast)
        return None if found is None else self._strips(fast, self._strips_within) or (found, fast)

    def _strips(
        self, limit: float, within: Callable[[float], Strips | None]
    ) -> tuple[Strips, float] | None:
        """Strips in which every layer gets the fewest rows of its ladder (``_ladder``) that
        keep it within the stage time, ``within`` the strips for a time: the heights chosen
        with the widths. Bisection on the stage time below ``limit``; the rectangles and
        heights of the best time found and that time, if it beats ``limit``. Strips that take
        under a ``STRIP_SPEEDUP``-th of the floor (a layer far slower on its fewest rows than
        on more, as a GEMV) start the search again below what they take."""
        best = None
        slow, fast = limit, limit / STRIP_SPEEDUP
        while slow > fast * (1 + BALANCE_TOLERANCE):
            middle = sqrt(fast * slow)
            found = within(middle)
            if found is None:
                fast = middle
                continue
            slow, best = middle, found
            # the layers bound the strips' time from below, and their lanes are dearer to count
            if self._layers_cycles(found[0]) * STRIP_SPEEDUP < fast:
                taken = self._strips_cycles(found[0])
                if taken * STRIP_SPEEDUP < fast:
                    slow, fast = taken, taken / STRIP_SPEEDUP
        return None if best is None else (best, slow)

    def _layers_cycles(self, rects: list[Rect]) -> float:
        """The stage time of the slowest layer of strips ``rects``."""
        return max(self.stage_cycles(self.cost(i, (0, 0, *r[2:]))) for i, r in enumerate(rects))

    def _strips_cycles(self, rects: list[Rect]) -> float:
        """The stage time of strips ``rects``: their slowest layer's, or their busiest lane's."""
        return max([self._layers_cycles(rects), *busiest_links(rects, self.tensors)])

    def _settled(self, rects: list[Rect]) -> list[Rect]:
        """``rects`` with every layer on its ladder's lowest rung on the fewest rows, its rows
        split up to ``SETTLE_SPLITS`` ways, that fit it and keep it and the lanes within their
        stage time: it may be faster only because the ladder ends (a finer one misleads)."""
        period = self._strips_cycles(rects)
        for index in range(self.count):
            x, y, width, height = rects[index]
            if height != self.ladders[index][0]:
                continue
            finer = {ceil(self.bases[index] / k) for k in range(1, SETTLE_SPLITS + 1)}
            for rows in sorted((h for h in finer if h < height), reverse=True):
                cost = self.cost(index, (0, 0, width, rows))
                if not self.fits(cost) or self.stage_cycles(cost) > period:
                    break
                trial = [*rects[:index], (x, y, width, rows), *rects[index + 1 :]]
                if max([0.0, *busiest_links(trial, self.tensors)]) > period:
                    break
                rects = trial
        self._restore([h for _, _, _, h in rects])
        return rects

    def _strips_within(self, limit: float) -> Strips | None:
        """Strips of one width, as many as fit the mesh, of layers on the fewest rows that
        keep each within ``limit`` there; the first width that works among the
        ``STRIP_WIDTHS_TRIED`` distinct widths ``cols // n`` nearest the last that worked (a
        slightly shorter stage time needs about as wide strips); None if none does. A width
        fails when a layer misses the limit on every rung of its ladder there, or when the
        strips overflow the mesh; a narrower one may still work (fewer columns can take less
        time: shorter broadcasts)."""
        nearest = sorted(self.strip_widths, key=lambda w: (abs(w - self.strip_width), -w))
        for width in nearest[:STRIP_WIDTHS_TRIED]:
            heights = self._strip_heights(width, limit)
            found = None if heights is None else self._raised_for_lanes(heights, width, limit)
            if found is not None:
                self.strip_width = width
                return found
        return None

    def _raised_for_lanes(self, heights: list[int], width: int, limit: float) -> Strips | None:
        """The strips of layers ``heights`` high on ``width`` columns, where a tensor between
        layers takes over ``limit`` cycles on its busiest link raising both its ends to their
        next rungs within the limit (more rows are more lanes: a diagonal neighbour's lanes
        leave on its rows, a side neighbour's cross on the rows it shares), up to
        ``LANE_RAISES`` times; None if the strips overflow the mesh or the lanes still fall
        behind with no end left to raise."""
        rows, cols = self.target.rows, self.target.cols
        for _ in range(LANE_RAISES + 1):
            rects = pack([(width, h) for h in heights], rows, cols)
            if rects is None:
                return None
            loads = busiest_links(rects, self.tensors)
            slow = {end for (a, b, _), load in zip(self.tensors, loads, strict=True)
                    if load > limit
                    for end in (a, b)}  # fmt: skip
            if not slow:
                return rects, heights
            raised = {i: self._taller(i, width, heights[i], limit) for i in sorted(slow)}
            if all(h is None for h in raised.values()):
                return None
            for index, height in raised.items():
                heights[index] = height or heights[index]
        return None

    def _taller(self, index: int, width: int, height: int, limit: float) -> int | None:
        """The next rung above ``height`` of layer ``index``'s ladder on which it fits and
        keeps ``limit`` on ``width`` columns, if any."""
        ladder = self.ladders[index]
        for step in range(bisect.bisect_right(ladder, height), len(ladder)):
            cost = self.cost(index, (0, 0, width, ladder[step]))
            if self.fits(cost) and self.stage_cycles(cost) <= limit:
                return ladder[step]
        return None

    def _mixed(self, found: tuple[Strips, float]) -> tuple[Strips, float]:
        """Strips of different widths (``_mixed_within``) and their stage time, at the best time
        the bisection finds, if they beat ``found`` (strips of one width or balanced widths, and
        their time) by the tolerance; else ``found``. A search that cannot beat it by that much
        stops there: each time it misses costs a timing of its slowest layer on every width."""
        widths = self._mixed_widths(found[0][0])
        limit = found[1] / (1 + BALANCE_TOLERANCE)
        first = self._mixed_within(limit, widths)
        if first is None:
            return found
        return self._strips(limit, lambda time: self._mixed_within(time, widths)) or (first, limit)

    def _mixed_within(self, limit: float, widths: Sequence[int]) -> Strips | None:
        """Strips of ``widths``, each a run of consecutive layers on the fewest rows of their
        ladders that keep ``limit`` on its width: the runs and widths that take the fewest
        columns (``_fewest_columns``). None if no strips fit, or the lanes do not keep up.

        A layer that missed a time on every rung of a width before (a killer) is timed first: if
        it misses this limit on every width, no other layer need be."""
        lowest: dict[tuple[int, int], int | None] = {}

        def height(index: int, width: int) -> int | None:
            if (index, width) not in lowest:
                lowest[index, width] = self._lowest(index, width, limit)
            return lowest[index, width]

        if any(all(height(i, w) is None for w in widths) for i in self.killers):
            return None
        runs = self._fewest_columns(widths, height)
        if runs is None:
            return None
        strips = [(w, [height(i, w) or 0 for i in range(start, end)]) for start, end, w in runs]
        rects = pack_runs(strips, self.target.rows)
        if not self._lanes_keep_up(rects, limit):
            return None
        return rects, [h for _, heights in strips for h in heights]

    def _mixed_widths(self, rects: list[Rect]) -> list[int]:
        """The widths of strips of different widths, within ``MIXED_RANGE`` of the slowest
        layer's in ``rects``: those of strips of one width, and those at which the slowest
        layer's tiles change (``tile_widths``). (Every layer's would cost a timing of the
        slowest on each, many more, when it cannot go faster.)"""
        times = [
            self.stage_cycles(self.cost(i, (0, 0, w, h))) for i, (_, _, w, h) in enumerate(rects)
        ]
        slowest = max(range(self.count), key=lambda i: (times[i], -i))
        near, cols = rects[slowest][2], self.target.cols
        low, high = ceil(near / MIXED_RANGE), min(cols, int(near * MIXED_RANGE))
        widths = {w for w in self.strip_widths if low <= w <= high}
        return sorted(widths | tile_widths(self.works[slowest], low, high))

    def _fewest_columns(
        self, widths: Sequence[int], height: Callable[[int, int], int | None]
    ) -> list[tuple[int, int, int]] | None:
        """The strips, ``(first layer, end, width)``, that hold all layers in the fewest columns
        (the first found among equals), each layer ``height(layer, width)`` rows high; None if
        they need more columns than the mesh has. A strip that cannot beat the best found so
        far is not tried."""
        rows, cols, count = self.target.rows, self.target.cols, self.count
        used = [0, *[cols + 1] * count]
        """The fewest columns that hold the first ``n`` layers, per ``n``..."""
        last = [(0, 0)] * (count + 1)
        """... and the first layer and width of the last strip there."""
        for start in range(count):
            for width in widths:
                if used[start] + width >= used[-1]:
                    continue
                filled = 0
                for index in range(start, count):
                    h = height(index, width)
                    if h is None or filled + h > rows:
                        break
                    filled += h
                    if used[start] + width < used[index + 1]:
                        used[index + 1], last[index + 1] = used[start] + width, (start, width)
        if used[-1] > cols:
            return None
        runs: list[tuple[int, int, int]] = []
        end = count
        while end:
            start, width = last[end]
            runs.insert(0, (start, end, width))
            end = start
        return runs

    def _strip_heights(self, width: int, limit: float) -> list[int] | None:
        """Every layer's fewest rows within ``limit`` on ``width`` columns, if they all have
        some and fill at most the ``cols // width`` strips of that width (next fit in program
        order, which is what ``pack`` does).

        The answer does not depend on the order in which the layers are timed, so the cheap
        bounds go first (``_floor``: a layer that cannot make the limit, or rows that cannot
        fit, need no timing at all), then the layers that failed a width before: a layer too
        slow on one width is usually too slow on its neighbours, and finding it first saves
        timing the others."""
        heights = []
        for index in range(self.count):
            step = self._floor(index, width, limit)
            if step is None:
                return None
            heights.append(self.ladders[index][step])
        if not self._stack(heights, width):
            return None
        order = [*self.killers, *(i for i in range(self.count) if i not in self.killers)]
        for index in order:
            height = self._lowest(index, width, limit)
            if height is None:
                self.killers = [index, *(i for i in self.killers if i != index)]
                return None
            heights[index] = height
            if not self._stack(heights, width):
                return None
        return heights

    def _stack(self, heights: list[int], width: int) -> bool:
        """Whether layers of ``heights`` stack, next fit in program order, into the strips of
        ``width`` columns that fit the mesh. Fewer rows never take more strips, so heights
        that are lower bounds can only pass where the true ones might."""
        rows, strips, used = self.target.rows, 1, 0
        for height in heights:
            strips, used = (
                (strips, used + height) if used + height <= rows else (strips + 1, height)
            )
        return strips <= self.target.cols // width

    def _floor(self, index: int, width: int, limit: float) -> int | None:
        """The lowest step of layer ``index``'s ladder that may keep ``limit`` on ``width``
        columns, without timing any: a scan for a larger limit on the same width missed it on
        the steps below its answer, and no rectangle computes faster than its PEs at peak
        (``_least_pes``). None if no step may."""
        ladder = self.ladders[index]
        known = self.lowest_known.get((index, width))
        start = known[1] if known is not None and known[0] >= limit else 0
        least = self._least_pes(index, limit) / width
        start = max(start, bisect.bisect_left(ladder, least))
        return start if start < len(ladder) else None

    def _lowest(self, index: int, width: int, limit: float) -> int | None:
        """The fewest rows of layer ``index``'s ladder on which it fits and takes at most
        ``limit`` on ``width`` columns, if any. The ladder is scanned from its floor
        (``_floor``) up (more rows can take longer: a rung is no bound on the next), past the
        rungs on which the layer missed the limit on more columns (fewer take no less, as the
        search assumes, nor hold more)."""
        ladder = self.ladders[index]
        start = self._floor(index, width, limit)
        if start is None:
            return None
        for step in range(start, len(ladder)):
            missed = self.rung_times.setdefault((index, ladder[step]), {})
            if any(t > limit for w, t in missed.items() if w >= width):
                continue
            cost = self.cost(index, (0, 0, width, ladder[step]))
            missed[width] = self.stage_cycles(cost) if self.fits(cost) else inf
            if missed[width] <= limit:
                self.lowest_known[index, width] = (limit, step)
                return ladder[step]
        self.lowest_known[index, width] = (limit, len(ladder))
        return None

    def _least_pes(self, index: int, limit: float) -> float:
        """The fewest PEs on which layer ``index`` may take at most ``limit``: its FLOPs at
        every PE's peak within what its host I/O leaves of the limit (the same bytes on any
        rectangle); infinite if the host I/O alone takes longer."""
        if not self.flops[index]:
            return 0.0
        left = limit - self.host_cycles[index]
        return self.flops[index] / (self.peaks[index] * left) * ROUNDING if left > 0 else inf

    def _peak(self, work: Program) -> int:
        """The most FLOPs a PE does per cycle on ``work``'s types: the 16-bit rate if it has
        16-bit floats, else the 32-bit one."""
        half = any(dtypes.is_float(dtypes.dtype(d)) and dtypes.dtype(d).itemsize <= 2
                   for _, d in work.registers)  # fmt: skip
        return self.target.peak_flops_per_pe_per_cycle("float16" if half else "float32")

    def _ladder(self, index: int) -> list[int]:
        """The heights a strip may give layer ``index``: its rows split ``k`` ways (the heights
        that change its tiles), whole multiples of them, then doublings up to the mesh's rows
        (for kernels that use more rows than a tensor has: a matmul splitting its contraction,
        a GEMV its matrix's rows)."""
        base, rows = self.bases[index], self.target.rows
        shorter = {ceil(base / k) for k in range(1, LADDER_SPLITS + 1)}
        taller = {base * m for m in range(2, LADDER_MULTIPLES + 1) if base * m <= rows}
        doubled = {min(base * LADDER_MULTIPLES << d, rows) for d in range(rows.bit_length())}
        return sorted(shorter | taller | {h for h in doubled if h > base})

    def _restore(self, heights: list[int]) -> None:
        """Gives the layers ``heights`` (forgetting the timings of those whose rows change)."""
        for index, height in enumerate(heights):
            if self.heights[index] != height:
                self.heights[index] = height
                self.widths_timed[index] = {}

    def _rect(self, index: int, width: int, x: int = 0, y: int = 0) -> Rect:
        return (x, y, width, self.heights[index])

    def _packable(self, narrowest: list[int]) -> list[int]:
        """Makes the narrowest rectangles pack. First the widest layers grow taller (doubling,
        up to the mesh's rows): a short wide layer makes its whole strip wide. If that is not
        enough, every layer gets an equal share of the rows, in ever more bands, so that more
        layers stack in a strip."""
        rows = self.target.rows
        while self._pack(narrowest) is None:
            short = [i for i in range(self.count) if self.heights[i] < rows and narrowest[i] > 1]
            if not short:
                return self._banded()
            widest = max(short, key=lambda i: (narrowest[i], -i))
            width = self._set_height(widest, min(2 * self.heights[widest], rows))
            assert width is not None  # it fits on fewer rows, so on more
            narrowest[widest] = width
        return narrowest

    def _banded(self) -> list[int]:
        rows = self.target.rows
        for bands in range(2, rows + 1):
            found = [self._set_height(i, rows // bands) for i in range(self.count)]
            widths = [w for w in found if w is not None]
            if len(widths) < self.count:
                break
            if self._pack(widths) is not None:
                return widths
        raise self._too_many()

    def _set_height(self, index: int, height: int) -> int | None:
        """Gives layer ``index`` ``height`` rows; returns its narrowest width there."""
        self.heights[index] = height
        self.widths_timed[index] = {}
        return self._narrowest(index)

    def _height(self, index: int) -> int:
        """The layer's rows: its useful rows, doubled while its SRAM does not fit on that many
        rows of the whole mesh's width."""
        t = self.target
        height = min(useful_rows(self.works[index]), t.rows)
        while height < t.rows and not self.fits(self.cost(index, (0, 0, t.cols, height))):
            height = min(2 * height, t.rows)
        return height

    def _narrowest(self, index: int) -> int | None:
        """The fewest columns (of the layer's height) on which it fits, if any.

        The search gallops up from the columns its weights and largest tensor alone need,
        then bisects: most layers fit close to that bound, and narrow candidates are the
        cheap ones to time.
        """
        cols, height = self.target.cols, self.heights[index]
        if not self.fits(self.cost(index, self._rect(index, cols))):
            return None
        least = ceil(self._least_bytes(index) / (height * self.target.sram_bytes_per_pe))
        lo = probe = min(max(least, 1), cols)
        while probe < cols and not self.fits(self.cost(index, self._rect(index, probe))):
            lo, probe = probe + 1, min(cols, 2 * probe)
        hi = probe
        while lo < hi:
            mid = (lo + hi) // 2
            if self.fits(self.cost(index, self._rect(index, mid))):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _least_bytes(self, index: int) -> int:
        """A lower bound of the SRAM layer ``index`` needs on any rectangle: its weights (a
        sparse one's live values) and its largest tensor (without padding)."""
        work = self.works[index]
        weights, largest = 0, 0
        for ins in work.instructions:
            for register in ins.results:
                size = work.tensor_bytes(register)
                sparse = work.sparse.get(ins.attrs.get("name", ""))
                if ins.opcode == Opcode.WEIGHT and sparse is not None:
                    size = min(size, sparse.live * size // sparse.size)
                if ins.opcode in (Opcode.WEIGHT, Opcode.CONSTANT):
                    weights += size
                else:
                    largest = max(largest, size)
        return weights + largest

    def cycles(self, index: int, width: int) -> float:
        """Layer ``index``'s stage time on ``width`` columns of its height."""
        timed = self.widths_timed[index]
        if width not in timed:
            timed[width] = self.stage_cycles(self.cost(index, self._rect(index, width)))
        return timed[width]

    def _pack(self, widths: Sequence[int], limit: float = float("inf")) -> list[Rect] | None:
        """The strips, aligned where they fit so; else the skyline; in each case only if no
        tensor between layers needs more than ``limit`` cycles on its lanes."""
        sizes = [(w, self.heights[i]) for i, w in enumerate(widths)]
        rows, cols = self.target.rows, self.target.cols
        for packing in (
            lambda: pack(sizes, rows, cols),
            lambda: pack(sizes, rows, cols, aligned=False),
            lambda: pack_skyline(sizes, rows, cols),
        ):
            rects = packing()
            if rects is not None and self._lanes_keep_up(rects, limit):
                return rects
        return None

    def _lanes_keep_up(self, rects: list[Rect], limit: float) -> bool:
        """Whether no layer's busiest input link, the routes sharing it added up as routed,
        takes over ``limit`` cycles; the tensors between two layers alone on their lanes bound
        it from below, and rule most rectangles out first."""
        alone = (w / len(lane_ends(rects[a], rects[b])[0]) for a, b, w in self.edges)
        if any(load > limit for load in alone):
            return False
        return bool(busiest_links(rects, self.tensors).max(initial=0) <= limit)

    def _balance(self, narrowest: list[int]) -> tuple[list[int], float]:
        """The widths that make the slowest stage as fast as the mesh allows, and its time:
        bisection between every layer on the whole width and each on its narrowest rectangle."""
        cols = self.target.cols
        fast = max(self.cycles(i, cols) for i in range(self.count))
        slow = max(self.cycles(i, w) for i, w in enumerate(narrowest))
        best = narrowest
        while slow > fast * (1 + BALANCE_TOLERANCE):
            middle = sqrt(fast * slow) if fast > 0 else slow / 2
            trial = self._widths_within(middle, narrowest)
            if trial is None or self._pack(trial, middle) is None:
                fast = middle
            else:
                slow, best = middle, trial
        return best, slow

    def _widths_within(self, limit: float, narrowest: list[int]) -> list[int] | None:
        widths = []
        for index, least in enumerate(narrowest):
            width = self._narrowest_within(index, least, limit)
            if width is None:
                return None
            widths.append(width)
        return widths

    def _narrowest_within(self, index: int, least: int, limit: float) -> int | None:
        """The fewest columns (at least ``least``) on which layer ``index`` takes at most
        ``limit`` cycles, if any. More columns take no longer, as the search assumes.

        The search starts from the tightest bracket the widths timed so far give and guesses
        inside it as if the time were ``a + b / width`` through the bracket's ends (falling
        back to halving), so it takes a few timings where bisection would take ten.
        """
        timed = self.widths_timed[index]
        hi = min((w for w, c in timed.items() if c <= limit and w >= least), default=None)
        if hi is None:
            hi = self.target.cols
            if self.cycles(index, hi) > limit:
                return None
        lo = max((w + 1 for w, c in timed.items() if c > limit and least <= w < hi), default=least)
        # no rectangle computes faster than its PEs at peak: the widths below that need no timing
        lo = max(lo, min(hi, ceil(self._least_pes(index, limit) / self.heights[index])))
        while lo < hi:
            guess = self._guess(index, lo - 1, hi, limit)
            half = (lo + hi) // 2
            mid = half if guess is None else min(max(guess, lo), hi - 1)
            if self.cycles(index, mid) <= limit:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _guess(self, index: int, slow: int, fast: int, limit: float) -> int | None:
        """The width at which ``a + b / width`` through the timings at ``slow`` and ``fast``
        columns reaches ``limit``, if both are timed and the curve does."""
        timed = self.widths_timed[index]
        if slow not in timed or fast not in timed or slow < 1:
            return None
        c_slow, c_fast = timed[slow], timed[fast]
        b = (c_slow - c_fast) / (1 / slow - 1 / fast)
        a = c_fast - b / fast
        if b <= 0 or limit <= a:
            return None
        return ceil(b / (limit - a))

    def _widen(self, rects: list[Rect]) -> list[Rect]:
        """Shares the columns no strip uses among the strips, in proportion to their widths,
        the rounding remainder to the strips of the slowest layers; a layer takes its strip's
        full width wherever that is no slower. A skyline packing stays as it is."""
        strips = sorted({(x, w) for x, _, w, _ in rects})
        ends = [x + w for x, w in strips]
        if [x for x, _ in strips] != [0, *ends[:-1]]:
            return rects
        used = sum(w for _, w in strips)
        spare = self.target.cols - used
        grown = {x: w + spare * w // used for x, w in strips}
        left = self.target.cols - sum(grown.values())
        slowest: dict[int, float] = {}
        for i, (x, _, w, _) in enumerate(rects):
            slowest[x] = max(slowest.get(x, 0.0), self.cycles(i, w))
        for x in sorted(grown, key=lambda x: (-slowest[x], x))[:left]:
            grown[x] += 1
        starts, position = {}, 0
        for x, _ in strips:
            starts[x] = position
            position += grown[x]
        result = []
        for i, (x, y, w, h) in enumerate(rects):
            width = grown[x] if self.cycles(i, grown[x]) <= self.cycles(i, w) else w
            result.append((starts[x], y, width, h))
        return result

    def _shortfall(self, stuck: list[int]) -> DoesNotFitError:
        t = self.target
        full = {i: self.cost(i, (0, 0, t.cols, t.rows)) for i in stuck}
        stuck = sorted(stuck, key=lambda i: (-full[i].sram_bytes_per_pe, i))
        per_pe = human_bytes(t.sram_bytes_per_pe)
        if len(stuck) == 1:
            (worst,) = stuck
            detail = (
                f"layer '{self._name(worst)}' needs "
                f"{human_bytes(full[worst].sram_bytes_per_pe)} per PE even on all "
                f"{t.cols}x{t.rows} PEs, {per_pe} available"
            )
        else:
            named = ", ".join(
                f"'{self._name(i)}' {human_bytes(full[i].sram_bytes_per_pe)}" for i in stuck[:4]
            )
            more = f" and {len(stuck) - 4} more" if len(stuck) > 4 else ""
            detail = (
                f"{len(stuck)} layers need more SRAM per PE than {per_pe} even on all "
                f"{t.cols}x{t.rows} PEs: {named}{more}"
            )
        return self._error(detail)

    def _too_many(self) -> DoesNotFitError:
        t = self.target
        columns = sum(self._set_height(i, t.rows) or t.cols for i in range(self.count))
        return self._error(
            f"its {self.count} layers, each on its narrowest rectangle, do not pack onto the "
            f"{t.rows}x{t.cols} mesh: as strips of all {t.rows} rows they need {columns} "
            f"columns ({human_bytes(columns * t.rows * t.sram_bytes_per_pe)} of SRAM), the mesh "
            f"has {t.cols} ({human_bytes(t.sram_bytes)})"
        )

    def _name(self, index: int) -> str:
        return self.works[index].layers[0].name

    def _error(self, detail: str) -> DoesNotFitError:
        return DoesNotFitError(
            f"model does not fit on {self.target.name} in pipelined mode: {detail}; "
            "use --mode weight_streaming"
        )


@dataclass(frozen=True)
class PlaceLayersPass(ModulePass):
    """Gives every layer a rectangle of PEs (pipelined mode)."""

    name = "place-layers"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        target = module_target(op)
        works = [w for w in layer_works(main_function(op), target.whole) if w.layer is not None]
        placer = Placer(works, target, module_sparse_weights(op))
        for work, rect in zip(works, placer.place(), strict=True):
            assert work.layer is not None
            x, y, w, h = rect
            work.layer.rect = wse.RectAttr(IntAttr(x), IntAttr(y), IntAttr(w), IntAttr(h))
