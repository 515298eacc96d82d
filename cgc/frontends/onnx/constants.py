"""ONNX ops evaluated at compile time: Constant, Shape, Size, ConstantOfShape, EyeLike and
Range, and the ops whose result shape depends on the data.

Results that depend only on shapes and attributes (Shape, Size, ConstantOfShape, EyeLike,
Range) are compile-time constants; they become ops only where a consumer needs them as tensors.
Ops whose result shape depends on the data (NonZero, Unique, Compress, NonMaxSuppression) are
evaluated at compile time, so their shape-deciding inputs must be known then (Compress then
gathers the selected slices of its input, which may be a run-time tensor).
"""

from __future__ import annotations

from math import ceil, prod

import numpy as np
from onnx import numpy_helper

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, axis_of, dtype_of, shape_of
from cgc.frontends.onnx.attributes import static_ints, static_scalar
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.model import dtype_attribute
from cgc.frontends.onnx.nodes import Lazy, Node, bad_attr, check_size
from cgc.machine.hardware import dtypes


def known(im: Importer, node: Node, array: np.ndarray) -> Lazy:
    """A compile-time result of ``node`` (its first output); an op only once something uses it."""
    return Lazy(np.asarray(array), node.proto.output[0], False, im.loc)


# ---------------------------------------------------------------------------------------------
# Constants and shapes
# ---------------------------------------------------------------------------------------------


def sparse_to_dense(sparse) -> np.ndarray:
    """The dense array of a SparseTensorProto: values at linear or coordinate indices."""
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 2:  # [NNZ, rank] coordinates
        dense[tuple(indices.T)] = values
    else:  # [NNZ] linear positions
        dense.reshape(-1)[indices] = values
    return dense


@register("Constant")
def _constant(im: Importer, node: Node) -> list:
    attrs = node.attrs
    if len(attrs) != 1:
        raise NodeError(f"expected exactly one value attribute, got {sorted(attrs) or 'none'}")
    key, value = next(iter(attrs.items()))
    if key == "value":
        array = numpy_helper.to_array(value)
    elif key == "sparse_value":
        array = sparse_to_dense(value)
    elif key in ("value_float", "value_floats"):
        array = np.array(value, dtype=np.float32)
    elif key in ("value_int", "value_ints"):
        array = np.array(value, dtype=np.int64)
    elif key in ("value_string", "value_strings"):
        raise NodeError(f"attribute {key} is not supported (cgc has no string tensors)")
    else:
        raise NodeError(f"attribute {key} is not supported")
    if array.dtype == object or array.dtype.kind in "SU":
        raise NodeError(f"attribute {key} holds strings, which cgc does not support")
    return [known(im, node, array)]


def clamped_range(start: int, end: int | None, size: int) -> tuple[int, int]:
    """ONNX's ``[start, end)`` of a shape: negative values count from the end, then clamp."""
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    return min(max(start, 0), size), min(max(end, 0), size)


def input_layout(im: Importer, node: Node, index: int) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of an input, without making an op of a not yet used constant."""
    entry = im.entry(node, index)
    if isinstance(entry, Lazy):
        return tuple(entry.array.shape), entry.array.dtype
    return shape_of(entry), dtype_of(entry)


@register("Shape")
def _shape(im: Importer, node: Node) -> list:
    shape, _ = input_layout(im, node, 0)
    begin, end = clamped_range(int(node.attr("start", 0)), node.attr("end", None), len(shape))
    return [known(im, node, np.array(shape[begin : max(begin, end)], dtype=np.int64))]


@register("Size")
def _size(im: Importer, node: Node) -> list:
    shape, _ = input_layout(im, node, 0)
    return [known(im, node, np.array(prod(shape), dtype=np.int64))]


@register("ConstantOfShape")
def _constant_of_shape(im: Importer, node: Node) -> list:
    dims = static_ints(im, node, 0)
    if any(d < 0 for d in dims):
        raise NodeError(f"input 'input' asks for the negative dimensions of {dims}")
    tensor = node.attr("value", None)
    fill = np.zeros((), np.float32) if tensor is None else numpy_helper.to_array(tensor)
    if fill.size != 1:
        raise bad_attr("value", f"<tensor of shape {fill.shape}>", " (needs one element)")
    # A broadcast view: no memory per element until something materializes it.
    return [known(im, node, np.broadcast_to(fill.reshape(()), tuple(dims)))]


@register("EyeLike")
def _eye_like(im: Importer, node: Node) -> list:
    shape, dtype = input_layout(im, node, 0)
    if len(shape) != 2:
        raise NodeError(f"the input must be 2-D, got shape {shape}")
    code = node.attr("dtype", None)
    if code is not None:
        dtype = dtype_attribute("dtype", code)
    k = int(node.attr("k", 0))
    return [known(im, node, np.eye(shape[0], shape[1], k).astype(dtype))]


def range_count(
    start: float | np.generic, limit: float | np.generic, delta: float | np.generic, integral: bool
) -> int:
    """``max(ceil((limit - start) / delta), 0)``, exact for integers."""
    if delta == 0:
        raise NodeError("input 'delta' must not be zero")
    if integral:
        return max(-((int(start) - int(limit)) // int(delta)), 0)
    return max(ceil((float(limit) - float(start)) / float(delta)), 0)


@register("Range")
def _range(im: Importer, node: Node) -> list:
    start, limit, delta = (static_scalar(im, node, i) for i in range(3))
    dtype = np.asarray(start).dtype
    integral = dtypes.is_integer(dtype)
    count = range_count(start, limit, delta, integral)
    check_size("output", (count,), dtype)
    values: np.ndarray
    if integral:
        values = int(start) + np.arange(count, dtype=np.int64) * int(delta)
    else:
        values = float(start) + np.arange(count, dtype=np.float64) * float(delta)
    return [known(im, node, values.astype(dtype))]


# ---------------------------------------------------------------------------------------------
# Ops whose result shape depends on the data
# ---------------------------------------------------------------------------------------------


def shape_deciding(im: Importer, node: Node, index: int) -> np.ndarray:
    """The compile-time value of an input that decides the output's shape."""
    array = im.known_value(node, index)
    if array is None:
        why = f": the output shape of {node.op_type} depends on it (cgc compiles static shapes)"
        raise im.not_constant(node, index, why)
    return np.asarray(array)


@register("NonZero")
def _non_zero(im: Importer, node: Node) -> list:
    array = shape_deciding(im, node, 0)
    return [known(im, node, np.array(np.nonzero(array), dtype=np.int64))]


@register("Compress")
def _compress(im: Importer, node: Node) -> list:
    condition = shape_deciding(im, node, 1)
    x = im.value(node, 0)
    axis = node.attr("axis", None)
    if axis is None:
        x, axis = im.emit(wse.ReshapeOp(x, (prod(shape_of(x)),))), 0
    axis = axis_of(int(axis), len(shape_of(x)))
    picked = np.nonzero(np.ravel(condition).astype(bool))[0]
    if picked.size and picked[-1] >= shape_of(x)[axis]:
        raise NodeError(f"condition selects beyond the {shape_of(x)[axis]} slices of axis {axis}")
    return [im.emit(wse.GatherOp(x, im.const(picked.astype(np.int64)), axis))]


@register("Unique")
def _unique(im: Importer, node: Node) -> list:
    """Unique of a compile-time tensor: the distinct values (or slices along ``axis``), sorted
    or in order of first occurrence, with their first indices, the inverse map and counts."""
    x = shape_deciding(im, node, 0)
    axis = node.attr("axis", None)
    if axis is not None:
        axis = axis_of(int(axis), x.ndim)
    values, first, inverse, counts = np.unique(
        x, return_index=True, return_inverse=True, return_counts=True, axis=axis
    )
    if not node.attr("sorted", 1):
        order = np.argsort(first, kind="stable")
        values = np.take(values, order, axis=0 if axis is None else axis)
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[np.ravel(inverse)]
    results = [values, first, np.ravel(inverse), counts]
    return [
        Lazy(a if i == 0 else a.astype(np.int64), name, False, im.loc) if name else None
        for i, (a, name) in enumerate(zip(results, node.proto.output, strict=False))
    ]


@register("NonMaxSuppression")
def _non_max_suppression(im: Importer, node: Node) -> list:
    """NonMaxSuppression of compile-time boxes and scores (how many boxes survive decides the
    output's shape): per batch and class, the boxes in decreasing score (ties: lower index
    first) above ``score_threshold``, each kept unless its IoU with a kept one exceeds
    ``iou_threshold``, at most ``max_output_boxes_per_class`` of them."""
    boxes, scores = shape_deciding(im, node, 0), shape_deciding(im, node, 1)
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise NodeError(
            f"expected boxes (B, N, 4) and scores (B, C, N), got {boxes.shape} and {scores.shape}"
        )
    if scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise NodeError(f"scores {scores.shape} do not match boxes {boxes.shape}")
    center = int(node.attr("center_point_box", 0))
    if center not in (0, 1):
        raise bad_attr("center_point_box", center, " (expected 0 or 1)")
    limit, iou, floor = (
        np.ravel(shape_deciding(im, node, i))[0] if node.has_input(i) else None for i in (2, 3, 4)
    )
    overlapping = iou_exceeds(box_corners(boxes, center), 0.0 if iou is None else iou)
    picked = []
    for b, c in np.ndindex(scores.shape[:2]):
        order = np.argsort(-scores[b, c], kind="stable")
        if floor is not None:
            order = order[scores[b, c, order] > floor]
        kept: list[int] = []
        for box in order:
            if len(kept) >= (limit or 0):
                break
            if not overlapping[b, box, kept].any():
                kept.append(int(box))
        picked += [(b, c, box) for box in kept]
    return [known(im, node, np.array(picked, dtype=np.int64).reshape(-1, 3))]


def box_corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """``(x_min, x_max, y_min, y_max)`` per box from ``[y1, x1, y2, x2]`` (any two opposite
    corners) or, with ``center_point_box``, ``[x_center, y_center, width, height]``."""
    if center_point_box:
        half_w, half_h = boxes[..., 2] / 2, boxes[..., 3] / 2
        x, y = boxes[..., 0], boxes[..., 1]
        return np.stack([x - half_w, x + half_w, y - half_h, y + half_h], axis=-1)
    xs, ys = np.sort(boxes[..., [1, 3]], axis=-1), np.sort(boxes[..., [0, 2]], axis=-1)
    return np.concatenate([xs, ys], axis=-1)


def iou_exceeds(corners: np.ndarray, threshold: float) -> np.ndarray:
    """``[B, N, N]``: whether the intersection over union of two boxes of a batch exceeds
    ``threshold`` (boxes that do not overlap, or have no area, never do)."""
    a, b = corners[:, :, None, :], corners[:, None, :, :]
    width = np.minimum(a[..., 1], b[..., 1]) - np.maximum(a[..., 0], b[..., 0])
    height = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 2], b[..., 2])
    area = (corners[..., 1] - corners[..., 0]) * (corners[..., 3] - corners[..., 2])
    inter = width * height
    union = area[:, :, None] + area[:, None, :] - inter
    valid = (width > 0) & (height > 0) & (area[:, :, None] > 0) & (area[:, None, :] > 0)
    valid &= union > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        return valid & (inter / np.where(valid, union, 1) > threshold)
