"""Tensors with numbers on the simulated mesh: per-PE tiles as one numpy array.

A ``DistTensor`` holds the tiles of a tensor in a ``Layout`` as one array
``[h, w, *batch, rt, ct]`` (zero padded), so a kernel step is one numpy operation over all PEs.

Either form of its numbers makes the other: the tiles (the PEs' view) and the logical array
(what the tiles hold, without the padding). A tensor keeps the form it was made in and makes
the other only when a kernel asks for it, then keeps both, so that kernels that compute on the
logical arrays (data movement, and the arithmetic whose numbers do not depend on the split)
never pay for splitting a tensor into tiles and joining it again. Neither form is ever
changed in place once a kernel has made it.

A third form defers both: a ``Deferred`` recipe for the logical array (a convolution's
patches, kept as its image), made only when a kernel that cannot use the recipe itself asks.

Other forms a kernel makes of a tensor's numbers (a filter's rows in the order of the patches
it multiplies) it keeps with the tensor (``DistTensor.derived``): the numbers never change, and
a weight's tensor may serve many runs (``cgc.runtime.memoryx.Derived``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Protocol

import numpy as np

from cgc.machine.hardware import dtypes
from cgc.machine.movement.layout import Layout


class Deferred(Protocol):
    """A logical array not made yet: what a kernel makes cheaper than its result, for kernels
    that can consume it as it is."""

    def array(self) -> np.ndarray:
        """The logical array, made now."""
        ...


class DistTensor:
    """A tensor on the mesh: its layout, and its tiles ``[h, w, *batch, rt, ct]`` or its
    logical array (or both), or the recipe of its logical array."""

    __slots__ = ("_array", "_derived", "_recipe", "_tiles", "layout")

    def __init__(
        self,
        layout: Layout,
        tiles: np.ndarray | None = None,
        *,
        array: np.ndarray | None = None,
        recipe: Deferred | None = None,
    ):
        assert tiles is not None or array is not None or recipe is not None, "no numbers"
        assert tiles is None or tiles.shape == layout.tile_shape(), (tiles.shape, layout)
        assert array is None or array.shape == layout.shape, (array.shape, layout)
        self.layout = layout
        self._tiles = tiles
        self._array = array
        self._recipe = recipe
        self._derived: dict[Hashable, np.ndarray] = {}

    @classmethod
    def scatter(cls, array: np.ndarray, layout: Layout) -> DistTensor:
        """A logical array laid out in ``layout`` (split into tiles when asked for them)."""
        logical = np.asarray(array, dtype=layout.dtype).reshape(layout.shape)
        return cls(layout, array=logical)

    @property
    def has_array(self) -> bool:
        """Whether the logical array is at hand, or made without joining the tiles."""
        return self._array is not None or self._tiles is None

    @property
    def deferred(self) -> Deferred | None:
        """The recipe of the logical array while neither it nor the tiles are made."""
        return self._recipe if self._array is None and self._tiles is None else None

    @property
    def tiles(self) -> np.ndarray:
        """The tiles ``[h, w, *batch, rt, ct]``, their padding zero if made from the array."""
        if self._tiles is None:
            self._tiles = _split(self.gather(), self.layout)
        return self._tiles

    def gather(self) -> np.ndarray:
        """The logical array (not to be changed in place: the tensor keeps it)."""
        if self._array is None:
            if self._tiles is not None:
                self._array = _join(self._tiles, self.layout)
            else:
                assert self._recipe is not None
                self._array = self._recipe.array().reshape(self.layout.shape)
        return self._array

    def derived(self, key: Hashable, make: Callable[[], np.ndarray]) -> np.ndarray:
        """The form of the tensor's numbers that ``make`` makes, by ``key``: made once and kept
        with the tensor (not to be changed in place)."""
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def relaid(self, layout: Layout) -> DistTensor:
        """The same numbers in ``layout`` (of the same shape and type); a recipe stays one."""
        recipe = self.deferred
        if recipe is not None:
            return DistTensor(layout, recipe=recipe)
        return DistTensor(layout, array=self.gather())

    def masked(self, fill: float) -> np.ndarray:
        """The tiles with every padding element replaced by ``fill``."""
        lay = self.layout
        if lay.rows == lay.h * lay.rt and lay.cols == lay.w * lay.ct:
            return self.tiles
        return np.where(lay.valid_mask(), self.tiles, _fill_value(fill, self.tiles.dtype))


def _split(array: np.ndarray, lay: Layout) -> np.ndarray:
    """The tiles of a logical array, zero padded: the whole blocks in one copy, the blocks
    cut short by the padding in up to three more."""
    nb = len(lay.batch)
    matrix = array.reshape(*lay.batch, lay.rows, lay.cols)
    tiles = np.empty(lay.tile_shape(), dtype=lay.dtype)
    if lay.rows != lay.h * lay.rt or lay.cols != lay.w * lay.ct or not matrix.size:
        tiles[...] = 0
        if not matrix.size:
            return tiles
    # the tile array seen as the padded matrices' blocks [*batch, h, rt, w, ct]
    blocks = np.moveaxis(tiles, (0, 1), (nb, nb + 2))
    whole_h, rest_h = divmod(lay.rows, lay.rt)
    whole_w, rest_w = divmod(lay.cols, lay.ct)
    for i, rows in ((slice(0, whole_h), lay.rt), (slice(whole_h, whole_h + 1), rest_h)):
        for j, cols in ((slice(0, whole_w), lay.ct), (slice(whole_w, whole_w + 1), rest_w)):
            part = matrix[
                ..., i.start * lay.rt : i.stop * lay.rt, j.start * lay.ct : j.stop * lay.ct
            ]
            if part.size:
                shape = (*lay.batch, i.stop - i.start, rows, j.stop - j.start, cols)
                blocks[..., i, :rows, j, :cols] = part.reshape(shape)
    return tiles


def _join(tiles: np.ndarray, lay: Layout) -> np.ndarray:
    """The logical array of tiles (one copy)."""
    nb = len(lay.batch)
    blocks = np.moveaxis(tiles, (0, 1), (nb, nb + 2))
    matrix = blocks.reshape(*lay.batch, lay.h * lay.rt, lay.w * lay.ct)
    return np.ascontiguousarray(matrix[..., : lay.rows, : lay.cols]).reshape(lay.shape)


def _fill_value(fill: float, dtype: np.dtype) -> np.ndarray:
    """``fill`` in ``dtype``; infinities become the extreme values of integer and bool types."""
    if dtype.kind == "b":
        return np.asarray(fill > 0)
    if dtypes.is_integer(dtype):
        info = np.iinfo(dtype)
        return np.asarray(min(max(fill, info.min), info.max), dtype=dtype)
    return np.asarray(fill, dtype=dtype)
