"""The flows of im2col as a sum over tap ranges, without the general engine's peeling.

A patch column ``j = c * K + t`` (channel ``c`` of ``K`` kernel taps) lies on destination PE
column ``j // tile``: each channel's taps split into ranges, one per PE column they reach, and
a channel's flows to one PE column are the distinct (source pixel, destination PE row) pairs
that its range of taps reads. Those pairs depend on the range alone, not on the channel, so
the flows are a sum over the distinct ranges ``T`` (at most ``K (K + 1) / 2``) of a product:
the pixel pairs of ``T`` (over the source PE row, the destination PE row, and the source PE
column where the image's columns are pixels) times the channels whose range is ``T`` (over
the destination PE column, and the source PE column where the image's columns are channels).
Every read is listed once, tap by tap; a range's pairs are a slice of them, made distinct. The
terms of a channels-last image are each a factor over PE rows times one over PE columns, so
all their link loads come from a few matrix products (``_separable_traffic``); a
channels-first image's pixels carry their source PE column too, and its loads are sums of
products over the terms all the same (``_channels_first_traffic``). Either way the traffic
equals ``flows.movement_traffic``'s and the per-element ``traffic.gather_traffic``'s (the
tests check both).

The engine instead peels the channels into phase classes and enumerates pixels and taps in
each, then routes term by term; the placer asks every convolution on many rectangles. Only
what keeps a channel off the pixel side of a PE coordinate is counted so: one group, and a
channels-last image, or a channels-first one with two spatial axes or more, unfolded; and
at most ``flows.ENUMERATION_LIMIT`` reads (the engine counts a large batch without listing
its reads); any other im2col goes to the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from math import prod
from typing import Any

import numpy as np

from cgc.machine.flow_counts import RawFactor, run_starts
from cgc.machine.flows import (
    DC,
    DR,
    ENUMERATION_LIMIT,
    SC,
    SR,
    movement_traffic,
)
from cgc.machine.index_maps import Attrs, relative_places
from cgc.machine.layout import Layout
from cgc.machine.ref_movement import window_counts
from cgc.machine.traffic import NO_TRAFFIC, Traffic


def im2col_traffic(attrs: Attrs, src: Layout, dst: Layout) -> Traffic:
    """The traffic of im2col from ``src`` into ``dst``: ``flows.movement_traffic``'s, counted
    by tap ranges where that applies."""
    if not src.size or not dst.size:
        return NO_TRAFFIC
    found = _window_traffic(Windows(attrs, src, dst))
    return movement_traffic("im2col", attrs, [src], dst) if found is None else found


@lru_cache(maxsize=1 << 14)
def _window_traffic(problem: Windows) -> Traffic | None:
    """The traffic counted by tap ranges, None where that does not apply; remembered as
    ``flows`` remembers its own, for the placer asks again elsewhere on the mesh."""
    raw = im2col_terms(problem.attrs, problem.src, problem.dst)
    if raw is None:
        return None
    if not raw:
        return NO_TRAFFIC
    grids = [problem.dst, problem.src]
    if problem.channels_last:
        return _separable_traffic(raw, grids)
    return _channels_first_traffic(raw, grids)


class Windows:
    """An im2col compared by what its traffic depends on: its attributes, and its layouts
    relative to their common top-left corner (as ``index_maps.Structure``)."""

    def __init__(self, attrs: Attrs, src: Layout, dst: Layout):
        self.attrs, self.src, self.dst = attrs, src, dst
        self.channels_last = bool(attrs.get("channels_last", False))
        attributes = tuple(sorted((k, _hashable(v)) for k, v in attrs.items()))
        self.key = (attributes, *relative_places([src, dst]))
        self.hash = hash(self.key)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Windows) and self.key == other.key


def _hashable(value: Any) -> object:
    """An attribute's value in a form that hashes (its lists as tuples)."""
    return tuple(value) if isinstance(value, list | tuple) else value


def im2col_terms(attrs: Attrs, src: Layout, dst: Layout) -> list[list[RawFactor]] | None:
    """The flows of im2col from ``src`` into ``dst`` as products of raw factors, one per tap
    range; None where the module docstring's conditions fail."""
    last = attrs.get("channels_last", False)
    spatial = src.shape[1:-1] if last else src.shape[2:]
    if attrs["group"] != 1 or not (last or (len(spatial) >= 2 and not src.fold)):
        return None
    kernel = attrs["kernel"]
    taps = prod(kernel)
    outs = window_counts(spatial, kernel, *(attrs[k] for k in ("strides", "pads", "dilations")))
    if src.shape[0] * prod(outs) * taps > ENUMERATION_LIMIT:
        return None  # the engine counts a large batch without listing its reads
    channels = src.shape[-1] if last else src.shape[1]
    runs = _tap_runs(channels, taps, dst)
    reads = _Reads(attrs, spatial, outs, src, dst)
    terms = []
    for start, stop in sorted(set(zip(runs[0].tolist(), runs[1].tolist(), strict=True))):
        pixels = reads.pairs(start, stop)
        if not pixels[2].size:
            continue  # these taps read only padding
        ranged = (runs[0] == start) & (runs[1] == stop)
        columns = runs[3][ranged]
        if last:
            at = np.array([src.col0 + runs[2][ranged] // src.ct, columns])
            channel_side: RawFactor = ((SC, DC), at, np.ones(columns.size))
        else:
            channel_side = ((DC,), columns[None, :], np.ones(columns.size))
        terms.append([pixels, channel_side])
    return terms


def _tap_runs(channels: int, taps: int, dst: Layout) -> tuple[np.ndarray, ...]:
    """``(first tap, end tap, channel, destination PE column)`` of every run of one channel's
    taps on one PE column."""
    j = np.arange(channels * taps)
    c, t, column = j // taps, j % taps, dst.col0 + j // dst.ct
    starts = run_starts(c * (column.max() + 1) + column)
    ends = np.append(starts[1:], j.size) - 1
    return t[starts], t[ends] + 1, c[starts], column[starts]


class _Reads:
    """Every read of the image by the windows (``outs`` along each axis), tap after tap in
    raster order: the PE coordinates of its flow but the destination column (``vars``,
    ``at``), a key of its source pixel and destination PE row, and where each tap's reads
    start (``starts``)."""

    def __init__(
        self, attrs: Attrs, spatial: Sequence[int], outs: Sequence[int], src: Layout, dst: Layout
    ):
        kernel, strides, pads, dilations = (
            attrs[k] for k in ("kernel", "strides", "pads", "dilations")
        )
        samples, windows, taps = src.shape[0], prod(outs), prod(kernel)
        n = np.arange(samples)[None, :, None]
        # unravelled flat: numpy 2.4's unravel_index errs on arrays shaped (1, n, 1)
        at_out = [o[None, None, :] for o in np.unravel_index(np.arange(windows), outs)]
        at_tap = [k[:, None, None] for k in np.unravel_index(np.arange(taps), kernel)]
        valid = np.ones((taps, samples, windows), dtype=bool)
        pixel, reads = n, []
        for i, (o, k) in enumerate(zip(at_out, at_tap, strict=True)):
            y = strides[i] * o + dilations[i] * k - pads[i]
            valid &= (y >= 0) & (y < spatial[i])
            pixel = pixel * spatial[i] + y
            reads.append(y)
        row = dst.row0 + (n * windows + np.arange(windows)[None, None, :]) // dst.rt
        pixel, row, *reads = (np.broadcast_to(a, valid.shape)[valid] for a in (pixel, row, *reads))
        self.starts = np.concatenate([[0], np.cumsum(valid.sum(axis=(1, 2)))])
        self.key = pixel.astype(np.int64) * dst.h + (row - dst.row0)
        if attrs.get("channels_last", False):
            source_row = pixel if src.fold else reads[-1]
            self.vars: tuple[int, ...] = (SR, DR)
            self.at = np.array([src.row0 + source_row // src.rt, row])
        else:
            self.vars = (SR, SC, DR)
            self.at = np.array(
                [src.row0 + reads[-2] // src.rt, src.col0 + reads[-1] // src.ct, row]
            )

    def pairs(self, start: int, stop: int) -> RawFactor:
        """The distinct (source pixel, destination PE row) pairs that taps ``start`` to
        ``stop`` read, by the PE coordinates ``vars``."""
        first, end = self.starts[start], self.starts[stop]
        if stop - start == 1:
            at = self.at[:, first:end]
        else:  # taps of one destination PE row may read the same pixel
            _, distinct = np.unique(self.key[first:end], return_index=True)
            at = self.at[:, first + distinct]
        return self.vars, at, np.ones(at.shape[1])


def _separable_traffic(terms: Sequence[Sequence[RawFactor]], grids: Sequence[Layout]) -> Traffic:
    """``flows.terms_traffic`` of terms that are each a factor over the PE rows (source,
    destination) times one over the PE columns, as a channels-last image's are. Flows go along
    the source row, then down the destination column: a row's eastward load is the flows from
    it times the column factor's eastward legs across the link, and so on; every load is a sum
    over the terms of outer products, one matrix product for all of them."""
    row0, col0 = min(g.row0 for g in grids), min(g.col0 for g in grids)
    rows = max(g.row0 + g.h for g in grids) - row0
    cols = max(g.col0 + g.w for g in grids) - col0
    pe_rows = _Side([t[0] for t in terms], row0, rows)
    pe_cols = _Side([t[1] for t in terms], col0, cols)
    longest = pe_rows.longest + pe_cols.longest
    if not longest.max(initial=0):
        return NO_TRAFFIC
    staying = pe_rows.staying.T @ pe_cols.staying
    loads = [pe_rows.sent.T @ legs for legs in pe_cols.legs]  # along the source rows
    loads += [pe_cols.received.T @ legs for legs in pe_rows.legs]  # down destination columns
    words = grids[1].words_per_element
    return Traffic(
        wavelet_hops=float(pe_rows.distance @ pe_cols.total + pe_rows.total @ pe_cols.distance)
        * words,
        max_link=max(float(load.max()) for load in loads) * words,
        max_inject=float((pe_rows.sent.T @ pe_cols.sent - staying).max()) * words,
        max_eject=float((pe_rows.received.T @ pe_cols.received - staying).max()) * words,
        max_hops=int(longest.max()),
    )


def _channels_first_traffic(
    terms: Sequence[Sequence[RawFactor]], grids: Sequence[Layout]
) -> Traffic:
    """``flows.terms_traffic`` of terms that are each a factor over (source PE row, source PE
    column, destination PE row) times one over the destination PE column, as a channels-first
    image's are: the image's columns are pixels, so its source column rides with the pixel.
    A flow's leg along its source row depends on the pixels only through (source row, source
    column), its leg down the destination column only through (source row, destination row),
    so each load is still a sum over the terms of products: of a cumulative sum of the pixels
    by source PE along the row with the channels beyond (or before) the link, and of the
    pixels' row legs with the channels in the column."""
    row0, col0 = min(g.row0 for g in grids), min(g.col0 for g in grids)
    rows = max(g.row0 + g.h for g in grids) - row0
    cols = max(g.col0 + g.w for g in grids) - col0
    pixels = [t[0] for t in terms]
    count = len(terms)
    term = np.repeat(np.arange(count), [f[2].size for f in pixels])
    sr, sc, dr = (
        np.concatenate([f[1][k] for f in pixels]) - origin
        for k, origin in enumerate((row0, col0, row0))
    )
    weight = np.concatenate([f[2] for f in pixels])
    # the channels by destination PE column, per term: [term, column]
    channel_term = np.repeat(np.arange(count), [t[1][2].size for t in terms])
    at_column = np.concatenate([t[1][1][0] for t in terms]) - col0
    per_column = np.bincount(
        channel_term * cols + at_column, np.concatenate([t[1][2] for t in terms]), count * cols
    ).reshape(count, cols)
    down = _Side([((SR, DR), f[1][[0, 2]], f[2]) for f in pixels], row0, rows)
    # the pixels by source PE, per term: [term, source row, source column]
    source_rows = int(sr.max()) + 1
    flat = (term * source_rows + sr) * cols + sc
    size = count * source_rows * cols
    by_source = np.bincount(flat, weight, size).reshape(count, source_rows, cols)
    staying = np.bincount(flat, np.where(sr == dr, weight, 0), size).reshape(by_source.shape)
    # the channels at or west of each column, and east of it
    west = np.cumsum(per_column, axis=1)
    east = west[:, -1:] - west
    sent = np.cumsum(by_source, axis=2)
    along = [
        np.einsum("trc,tc->rc", sent, east),
        np.einsum("trc,tc->rc", sent[:, :, -1:] - sent, west),
    ]
    loads = [*along, *(per_column.T @ legs for legs in down.legs)]
    stay = np.einsum("trc,tc->rc", staying, per_column)
    inject = np.einsum("trc,t->rc", by_source, per_column.sum(axis=1)) - stay
    eject = down.received.T @ per_column
    eject[:source_rows] -= stay
    apart = np.abs(np.arange(cols)[:, None] - np.arange(cols)[None, :])
    across = np.einsum("trc,tc->", by_source, per_column @ apart)
    words = grids[1].words_per_element
    return Traffic(
        wavelet_hops=float(down.distance @ per_column.sum(axis=1) + across) * words,
        max_link=max(float(load.max()) for load in loads) * words,
        max_inject=float(inject.max()) * words,
        max_eject=float(eject.max()) * words,
        max_hops=_longest(term, sr, sc, dr, per_column),
    )


def _longest(
    term: np.ndarray, sr: np.ndarray, sc: np.ndarray, dr: np.ndarray, per_column: np.ndarray
) -> int:
    """The most hops of any flow: a pixel's rows apart, plus its source column's distance to
    the farther of its term's outermost destination columns."""
    reached = per_column > 0
    first = reached.argmax(axis=1)
    last = per_column.shape[1] - 1 - reached[:, ::-1].argmax(axis=1)
    across = np.maximum(np.abs(sc - first[term]), np.abs(last[term] - sc))
    return int((np.abs(sr - dr) + across).max())


class _Side:
    """The PE rows, or the PE columns, of terms' factors over (source, destination) lines:
    arrays ``[term, line]`` over ``extent`` mesh lines from ``origin`` of the flows by source
    line (``sent``), by destination line (``received``), that stay on their line
    (``staying``), and crossing each link forward and backward (``legs``: from line ``x`` to
    ``x + 1`` and back); per term, the flows, the lines they cross and the most one crosses."""

    def __init__(self, factors: Sequence[RawFactor], origin: int, extent: int):
        terms = len(factors)
        term = np.repeat(np.arange(terms), [f[2].size for f in factors])
        src, dst = (np.concatenate([f[1][k] for f in factors]) - origin for k in (0, 1))
        counts = np.concatenate([f[2] for f in factors])

        def dense(at: np.ndarray, weights: np.ndarray) -> np.ndarray:
            flat = np.bincount(term * (extent + 1) + at, weights, terms * (extent + 1))
            return flat.reshape(terms, extent + 1)

        self.sent = dense(src, counts)[:, :extent]
        self.received = dense(dst, counts)[:, :extent]
        self.staying = dense(src, np.where(src == dst, counts, 0))[:, :extent]
        self.legs = [
            np.cumsum(dense(low, weight) - dense(high, weight), axis=1)[:, :extent]
            for low, high, weight in (
                (src, dst, np.where(src < dst, counts, 0)),
                (dst, src, np.where(dst < src, counts, 0)),
            )
        ]
        self.total = self.sent.sum(axis=1)
        span = np.abs(dst - src)
        self.distance = np.bincount(term, counts * span, terms)
        self.longest = np.maximum.reduceat(span, _starts(factors))


def _starts(factors: Sequence[RawFactor]) -> np.ndarray:
    """Where each factor's entries start among all of theirs (none is empty)."""
    return np.cumsum([0] + [f[2].size for f in factors[:-1]])
