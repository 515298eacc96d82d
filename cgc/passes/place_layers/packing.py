"""Packings of layers' rectangles onto the mesh, in pipeline order.

The pipelined placement (``cgc.passes.place_layers``) chooses every layer's width and height;
these functions put the rectangles in place: vertical strips down the first and up the next,
so that a layer's producer sits against it, or, where strips leave too much empty, a skyline.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cgc.machine.movement.layout import Rect


def pack_strips(
    sizes: Sequence[tuple[int, int]], rows: int, cols: int, aligned: bool = True
) -> list[Rect] | None:
    """Rectangles of ``(width, height)`` in order, stacked into vertical strips: down the
    first strip, up the next, each strip as wide as its widest member, every member widened to
    its strip; None if they do not fit in ``rows`` x ``cols``.

    ``aligned``: a strip starts level with the last rectangle of the strip before (where the
    first one fits), so that the two sit side by side and the tensor between them crosses on
    every row they share; otherwise at the mesh's edge.
    """
    rects: list[Rect] = []
    strip: list[int] = []
    x, width, down, cursor = 0, 0, True, 0
    for index, (w, h) in enumerate(sizes):
        if h > rows:
            return None
        if strip and not (cursor + h <= rows if down else cursor - h >= 0):
            x += width
            _widen_strip(rects, strip, width)
            strip, width, down = [], 0, not down
            _, last_y, _, last_h = rects[-1]
            if down:
                cursor = last_y if aligned and last_y + h <= rows else 0
            else:
                cursor = last_y + last_h if aligned and last_y + last_h >= h else rows
        y = cursor if down else cursor - h
        cursor = y + h if down else y
        rects.append((x, y, w, h))
        strip.append(index)
        width = max(width, w)
    _widen_strip(rects, strip, width)
    return rects if x + width <= cols else None


def pack_runs(strips: Sequence[tuple[int, Sequence[int]]], rows: int) -> list[Rect]:
    """The rectangles of strips given as their width and their members' heights (each at most
    ``rows`` in all), left to right, down the first strip, up the next: each strip starts level
    with the last rectangle of the strip before, or as near as its members leave room for, so
    that a layer's producer sits against it."""
    rects: list[Rect] = []
    x, down = 0, True
    for width, heights in strips:
        total = sum(heights)
        if not rects:
            cursor = 0
        elif down:
            cursor = min(rects[-1][1], rows - total)
        else:
            cursor = max(rects[-1][1] + rects[-1][3], total)
        for h in heights:
            y = cursor if down else cursor - h
            cursor = y + h if down else y
            rects.append((x, y, width, h))
        x, down = x + width, not down
    return rects


def pack_skyline(sizes: Sequence[tuple[int, int]], rows: int, cols: int) -> list[Rect] | None:
    """Rectangles of ``(width, height)`` in order, each at the highest place the ones before
    leave free (the skyline: per column, the first row below everything placed there), the
    nearest to the rectangle before it among equally high places; None if one does not fit.
    Denser than strips when a few wide layers would make their strips wide and empty."""
    skyline = np.zeros(cols, dtype=np.int64)
    rects: list[Rect] = []
    for w, h in sizes:
        if w > cols or h > rows:
            return None
        tops = np.lib.stride_tricks.sliding_window_view(skyline, w).max(axis=1)
        room = np.flatnonzero(tops + h <= rows)
        if not len(room):
            return None
        highest = room[tops[room] == tops[room].min()]
        if rects:
            px, _, pw, _ = rects[-1]
            centre = (2 * highest + w) - (2 * px + pw)
            x = int(highest[np.argmin(np.abs(centre))])
        else:
            x = int(highest[0])
        y = int(tops[x])
        rects.append((x, y, w, h))
        skyline[x : x + w] = y + h
    return rects


def _widen_strip(rects: list[Rect], members: list[int], width: int) -> None:
    for i in members:
        x, y, _, h = rects[i]
        rects[i] = (x, y, width, h)
