"""Index maps: a data movement described by the few digits that enumerate its reads.

A data movement (a relayout, reshape, transpose, broadcast, concat, slice, pad, reverse, tile,
one-hot, im2col, pooling windows, col2im) is an ``IndexMap``: the combinations of a few
``digits`` (a refinement of the result's axes, and the taps of a window) enumerate its reads,
and every coordinate of the element read, and of the reading element, is a function of some
digits (``Affine`` or ``Lookup``); a ``Block`` is the mesh row or column of the PE holding such
a coordinate. ``movement_map`` builds the index map of each op; ``flows.map_traffic`` counts
its traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from math import prod
from typing import Any

import numpy as np

from cgc.machine.layout import Layout
from cgc.machine.ref_movement import pad

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


# --------------------------------------------------------------------------- index maps


@dataclass(frozen=True, eq=False)
class Source:
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
    sources: tuple[Source, ...]


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
        return IndexMap(digits, out, patches, (Source(sources[0], image),))
    if name == "col2im":
        digits, patches, image = _im2col_digits(out.shape, attrs)
        return IndexMap(digits, out, image, (Source(sources[0], patches),))
    maps = tuple(
        Source(src, _axis_coords(name, attrs, k, [s.shape for s in sources], out.shape))
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
    one refinement."""
    places = _places(src.shape, dst.shape)
    digits = tuple(high // low for low, high in pairwise(places))
    source = Source(src, _radix_coords(src.shape, places))
    return IndexMap(digits, dst, _radix_coords(dst.shape, places), (source,))


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
    return IndexMap(tuple(digits.sizes), out, result, (Source(src, reads),))


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
