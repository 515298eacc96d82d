"""The strips' search: heights and widths chosen together, by bisection on the stage time.

Strips of one width, as many as fit the mesh, in which every layer takes the fewest of its
candidate heights (``LayerTimings.height_choices``) that keep it within the stage time, the
two ends of a tensor whose lanes fall behind that time rising one candidate height at a time
(more rows are more lanes to the next strip). Then strips of different widths: one width
wastes the columns a layer's tiles leave, so every run of consecutive layers gets its own
strip width, the runs and widths that take the fewest columns (dynamic programming).

Timing a layer is the search's cost, so it remembers what it learned: the lowest height found
per layer, width and stage time (a lower time cannot start below it), the times per layer and
height on each width (a height on which a layer missed a time on more columns is not timed on
fewer), and the layers that last missed a time on every height of a width (timed first next).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from math import ceil, inf, sqrt

from cgc.dialects.lowering import LayerWork
from cgc.machine.hardware.target import Target
from cgc.machine.movement.layout import Rect
from cgc.machine.movement.traffic import busiest_links
from cgc.passes.place_layers.layers import (
    STAGE_TIME_TOLERANCE,
    LayerTimings,
    spanned_width,
    tile_widths,
)
from cgc.passes.place_layers.packing import pack_runs, pack_strips

STRIP_SPEEDUP = 4.0
"""The strips' search looks for stage times down to this fraction of the balanced one..."""
STRIP_WIDTHS_TRIED = 12
"""... on this many strip widths per stage time, the nearest the last that worked: a time no
width near it meets costs a timing of every layer on each (the placement's own time)."""
LANE_RAISES = 16
"""The layers at the ends of tensors whose lanes fall behind the stage time rise one candidate
height at most this many times before strips of a width give up: a stage time low enough to
need finer heights leaves short layers few lanes to their neighbours."""
MIXED_RANGE = 1.5
"""Strips of different widths take widths within this factor of the last strips of one width
that worked."""

Strips = tuple[list[Rect], list[int]]
"""The rectangles of the layers, and their heights (among their candidate heights)."""


class StripSearch(LayerTimings):
    """The search for strips that keep a stage time, and what it learned so far."""

    def __init__(
        self, works: Sequence[LayerWork], target: Target, live: Mapping[str, int] | None = None
    ):
        super().__init__(works, target, live)
        self.lowest_step_found: dict[tuple[int, int], tuple[float, int]] = {}
        """Per layer and strip width, the last stage time asked and the index of its lowest
        height within it among the layer's candidate heights."""
        self.times_by_height: dict[tuple[int, int], dict[int, float]] = {}
        """Per layer and candidate height, its stage time (infinite where it does not fit) on
        each width it was timed on."""
        cols = self.target.cols
        self.strip_widths = sorted({cols // n for n in range(1, cols + 1)})
        """The strips' widths worth trying: ``cols // n``, each for the most strips it fits."""
        self.last_strip_width = cols
        """The width of the last strips that kept the stage time."""
        self.timed_first: list[int] = []
        """The layers that missed a stage time on every candidate height of some width, latest
        first."""

    def strips_at_whole_width_time(self) -> tuple[Strips, float] | None:
        """The strips and their stage time, if some keep every layer within its time on the
        whole width at its height: no balanced widths can beat that time (more columns take no
        longer, as the balance assumes), so the balance need not run, and the strips' search
        starts there."""
        fast = max(self.cycles(i, self.target.cols) for i in range(self.count))
        found = self.one_width_strips(fast)
        if found is None:
            return None
        return self.fastest_strips(fast, self.one_width_strips) or (found, fast)

    def fastest_strips(
        self, limit: float, within: Callable[[float], Strips | None]
    ) -> tuple[Strips, float] | None:
        """Strips in which every layer gets the fewest rows of its candidate heights that keep
        it within the stage time, ``within`` the strips for a time: the heights chosen with the
        widths. Bisection on the stage time below ``limit``; the rectangles and heights of the
        best time found and that time, if it beats ``limit``. Strips that take under a
        ``STRIP_SPEEDUP``-th of the lower bound (a layer far slower on its fewest rows than on
        more, as a GEMV) start the search again below what they take."""
        best = None
        slow, fast = limit, limit / STRIP_SPEEDUP
        while slow > fast * (1 + STAGE_TIME_TOLERANCE):
            middle = sqrt(fast * slow)
            found = within(middle)
            if found is None:
                fast = middle
                continue
            slow, best = middle, found
            # the layers bound the strips' time from below, and their lanes are dearer to count
            if self.slowest_layer_cycles(found[0]) * STRIP_SPEEDUP < fast:
                taken = self.placement_cycles(found[0])
                if taken * STRIP_SPEEDUP < fast:
                    slow, fast = taken, taken / STRIP_SPEEDUP
        return None if best is None else (best, slow)

    def one_width_strips(self, limit: float) -> Strips | None:
        """Strips of one width, as many as fit the mesh, of layers on the fewest rows that
        keep each within ``limit`` there; the first width that works among the
        ``STRIP_WIDTHS_TRIED`` distinct widths ``cols // n`` nearest the last that worked (a
        slightly shorter stage time needs about as wide strips); None if none does. A width
        fails when a layer misses the limit on every candidate height there, or when the
        strips overflow the mesh; a narrower one may still work (fewer columns can take less
        time: shorter broadcasts)."""
        nearest = sorted(self.strip_widths, key=lambda w: (abs(w - self.last_strip_width), -w))
        for width in nearest[:STRIP_WIDTHS_TRIED]:
            heights = self._strip_heights(width, limit)
            found = None if heights is None else self._raised_for_lanes(heights, width, limit)
            if found is not None:
                self.last_strip_width = width
                return found
        return None

    def _raised_for_lanes(self, heights: list[int], width: int, limit: float) -> Strips | None:
        """The strips of layers ``heights`` high on ``width`` columns, where a tensor between
        layers takes over ``limit`` cycles on its busiest link raising both its ends to their
        next candidate heights within the limit (more rows are more lanes: a diagonal
        neighbour's lanes leave on its rows, a side neighbour's cross on the rows it shares),
        up to ``LANE_RAISES`` times; None if the strips overflow the mesh or the lanes still
        fall behind with no end left to raise."""
        rows, cols = self.target.rows, self.target.cols
        for _ in range(LANE_RAISES + 1):
            rects = pack_strips([(width, h) for h in heights], rows, cols)
            if rects is None:
                return None
            loads = busiest_links(rects, self.tensors)
            slow = {end for (a, b, _), load in zip(self.tensors, loads, strict=True)
                    if load > limit
                    for end in (a, b)}  # fmt: skip
            if not slow:
                return rects, heights
            raised = {
                i: self._next_height_within(i, width, heights[i], limit) for i in sorted(slow)
            }
            if all(h is None for h in raised.values()):
                return None
            for index, height in raised.items():
                heights[index] = height or heights[index]
        return None

    def _next_height_within(self, index: int, width: int, height: int, limit: float) -> int | None:
        """The next candidate height above ``height`` of layer ``index`` on which it fits and
        keeps ``limit`` on ``width`` columns, if any."""
        choices = self.height_choices[index]
        for step in range(bisect.bisect_right(choices, height), len(choices)):
            cost = self.cost(index, (0, 0, width, choices[step]))
            if self.fits(cost) and self.stage_cycles(cost) <= limit:
                return choices[step]
        return None

    def _strip_heights(self, width: int, limit: float) -> list[int] | None:
        """Every layer's fewest rows within ``limit`` on ``width`` columns, if they all have
        some and fill at most the ``cols // width`` strips of that width (next fit in program
        order, which is what ``pack_strips`` does).

        The answer does not depend on the order in which the layers are timed, so the cheap
        bounds go first (``_lowest_possible_step``: a layer that cannot make the limit, or rows
        that cannot fit, need no timing at all), then the layers that failed a width before: a
        layer too slow on one width is usually too slow on its neighbours, and finding it
        first saves timing the others."""
        heights = []
        for index in range(self.count):
            step = self._lowest_possible_step(index, width, limit)
            if step is None:
                return None
            heights.append(self.height_choices[index][step])
        if not self._fill_strips(heights, width):
            return None
        order = [*self.timed_first, *(i for i in range(self.count) if i not in self.timed_first)]
        for index in order:
            height = self.lowest_height_within(index, width, limit)
            if height is None:
                self.timed_first = [index, *(i for i in self.timed_first if i != index)]
                return None
            heights[index] = height
            if not self._fill_strips(heights, width):
                return None
        return heights

    def _fill_strips(self, heights: list[int], width: int) -> bool:
        """Whether layers of ``heights`` stack, next fit in program order, into the strips of
        ``width`` columns that fit the mesh. Fewer rows never take more strips, so heights
        that are lower bounds can only pass where the true ones might."""
        rows, strips, used = self.target.rows, 1, 0
        for height in heights:
            strips, used = (
                (strips, used + height) if used + height <= rows else (strips + 1, height)
            )
        return strips <= self.target.cols // width

    def _lowest_possible_step(self, index: int, width: int, limit: float) -> int | None:
        """The index of the lowest of layer ``index``'s candidate heights that may keep
        ``limit`` on ``width`` columns, without timing any: a search for a larger limit on the
        same width missed it on the heights below its answer, and no rectangle computes faster
        than its PEs at peak (``fewest_pes``). None if no height may."""
        choices = self.height_choices[index]
        known = self.lowest_step_found.get((index, width))
        start = known[1] if known is not None and known[0] >= limit else 0
        least = self.fewest_pes(index, limit) / spanned_width(self.columns[index], width)
        start = max(start, bisect.bisect_left(choices, least))
        return start if start < len(choices) else None

    def lowest_height_within(self, index: int, width: int, limit: float) -> int | None:
        """The fewest rows among layer ``index``'s candidate heights on which it fits and takes
        at most ``limit`` on ``width`` columns, if any. The heights are tried from the lowest
        possible (``_lowest_possible_step``) up (more rows can take longer: a height is no bound
        on the next), past the heights on which the layer missed the limit on more columns
        (fewer take no less, as the search assumes, nor hold more)."""
        choices = self.height_choices[index]
        start = self._lowest_possible_step(index, width, limit)
        if start is None:
            return None
        for step in range(start, len(choices)):
            missed = self.times_by_height.setdefault((index, choices[step]), {})
            if any(t > limit for w, t in missed.items() if w >= width):
                continue
            cost = self.cost(index, (0, 0, width, choices[step]))
            missed[width] = self.stage_cycles(cost) if self.fits(cost) else inf
            if missed[width] <= limit:
                self.lowest_step_found[index, width] = (limit, step)
                return choices[step]
        self.lowest_step_found[index, width] = (limit, len(choices))
        return None

    def mixed_width_strips(self, found: tuple[Strips, float]) -> tuple[Strips, float]:
        """Strips of different widths (``_mixed_width_strips_within``) and their stage time, at
        the best time the bisection finds, if they beat ``found`` (strips of one width or
        balanced widths, and their time) by the tolerance; else ``found``. A search that cannot
        beat it by that much stops there: each time it misses costs a timing of its slowest
        layer on every width."""
        widths = self._mixed_strip_widths(found[0][0])
        limit = found[1] / (1 + STAGE_TIME_TOLERANCE)
        first = self._mixed_width_strips_within(limit, widths)
        if first is None:
            return found
        return self.fastest_strips(
            limit, lambda time: self._mixed_width_strips_within(time, widths)
        ) or (first, limit)

    def _mixed_width_strips_within(self, limit: float, widths: Sequence[int]) -> Strips | None:
        """Strips of ``widths``, each a run of consecutive layers on the fewest of their
        candidate heights that keep ``limit`` on its width: the runs and widths that take the
        fewest columns (``_runs_in_fewest_columns``). None if no strips fit, or the lanes do
        not keep up.

        A layer that missed a time on every candidate height of a width before is timed first:
        if it misses this limit on every width, no other layer need be."""
        lowest: dict[tuple[int, int], int | None] = {}

        def height(index: int, width: int) -> int | None:
            if (index, width) not in lowest:
                lowest[index, width] = self.lowest_height_within(index, width, limit)
            return lowest[index, width]

        if any(all(height(i, w) is None for w in widths) for i in self.timed_first):
            return None
        runs = self._runs_in_fewest_columns(widths, height)
        if runs is None:
            return None
        strips = [(w, [height(i, w) or 0 for i in range(start, end)]) for start, end, w in runs]
        rects = pack_runs(strips, self.target.rows)
        if not self.links_keep_up(rects, limit):
            return None
        return rects, [h for _, heights in strips for h in heights]

    def _mixed_strip_widths(self, rects: list[Rect]) -> list[int]:
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

    def _runs_in_fewest_columns(
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
