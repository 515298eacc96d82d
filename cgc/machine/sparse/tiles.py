"""Sparse weights as the machine sees them: live values counted per weight-streaming tile,
each tile streamed in the encoding that suits it, and what a PE pays for it.

The weight-streaming matmul (``plans.sparse``) cuts a streamed weight ``[.., K, N]`` into
tiles of ``kb`` rows by ``nt`` columns: PE column ``c`` receives rows ``c*kb...`` of the
output columns of chunk ``j``. MemoryX keeps every tile of a sparse weight in one of three
encodings and streams it as such; it picks per tile the one that lets the PE finish the tile
soonest (its arrival and its arithmetic overlap: the longer counts), of fewest 32-bit
wavelets on a tie:

* ``dense``: every value, zeros included (``S`` values for a tile of ``S``): no metadata, and
  the PE multiplies the zeros as a dense tile's FMACs;
* ``coordinate``: each live value with its 16-bit row index inside the tile (one wavelet per
  16-bit value, one and a half per 32-bit one), and one control wavelet per output column,
  which points the PE's accumulation at the next column: best for sparse tiles;
* ``bitmap``: the live values and one bit per position: best for tiles about half live, where
  a row index per value costs more than a bit per position.

A PE does one AXPY per live weight it receives (the weight times its rows of the activations'
column ``k``, into the partial sums of column ``n``): the vector op's cycles, plus
``INDEX_CYCLES`` to decode the index and point the op at its operands, plus per tile the
encoding's fixed work (a control wavelet per column, a bitmap word per 32 positions). The
columns of PEs then sum their partials along the row, chunk by chunk, so the imbalance of the
mask between columns costs time (``plans.sparse`` says how much).

Which values live comes from the mask where the timing can have it: a weight of at most
``MASK_LIMIT`` values whose mask is known (random masks from their seed; a magnitude or
detected mask from the values). For a larger weight, or one whose values a timing-only run
does not have, the counts per tile are those of a uniformly random mask with the weight's
live count: a multivariate hypergeometric draw over the tiles from the seed, never
materializing the mask, the same for every weight of that shape and density (so the layers
of a deep model that repeat one structure are timed once). Numeric and timing-only runs
follow the same rule, so they time alike.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from cgc.errors import CgcError
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import WAVELET_BYTES
from cgc.machine.movement.layout import grid_extent
from cgc.machine.reference.data_movement import weight_view
from cgc.machine.sparse.sparsity import live_count, mask

MASK_LIMIT = 1 << 20
"""Most values of a weight whose tiles are counted from its mask."""
FORMATS = ("dense", "coordinate", "bitmap")
"""The encodings of a streamed tile, in order of preference on a tie."""
INDEX_BITS = 16
"""A coordinate's row index: tiles have at most 65536 rows."""
INDEX_CYCLES = 1
"""A PE's cycles per live weight beyond its AXPY: decoding the index and pointing the vector
op at the activations' column and the partial sums' column (a modelling choice)."""


@dataclass(frozen=True)
class SparseWeight:
    """One sparse weight: its stored shape, its live values, and its mask if known. Two
    compare equal when they stream and cost alike: the same shape, live count and mask (or
    the same seed, when the mask is not known)."""

    name: str = field(compare=False)
    shape: tuple[int, ...]
    live: int
    seed: int
    dense_gradient: bool = False
    """MemoryX needs its dense gradient (its mask moves where the gradient is largest:
    RigL's regrowth), so the wafer forms and sends it whole."""
    bits: bytes | None = field(default=None, compare=False, repr=False)
    """The mask, ``np.packbits`` of its values in row-major order; None: not known."""
    digest: str = ""
    """Of ``bits``: two weights with equal masks compare equal."""

    @property
    def size(self) -> int:
        """Values of the weight, live or not."""
        return math.prod(self.shape)

    @property
    def density(self) -> float:
        """The fraction of its values that live."""
        return self.live / self.size

    def mask(self) -> np.ndarray | None:
        """The boolean mask in the stored shape, if known."""
        if self.bits is None:
            return None
        flat = np.unpackbits(np.frombuffer(self.bits, np.uint8), count=self.size)
        return flat.astype(bool).reshape(self.shape)


def with_mask(name: str, live: np.ndarray, seed: int, dense_gradient: bool = False) -> SparseWeight:
    """The sparse weight whose mask is ``live``."""
    bits = np.packbits(live.ravel()).tobytes()
    return SparseWeight(
        name, tuple(live.shape), int(live.sum()), seed, dense_gradient, bits,
        hashlib.sha256(bits).hexdigest(),
    )  # fmt: skip


def sparse_weights(
    record: Mapping[str, Any] | None,
    shapes: Mapping[str, Sequence[int]],
    values: Mapping[str, np.ndarray],
) -> dict[str, SparseWeight]:
    """The sparse weights of a manifest's sparsity ``record`` (``Sparsity.to_json``): their
    masks from the seed or from ``values`` (the weights' initial values, where known) for
    those of at most ``MASK_LIMIT`` values, else their live counts alone; a weight all of
    whose values live is dense."""
    if record is None:
        return {}
    density, init, seed = record["density"], record["init"], record["seed"]
    # RigL's regrowth needs the dense gradient, every step as cgc counts it (an upper bound:
    # it is read on update steps only); SET's random regrowth needs only the live values
    dense = record.get("schedule") == "dynamic" and record.get("regrow") == "gradient"
    out = {}
    for name in record["weights"]:
        shape = tuple(shapes[name])
        size = math.prod(shape)
        if init != "detected" and live_count(size, density) == size:  # dense after all
            continue
        initial = values.get(name)
        if init == "detected":  # its zeros are its dead values
            if initial is None:
                raise CgcError(f"sparsity: weight '{name}' has a detected mask but no values")
            out[name] = with_mask(name, initial != 0, seed, dense)
            continue
        if initial is None and init == "random":
            initial = np.broadcast_to(np.float32(0), shape)  # a random mask needs no values
        if size > MASK_LIMIT or initial is None:
            out[name] = SparseWeight(name, shape, live_count(size, density), seed, dense)
        else:
            out[name] = with_mask(name, mask(name, initial, density, init, seed), seed, dense)
    return out


@dataclass(frozen=True)
class TileGrid:
    """A weight's view ``[.., K, N]`` cut into tiles of ``kb`` rows by ``nt`` columns (the
    leading axes, if any, stacked in every tile)."""

    rows: int
    cols: int
    kb: int
    nt: int
    lead: tuple[int, ...] = ()
    """The view's leading axes."""

    @property
    def stacked(self) -> int:
        """Matrices stacked in every tile."""
        return math.prod(self.lead)

    @property
    def shape(self) -> tuple[int, ...]:
        """The view's shape."""
        return (*self.lead, self.rows, self.cols)

    @property
    def row_sizes(self) -> np.ndarray:
        """Rows of each tile row (the last may be short)."""
        return _sizes(self.rows, self.kb)

    @property
    def col_sizes(self) -> np.ndarray:
        """Columns of each tile column."""
        return _sizes(self.cols, self.nt)

    @property
    def sizes(self) -> np.ndarray:
        """Values per tile, ``[row tiles, column tiles]``."""
        return self.stacked * np.outer(self.row_sizes, self.col_sizes)


def _sizes(n: int, per: int) -> np.ndarray:
    full, rest = divmod(n, per)
    return np.array([per] * full + ([rest] if rest else []), dtype=np.int64)


@lru_cache(maxsize=16)
def tile_counts(weight: SparseWeight, perm: tuple[int, ...] | None, grid: TileGrid) -> np.ndarray:
    """Live values per tile of the view ``perm`` of ``weight`` (``[row tiles, column
    tiles]``; the view's shape is the grid's: as ``ref_movement.weight_view`` reads it), from
    its mask if known, else drawn as those of a uniformly random mask."""
    live = weight.mask()
    if live is None:  # one draw for all weights alike: their layers cost the same
        key = [weight.seed, weight.live, grid.rows, grid.cols, grid.kb, grid.nt, *(perm or ())]
        sizes = grid.sizes
        rng = np.random.default_rng(key)
        drawn = rng.multivariate_hypergeometric(sizes.ravel(), weight.live, method="marginals")
        return drawn.reshape(sizes.shape).astype(np.int32)
    view = weight_view(live, grid.shape, perm)
    matrix = view.reshape(-1, grid.rows, grid.cols).sum(axis=0, dtype=np.int64)
    starts_r = np.arange(0, grid.rows, grid.kb)
    starts_c = np.arange(0, grid.cols, grid.nt)
    counts = np.add.reduceat(np.add.reduceat(matrix, starts_r, axis=0), starts_c, axis=1)
    return counts.astype(np.int32)


SAMPLED_ROWS = 256
"""Rows of a weight's gradient whose live values per PE column a timing draws, when it does
not know the mask: the cost of the others is theirs scaled."""


@lru_cache(maxsize=16)
def row_counts(
    weight: SparseWeight, perm: tuple[int, ...] | None, grid: TileGrid
) -> tuple[np.ndarray, float]:
    """Live values per row and column tile of a view (``grid.kb`` is 1), and the factor that
    scales a sum over these rows to all of them: every row, from the mask if known, else
    ``SAMPLED_ROWS`` rows drawn as a uniformly random mask's."""
    rows = min(grid.rows, SAMPLED_ROWS)
    if weight.bits is not None or rows == grid.rows:
        return tile_counts(weight, perm, grid), 1.0
    key = [weight.seed, weight.live, grid.rows, grid.cols, grid.nt, *(perm or ())]
    rng = np.random.default_rng(key)
    positions = rows * grid.cols * grid.stacked
    inside = rng.hypergeometric(weight.live, weight.size - weight.live, positions)
    sizes = grid.stacked * np.outer(np.ones(rows, dtype=np.int64), grid.col_sizes)
    drawn = rng.multivariate_hypergeometric(sizes.ravel(), inside, method="marginals")
    return drawn.reshape(sizes.shape), grid.rows / rows


@dataclass(frozen=True)
class Encoding:
    """How the tiles of a sparse weight's view stream, and what each costs a PE."""

    live: np.ndarray
    """Live values per tile, ``[row tiles, column tiles]``."""
    formats: np.ndarray
    """Per tile, its encoding's index in ``FORMATS``."""
    words: np.ndarray
    """Per tile, the wavelets it streams in."""
    cycles: np.ndarray
    """Per tile, the PE's arithmetic on it."""

    @property
    def total_words(self) -> float:
        """Wavelets of every tile."""
        return float(self.words.sum(dtype=np.float64))

    def format_counts(self) -> dict[str, int]:
        """Tiles per encoding."""
        counts = np.bincount(self.formats.ravel(), minlength=len(FORMATS))
        return {name: int(n) for name, n in zip(FORMATS, counts, strict=True) if n}


@lru_cache(maxsize=16)
def encoding(
    weight: SparseWeight,
    perm: tuple[int, ...] | None,
    grid: TileGrid,
    dtype: str,
    rows: int,
    rate: int,
) -> Encoding:
    """Each tile of the view in the encoding that lets a PE finish it soonest (its arithmetic
    and its arrival overlap: the longer of the two), of fewest wavelets on a tie: the PE
    multiplies ``rows`` activation values by each weight it receives, ``rate`` per cycle.

    A dense tile costs what the dense kernel's does; a sparse one an AXPY per live value
    (``INDEX_CYCLES`` more for its index) and its encoding's fixed work: a control wavelet
    per column (``coordinate``), a bitmap word per 32 positions (``bitmap``)."""
    live = tile_counts(weight, perm, grid)
    sizes = grid.sizes
    per_value = dtypes.dtype(dtype).itemsize / WAVELET_BYTES
    columns = grid.stacked * grid.col_sizes[np.newaxis, :]
    bitmap_words = np.ceil(sizes / 32)
    words = np.stack(
        [
            sizes * per_value,
            live * (per_value + INDEX_BITS / 32) + columns,
            live * per_value + bitmap_words,
        ]
    )
    per_live = live * (math.ceil(rows / rate) + INDEX_CYCLES)
    cycles = np.stack([sizes * (rows / rate), per_live + columns, per_live + bitmap_words])
    steps = np.maximum(cycles, words)
    soonest = steps == steps.min(axis=0)
    formats = np.argmin(np.where(soonest, words, np.inf), axis=0)[np.newaxis]
    chosen = np.take_along_axis(words, formats, axis=0)[0]
    # kept compact (a weight of a 13B model has half a million tiles): whole numbers and
    # halves of at most a few million, exact in float32
    chosen_cycles = np.take_along_axis(cycles, formats, axis=0)[0]
    return Encoding(
        live,
        formats[0].astype(np.int8),
        chosen.astype(np.float32),
        chosen_cycles.astype(np.float32),
    )


@lru_cache(maxsize=256)
def resident_bytes(live: int, grid: TileGrid, dtype: str) -> int:
    """The bytes the busiest PE holds of a sparse weight of ``live`` live values kept on the
    wafer in tiles of ``grid``, each in the smallest of the encodings (all values; the live
    ones with a 16-bit index each and a control word per column; the live ones and a bit per
    position). Counted by the statistics of a uniformly random mask of that live count,
    whatever its mask: the placement chooses the rectangles from the live counts alone,
    before any mask exists."""
    sizes = grid.sizes
    rng = np.random.default_rng([live, grid.rows, grid.cols, grid.kb, grid.nt])
    counts = rng.multivariate_hypergeometric(sizes.ravel(), live, method="marginals")
    counts = counts.reshape(sizes.shape)
    itemsize = dtypes.dtype(dtype).itemsize
    columns = grid.stacked * grid.col_sizes[np.newaxis, :]
    coordinate = counts * (itemsize + INDEX_BITS // 8) + columns * WAVELET_BYTES
    bitmap = counts * itemsize + -(-sizes // 8)
    return int(np.minimum(sizes * itemsize, np.minimum(coordinate, bitmap)).max())


def live_only(
    live: Mapping[str, int], shapes: Mapping[str, Sequence[int]]
) -> dict[str, SparseWeight]:
    """Sparse weights known by their live counts alone, of the sizes ``shapes`` give (what
    ``resident_bytes`` needs: a placement knows no more)."""
    return {name: SparseWeight(name, tuple(shapes[name]), n, 0) for name, n in live.items()}


def layout_grid(shape: Sequence[int], rows: int, cols: int, rt: int, ct: int) -> TileGrid:
    """The tiles of a tensor of ``shape`` laid out ``rt`` x ``ct`` a PE over its ``rows`` x
    ``cols`` matrix (the leading axes whole on every PE)."""
    return TileGrid(rows, cols, rt, ct, tuple(shape[:-2]))


@dataclass(frozen=True)
class SparseView:
    """A kernel's operand that is a view of a sparse weight: its permutation of the stored
    axes (None: as stored)."""

    weight: SparseWeight
    perm: tuple[int, ...] | None


def stream_grid(shape: Sequence[int], width: int) -> TileGrid:
    """The tiles of a weight view of ``shape`` ``[.., K, N]`` streaming into a rectangle
    ``width`` PEs wide: ``K`` split over the columns, ``N`` in chunks of as many columns as
    the output has on each PE (``plans.sparse``)."""
    *lead, rows, cols = shape
    kb = math.ceil(rows / grid_extent(rows, width))
    nt = math.ceil(cols / grid_extent(cols, width))
    return TileGrid(rows, cols, kb, nt, tuple(lead))
