"""The flows of im2col as a sum over tap ranges, without the general engine's peeling.

A patch column ``j = c * K + t`` (channel ``c`` of ``K`` kernel taps) lies on destination PE
column ``j // tile``: each channel's taps split into ranges, one per PE column they reach, and
a channel's flows to one PE column are the distinct (source pixel, destination PE row) pairs
that its range of taps reads. Those pairs depend on the range alone, not on the channel, so
the flows are a sum over the distinct ranges ``T`` (at most ``K (K + 1) / 2``) of a product:
the pixel pairs of ``T`` (over the source PE row, the destination PE row, and the source PE
column where the image's columns are pixels) times the channels whose range is ``T`` (over
the destination PE column, and the source PE column where the image's columns are channels).
No read is listed: the pairs come from segments of windows (``window_segments``: a few
per destination PE row, not one per read), merged into runs of distinct pixels where a
range's taps may read one pixel twice. The terms of a channels-last image are each a factor
over PE rows times one over PE columns, so all their link loads come from a few matrix
products (``_separable_traffic``); a channels-first image's pixels carry their source PE
column too, and its loads are sums of products over the taps or the terms all the same
(``_channels_first_traffic``). Either way the traffic equals ``flows.movement_traffic``'s
and the per-element ``traffic.gather_traffic``'s (the tests check both).

The engine instead peels the channels into phase classes and enumerates pixels and taps in
each, then routes term by term; the placer asks every convolution on many rectangles.

Groups. Every group's patch columns are numbered as its own im2col's, on its own channels,
so its channels' taps run alike (``_tap_runs``); a pixel of one group's channel is no other
group's, so the flows add up over the groups. An unfolded result holds every group on the
same rows: a channels-last term's channels are those of all groups, a channels-first one's
count every group. A folded result stacks the groups along its rows, as many samples of the
windows: a channels-last term is then a range of one group's taps. A folded channels-first
image holds each channel on rows of its own, so its terms are a range of one channel's taps
(``ColumnSegments`` per channel), AlexNet's grouped and depthwise convolutions' layout.

Counted so: a channels-last image, or a channels-first one with two spatial axes or more
(into an unfolded result where it has several groups); and at most
``flows.ENUMERATION_LIMIT`` reads of one channel (the segments grow with the batch and the
stacked groups, which the engine counts without enumerating them); any other im2col goes to
the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from math import prod
from typing import Any

import numpy as np

from cgc.machine.movement.flow_counts import RawFactor, run_starts
from cgc.machine.movement.flow_factors import DC, DR, SC, SR
from cgc.machine.movement.flows import ENUMERATION_LIMIT, movement_traffic
from cgc.machine.movement.index_maps import Attrs, relative_places
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic
from cgc.machine.movement.window_segments import (
    ColumnSegments,
    Runs,
    Segments,
    collide,
    progressions,
    source_rows,
)
from cgc.machine.reference.data_movement import window_counts


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
    attrs, src, dst = problem.attrs, problem.src, problem.dst
    if not tap_ranges_apply(attrs, src, _row_groups(attrs, dst)):
        return None
    if not problem.channels_last:
        return _channels_first_traffic(attrs, src, dst)
    raw = im2col_terms(attrs, src, dst)
    return _separable_traffic(raw, [dst, src]) if raw else NO_TRAFFIC


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


def tap_ranges_apply(attrs: Attrs, src: Layout, groups: int = 1) -> bool:
    """Whether an im2col of ``src`` is counted by tap ranges (the module docstring's
    conditions), its windows on ``groups`` groups of rows of their own (``_row_groups``)."""
    last = attrs.get("channels_last", False)
    spatial = _spatial(attrs, src)
    if not (last or (len(spatial) >= 2 and groups == 1)):
        return False
    windows = src.shape[0] * groups * prod(_outs(attrs, spatial))
    return windows * prod(attrs["kernel"]) <= ENUMERATION_LIMIT


def _row_groups(attrs: Attrs, dst: Layout) -> int:
    """The groups whose windows lie on rows of their own: a folded result's, stacked along
    its rows; an unfolded one holds every group on the same rows (one counts for all)."""
    return int(attrs["group"]) if dst.fold else 1


def _spatial(attrs: Attrs, src: Layout) -> tuple[int, ...]:
    """The spatial axes of the image ``src``."""
    return src.shape[1:-1] if attrs.get("channels_last", False) else src.shape[2:]


def _outs(attrs: Attrs, spatial: Sequence[int]) -> list[int]:
    """How many windows fit along each spatial axis."""
    return window_counts(
        spatial, attrs["kernel"], *(attrs[k] for k in ("strides", "pads", "dilations"))
    )


def im2col_terms(attrs: Attrs, src: Layout, dst: Layout) -> list[list[RawFactor]]:
    """The flows of a channels-last im2col from ``src`` into ``dst`` as products of raw
    factors, one per tap range and group of rows of its own (where ``tap_ranges_apply``): the
    runs of distinct pixels the range reads (``Segments.runs``) split by source PE row, times
    its channels in the group. A source PE row holds positions along the image's last spatial
    axis, or (folded) along its flattened pixels; a folded result's groups are as many
    samples of the windows."""
    spatial, taps = _spatial(attrs, src), prod(attrs["kernel"])
    groups, samples = _row_groups(attrs, dst), src.shape[0]
    first, end, channel, column = _tap_runs(src.shape[-1], taps, dst, attrs["group"])
    ranges = sorted(set(zip(first.tolist(), end.tolist(), strict=True)))
    outs = _outs(attrs, spatial)
    runs = Segments(attrs, spatial, outs, samples * groups, dst).runs(ranges)
    group, image_row = np.divmod(runs.image_row, samples * prod(spatial[:-1]))
    run, block, pixels = runs.pieces(image_row * spatial[-1] if src.fold else 0, src.rt)
    key = runs.term[run] * groups + group[run]  # ascending: by term, then image row
    bounds = np.searchsorted(key, np.arange(len(ranges) * groups + 1))
    of_group = channel // (src.shape[-1] // groups)
    terms: list[list[RawFactor]] = []
    for k, (low, high) in enumerate(pairwise(bounds)):
        if low == high:
            continue  # these taps read only padding
        (a, b), g = ranges[k // groups], k % groups
        at = np.array([src.row0 + block[low:high], runs.dst_row[run[low:high]]])
        ranged = (first == a) & (end == b) & (of_group == g)
        channels = np.array([src.col0 + channel[ranged] // src.ct, column[ranged]])
        terms.append(
            [
                ((SR, DR), at, pixels[low:high].astype(np.float64)),
                ((SC, DC), channels, np.ones(channels.shape[1])),
            ]
        )
    return terms


def _tap_runs(channels: int, taps: int, dst: Layout, group: int = 1) -> tuple[np.ndarray, ...]:
    """``(first tap, end tap, channel, destination PE column)`` of every run of one channel's
    taps on one PE column, group by group: every group's patch columns are numbered alike
    (as its own im2col's), and so run alike, on its own channels."""
    per = channels // group
    j = np.arange(per * taps)
    c, t, column = j // taps, j % taps, dst.col0 + j // dst.ct
    starts = run_starts(c * (column.max() + 1) + column)
    ends = np.append(starts[1:], j.size) - 1
    offset = np.repeat(np.arange(group) * per, starts.size)
    runs = (t[starts], t[ends] + 1, c[starts], column[starts])
    first, end, channel, at = (np.tile(part, group) for part in runs)
    return first, end, channel + offset, at


def _separable_traffic(terms: Sequence[Sequence[RawFactor]], grids: Sequence[Layout]) -> Traffic:
    """``flows.terms_traffic`` of terms that are each a factor over the PE rows (source,
    destination) times one over the PE columns, as a channels-last image's are. Flows go along
    the source row, then down the destination column: a row's eastward load is the flows from
    it times the column factor's eastward legs across the link, and so on; every load is a sum
    over the terms of outer products, one matrix product for all of them."""
    box = _Box(grids)
    pe_rows = _Side.of([t[0] for t in terms], box.row0, box.rows)
    pe_cols = _Side.of([t[1] for t in terms], box.col0, box.cols)
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


def _channels_first_traffic(attrs: Attrs, src: Layout, dst: Layout) -> Traffic:
    """The traffic of a channels-first im2col, as ``flows.terms_traffic`` would route its
    terms: the image's columns are pixels, so a flow's source PE column rides with its pixel,
    and each term is a factor over (source PE row, source PE column, destination PE row)
    times one over the destination PE column (the channels whose range it is). An unfolded
    image holds every channel's plane on the same PEs, so a term is a range of taps of all
    channels; a folded one holds each channel on rows of its own, so a term is a range of
    one channel's taps. The terms whose taps never read one pixel twice are counted tap by
    tap (``window_segments``), each tap weighted by the channels of the terms that hold it;
    the others by the runs of distinct pixels they read (``Segments.runs``)."""
    spatial, taps = _spatial(attrs, src), prod(attrs["kernel"])
    outs = _outs(attrs, spatial)
    box = _Box([dst, src])
    first, end, channel, column = _tap_runs(src.shape[1], taps, dst, attrs["group"])
    planes = channel if src.fold else np.zeros_like(channel)
    keys, term = np.unique(np.array([planes, first, end]), axis=1, return_inverse=True)
    term = term.ravel()
    per_column = (
        np.bincount(term * box.cols + column - box.col0, minlength=keys.shape[1] * box.cols)
        .reshape(-1, box.cols)
        .astype(np.float64)
    )  # [term, destination PE column]
    found_ranges, of_range = np.unique(keys[1:], axis=1, return_inverse=True)
    ranges = list(zip(*found_ranges.tolist(), strict=True))
    of_range = of_range.ravel()
    channels, of_plane = np.unique(keys[0], return_inverse=True)
    of_plane = of_plane.ravel()
    apart = np.array([b - a == 1 or not collide(attrs, outs, a, b) for a, b in ranges])
    segments = ColumnSegments(
        attrs, spatial, outs, src, dst, (box.row0, box.col0), (box.rows, box.cols), channels
    )
    parts = []
    chosen = np.flatnonzero(apart[of_range])
    if chosen.size:
        held, tap = progressions(keys[1, chosen], keys[2, chosen] - keys[1, chosen])
        weights = np.zeros((channels.size * taps, box.cols))  # [channel tap, column]
        np.add.at(weights, of_plane[chosen[held]] * taps + tap, per_column[chosen[held]])
        parts.append(_tap_flows(segments, weights, box))
    rest = np.flatnonzero(~apart[of_range])
    if rest.size:
        kept = np.unique(of_range[rest])
        runs = segments.runs([ranges[i] for i in kept])
        runs = runs.of_terms(np.searchsorted(kept, of_range[rest]))
        plane = channels[of_plane[rest]]
        parts.append(_run_flows(runs, per_column[rest], src, spatial, box, plane))
    found = [part for part in parts if part is not None]
    if not found:
        return NO_TRAFFIC  # every tap reads only padding
    total = sum(found[1:], found[0])
    words = src.words_per_element
    return Traffic(
        wavelet_hops=total.hops * words,
        max_link=max(float(load.max()) for load in total.loads) * words,
        max_inject=float(total.inject.max()) * words,
        max_eject=float(total.eject.max()) * words,
        max_hops=total.longest,
    )


class _Box:
    """The box of the mesh holding ``grids``: its top-left PE and its extent."""

    def __init__(self, grids: Sequence[Layout]):
        self.row0, self.col0 = min(g.row0 for g in grids), min(g.col0 for g in grids)
        self.rows = max(g.row0 + g.h for g in grids) - self.row0
        self.cols = max(g.col0 + g.w for g in grids) - self.col0


@dataclass
class _Loads:
    """Flows' loads over a box, ``[row, column]`` arrays that add up: on the links (east,
    west, then south and north as ``[column, row]``), sent and received by each PE; and the
    hops of all and of the longest."""

    loads: list[np.ndarray]
    inject: np.ndarray
    eject: np.ndarray
    hops: float
    longest: int

    def __add__(self, other: _Loads) -> _Loads:
        return _Loads(
            [a + b for a, b in zip(self.loads, other.loads, strict=True)],
            self.inject + other.inject,
            self.eject + other.eject,
            self.hops + other.hops,
            max(self.longest, other.longest),
        )


def _tap_flows(segments: ColumnSegments, weights: np.ndarray, box: _Box) -> _Loads | None:
    """The loads of every tap's reads (``segments``), each sent to the channels of
    ``weights`` (``[tap, destination PE column]``, no more entries than patch columns);
    None where no tap reads a pixel. A tap's reads by source PE are an outer product whose
    row factor it shares with its kernel row, so each load along the source rows is one matrix
    product over the kernel rows; down the destination columns, the segments are the flows
    (``_Side``), spread over the columns entry by entry of ``weights``."""
    count = np.where(weights.sum(axis=1)[:, None] > 0, segments.reads, 0)
    tap, segment = np.nonzero(count)  # tap-major: the order _Side takes
    if not tap.size:
        return None
    source_row = segments.source_row[tap, segment] - box.row0
    dst_row = segments.dst_row[segment] - box.row0
    down = _Side(tap, source_row, dst_row, count[tap, segment], weights.shape[0], box.rows)
    to_tap, to_col = np.nonzero(weights)
    spread = weights[to_tap, to_col][:, None]

    def by_column(per_tap: np.ndarray) -> np.ndarray:
        """``weights.T @ per_tap``."""
        return _sparse_product(weights, per_tap)

    def by_kernel_row(per_tap: np.ndarray) -> np.ndarray:
        """``by_row.T @ per_tap`` with ``by_row`` per tap: summed over each kernel row."""
        rows = per_tap.reshape(-1, segments.row_taps, per_tap.shape[1]).sum(axis=1)
        return _sparse_product(segments.by_row, rows)

    west = np.cumsum(weights, axis=1)
    east = west[:, -1:] - west
    by_col = segments.by_col
    sent = np.cumsum(by_col, axis=1)
    reach = weights.sum(axis=1)
    staying = segments.staying(np.flatnonzero(reach))
    stay_row, stay_col = staying[1] - box.row0, staying[2] - box.col0
    stay = np.bincount(
        stay_row * box.cols + stay_col,
        weights[staying[0], stay_col],
        box.rows * box.cols,
    ).reshape(box.rows, box.cols)
    # columns crossed: each tap's pixels by source column, to each of its columns
    cross = np.abs(to_col[:, None] - np.arange(box.cols)[None, :]) * by_col[to_tap]
    across = np.repeat(segments.by_row.sum(axis=1), segments.row_taps)[to_tap] @ (
        spread[:, 0] * cross.sum(axis=1)
    )
    first, last = _reached(weights)
    far = np.maximum(
        segments.last_col[tap, segment] - box.col0 - first[tap],
        last[tap] - (segments.first_col[tap, segment] - box.col0),
    )
    return _Loads(
        [
            by_kernel_row(sent * east),
            by_kernel_row((sent[:, -1:] - sent) * west),
            *(by_column(legs) for legs in down.legs),
        ],
        by_kernel_row(by_col * reach[:, None]) - stay,
        by_column(down.received).T - stay,
        float(down.distance @ reach + across),
        int((np.abs(source_row - dst_row) + far).max()),
    )


def _run_flows(
    runs: Runs,
    per_column: np.ndarray,
    src: Layout,
    spatial: Sequence[int],
    box: _Box,
    plane: np.ndarray,
) -> _Loads | None:
    """The loads of terms whose taps may read one pixel twice, counted by the runs of
    distinct pixels they read (``Segments.runs``) in the image ``src``, each term sent to the
    channels of its row of ``per_column``; None where no term reads a pixel. A flow's leg
    along its source row depends on its pixel only through (source row, source column), its
    leg down the destination column only through (source row, destination row), so each load
    is a sum over the terms of products: of a cumulative sum of the pixels by source PE along
    the row with the channels beyond (or before) the link, and of the pixels' row legs with
    the channels in the column. A term's pixels are those of its channel ``plane`` (any, of
    an unfolded image)."""
    if not runs.count.size:
        return None
    count = per_column.shape[0]
    source_row = source_rows(runs.image_row, spatial, src, plane[runs.term])
    down = _Side(
        runs.term, source_row - box.row0, runs.dst_row - box.row0, runs.count, count, box.rows
    )
    # the pixels by source PE column, per (term, source row) a term reads from: a folded
    # image's channel, a term's, spans a few source rows
    run, block, pixels = runs.pieces(0, src.ct)
    pairs, pair = np.unique(
        runs.term[run] * src.h + source_row[run] - src.row0, return_inverse=True
    )
    pair_term, pair_row = np.divmod(pairs, src.h)
    at = pair.ravel() * box.cols + src.col0 - box.col0 + block
    by_source = np.bincount(at, pixels, pairs.size * box.cols).reshape(pairs.size, box.cols)
    west = np.cumsum(per_column, axis=1)
    east = west[:, -1:] - west
    sent = np.cumsum(by_source, axis=1)
    reach = per_column.sum(axis=1)
    run, position = runs.staying(source_row)
    stay_row = source_row[run] - src.row0
    stay_col = src.col0 - box.col0 + position // src.ct
    stay = np.bincount(
        stay_row * box.cols + stay_col, per_column[runs.term[run], stay_col], src.h * box.cols
    ).reshape(src.h, box.cols)
    apart = np.abs(np.arange(box.cols)[:, None] - np.arange(box.cols)[None, :])
    first, last = _reached(per_column)
    first_col = src.col0 - box.col0 + runs.first // src.ct
    last_col = src.col0 - box.col0 + (runs.first + runs.stride * (runs.count - 1)) // src.ct
    far = np.maximum(last_col - first[runs.term], last[runs.term] - first_col)

    def on_box(by_row: np.ndarray) -> np.ndarray:
        """A ``[source row, column]`` array on the box's rows."""
        out = np.zeros((box.rows, box.cols))
        out[src.row0 - box.row0 : src.row0 - box.row0 + src.h] = by_row
        return out

    def by_row(per_pair: np.ndarray) -> np.ndarray:
        """``[(term, source row), column]`` summed over the terms, on the box's rows."""
        at = pair_row[:, None] * box.cols + np.arange(box.cols)[None, :]
        return on_box(
            np.bincount(at.ravel(), per_pair.ravel(), src.h * box.cols).reshape(src.h, -1)
        )

    return _Loads(
        [
            by_row(sent * east[pair_term]),
            by_row((sent[:, -1:] - sent) * west[pair_term]),
            *(_sparse_product(per_column, legs) for legs in down.legs),
        ],
        by_row(by_source * reach[pair_term, None]) - on_box(stay),
        _sparse_product(per_column, down.received).T - on_box(stay),
        float(down.distance @ reach + np.sum(by_source * (per_column @ apart)[pair_term])),
        int((np.abs(source_row - runs.dst_row) + far).max()),
    )


def _sparse_product(weights: np.ndarray, per_row: np.ndarray) -> np.ndarray:
    """``weights.T @ per_row``, entry by entry of ``weights``: a folded image's terms each
    reach a column or two, and its channel taps' kernel rows a few source rows."""
    row, column = np.nonzero(weights)
    lines = per_row.shape[1]
    at = column[:, None] * lines + np.arange(lines)[None, :]
    spread = weights[row, column][:, None] * per_row[row]
    out = np.bincount(at.ravel(), spread.ravel(), weights.shape[1] * lines)
    return out.reshape(weights.shape[1], lines)


def _reached(per_column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first and the last column each row of ``per_column`` reaches."""
    reached = per_column > 0
    first = reached.argmax(axis=1)
    return first, per_column.shape[1] - 1 - reached[:, ::-1].argmax(axis=1)


class _Side:
    """The PE rows, or the PE columns, of terms' flows between (source, destination) lines,
    entry by entry (``term``, ascending; ``src``, ``dst`` from the box's first line;
    ``counts``): arrays ``[term, line]`` over ``extent`` mesh lines of the flows by source
    line (``sent``), by destination line (``received``), that stay on their line
    (``staying``), and crossing each link forward and backward (``legs``: from line ``x`` to
    ``x + 1`` and back); per term, the flows, the lines they cross and the most one crosses."""

    def __init__(
        self,
        term: np.ndarray,
        src: np.ndarray,
        dst: np.ndarray,
        counts: np.ndarray,
        terms: int,
        extent: int,
    ):
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
        self.longest = np.zeros(terms, dtype=span.dtype)
        starts = run_starts(term)
        self.longest[term[starts]] = np.maximum.reduceat(span, starts)

    @classmethod
    def of(cls, factors: Sequence[RawFactor], origin: int, extent: int) -> _Side:
        """The side of raw factors over (source, destination) lines, one per term."""
        term = np.repeat(np.arange(len(factors)), [f[2].size for f in factors])
        src, dst = (np.concatenate([f[1][k] for f in factors]) - origin for k in (0, 1))
        counts = np.concatenate([f[2] for f in factors])
        return cls(term, src, dst, counts, len(factors), extent)
