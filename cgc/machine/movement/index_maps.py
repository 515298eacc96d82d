"""Index maps: a data movement described by the few digits that enumerate its reads.

A data movement (a relayout, reshape, transpose, broadcast, concat, slice, pad, reverse, tile,
one-hot, im2col, pooling windows, col2im) is an ``IndexMap``: the combinations of a few
``digits`` (a refinement of the result's axes, and the taps of a window) enumerate its reads,
and every coordinate of the element read, and of the reading element, is a function of some
digits (``Affine`` or ``Lookup``); a ``Block`` is the mesh row or column of the PE holding such
a coordinate, and ``phase_classes`` sorts the values of a digit by where the blocks' tile ends
cut the rest of their coordinates, without listing the values. ``movement_map`` builds the
index map of each op; ``flows.map_traffic`` counts its traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from math import gcd, lcm, prod
from typing import Any

import numpy as np

from cgc.machine.movement.layout import Layout
from cgc.machine.reference.data_movement import pad

Attrs = Mapping[str, Any]
"""An op's attributes: plain JSON values."""

POOLS = ("max_pool", "avg_pool", "argmax_pool")
"""The pooling ops: their reads are the windows of ``reference.pool_windows``."""

Values = Mapping[int, np.ndarray]
"""Digit values by digit: arrays that broadcast together (an open grid)."""

# --------------------------------------------------------------------------- coordinates


@dataclass(frozen=True)
class Affine:
    """``((offset + sum of stride * digit) // divisor) % modulus``; -1 where ``offset + sum``
    falls outside ``[0, bound)``."""

    terms: tuple[tuple[int, int], ...] = ()
    """``(digit, stride)`` pairs, each digit once."""
    offset: int = 0
    bound: int | None = None
    divisor: int = 1
    modulus: int | None = None

    @property
    def digits(self) -> tuple[int, ...]:
        return tuple(d for d, _ in self.terms)

    @property
    def plain(self) -> bool:
        """Whether the coordinate is the sum itself."""
        return self.divisor == 1 and self.modulus is None

    def __call__(self, values: Values) -> np.ndarray:
        raw = np.asarray(self.offset, dtype=np.int64)
        for digit, stride in self.terms:
            raw = raw + stride * values[digit]
        value = raw // self.divisor if self.divisor != 1 else raw
        if self.modulus is not None:
            value = value % self.modulus
        if self.bound is None:
            return value
        return np.where((raw >= 0) & (raw < self.bound), value, -1)

    def always_valid(self, sizes: Sequence[int]) -> bool:
        """Whether no digit combination falls outside the bound."""
        if self.bound is None:
            return True
        low = self.offset + sum(min(0, s * (sizes[d] - 1)) for d, s in self.terms)
        high = self.offset + sum(max(0, s * (sizes[d] - 1)) for d, s in self.terms)
        return low >= 0 and high < self.bound

    def fix(self, digit: int, value: int) -> Affine:
        """The coordinate with ``digit`` held at ``value``."""
        stride = dict(self.terms).get(digit, 0)
        kept = tuple(t for t in self.terms if t[0] != digit)
        return replace(self, terms=kept, offset=self.offset + stride * value)

    def recovers(self, digit: int, sizes: Sequence[int]) -> bool:
        """Whether the coordinate's value determines ``digit``: it is a place of a mixed radix
        (the smaller strides cannot reach it; the larger are multiples of its whole span)."""
        strides = dict(self.terms)
        if digit not in strides or not self.plain or min(strides.values()) <= 0:
            return False
        own = strides[digit]
        others = [(d, s) for d, s in self.terms if d != digit]
        below = sum(s * (sizes[d] - 1) for d, s in others if s <= own)
        return below < own and all(s % (own * sizes[digit]) == 0 for _, s in others if s > own)


@dataclass(frozen=True, eq=False)
class Lookup:
    """``table[digit]``: a coordinate given by a table (-1 for none)."""

    digit: int
    table: np.ndarray

    @property
    def digits(self) -> tuple[int, ...]:
        return (self.digit,)

    def __call__(self, values: Values) -> np.ndarray:
        result: np.ndarray = self.table[values[self.digit]]
        return result

    def always_valid(self, sizes: Sequence[int]) -> bool:
        """Whether the table names an element everywhere."""
        return bool(self.table.min(initial=0) >= 0)

    def fix(self, digit: int, value: int) -> Coord:
        """The coordinate with ``digit`` held at ``value``."""
        return Affine((), int(self.table[value])) if digit == self.digit else self

    def recovers(self, digit: int, sizes: Sequence[int]) -> bool:
        """Whether the coordinate's value determines ``digit`` (where it names an element)."""
        named = self.table[self.table >= 0]
        return digit == self.digit and np.unique(named).size == named.size


Coord = Affine | Lookup
"""An element coordinate as a function of digits."""


def as_affine(coord: Coord) -> Affine | None:
    """``coord`` as an ``Affine`` if it is one, or a table that is: an arithmetic progression,
    maybe between runs of -1 that the raw sum leaves ``[0, bound)`` on (a slice, a reversal, a
    constant pad); else None."""
    if isinstance(coord, Affine):
        return coord
    table = coord.table
    named = np.flatnonzero(table >= 0)
    if not named.size or named[-1] - named[0] + 1 != named.size:
        return None
    first, last = int(named[0]), int(named[-1])
    start, end = int(table[first]), int(table[last])
    step = (end - start) // (last - first) if last > first else 1
    if step == 0 or not np.array_equal(table[named], start + step * (named - first)):
        return None
    offset = start - step * first
    if named.size == table.size:
        return Affine(((coord.digit, step),), offset)
    # the -1s on either side: the raw sum one step beyond either end must leave [0, bound)
    below = step > 0 and first > 0 and start >= step
    beyond = step < 0 and last < table.size - 1 and end >= -step
    if below or beyond:
        return None
    return Affine(((coord.digit, step),), offset, bound=max(start, end) + 1)


def gives_axes(coords: tuple[Coord, ...], layout: Layout) -> bool:
    """Whether ``coords`` give every axis of a folded layout (not its matrix row and column,
    as ``reshape_map`` gives them)."""
    return layout.fold and len(coords) == len(layout.shape)


def matrix_coords(coords: tuple[Coord, ...], layout: Layout) -> tuple[Coord, Coord] | None:
    """The matrix row and column of a tensor's coordinates (``layout.matrix_dims``): a folded
    layout's row is the row-major combination of its leading coordinates, one ``Affine`` (a
    ``Lookup`` of a slice, a constant pad or a reversal is one too); None where a leading
    coordinate is not (a tile's modulus, a reflecting pad)."""
    if gives_axes(coords, layout):
        row = _flattened(coords[:-1], layout.shape[:-1])
        return None if row is None else (row, coords[-1])
    if len(coords) >= 2:
        return coords[-2], coords[-1]
    return Affine(), coords[0] if coords else Affine()


def _flattened(coords: Sequence[Coord], shape: Sequence[int]) -> Affine | None:
    """The row-major index over axes of ``shape`` at ``coords``, if all of them are plain: the
    strides of a digit met in several axes add up; their bounds stay with the coordinates,
    which the counting checks on their own."""
    strides: dict[int, int] = {}
    offset = 0
    for axis, coord in enumerate(coords):
        plain = as_affine(coord)
        if plain is None or not plain.plain:
            return None
        place = prod(shape[axis + 1 :])
        offset += place * plain.offset
        for digit, stride in plain.terms:
            strides[digit] = strides.get(digit, 0) + place * stride
    return Affine(tuple((d, s) for d, s in sorted(strides.items()) if s), offset)


@dataclass(frozen=True)
class Block:
    """The mesh row (or column) of the PE holding matrix row (or column) ``coord``: ``base +
    coord // tile``; -1 where ``coord`` is."""

    coord: Coord
    tile: int
    base: int

    @property
    def digits(self) -> tuple[int, ...]:
        return self.coord.digits

    def __call__(self, values: Values) -> np.ndarray:
        at = self.coord(values)
        return np.where(at >= 0, self.base + at // self.tile, -1)

    def fix(self, digit: int, value: int) -> Block:
        """The PE coordinate with ``digit`` held at ``value``."""
        return replace(self, coord=self.coord.fix(digit, value))

    def recovers(self, digit: int, sizes: Sequence[int]) -> bool:
        """Whether the PE coordinate determines ``digit``: one element per PE."""
        return self.tile == 1 and self.coord.recovers(digit, sizes)


# --------------------------------------------------------------------------- phases

RUN_LIMIT = 1 << 20
"""Runs of values (``_runs``) that the phase classes of a digit may be found from."""


@dataclass(frozen=True)
class Phase:
    """The values of a digit that make one pattern of PEs in the blocks it enters (a plain
    term of each): the first such value, and how far (in PEs, along each block) the others
    move it, with how many values at each distance (``shifts[:, k]``, ``counts[k]``)."""

    value: int
    shifts: np.ndarray
    counts: np.ndarray


def phase_count(blocks: Sequence[Block], digit: int, sizes: Sequence[int]) -> int:
    """How many phase classes ``digit`` has in ``blocks`` at most, without listing its values
    (a digit can have billions): the phases of a step ``c`` in tiles of ``t`` repeat every
    ``t / gcd(c, t)`` values, those of several blocks every least common multiple; and in a
    coordinate whose other terms span ``W`` values, no more than ``W + 1`` phases differ
    (``_Line``): the rest of a sample's rows crosses a tile's end at as few places, however
    large the batch makes the tiles."""
    periods, keys = [], 1
    for b in blocks:
        line = _Line.of(b, digit, sizes)
        periods.append(line.tile // gcd(line.stride, line.tile))
        keys *= min(periods[-1], line.span + 1)
    return min(lcm(*periods), keys, sizes[digit])


def phase_classes(blocks: Sequence[Block], digit: int, sizes: Sequence[int]) -> list[Phase] | None:
    """The phase classes of ``digit`` in ``blocks``, in the order of their patterns, in closed
    form: the values fall into runs over which no block changes its PE or its pattern, and
    only the values near a tile's end are runs of one (None where that lists more than
    ``RUN_LIMIT`` runs)."""
    if not blocks:  # one class, whose values all have the PEs of the first
        return [Phase(0, np.zeros((0, 1), np.int64), np.array([float(sizes[digit])]))]
    lines = [_Line.of(b, digit, sizes) for b in blocks]
    runs = _runs(lines, sizes[digit])
    if runs is None:
        return None
    first, length = runs
    keys = np.array([line.key(first) for line in lines])
    shift = np.array([line.pe(first) for line in lines])
    _, leads, inverse = np.unique(keys, axis=1, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    distances = shift - shift[:, leads[inverse]]
    # one column per (class, distance), in class order and then in distance order
    rows, where = np.unique(np.vstack([inverse, distances]), axis=1, return_inverse=True)
    counts = np.bincount(where.reshape(-1), weights=length, minlength=rows.shape[1])
    bounds = np.searchsorted(rows[0], np.arange(len(leads) + 1))
    return [
        Phase(int(first[lead]), rows[1:, lo:hi], counts[lo:hi])
        for lead, lo, hi in zip(leads.tolist(), bounds[:-1], bounds[1:], strict=True)
    ]


@dataclass(frozen=True)
class _Line:
    """A PE coordinate as a function of one digit ``n``: the element coordinate runs over
    ``[u, u + span]`` with ``u = stride * n + low``, tiles of ``tile`` elements. The PE is
    ``u // tile + (u % tile + j) // tile``: ``u`` shifts the flows by ``u // tile`` PEs, and
    the pattern is that of the phase ``u % tile``, where all phases up to ``tile - 1 -
    span`` make the same one (no tile end within reach), so they share a key."""

    stride: int
    low: int
    span: int
    tile: int

    @classmethod
    def of(cls, b: Block, digit: int, sizes: Sequence[int]) -> _Line:
        assert isinstance(b.coord, Affine)
        terms = b.coord.terms
        others = [(s, sizes[d] - 1) for d, s in terms if d != digit]
        low = b.coord.offset + sum(min(0, s * top) for s, top in others)
        span = sum(abs(s) * top for s, top in others)
        return cls(dict(terms)[digit], low, span, b.tile)

    def pe(self, n: np.ndarray) -> np.ndarray:
        """How many PEs the values ``n`` move the coordinate."""
        moved: np.ndarray = (self.stride * n + self.low) // self.tile
        return moved

    def key(self, n: np.ndarray) -> np.ndarray:
        """The pattern class of the values ``n``."""
        phase = (self.stride * n + self.low) % self.tile
        key: np.ndarray = np.maximum(phase, self.tile - 1 - self.span)
        return key

    def cuts(self, size: int) -> np.ndarray | None:
        """The values in ``(0, size)`` at which the PE changes (None if too many)."""
        ends = self.pe(np.array([0, size - 1]))
        if abs(int(ends[1] - ends[0])) > RUN_LIMIT:
            return None
        step, t = abs(self.stride), self.tile
        if self.stride > 0:  # the first value whose coordinate reaches k * t
            k = np.arange(ends[0] + 1, ends[1] + 1)
            return -((self.low - k * t) // step)
        k = np.arange(ends[1] + 1, ends[0] + 1)  # the first value whose coordinate is below
        cut: np.ndarray = (self.low - k * t) // step + 1
        return cut

    def near(self, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """In runs ``[start, end)`` of one PE, where the values whose phase comes within
        ``span`` of the tile's end lie: before the first value returned (a falling
        coordinate) or from the second (a rising one)."""
        # the phase reaches tile - span where stride * n >= (q + 1) * t - span - low
        edge = (self.pe(start) + 1) * self.tile - self.span - self.low
        if self.stride > 0:
            return start, np.clip(-(-edge // self.stride), start, end)
        return np.clip((-edge) // -self.stride + 1, start, end), end


def _runs(lines: Sequence[_Line], size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The values ``[0, size)`` as runs (first values, lengths) within which every line
    has one PE and one key; None if they are more than ``RUN_LIMIT``."""
    cuts = [line.cuts(size) for line in lines]
    if any(c is None for c in cuts):
        return None
    bounds = np.unique(np.concatenate([[0, size], *(c for c in cuts if c is not None)]))
    start, end = bounds[:-1], bounds[1:]
    head, tail = start, end  # values before head or from tail are listed one by one
    for line in lines:
        before, after = line.near(start, end)
        head, tail = np.maximum(head, before), np.minimum(tail, after)
    tail = np.maximum(tail, head)
    before, after = _ranges(start, head), _ranges(tail, end)
    if before.size + after.size + start.size > RUN_LIMIT:
        return None
    middle = head < tail
    first = np.concatenate([before, head[middle], after])
    ones = np.ones(before.size + after.size, np.int64)
    length = np.concatenate([ones[: before.size], (tail - head)[middle], ones[before.size :]])
    order = np.argsort(first, kind="stable")
    return first[order], length[order]


def _ranges(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The integers of the ranges ``[start, end)``, in order."""
    lengths = end - start
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
    values: np.ndarray = np.repeat(start, lengths) + np.arange(lengths.sum()) - offsets
    return values


# --------------------------------------------------------------------------- index maps


@dataclass(frozen=True, eq=False)
class IndexedSource:
    """A tensor read by an index map: ``coords`` give each of its axes."""

    layout: Layout
    coords: tuple[Coord, ...]


@dataclass(frozen=True, eq=False)
class IndexMap:
    """A data movement into ``dst``: every combination of the ``digits`` (their sizes) is one
    read, by the element of ``dst`` at ``dst_coords``, of the element at each source's
    coordinates (where all are valid)."""

    digits: tuple[int, ...]
    dst: Layout
    dst_coords: tuple[Coord, ...]
    sources: tuple[IndexedSource, ...]


class _Digits:
    """Digit sizes handed out one at a time."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def new(self, size: int) -> int:
        self.sizes.append(size)
        return len(self.sizes) - 1


def identity(digit: int) -> Affine:
    """The coordinate equal to ``digit``."""
    return Affine(((digit, 1),))


def movement_map(name: str, attrs: Attrs, sources: Sequence[Layout], out: Layout) -> IndexMap:
    """The index map of data-movement op ``name`` (a ``reference.MOVEMENT`` op, one_hot, a
    pooling window, col2im) from ``sources`` into ``out``."""
    if name == "reshape":
        return reshape_map(sources[0], out)
    if name in POOLS:
        return pool_map(sources[0], out, attrs)
    if name == "im2col":
        digits, patches, image = _im2col_digits(sources[0].shape, attrs)
        return IndexMap(digits, out, patches, (IndexedSource(sources[0], image),))
    if name == "col2im":
        digits, patches, image = _im2col_digits(out.shape, attrs)
        return IndexMap(digits, out, image, (IndexedSource(sources[0], patches),))
    maps = tuple(
        IndexedSource(src, _axis_coords(name, attrs, k, [s.shape for s in sources], out.shape))
        for k, src in enumerate(sources)
    )
    return IndexMap(out.shape, out, tuple(map(identity, range(len(out.shape)))), maps)


def _axis_coords(
    name: str, attrs: Attrs, k: int, shapes: Sequence[tuple[int, ...]], result: tuple[int, ...]
) -> tuple[Coord, ...]:
    """Source ``k``'s coordinates for an op that reads every source axis from one result
    axis (the result's axes are the digits)."""
    shape, rank = shapes[k], len(result)
    lead = rank - len(shape)
    if name == "transpose":
        return tuple(identity(int(a)) for a in np.argsort(attrs["perm"]))
    if name in ("slice", "pad", "reverse"):
        return tuple(Lookup(a, _axis_table(name, attrs, a, shape)) for a in range(len(shape)))
    if name == "tile":
        return tuple(Affine(((lead + a, 1),), modulus=n) for a, n in enumerate(shape))
    if name == "broadcast_to":
        return tuple(Affine() if n == 1 else identity(lead + a) for a, n in enumerate(shape))
    if name == "one_hot":
        return tuple(map(identity, range(len(shape))))
    if name == "concat":
        axis = attrs["axis"] % rank
        start = sum(s[axis] for s in shapes[:k])
        along = Affine(((axis, 1),), -start, bound=shape[axis])
        return tuple(along if a == axis else identity(a) for a in range(rank))
    raise KeyError(name)


def _axis_table(name: str, attrs: Attrs, axis: int, shape: tuple[int, ...]) -> np.ndarray:
    """The source index of every result index along ``axis`` (-1 for none): the op applied to
    the indices of that axis."""
    ids = np.arange(shape[axis])
    if name == "slice":
        return ids[slice(attrs["starts"][axis], attrs["limits"][axis], attrs["strides"][axis])]
    if name == "pad":
        low, high = [attrs["low"][axis]], [attrs["high"][axis]]
        return pad(ids, low, high, -1, attrs.get("mode", "constant"))
    flipped = {a % len(shape) for a in attrs["axes"]}
    return ids[::-1] if axis in flipped else ids


def reshape_map(src: Layout, dst: Layout) -> IndexMap:
    """The index map of a reshape: the axes of both shapes as mixed radices over the digits of
    one refinement; a folded layout's by its matrix row and column (one plain coordinate
    each, where its axes could need a divisor and a modulus)."""
    src_axes, dst_axes = _reshape_axes(src), _reshape_axes(dst)
    places = _places(src_axes, dst_axes)
    digits = tuple(high // low for low, high in pairwise(places))
    source = IndexedSource(src, _radix_coords(src_axes, places))
    return IndexMap(digits, dst, _radix_coords(dst_axes, places), (source,))


def _reshape_axes(layout: Layout) -> tuple[int, ...]:
    """The axes a reshape's coordinates give: the matrix row and column of a folded layout,
    every axis of the others."""
    return (layout.rows, layout.cols) if layout.fold else layout.shape


def _places(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """The place values of the digits of a reshape, then the size: a chain in which each
    divides the next, holding every axis boundary of ``a`` and ``b`` that such a chain can
    (where none can, one digit spans the conflicting boundaries)."""
    bounds = {prod(a[k:]) for k in range(len(a) + 1)} | {prod(b[k:]) for k in range(len(b) + 1)}
    places = [1]
    for bound in sorted(bounds - {1}):
        if bound % places[-1] == 0:
            places.append(bound)
    return places


def _radix_coords(shape: Sequence[int], places: Sequence[int]) -> tuple[Coord, ...]:
    """Each axis of ``shape`` (row-major over the same elements) as a function of the digits
    at ``places``: the digits its span covers, and lower ones whose carries reach it."""
    coords: list[Coord] = []
    for axis, n in enumerate(shape):
        stride = prod(shape[axis + 1 :])
        if n == 1:
            coords.append(Affine())
            continue
        low = max(i for i, p in enumerate(places[:-1]) if stride % p == 0)
        high = min(i for i, p in enumerate(places) if p % (stride * n) == 0)
        terms = tuple((i, places[i]) for i in range(low, high))
        if places[low] == stride and places[high] == stride * n:
            coords.append(Affine(tuple((i, p // stride) for i, p in terms)))
        else:
            coords.append(Affine(terms, divisor=stride, modulus=n))
    return tuple(coords)


def pool_map(src: Layout, out: Layout, attrs: Attrs) -> IndexMap:
    """The index map of a pooling op's windows (``reference.pool_windows``): every result
    element reads its window's taps."""
    last = attrs.get("channels_last", False)
    digits = _Digits()
    n, c = digits.new(src.shape[0]), digits.new(src.shape[-1] if last else src.shape[1])
    spatial = src.shape[1:-1] if last else src.shape[2:]
    outs, _, image = _windows(digits, spatial, attrs)
    sample, channel = identity(n), identity(c)
    if last:
        reads = (sample, *image, channel)
        result = (sample, *map(identity, outs), channel)
    else:
        reads = (sample, channel, *image)
        result = (sample, channel, *map(identity, outs))
    return IndexMap(tuple(digits.sizes), out, result, (IndexedSource(src, reads),))


def _windows(
    digits: _Digits, spatial: Sequence[int], attrs: Attrs
) -> tuple[list[int], list[int], list[Coord]]:
    """The output and tap digits of sliding windows over ``spatial`` axes
    (``ref_movement.windows``), and the coordinate each pair reads (-1 in the padding)."""
    kernel, strides, pads, dilations = (
        attrs[k] for k in ("kernel", "strides", "pads", "dilations")
    )
    outs: list[int] = []
    taps: list[int] = []
    reads: list[Coord] = []
    for i, (size, k) in enumerate(zip(spatial, kernel, strict=True)):
        low, high = pads[i], pads[len(kernel) + i]
        span = dilations[i] * (k - 1) + 1
        o, t = digits.new(max(0, (size + low + high - span) // strides[i] + 1)), digits.new(k)
        outs.append(o)
        taps.append(t)
        reads.append(Affine(((o, strides[i]), (t, dilations[i])), -low, bound=size))
    return outs, taps, reads


def _im2col_digits(
    image: Sequence[int], attrs: Attrs
) -> tuple[tuple[int, ...], tuple[Coord, ...], tuple[Coord, ...]]:
    """``(digits, patch coordinates, image coordinates)`` of im2col on an image of shape
    ``image`` (``ref_movement.im2col``): patch ``[g, (n, *out), (c, *kernel)]`` reads image
    ``[n, g * C/g + c, *(stride * out + dilation * tap - pad)]``."""
    last = attrs.get("channels_last", False)
    group = attrs["group"]
    channels = image[-1] if last else image[1]
    spatial = image[1:-1] if last else image[2:]
    digits = _Digits()
    g, n = digits.new(group), digits.new(image[0])
    outs, taps, reads = _windows(digits, spatial, attrs)
    c = digits.new(channels // group)
    sizes = digits.sizes
    row = _mixed([n, *outs], sizes)
    col = _mixed([c, *taps], sizes)
    channel = Affine(((g, sizes[c]), (c, 1)))
    sample = identity(n)
    pixels = (sample, *reads, channel) if last else (sample, channel, *reads)
    return tuple(sizes), (identity(g), row, col), pixels


def _mixed(digits: Sequence[int], sizes: Sequence[int]) -> Affine:
    """The row-major index over ``digits``."""
    strides = [prod(sizes[d] for d in digits[k + 1 :]) for k in range(len(digits))]
    return Affine(tuple(zip(digits, strides, strict=True)))


def relative_places(grids: Sequence[Layout]) -> list[tuple[object, ...]]:
    """What the traffic between ``grids`` depends on in each: its shape, element size, grid
    and fold, and its place relative to their common top-left corner (a movement moved by
    whole PEs has the same traffic)."""
    row0, col0 = min(g.row0 for g in grids), min(g.col0 for g in grids)
    return [(g.shape, g.itemsize, g.row0 - row0, g.col0 - col0, g.h, g.w, g.fold) for g in grids]


class Structure:
    """An index map compared by what its traffic depends on (``key``): its digits and
    coordinates, and its layouts relative to their common top-left corner (a movement moved by
    whole PEs has the same traffic), with their element sizes."""

    def __init__(self, index_map: IndexMap):
        self.index_map = index_map
        dst, *sources = relative_places([index_map.dst, *(s.layout for s in index_map.sources)])
        self.key = (
            index_map.digits,
            dst,
            tuple(map(_coord_key, index_map.dst_coords)),
            tuple(
                (place, tuple(map(_coord_key, s.coords)))
                for place, s in zip(sources, index_map.sources, strict=True)
            ),
        )
        self.hash = hash(self.key)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Structure) and self.key == other.key


def _coord_key(coord: Coord) -> object:
    """A hashable value, equal for equal coordinates."""
    if isinstance(coord, Lookup):
        return ("lookup", coord.digit, coord.table.dtype.str, coord.table.tobytes())
    return coord
