"""The placement's steps in order, from the layers' timings to their rectangles.

``Placer.place`` checks the layers fit (``fit``), finds strips that keep every layer's time
on the whole width or else balances the widths (``balance``) and searches strips below that
time (``strips``), tries strips of different widths, then spreads the columns no strip uses,
takes from layers the rows they do not need, and leaves every layer only the columns its
tensors split across.
"""

from __future__ import annotations

from math import ceil

from cgc.machine.movement.layout import Rect
from cgc.machine.movement.traffic import busiest_links
from cgc.passes.place_layers.balance import balanced_widths
from cgc.passes.place_layers.fit import narrowest_widths, packable_widths
from cgc.passes.place_layers.layers import spanned_width
from cgc.passes.place_layers.strips import StripSearch

TRIM_SPLITS = 64
"""Once the stage time is found, a layer on its lowest candidate height may split its rows up
to this many ways (``Placer.trimmed_rows``)."""


class Placer(StripSearch):
    """Chooses the rectangles of a module's layers, from their works (one-layer programs,
    ``cgc.dialects.lowering``)."""

    def place(self) -> list[Rect]:
        """The rectangle of every layer, in layer order."""
        if not self.count:
            return []
        narrowest = packable_widths(self, narrowest_widths(self))
        found = self.strips_at_whole_width_time()
        if found is None:
            widths, limit = balanced_widths(self, narrowest)
            found = self.fastest_strips(limit, self.one_width_strips)
            if found is None:
                rects = self.packed(widths, limit) or self.packed(widths)
                assert rects is not None
                found = (rects, list(self.heights)), limit
        (rects, heights), _ = self.mixed_width_strips(found)
        self.set_heights(heights)
        rects = self.trimmed_rows(self.spare_columns_spread(rects))
        return self.narrowed_to_their_tiles(rects)

    def spare_columns_spread(self, rects: list[Rect]) -> list[Rect]:
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

    def trimmed_rows(self, rects: list[Rect]) -> list[Rect]:
        """``rects`` with every layer on its lowest candidate height on the fewest rows, its
        rows split up to ``TRIM_SPLITS`` ways, that fit it and keep it and the lanes within
        their stage time: it may be faster only because its candidate heights end (finer ones
        mislead)."""
        period = self.placement_cycles(rects)
        for index in range(self.count):
            x, y, width, height = rects[index]
            if height != self.height_choices[index][0]:
                continue
            finer = {ceil(self.initial_heights[index] / k) for k in range(1, TRIM_SPLITS + 1)}
            for rows in sorted((h for h in finer if h < height), reverse=True):
                cost = self.cost(index, (0, 0, width, rows))
                if not self.fits(cost) or self.stage_cycles(cost) > period:
                    break
                trial = [*rects[:index], (x, y, width, rows), *rects[index + 1 :]]
                if max([0.0, *busiest_links(trial, self.tensors)]) > period:
                    break
                rects = trial
        self.set_heights([h for _, _, _, h in rects])
        return rects

    def narrowed_to_their_tiles(self, rects: list[Rect]) -> list[Rect]:
        """``rects`` with every layer on the fewest of its columns across which its tensors
        split as across all of them (``spanned_width``: the same time), where the lanes to
        and from it keep within the stage time: a 64-column layer in a 250-column strip
        holds 64 of them, and the others are left unplaced rather than idle inside it."""
        period = self.placement_cycles(rects)
        for index, (x, y, width, height) in enumerate(rects):
            narrow = spanned_width(self.columns[index], width)
            if narrow == width:
                continue
            trial = [*rects[:index], (x, y, narrow, height), *rects[index + 1 :]]
            if self.links_keep_up(trial, period):
                rects = trial
        return rects
