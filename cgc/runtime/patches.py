"""A convolution's patches kept as its image until a kernel needs them.

``wse.im2col`` orders each patch channel-major, then by kernel tap: made in that order from a
channels-last image (as every convolution after the first reads it), each patch element is a
copy of its own, one channel apart from the last, and the copy of the patches (nine times the
image for a 3x3 kernel) costs more than the GEMM that reads them. Made taps first, each tap is
a copy of whole runs of channels, several times faster; a matmul that reads the patches then
takes its filter's rows in the same order (a copy of the weights, which the kernel keeps with a
filter's tensor: a resident weight's is made once for every run of its artifact), or gives the
filter gradient's rows back in the op's order.

The products are the same sums in another order: equal where the arithmetic is exact, within
rounding elsewhere. The timing never sees any of this: it comes from the plans.
"""

from __future__ import annotations

from math import prod

import numpy as np

from cgc.machine.plans import Attrs
from cgc.machine.reference.data_movement import (
    channels_first,
    channels_first_rows,
    im2col_taps_first,
    movement,
    taps_first_rows,
)


class Patches:
    """The patches ``wse.im2col`` makes of ``image`` (in the op's own axis order) with the
    windows of ``attrs``: a ``Deferred`` for ``DistTensor``, which matmuls consume without
    making the op's own column order."""

    __slots__ = ("_array", "_taps_first", "attrs", "image")

    def __init__(self, image: np.ndarray, attrs: Attrs):
        self.image = image
        self.attrs = attrs
        self._array: np.ndarray | None = None
        self._taps_first: np.ndarray | None = None

    @property
    def taps(self) -> int:
        """Kernel positions in a window."""
        return prod(self.attrs["kernel"])

    def array(self) -> np.ndarray:
        """The patches in the op's column order (channel-major), as the reference makes them;
        made once, for every copy of the tensor that asks (relaid copies share the recipe)."""
        if self._array is None:
            self._array = movement("im2col", self.attrs, [self.image], ())
        return self._array

    def taps_first(self) -> np.ndarray:
        """The patches ``[g, rows, taps * C/g]``, columns taps first; made once, for every
        matmul that reads them (a convolution's forward pass and its filter gradient)."""
        if self._taps_first is None:
            a = self.attrs
            # channels innermost (a copy of a channels-first image, small beside its
            # patches): every tap then copies runs of whole channels
            image = self.image
            if not a.get("channels_last", False):
                image = np.ascontiguousarray(np.moveaxis(image, 1, -1))
            self._taps_first = im2col_taps_first(
                channels_first(image, True),
                a["kernel"], a["strides"], a["pads"], a["dilations"], a["group"],
            )  # fmt: skip
        return self._taps_first

    def filter_rows(self, filters: np.ndarray) -> np.ndarray:
        """The rows of ``filters`` ``[..., C/g * taps, M]`` (in the op's row order) in the
        order of the patches' columns, as ``times`` takes them."""
        return taps_first_rows(filters, self.taps)

    def times(self, rows: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """``patches @ filters``, computed in ``dtype``, of the filters' ``rows`` in the order
        of the patches' columns (``filter_rows``)."""
        return self.taps_first().astype(dtype, copy=False) @ rows.astype(dtype, copy=False)

    def transposed_times(self, right: np.ndarray) -> np.ndarray:
        """``patches^T @ right`` (a filter's gradient), its rows in the op's column order."""
        product = np.swapaxes(self.taps_first(), -1, -2) @ right
        return channels_first_rows(product, self.taps)
