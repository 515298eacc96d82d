"""ONNX ops that join, cut and repeat tensors along axes: Concat, Split, Slice, Tile and
Expand.

The operands that decide the result's shape (Split's ``split``, Slice's ``starts``, ``ends``,
``axes`` and ``steps``, Tile's ``repeats``, Expand's ``shape``) must be known at compile time
(Split's sizes are an attribute before opset 13, Slice's bounds before opset 10). Concat leaves
out inputs that are empty along its axis. A negative Slice step reverses the axis and slices it
with a positive stride.
"""

from __future__ import annotations

import numpy as np

from cgc.dialects import shapes, wse
from cgc.frontends.builders import (
    NodeError,
    axis_of,
    dtype_of,
    int_list,
    shape_of,
    slice_axes,
    unique_axes,
)
from cgc.frontends.onnx.attributes import static_ints, static_scalar
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr


@register("Concat")
def _concat(im: Importer, node: Node) -> list:
    values = [im.value(node, i) for i in range(len(node.proto.input)) if node.has_input(i)]
    if not values:
        raise NodeError("there are no inputs")
    axis = node.attr("axis", 1 if im.opset < 4 else None)
    if axis is None:
        raise NodeError("attribute axis is required")
    shapes_in = [shape_of(v) for v in values]
    axis = axis_of(int(axis), len(shapes_in[0]))
    try:
        joined = shapes.concat(shapes_in, axis)
    except ValueError as error:
        raise NodeError(str(error)) from None
    # Pieces empty along the axis add nothing; leaving them out keeps zero-size tensors out of
    # the program.
    pieces = [v for v in values if shape_of(v)[axis]]
    if not pieces:
        return [im.const(np.zeros(joined, dtype=dtype_of(values[0])))]
    if len(pieces) == 1:
        return [pieces[0]]
    return [im.emit(wse.ConcatOp(pieces, axis))]


def split_sizes(im: Importer, node: Node, size: int, count: int) -> list[int]:
    """The length of every output of Split along its axis."""
    if im.opset < 2:
        given = node.attr("split", None)
        if given is None and node.has_input(1):
            given = im.static(node, 1)
    elif im.opset < 13:
        given = node.attr("split", None)
    else:
        given = im.static(node, 1) if node.has_input(1) else None
    parts = node.attr("num_outputs", None) if im.opset >= 18 else None
    if given is not None:
        sizes = int_list(given)
        if len(sizes) != count or sum(sizes) != size or min(sizes, default=0) < 0:
            raise NodeError(f"split {sizes} does not cut an axis of {size} into {count} parts")
        return sizes
    if parts is not None:
        if int(parts) != count or count < 1:
            raise bad_attr("num_outputs", parts, f" (the node has {count} outputs)")
        chunk = -(-size // count)
        last = size - chunk * (count - 1)
        if last < 0:
            raise bad_attr("num_outputs", parts, f" for an axis of {size}")
        return [chunk] * (count - 1) + [last]
    if size % count:
        raise NodeError(f"an axis of {size} does not split into {count} equal parts")
    return [size // count] * count


@register("Split")
def _split(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    axis = axis_of(int(node.attr("axis", 0)), len(shape))
    count = len(node.proto.output)
    sizes = split_sizes(im, node, shape[axis], count)
    outputs, begin = [], 0
    for length in sizes:
        outputs.append(slice_axes(im, x, {axis: (begin, begin + length)}, None))
        begin += length
    return outputs


def slice_spec(im: Importer, node: Node) -> tuple[list[int], list[int], list | None, list | None]:
    """starts, ends, axes and steps of Slice: attributes before opset 10, inputs from it."""
    if im.opset < 10:
        starts, ends = node.attr("starts", None), node.attr("ends", None)
        if starts is None or ends is None:
            raise NodeError("attributes starts and ends are required")
        axes = node.attr("axes", None)
        return int_list(starts), int_list(ends), None if axes is None else int_list(axes), None
    starts, ends = static_ints(im, node, 1), static_ints(im, node, 2)
    axes = static_ints(im, node, 3) if node.has_input(3) else None
    steps = static_ints(im, node, 4) if node.has_input(4) else None
    return starts, ends, axes, steps


def slice_bounds(start: int, end: int, step: int, size: int) -> tuple[int, int]:
    """ONNX's clamped ``start`` and ``end`` along an axis of ``size`` for ``step``."""
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    if step > 0:
        return min(max(start, 0), size), min(max(end, 0), size)
    return min(max(start, 0), size - 1), min(max(end, -1), size - 1)


@register("Slice")
def _slice(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    starts, ends, axes, steps = slice_spec(im, node)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise NodeError("starts, ends, axes and steps must have the same length")
    axes = unique_axes(axes, len(shape))
    bounds, strides, flipped = {}, {}, []
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        if step == 0:
            raise NodeError(f"the step of axis {axis} is zero")
        size = shape[axis]
        begin, stop = slice_bounds(start, end, step, size)
        if step < 0:  # the same elements, counted from the end of the reversed axis
            flipped.append(axis)
            begin, stop, step = size - 1 - begin, size - 1 - stop, -step
        bounds[axis], strides[axis] = (begin, max(begin, stop)), step
    if flipped:
        x = im.emit(wse.ReverseOp(x, sorted(flipped)))
    return [slice_axes(im, x, bounds, strides)]


@register("Tile")
def _tile(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    rank = len(shape_of(x))
    if im.opset < 6:  # Tile-1: `tiles` copies along one `axis`
        tiles, axis = int(static_scalar(im, node, 1)), int(static_scalar(im, node, 2))
        repeats = [1] * rank
        repeats[axis_of(axis, rank)] = tiles
    else:
        repeats = static_ints(im, node, 1)
    if len(repeats) != rank or min(repeats, default=1) < 0:
        raise NodeError(f"repeats {repeats} do not fit an input of rank {rank}")
    if all(r == 1 for r in repeats):
        return [x]
    return [im.emit(wse.TileOp(x, repeats))]


@register("Expand")
def _expand(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    spec = static_ints(im, node, 1)
    try:
        target = shapes.broadcast(shape_of(x), spec)
    except ValueError:
        raise NodeError(f"shape {shape_of(x)} does not expand to {spec}") from None
    if target == shape_of(x):
        return [x]
    return [im.emit(wse.BroadcastToOp(x, target))]
