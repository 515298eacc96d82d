"""Balanced widths: every layer at its height, the fewest columns that keep a stage time.

The balance bisects on the stage time between every layer on the whole width and each on its
narrowest rectangle, giving every layer the fewest columns on which it takes no longer (and
its SRAM holds its share), and keeps the smallest time whose rectangles still pack onto the
mesh with no layer's busiest input link slower than it.
"""

from __future__ import annotations

from math import ceil, sqrt

from cgc.passes.place_layers.layers import STAGE_TIME_TOLERANCE, LayerTimings


def balanced_widths(layers: LayerTimings, narrowest: list[int]) -> tuple[list[int], float]:
    """The widths that make the slowest stage as fast as the mesh allows, and its time:
    bisection between every layer on the whole width and each on its narrowest rectangle."""
    cols = layers.target.cols
    fast = max(layers.cycles(i, cols) for i in range(layers.count))
    slow = max(layers.cycles(i, w) for i, w in enumerate(narrowest))
    best = narrowest
    while slow > fast * (1 + STAGE_TIME_TOLERANCE):
        middle = sqrt(fast * slow) if fast > 0 else slow / 2
        trial = _widths_within(layers, middle, narrowest)
        if trial is None or layers.packed(trial, middle) is None:
            fast = middle
        else:
            slow, best = middle, trial
    return best, slow


def _widths_within(layers: LayerTimings, limit: float, narrowest: list[int]) -> list[int] | None:
    """Every layer's fewest columns (at least its narrowest) within ``limit``, if all have
    some."""
    widths = []
    for index, least in enumerate(narrowest):
        width = narrowest_width_within(layers, index, least, limit)
        if width is None:
            return None
        widths.append(width)
    return widths


def narrowest_width_within(
    layers: LayerTimings, index: int, least: int, limit: float
) -> int | None:
    """The fewest columns (at least ``least``) on which layer ``index`` takes at most
    ``limit`` cycles, if any. More columns take no longer, as the search assumes.

    The search starts from the tightest bracket the widths timed so far give and guesses
    inside it as if the time were ``a + b / width`` through the bracket's ends (falling
    back to halving), so it takes a few timings where bisection would take ten.
    """
    timed = layers.widths_timed[index]
    hi = min((w for w, c in timed.items() if c <= limit and w >= least), default=None)
    if hi is None:
        hi = layers.target.cols
        if layers.cycles(index, hi) > limit:
            return None
    lo = max((w + 1 for w, c in timed.items() if c > limit and least <= w < hi), default=least)
    # no rectangle computes faster than its PEs at peak: the widths below that need no timing
    lo = max(lo, min(hi, ceil(layers.fewest_pes(index, limit) / layers.heights[index])))
    while lo < hi:
        guess = _interpolated_width(layers, index, lo - 1, hi, limit)
        half = (lo + hi) // 2
        mid = half if guess is None else min(max(guess, lo), hi - 1)
        if layers.cycles(index, mid) <= limit:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _interpolated_width(
    layers: LayerTimings, index: int, slow: int, fast: int, limit: float
) -> int | None:
    """The width at which ``a + b / width`` through the timings at ``slow`` and ``fast``
    columns reaches ``limit``, if both are timed and the curve does."""
    timed = layers.widths_timed[index]
    if slow not in timed or fast not in timed or slow < 1:
        return None
    c_slow, c_fast = timed[slow], timed[fast]
    b = (c_slow - c_fast) / (1 / slow - 1 / fast)
    a = c_fast - b / fast
    if b <= 0 or limit <= a:
        return None
    return ceil(b / (limit - a))
