"""How a tensor lives on the mesh.

Every tensor on the wafer has one layout: viewed as a batch of matrices (the last two axes,
``R x C``; rank-1 tensors are ``1 x C``, scalars ``1 x 1``), each matrix is split into an
``h x w`` grid of blocks, block ``(i, j)`` on the PE at row ``row0 + i``, column ``col0 + j``.
Every PE holds its block of every matrix of the batch. This is the activation layout of the
Cerebras weight-streaming design: the hidden dimension along the mesh columns, samples (or
tokens) along the mesh rows.

A folded layout (``fold``) distributes the leading axes over the PEs too: its matrix is
``prod(shape[:-1]) x shape[-1]``, every leading axis flattened row-major into the rows (the
tokens of all samples of a batch, the pixels of all images), so a batch of ``B`` sequences of
``S`` tokens uses ``B * S`` rows of PEs where the batch-of-matrices view uses ``S``. Where the
leading axes before the last but one hold one element (ranks below 3 included), both views
are the same matrix, and the layout is the unfolded one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from math import ceil, prod

import numpy as np

from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import WAVELET_BYTES

Rect = tuple[int, int, int, int]
"""``(x, y, w, h)``: column and row of the top-left PE, width in columns, height in rows."""


def grid_extent(n: int, available: int) -> int:
    """PEs to split ``n`` items over, at most ``available``, with no PE left empty."""
    if n <= 0:
        return 1
    per = ceil(n / max(1, min(n, available)))
    return ceil(n / per)


def matrix_dims(shape: Sequence[int], fold: bool = False) -> tuple[tuple[int, ...], int, int]:
    """``(batch, R, C)`` of the matrix view of ``shape`` (folded: no batch, the leading axes
    flattened into the rows)."""
    if fold and len(shape) >= 2:
        return (), prod(shape[:-1]), shape[-1]
    if len(shape) >= 2:
        return tuple(shape[:-2]), shape[-2], shape[-1]
    if len(shape) == 1:
        return (), 1, shape[0]
    return (), 1, 1


def foldable(shape: Sequence[int]) -> bool:
    """Whether folding ``shape`` changes its matrix view: some leading axis before the last
    but one holds more than one element."""
    return prod(shape[:-2]) > 1


@dataclass(frozen=True)
class Layout:
    """A tensor of ``shape`` and ``dtype`` split over the PE grid at ``(row0, col0)``."""

    shape: tuple[int, ...]
    dtype: str
    row0: int
    col0: int
    h: int
    w: int
    fold: bool = False
    """Whether the leading axes are flattened into the matrix rows (see the module)."""

    def __post_init__(self) -> None:
        # one matrix view, one layout: a fold that changes nothing is no fold
        if self.fold and not foldable(self.shape):
            object.__setattr__(self, "fold", False)

    @classmethod
    def on(cls, shape: Sequence[int], dtype: str, rect: Rect, fold: bool = False) -> Layout:
        """The default layout of a tensor in a rectangle: as many PEs as useful, top-left."""
        _, rows, cols = matrix_dims(shape, fold)
        x, y, width, height = rect
        return cls(
            tuple(shape), dtype, y, x, grid_extent(rows, height), grid_extent(cols, width), fold
        )

    @cached_property
    def batch(self) -> tuple[int, ...]:
        """Leading axes that every PE holds whole."""
        return matrix_dims(self.shape, self.fold)[0]

    @cached_property
    def rows(self) -> int:
        """R: the matrix rows, split over the grid rows."""
        return matrix_dims(self.shape, self.fold)[1]

    @cached_property
    def cols(self) -> int:
        """C: the matrix columns, split over the grid columns."""
        return matrix_dims(self.shape, self.fold)[2]

    @cached_property
    def rt(self) -> int:
        """Tile rows per PE."""
        return ceil(self.rows / self.h)

    @cached_property
    def ct(self) -> int:
        """Tile columns per PE."""
        return ceil(self.cols / self.w)

    @cached_property
    def itemsize(self) -> int:
        """Bytes per element."""
        return dtypes.dtype(self.dtype).itemsize

    @property
    def words_per_element(self) -> float:
        """Wavelets per element: 16-bit values travel two to a wavelet."""
        return self.itemsize / WAVELET_BYTES

    @cached_property
    def tile_elements(self) -> int:
        """Elements each PE of the grid holds (padding included)."""
        return prod(self.batch) * self.rt * self.ct

    @cached_property
    def tile_bytes(self) -> int:
        """SRAM bytes each PE of the grid spends on this tensor."""
        return self.tile_elements * self.itemsize

    @property
    def pes(self) -> int:
        """PEs holding a part of the tensor."""
        return self.h * self.w

    @property
    def size(self) -> int:
        """Logical element count."""
        return prod(self.shape)

    @property
    def rect(self) -> Rect:
        """The grid as a rectangle ``(x, y, w, h)``."""
        return (self.col0, self.row0, self.w, self.h)

    def tile_shape(self) -> tuple[int, ...]:
        """Shape of the tile array of a DistTensor in this layout."""
        return (self.h, self.w, *self.batch, self.rt, self.ct)

    def row_pe(self, i: np.ndarray) -> np.ndarray:
        """Absolute mesh row of the PE holding matrix row ``i``."""
        return self.row0 + i // self.rt

    def col_pe(self, j: np.ndarray) -> np.ndarray:
        """Absolute mesh column of the PE holding matrix column ``j``."""
        return self.col0 + j // self.ct

    def valid_mask(self) -> np.ndarray:
        """Boolean mask, broadcastable to the tile array, of the non-padding elements."""
        r = np.arange(self.h)[:, None] * self.rt + np.arange(self.rt)[None, :] < self.rows
        c = np.arange(self.w)[:, None] * self.ct + np.arange(self.ct)[None, :] < self.cols
        nb = len(self.batch)
        rows = r.reshape(self.h, 1, *([1] * nb), self.rt, 1)
        cols = c.reshape(1, self.w, *([1] * nb), 1, self.ct)
        return rows & cols
