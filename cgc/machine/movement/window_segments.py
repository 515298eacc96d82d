"""An image's im2col reads, counted by segments rather than read by read.

The windows of one destination PE row are consecutive in raster order: for each window line
(every spatial axis but the last fixed, the sample too) they are an interval of the last
axis, a *segment*. One tap reads, from a segment, one image row and the positions
``stride * o + dilation * k - pad`` along it. There are at most (window lines + destination
PE rows) segments, the same for every tap, where the reads are (windows x taps): the ResNet
stem's 614k reads are some 1000 segments a tap.

The taps of one range (``window_flows``) on one destination PE column count their distinct
(pixel, destination PE row) pairs. Where no two of them can read one pixel (``collide``),
those are every tap's reads together. Otherwise the range's segments that read one image row
for one destination PE row are merged into runs of distinct pixels (``Segments.runs``),
still a few per destination PE row; a run split by source PE (``Runs.pieces``) gives its
flows.

A channels-first image's columns are on PE columns (``ColumnSegments``): a tap's segment
reads from one source PE row, along which its source PE columns never fall, so its flows by
(source PE row, destination PE row) take one entry per segment, its farthest flows come from
the segment's end pixels, and its reads by source PE are an outer product of histograms: of
its window lines by source PE row, and of its windows along the last axis by source PE column.
A folded image holds each channel on rows of its own: the segments' source rows are then per
channel, the rest the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

from cgc.machine.movement.flow_counts import codes, run_starts
from cgc.machine.movement.index_maps import Attrs
from cgc.machine.movement.layout import Layout


def collide(attrs: Attrs, outs: Sequence[int], start: int, stop: int) -> bool:
    """Whether two of the taps ``start`` to ``stop`` (raster order) may read one pixel: two
    windows ``delta`` apart read it where ``stride * delta == dilation * (k2 - k1)`` along
    every axis, and both windows exist."""
    taps = np.array(np.unravel_index(np.arange(start, stop), attrs["kernel"])).T
    apart = (taps[None, :, :] - taps[:, None, :]) * np.array(attrs["dilations"])
    strides = np.array(attrs["strides"])
    same = np.all((apart % strides == 0) & (np.abs(apart // strides) < np.array(outs)), axis=2)
    return bool(same.sum() > len(taps))  # more than each tap with itself


class Segments:
    """Every tap's reads by segment (arrays ``[tap, segment]``): how many (``count``),
    windows ``low`` to ``high`` of the last axis reading inside the image, of which image row
    (``image_row``: the sample and every spatial position but the last), for which
    destination PE row (``dst_row``, per segment); window 0 of the last axis reads position
    ``start`` (per tap), and the windows are ``stride`` positions apart."""

    def __init__(
        self, attrs: Attrs, spatial: Sequence[int], outs: Sequence[int], samples: int, dst: Layout
    ):
        kernel, strides, pads, dilations = (
            attrs[k] for k in ("kernel", "strides", "pads", "dilations")
        )
        self.stride = strides[-1]
        at_tap = np.unravel_index(np.arange(prod(kernel)), kernel)
        # where window 0 reads along each axis, per tap; and the windows reading inside
        self.starts = [dilations[i] * k - pads[i] for i, k in enumerate(at_tap)]
        self.spans = [
            _span(*axis) for axis in zip(spatial, outs, strides, self.starts, strict=True)
        ]
        line, low, high, self.dst_row = _segments(samples, outs, dst)
        sample, *at_line = np.unravel_index(line, (samples, *outs[:-1]))
        valid = np.ones((at_tap[0].size, line.size), dtype=bool)
        self.image_row = np.broadcast_to(sample[None, :], valid.shape)
        for i, o in enumerate(at_line):
            first, end = self.spans[i]
            valid &= (o[None, :] >= first[:, None]) & (o[None, :] < end[:, None])
            y = strides[i] * o[None, :] + self.starts[i][:, None]
            self.image_row = self.image_row * spatial[i] + y
        self.start = self.starts[-1]
        self.line, self.valid = line, valid
        self.low = np.maximum(low[None, :], self.spans[-1][0][:, None])
        self.high = np.minimum(high[None, :], self.spans[-1][1][:, None])
        self.count = np.where(valid, np.maximum(self.high - self.low, 0), 0)

    def runs(self, ranges: Sequence[tuple[int, int]]) -> Runs:
        """The distinct (pixel, destination PE row) pairs each range of taps (a term) reads,
        as runs along image rows: the segments of its taps that read one image row for one
        destination PE row, at positions of one residue modulo the stride, are intervals
        of the positions divided by the stride, merged where they overlap."""
        member = np.zeros((len(ranges), self.count.shape[0]), dtype=bool)
        for i, (start, stop) in enumerate(ranges):
            member[i, start:stop] = True
        term, tap = np.nonzero(member)
        pair, segment = np.nonzero(self.count[tap] > 0)
        term, tap = term[pair], tap[pair]
        if not term.size:  # only padding
            empty = np.zeros(0, dtype=np.int64)
            return Runs(empty, empty, empty, empty, empty, self.stride)
        first = self.stride * self.low[tap, segment] + self.start[tap]
        residue, low = first % self.stride, first // self.stride
        high = low + self.count[tap, segment]
        row = self.image_row[tap, segment]
        key = codes(np.array([term, row, self.dst_row[segment], residue]))[0]
        order = np.lexsort((low, key))
        key, low, high = key[order], low[order], high[order]
        new = np.empty(key.size, dtype=bool)
        new[:1] = True
        np.not_equal(key[1:], key[:-1], out=new[1:])
        # the farthest end so far of each key's intervals, by a running maximum that the
        # ranks of the keys keep apart
        apart = (np.cumsum(new) - 1) * (int(high.max(initial=0)) + 1)
        reached = np.maximum.accumulate(high + apart) - apart
        new[1:] |= low[1:] > reached[:-1]
        starts = np.flatnonzero(new)
        at = order[starts]
        return Runs(
            term[at],
            row[at],
            self.dst_row[segment[at]],
            self.stride * low[starts] + residue[at],
            np.maximum.reduceat(high, starts) - low[starts],
            self.stride,
        )


class ColumnSegments(Segments):
    """The segments of a channels-first image, whose columns are on PE columns, for the taps
    of each of ``channels`` (*channel taps*, channel-major: a folded image holds each channel
    on rows of its own; an unfolded one every channel alike, and one channel stands for all):
    each segment's reads (``reads``), source PE row (``source_row``) and the source PE
    columns of its first and last read (``first_col``, ``last_col``), all ``[channel tap,
    segment]``; and every channel tap's reads by source PE row (``by_row``, ``[channel kernel
    row, row]`` from ``origin``: tap ``t`` is on kernel row ``t // row_taps``) and column
    (``by_col``, ``[channel tap, column]``), whose outer product counts them."""

    def __init__(
        self,
        attrs: Attrs,
        spatial: Sequence[int],
        outs: Sequence[int],
        src: Layout,
        dst: Layout,
        origin: tuple[int, int],
        extent: tuple[int, int],
        channels: np.ndarray,
    ):
        super().__init__(attrs, spatial, outs, src.shape[0], dst)
        self.src, self.taps = src, self.count.shape[0]
        copies = (channels.size, 1)
        self.reads = np.tile(self.count, copies)
        rows = source_rows(self.image_row[None], spatial, src, channels[:, None, None])
        self.source_row = rows.reshape(self.reads.shape)
        self.first_col, self.last_col = (
            np.tile(self.column(o, self.start[:, None]), copies) for o in (self.low, self.high - 1)
        )
        # by row, the taps of one kernel row (all axes but the last) read alike: each window
        # line once (its first segment), from the row of its image row
        self.row_taps = attrs["kernel"][-1]
        leading = slice(None, None, self.row_taps)
        first = run_starts(self.line)
        line_rows = rows[:, leading][:, :, first] - origin[0]  # [channel, kernel row, line]
        valid = np.broadcast_to(self.valid[leading][:, first], line_rows.shape)
        kernel_rows = np.arange(valid.shape[0] * valid.shape[1]).reshape(valid.shape[:2])
        at = (kernel_rows[..., None] * extent[0] + line_rows)[valid]
        self.by_row = np.bincount(at, minlength=kernel_rows.size * extent[0]).reshape(-1, extent[0])
        by_col = _histogram(
            self.spans[-1], self.stride, self.start, src.ct, src.col0 - origin[1], extent[1]
        )
        self.by_col = np.tile(by_col, copies)

    def column(self, o: np.ndarray, start: np.ndarray) -> np.ndarray:
        """The source PE column of the pixel that window ``o`` of the last axis reads, where
        window 0 reads ``start``."""
        column: np.ndarray = self.src.col0 + (self.stride * o + start) // self.src.ct
        return column

    def staying(self, taps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(channel tap, source PE row, source PE column)`` of every read of the channel
        taps ``taps`` whose source and destination PE rows are one: the segments on their own
        row, window by window."""
        source_row, count = self.source_row[taps], self.reads[taps]
        tap, segment = np.nonzero((source_row == self.dst_row) & (count > 0))
        own = taps % self.taps
        at, o = progressions(self.low[own][tap, segment], count[tap, segment])
        tap, segment = tap[at], segment[at]
        return taps[tap], source_row[tap, segment], self.column(o, self.start[own][tap])


def source_rows(
    image_row: np.ndarray, spatial: Sequence[int], src: Layout, channel: np.ndarray | int = 0
) -> np.ndarray:
    """The source PE row of image rows of ``channel`` of a channels-first image: the PE row
    of their position along the last spatial axis but one, or, folded, of their matrix row
    (the sample's channels' leading positions, row-major)."""
    if not src.fold:
        rows: np.ndarray = src.row0 + image_row % spatial[-2] // src.rt
        return rows
    lines = prod(spatial[:-1])
    sample, position = np.divmod(image_row, lines)
    folded: np.ndarray = src.row0 + ((sample * src.shape[1] + channel) * lines + position) // src.rt
    return folded


@dataclass
class Runs:
    """Distinct pixels read, by runs along image rows, ``stride`` positions apart: each run's
    term, image row, destination PE row, first position along its row and pixels."""

    term: np.ndarray
    image_row: np.ndarray
    dst_row: np.ndarray
    first: np.ndarray
    count: np.ndarray
    stride: int

    def pieces(self, base: np.ndarray | int, tile: int) -> tuple[np.ndarray, ...]:
        """The runs split by blocks of ``tile`` positions, a run's positions counted from
        its ``base``: ``(run, block, pixels)`` of every block a run has pixels in, in the
        runs' order."""
        first = base + self.first
        last = first + self.stride * (self.count - 1)
        run, block = progressions(first // tile, last // tile - first // tile + 1)
        start = first[run]
        low = np.maximum(start, block * tile) - start
        high = np.minimum(last[run], (block + 1) * tile - 1) - start
        pixels = high // self.stride + low // -self.stride + 1  # floor less ceiling
        some = pixels > 0
        return run[some], block[some], pixels[some]

    def of_terms(self, of: np.ndarray) -> Runs:
        """The runs of new terms, term ``p`` holding the runs of term ``of[p]`` (as many
        channels' taps read the same pixels of their own planes)."""
        bounds = np.searchsorted(self.term, np.arange(int(of.max(initial=0)) + 2))
        term, run = progressions(bounds[of], bounds[of + 1] - bounds[of])
        return Runs(
            term,
            self.image_row[run],
            self.dst_row[run],
            self.first[run],
            self.count[run],
            self.stride,
        )

    def staying(self, source_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(run, position)`` of every pixel of the runs from ``source_row`` (per run) to
        their own destination PE row, pixel by pixel."""
        return progressions(self.first, self.count, self.stride, source_row == self.dst_row)


def progressions(
    first: np.ndarray, count: np.ndarray, stride: int = 1, keep: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Every element of the progressions ``first + stride * i`` (``i < count``) of ``keep``:
    ``(progression, element)``."""
    chosen = np.flatnonzero(count if keep is None else keep & (count > 0))
    many = count[chosen]
    offset = np.arange(many.sum()) - np.repeat(np.cumsum(many) - many, many)
    at = np.repeat(chosen, many)
    return at, first[at] + stride * offset


def _segments(
    samples: int, outs: Sequence[int], dst: Layout
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(window line, first window, end window, destination PE row)`` of every segment."""
    lines, width = samples * prod(outs[:-1]), outs[-1]
    first = np.arange(lines) * width // dst.rt
    line, row = progressions(first, (np.arange(1, lines + 1) * width - 1) // dst.rt - first + 1)
    low = np.maximum(row * dst.rt - line * width, 0)
    high = np.minimum((row + 1) * dst.rt - line * width, width)
    return line, low, high, dst.row0 + row


def _span(size: int, count: int, stride: int, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first and the end window (of ``count``) reading inside an axis of ``size``, where
    window 0 reads ``start`` (per tap): as ``ref_movement.tap_slices``, for many taps."""
    first = np.clip(-(start // stride), 0, count)
    end = np.clip((size - 1 - start) // stride + 1, first, count)
    return first, end


def _histogram(
    span: tuple[np.ndarray, np.ndarray],
    stride: int,
    start: np.ndarray,
    tile: int,
    offset: int,
    extent: int,
) -> np.ndarray:
    """``[tap, PE]``: each tap's windows in ``span`` by the PE (of ``tile`` positions, from
    ``offset``) of the position they read, ``stride * o + start``."""
    first, end = span
    o = np.arange(int(end.max(initial=0)))
    inside = (o[None, :] >= first[:, None]) & (o[None, :] < end[:, None])
    pe = offset + (stride * o[None, :] + start[:, None]) // tile
    tap = np.broadcast_to(np.arange(first.size)[:, None], pe.shape)
    at = np.where(inside, tap * extent + pe, 0)  # outside reads nothing, anywhere
    return np.bincount(at.ravel(), inside.ravel(), first.size * extent).reshape(first.size, extent)
