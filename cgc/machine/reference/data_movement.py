"""numpy semantics of data movement and sliding windows, on whole arrays or on index arrays.

``movement`` applies reshape, transpose, broadcast, concat, slice, pad, reverse, tile and
im2col; run on arrays of element indices, it says where every result element comes from
(``-1`` for a value made locally, such as padding). Around it: the sliding ``windows`` that
im2col and pooling read, ``col2im`` (the adjoint of im2col), pooling and the index of each
window's maximum (``argmax_pool``), one-hot rows, and the views of stored weights.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from itertools import product
from math import prod
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cgc.machine.reference.arithmetic import lowest

Attrs = Mapping[str, Any]
"""An op's attributes: plain JSON values."""


def slice_array(
    x: np.ndarray, starts: Sequence[int], limits: Sequence[int], strides: Sequence[int]
) -> np.ndarray:
    """``x[starts:limits:strides]`` on every axis."""
    index = tuple(slice(a, b, s) for a, b, s in zip(starts, limits, strides, strict=True))
    return x[index]


def pad(
    x: np.ndarray,
    low: Sequence[int],
    high: Sequence[int],
    value: float,
    mode: str = "constant",
) -> np.ndarray:
    """Padding before (``low``) and after (``high``) every axis, in numpy.pad's ``mode``."""
    widths = list(zip(low, high, strict=True))
    if mode == "constant":
        return np.pad(x, widths, constant_values=value)
    return np.pad(x, widths, mode=typing.cast(Any, mode))


def one_hot(indices: np.ndarray, depth: int, dtype: np.dtype) -> np.ndarray:
    """Rows of ``depth`` with a one at each index; out-of-range indices give zero rows."""
    hits: np.ndarray = indices[..., None] == np.arange(depth)
    return hits.astype(dtype)


def windows(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    fill: float,
) -> np.ndarray:
    """Every sliding window over the trailing ``len(kernel)`` axes of ``x``.

    Returns ``[*lead, *out_spatial, *kernel]``; positions in the padding hold ``fill``.
    """
    spatial = len(kernel)
    lead = x.ndim - spatial
    padded = _padded(x, [(pads[i], pads[spatial + i]) for i in range(spatial)], fill)
    spans = [dilations[i] * (kernel[i] - 1) + 1 for i in range(spatial)]
    view = sliding_window_view(padded, spans, axis=tuple(range(lead, x.ndim)))
    steps = tuple(slice(None, None, strides[i]) for i in range(spatial))
    taps = tuple(slice(None, None, dilations[i]) for i in range(spatial))
    index: tuple[Any, ...] = (Ellipsis, *steps, *taps)
    return view[index] if spatial else view


def _padded(x: np.ndarray, widths: Sequence[tuple[int, int]], fill: float) -> np.ndarray:
    """``x`` with its trailing ``len(widths)`` axes padded by ``fill``, in ``x``'s own memory
    order (``np.pad`` makes a C-ordered array: a channels-last image seen channels-first would
    come back channels-first, and every window read from it strided)."""
    if not any(low or high for low, high in widths):
        return x
    sizes = list(zip(x.shape[x.ndim - len(widths) :], widths, strict=True))
    shape = (*x.shape[: x.ndim - len(widths)], *(n + low + high for n, (low, high) in sizes))
    padded = np.full_like(x, fill, shape=shape)
    inside: tuple[Any, ...] = (Ellipsis, *(slice(low, low + n) for n, (low, _) in sizes))
    padded[inside] = x
    return padded


def patch_windows(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    group: int,
    fill: float = 0.0,
) -> np.ndarray:
    """The windows of a grouped convolution on ``x`` (N, C, *spatial) as a view ``[g, N,
    *out, C/g, *kernel]``: im2col's rows are its leading axes, its columns the trailing."""
    n, c = x.shape[:2]
    w = windows(x, kernel, strides, pads, dilations, fill)  # [N, C, *out, *kernel]
    spatial = len(kernel)
    w = w.reshape(n, group, c // group, *w.shape[2:])  # a view: only the channels split
    return np.moveaxis(w, (1, 2), (0, 2 + spatial))


def im2col(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    group: int,
    fill: float = 0.0,
) -> np.ndarray:
    """The patches of a grouped convolution as matrices ``[group, N * prod(out), C/group *
    prod(kernel)]``: row ``(n, *o)`` holds the window under output position ``o`` of sample n."""
    w = patch_windows(x, kernel, strides, pads, dilations, group, fill)
    # one copy at most: none where the windows already lie in order (a 1x1 kernel on a
    # channels-last image, as every pointwise convolution reads it)
    return _rows(np.ascontiguousarray(w), len(kernel))


def im2col_taps_first(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    group: int,
) -> np.ndarray:
    """``im2col``'s patches with their columns in another order: kernel taps major, then
    channels (``taps_first_rows`` orders a filter's rows alike). From a channels-last image
    every tap is a copy of contiguous runs of channels, where ``im2col``'s order reads the
    image one element per tap."""
    spatial = len(kernel)
    w = patch_windows(x, kernel, strides, pads, dilations, group)
    return _rows(np.ascontiguousarray(np.moveaxis(w, 2 + spatial, -1)), spatial)


def _rows(patches: np.ndarray, spatial: int) -> np.ndarray:
    """Patches ``[g, N, *out, ...]`` (contiguous) as matrices ``[g, N * prod(out), -1]``."""
    group, rows = patches.shape[0], prod(patches.shape[1 : 2 + spatial])
    return patches.reshape(group, rows, -1)


def taps_first_rows(matrix: np.ndarray, taps: int) -> np.ndarray:
    """The rows of ``matrix`` ``[..., C * taps, M]`` (channel-major, as im2col's columns)
    reordered taps first, as ``im2col_taps_first``'s columns (a view for a single tap)."""
    *lead, rows, cols = matrix.shape
    split = matrix.reshape(*lead, rows // taps, taps, cols)
    return np.swapaxes(split, -3, -2).reshape(*lead, rows, cols)


def channels_first_rows(matrix: np.ndarray, taps: int) -> np.ndarray:
    """The inverse of ``taps_first_rows``."""
    *lead, rows, cols = matrix.shape
    split = matrix.reshape(*lead, taps, rows // taps, cols)
    return np.swapaxes(split, -3, -2).reshape(*lead, rows, cols)


def im2col_sources(image: Sequence[int], attrs: Attrs) -> np.ndarray:
    """For each element of ``im2col``'s result on an image of shape ``image`` (in the op's own
    axis order), the flat index of the image element it reads, or -1 for padding."""
    ids = np.arange(prod(image)).reshape(image)
    return movement("im2col", {**attrs, "fill": -1}, [ids], ())


def col2im(patches: np.ndarray, image: Sequence[int], attrs: Attrs) -> np.ndarray:
    """The adjoint of ``im2col``: every patch element added to the image element it was read
    from (in float64, one kernel position after another, then rounded once to the patches'
    type). Each kernel position adds its patch column to a strided slice of the image."""
    last = attrs.get("channels_last", False)
    kernel, strides, pads, dilations, group = (
        attrs[k] for k in ("kernel", "strides", "pads", "dilations", "group")
    )
    spatial, n = len(kernel), image[0]
    channels = image[-1] if last else image[1]
    sizes = tuple(image[1:-1] if last else image[2:])
    outs = window_counts(sizes, kernel, strides, pads, dilations)
    columns = patches.reshape(group, n, *outs, channels // group, *kernel)
    # [*kernel, g, N, C/g, *out]: a view, one kernel position a step
    taps_first = columns.transpose(
        (*range(3 + spatial, 3 + 2 * spatial), 0, 1, 2 + spatial, *range(2, 2 + spatial))
    )
    total = np.zeros(image, dtype=np.float64)
    planes = channels_first(total, last).reshape(n, group, channels // group, *sizes)
    planes = np.moveaxis(planes, 1, 0)  # [g, N, C/g, *sizes], a view of total
    whole = (slice(None),) * 3
    for taps in product(*map(range, kernel)):
        reads = [
            tap_slices(sizes[a], outs[a], strides[a], dilations[a], pads[a], t)
            for a, t in enumerate(taps)
        ]
        into = planes[(*whole, *(image_at for _, image_at in reads))]
        read: tuple[Any, ...] = (*taps, *whole, *(out_at for out_at, _ in reads))
        into += taps_first[read]
    return total.astype(patches.dtype)


def window_counts(
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> list[int]:
    """How many windows fit along each spatial axis (as ``windows`` makes them)."""
    spatial = len(kernel)
    return [
        max(
            0,
            (size + pads[i] + pads[spatial + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i]
            + 1,
        )
        for i, size in enumerate(sizes)
    ]


def tap_slices(
    size: int, count: int, stride: int, dilation: int, low: int, tap: int
) -> tuple[slice, slice]:
    """Along one axis of ``size`` with ``count`` windows: the windows whose kernel position
    ``tap`` reads inside the axis (not the padding), and the positions they read."""
    start = dilation * tap - low  # where window 0 reads
    first = min(count, max(0, -(start // stride)))  # the first window reading position >= 0
    last = min(count, (size - 1 - start) // stride + 1) if start < size else 0
    reading = max(0, last - first)
    begin = start + stride * first
    return slice(first, first + reading), slice(begin, begin + stride * reading, stride)


def channels_first(x: np.ndarray, channels_last: bool) -> np.ndarray:
    """A view of ``x`` as (N, C, *spatial) when it is (N, *spatial, C)."""
    return np.moveaxis(x, -1, 1) if channels_last else x


def channels_back(y: np.ndarray, channels_last: bool) -> np.ndarray:
    """The inverse of ``channels_first`` on a result (N, C, *rest)."""
    return np.moveaxis(y, 1, -1) if channels_last else y


def pool_windows(x: np.ndarray, attrs: Attrs, fill: float) -> np.ndarray:
    """Every window of a pooling op, ``[*result, *kernel]`` in the op's own axis order."""
    last = attrs.get("channels_last", False)
    taps = windows(channels_first(x, last), *pool_args(attrs), fill)
    return np.moveaxis(taps, 1, 1 + len(attrs["kernel"])) if last else taps


def pool_args(attrs: Attrs) -> tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int]]:
    """A pooling op's kernel, strides, pads and dilations."""
    return attrs["kernel"], attrs["strides"], attrs["pads"], attrs["dilations"]


def pool(
    kind: str,
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    count_include_pad: bool = False,
) -> np.ndarray:
    """Max or average pooling (``kind`` is ``max_pool`` or ``avg_pool``)."""
    spatial = len(kernel)
    axes = tuple(range(-spatial, 0))
    if kind == "max_pool":
        peaks = windows(x, kernel, strides, pads, dilations, lowest(x.dtype))
        return _fold_taps(np.maximum, peaks, spatial)
    total: np.ndarray = windows(x, kernel, strides, pads, dilations, 0.0).sum(axis=axes)
    if count_include_pad:
        count = np.asarray(prod(kernel), dtype=x.dtype)
    else:
        ones = np.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
        count = np.asarray(windows(ones, kernel, strides, pads, dilations, 0.0).sum(axis=axes))
    mean: np.ndarray = total / count
    return mean.astype(x.dtype, copy=False)


def _fold_taps(combine: np.ufunc, taps: np.ndarray, spatial: int) -> np.ndarray:
    """``combine`` over the last ``spatial`` axes of ``taps`` (``windows``' kernel axes), one
    kernel position after another: whole-array steps in the windows' memory order, where a
    reduction over each window's few strided taps runs an inner loop per output element."""
    positions = product(*map(range, taps.shape[taps.ndim - spatial :]))
    first: tuple[Any, ...] = (Ellipsis, *next(positions))
    total: np.ndarray = taps[first].copy(order="K")
    for at in positions:
        index: tuple[Any, ...] = (Ellipsis, *at)
        combine(total, taps[index], out=total)
    return total


def argmax_pool(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    storage_order: int,
) -> np.ndarray:
    """The flat input index of each pooling window's (first) maximum."""
    spatial = len(kernel)
    ids = np.arange(x.size).reshape(x.shape)
    if storage_order:  # spatial axes column-major within each (n, c) plane
        plane = np.arange(int(np.prod(x.shape[2:]))).reshape(x.shape[2:][::-1]).T
        ids = (np.arange(x.shape[0] * x.shape[1]) * plane.size).reshape(
            x.shape[:2] + (1,) * spatial
        )
        ids = ids + plane
    values = windows(x, kernel, strides, pads, dilations, lowest(x.dtype))
    lead = values.shape[: x.ndim]
    values = values.reshape(*lead, -1)
    taps = windows(ids, kernel, strides, pads, dilations, -1).reshape(*lead, -1)
    # the first maximum among real elements: padding loses a tie with an element at the minimum
    peak = values.max(axis=-1, keepdims=True)
    is_best = ((values == peak) | (np.isnan(values) & np.isnan(peak))) & (taps >= 0)
    best = np.argmax(is_best, axis=-1)[..., None]
    return np.take_along_axis(taps, best, axis=-1)[..., 0]


def weight_view(stored: np.ndarray, shape: Sequence[int], perm: Sequence[int] | None) -> np.ndarray:
    """The view of a stored weight that a ``wse.weight`` of ``shape`` and ``perm`` denotes:
    the elements reshaped to ``shape`` permuted back by ``perm``, then permuted by ``perm``."""
    if perm is None:
        return stored.reshape(shape)
    inverse = np.argsort(perm)
    return np.transpose(stored.reshape([shape[i] for i in inverse]), perm)


def weight_unview(
    grad: np.ndarray, stored_shape: Sequence[int], perm: Sequence[int] | None
) -> np.ndarray:
    """Maps the gradient of a view back onto the stored weight's shape."""
    if perm is not None:
        grad = np.transpose(grad, np.argsort(perm))
    return np.ascontiguousarray(grad).reshape(stored_shape)


def movement(
    name: str, attrs: Attrs, inputs: Sequence[np.ndarray], shape: Sequence[int]
) -> np.ndarray:
    """Applies a data-movement op; works on data and on index arrays alike."""
    x = inputs[0]
    if name == "reshape":
        return x.reshape(shape)
    if name == "transpose":
        return np.transpose(x, attrs["perm"])
    if name == "broadcast_to":
        return np.broadcast_to(x, shape)
    if name == "concat":
        return np.concatenate(inputs, axis=attrs["axis"])
    if name == "slice":
        return slice_array(x, attrs["starts"], attrs["limits"], attrs["strides"])
    if name == "pad":
        return pad(
            x, attrs["low"], attrs["high"], attrs.get("value", 0.0), attrs.get("mode", "constant")
        )
    if name == "reverse":
        return np.flip(x, attrs["axes"])
    if name == "tile":
        return np.tile(x, attrs["repeats"])
    if name == "im2col":
        return im2col(
            channels_first(x, attrs.get("channels_last", False)),
            attrs["kernel"],
            attrs["strides"],
            attrs["pads"],
            attrs["dilations"],
            attrs["group"],
            attrs.get("fill", 0.0),
        )
    raise KeyError(name)


MOVEMENT = (
    "reshape", "transpose", "broadcast_to", "concat", "slice", "pad", "im2col", "reverse", "tile",
)  # fmt: skip
