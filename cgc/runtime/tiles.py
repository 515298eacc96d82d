"""Tensors with numbers on the simulated mesh: per-PE tiles as one numpy array.

A ``DistTensor`` holds the tiles of a tensor in a ``Layout`` as one array
``[h, w, *batch, rt, ct]`` (zero padded), so a kernel step is one numpy operation over all PEs.
"""

from __future__ import annotations

import numpy as np

from cgc.machine import dtypes
from cgc.machine.layout import Layout


class DistTensor:
    """A tensor on the mesh: its layout and its tiles ``[h, w, *batch, rt, ct]``."""

    __slots__ = ("layout", "tiles")

    def __init__(self, layout: Layout, tiles: np.ndarray):
        assert tiles.shape == layout.tile_shape(), (tiles.shape, layout)
        self.layout = layout
        self.tiles = tiles

    @classmethod
    def scatter(cls, array: np.ndarray, layout: Layout) -> DistTensor:
        """Splits a logical array into tiles (the inverse of ``gather``)."""
        lay = layout
        nb = len(lay.batch)
        matrix = np.asarray(array, dtype=lay.dtype).reshape(*lay.batch, lay.rows, lay.cols)
        pad = [(0, 0)] * nb + [(0, lay.h * lay.rt - lay.rows), (0, lay.w * lay.ct - lay.cols)]
        if any(p for _, p in pad):
            matrix = np.pad(matrix, pad)
        blocks = matrix.reshape(*lay.batch, lay.h, lay.rt, lay.w, lay.ct)
        tiles = np.moveaxis(blocks, (nb, nb + 2), (0, 1))
        return cls(lay, np.ascontiguousarray(tiles))

    def gather(self) -> np.ndarray:
        """The logical array."""
        lay = self.layout
        nb = len(lay.batch)
        blocks = np.moveaxis(self.tiles, (0, 1), (nb, nb + 2))
        matrix = blocks.reshape(*lay.batch, lay.h * lay.rt, lay.w * lay.ct)
        return np.ascontiguousarray(matrix[..., : lay.rows, : lay.cols]).reshape(lay.shape)

    def masked(self, fill: float) -> np.ndarray:
        """The tiles with every padding element replaced by ``fill``."""
        lay = self.layout
        if lay.rows == lay.h * lay.rt and lay.cols == lay.w * lay.ct:
            return self.tiles
        return np.where(lay.valid_mask(), self.tiles, _fill_value(fill, self.tiles.dtype))


def _fill_value(fill: float, dtype: np.dtype) -> np.ndarray:
    """``fill`` in ``dtype``; infinities become the extreme values of integer and bool types."""
    if dtype.kind == "b":
        return np.asarray(fill > 0)
    if dtypes.is_integer(dtype):
        info = np.iinfo(dtype)
        return np.asarray(min(max(fill, info.min), info.max), dtype=dtype)
    return np.asarray(fill, dtype=dtype)
