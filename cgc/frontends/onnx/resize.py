"""ONNX Resize and Upsample.

Both are separable: each resized axis gets one constant interpolation matrix, built with numpy
and applied with a matmul (nearest: a gather with constant indices); an axis that keeps its size
at scale 1 is left alone. Linear and cubic interpolation compute in float (``working_dtype``)
and round integers back, half to even, clipped to their type. tf_crop_and_resize fills the
output elements outside the input with ``extrapolation_value``. Upsample and Resize before
opset 11 use asymmetric coordinates and ``floor(size * scale)`` output sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import ml_dtypes
import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    cast,
    clamp,
    dtype_of,
    reshape,
    select,
    shape_of,
    working_dtype,
)
from cgc.frontends.onnx.attributes import string_attr
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr
from cgc.machine.hardware import dtypes

TRANSFORMS = (
    "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
    "tf_half_pixel_for_nn", "tf_crop_and_resize",
)  # fmt: skip
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@dataclass(frozen=True)
class Interpolation:
    """How Resize maps output positions to input positions and weighs the neighbours."""

    mode: str
    """``nearest``, ``linear`` or ``cubic``."""
    transform: str = "asymmetric"
    nearest_mode: str = "floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    extrapolation: float = 0.0
    antialias: bool = False


@dataclass(frozen=True)
class AxisResize:
    """One resized axis: sizes, the scale of the coordinate transform and the roi."""

    axis: int
    size: int
    out: int
    scale: float
    length: float
    """The resized length the coordinate transforms use: ``scale * size``, or the size asked
    for."""
    roi: tuple[float, float] = (0.0, 1.0)


# ---------------------------------------------------------------------------------------------
# Interpolation matrices
# ---------------------------------------------------------------------------------------------


def source_coordinates(transform: str, ax: AxisResize) -> np.ndarray:
    """The input coordinate of every output position along one axis."""
    y = np.arange(ax.out, dtype=np.float64)
    if transform == "half_pixel":
        return (y + 0.5) / ax.scale - 0.5
    if transform == "half_pixel_symmetric":
        offset = ax.size / 2 * (1 - ax.out / ax.length)
        return offset + (y + 0.5) / ax.scale - 0.5
    if transform == "pytorch_half_pixel":
        return (y + 0.5) / ax.scale - 0.5 if ax.length > 1 else np.zeros_like(y)
    if transform == "align_corners":
        return y * (ax.size - 1) / (ax.length - 1) if ax.length != 1 else np.zeros_like(y)
    if transform == "asymmetric":
        return y / ax.scale
    if transform == "tf_half_pixel_for_nn":
        return (y + 0.5) / ax.scale
    start, end = ax.roi  # tf_crop_and_resize
    if ax.length > 1:
        return start * (ax.size - 1) + y * (end - start) * (ax.size - 1) / (ax.length - 1)
    return np.full_like(y, 0.5 * (start + end) * (ax.size - 1))


def nearest_sources(x: np.ndarray, size: int, nearest_mode: str) -> np.ndarray:
    """The input index nearest to every coordinate, clamped into the input."""
    below = np.ceil(x) - 1  # the largest integer strictly below x
    fraction = x - below  # in (0, 1]
    if nearest_mode == "round_prefer_floor":
        index = np.where(fraction <= 0.5, below, below + 1)
    elif nearest_mode == "round_prefer_ceil":
        index = np.where(fraction < 0.5, below, below + 1)
    elif nearest_mode == "floor":
        index = np.where(fraction < 1, below, below + 1)
    else:  # ceil
        index = below + 1
    return np.clip(index, 0, size - 1).astype(np.int64)


def tent(distance: np.ndarray, _a: float) -> np.ndarray:
    """The linear interpolation kernel."""
    return np.clip(1 - np.abs(distance), 0, 1)


def keys_cubic(distance: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient ``a``."""
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def interpolation_matrix(x: np.ndarray, size: int, interp: Interpolation, scale: float):
    """The (out, size) matrix whose rows weigh the input elements of every output element.

    The taps of a coordinate ``x`` start from the largest integer strictly below it; their
    weights are the kernel of the distance, stretched by ``1 / scale`` when antialiasing a
    downscale (and then normalized). Taps outside the input read the edge element, or with
    ``exclude_outside`` get no weight (the others are renormalized).
    """
    kernel, support = (tent, 1) if interp.mode == "linear" else (keys_cubic, 2)
    stretch = min(scale, 1.0) if interp.antialias else 1.0
    first = int(np.floor(-support / stretch)) + 1
    count = 2 - 2 * first
    below = np.ceil(x) - 1
    taps = below[:, None].astype(np.int64) + np.arange(first, first + count)[None, :]
    weights = kernel(stretch * (taps - x[:, None]), interp.cubic_a)
    if interp.antialias:
        weights = weights / weights.sum(axis=1, keepdims=True)
    if interp.exclude_outside:
        weights = np.where((taps < 0) | (taps >= size), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    matrix = np.zeros((len(x), size))
    rows = np.broadcast_to(np.arange(len(x))[:, None], taps.shape)
    np.add.at(matrix, (rows, np.clip(taps, 0, size - 1)), weights)
    return matrix


def apply_matrix(im: Importer, x: SSAValue, axis: int, matrix: np.ndarray) -> SSAValue:
    """``x`` with ``axis`` mapped through ``matrix`` (out, in)."""
    shape = shape_of(x)
    before, after = prod(shape[:axis]), prod(shape[axis + 1 :])
    x3 = reshape(im, x, (before, shape[axis], after))
    y = im.emit(wse.MatmulOp(im.const(matrix.astype(dtype_of(x))), x3))
    return reshape(im, y, (*shape[:axis], matrix.shape[0], *shape[axis + 1 :]))


def resample_axis(im: Importer, x: SSAValue, ax: AxisResize, interp: Interpolation):
    """``x`` resized along one axis; an axis that keeps its size at scale 1 (and, cropping,
    the whole roi) is left alone whatever the coordinate transform."""
    whole = interp.transform != "tf_crop_and_resize" or np.allclose(ax.roi, (0.0, 1.0))
    if whole and ax.out == ax.size and np.isclose(ax.scale, 1.0, rtol=1e-9, atol=0):
        return x
    coords = source_coordinates(interp.transform, ax)
    if interp.mode == "nearest":
        indices = nearest_sources(coords, ax.size, interp.nearest_mode)
        if ax.out == ax.size and (indices == np.arange(ax.size)).all():
            return x
        return im.emit(wse.GatherOp(x, im.const(indices), ax.axis))
    matrix = interpolation_matrix(coords, ax.size, interp, ax.scale)
    if ax.out == ax.size and np.array_equal(matrix, np.eye(ax.size)):
        return x
    return apply_matrix(im, x, ax.axis, matrix)


def extrapolated(axes: Sequence[AxisResize], rank: int) -> np.ndarray | None:
    """For tf_crop_and_resize: which output elements lie outside the input (broadcastable to
    the output), or None when none do."""
    outside = np.zeros([1] * rank, dtype=bool)
    for ax in axes:
        coords = source_coordinates("tf_crop_and_resize", ax)
        shape = [1] * rank
        shape[ax.axis] = ax.out
        outside = outside | ((coords < 0) | (coords > ax.size - 1)).reshape(shape)
    return outside if outside.any() else None


def from_float(im: Importer, y: SSAValue, dtype: np.dtype) -> SSAValue:
    """A float result back in ``dtype``: integers are rounded (half to even) and clipped."""
    if dtypes.is_integer(dtype):
        info = ml_dtypes.iinfo(dtype)
        y = clamp(im, im.emit(wse.RoundOp(y)), info.min, info.max)
    return cast(im, y, dtype)


def resample(
    im: Importer, x: SSAValue, axes: Sequence[AxisResize], interp: Interpolation
) -> SSAValue:
    """``x`` resized along ``axes``, one axis at a time."""
    dtype = dtype_of(x)
    linear = interp.mode != "nearest"
    if linear and dtype == np.dtype(bool):
        raise NodeError(f"mode={interp.mode} needs a numeric input, got bool")
    y = cast(im, x, working_dtype(dtype)) if linear else x
    for ax in axes:
        y = resample_axis(im, y, ax, interp)
    if linear:
        y = from_float(im, y, dtype)
    outside = None
    if interp.transform == "tf_crop_and_resize":
        outside = extrapolated(axes, len(shape_of(x)))
    if outside is None:
        return y
    fill = np.array(interp.extrapolation)
    if dtypes.is_integer(dtype):
        info = ml_dtypes.iinfo(dtype)
        fill = np.clip(np.round(fill), info.min, info.max)
    return select(im, im.const(outside), im.const(fill.astype(dtype)), y)


# ---------------------------------------------------------------------------------------------
# Resize and Upsample
# ---------------------------------------------------------------------------------------------


def resize_interpolation(node: Node) -> Interpolation:
    """The interpolation attributes of Resize from opset 11 on."""
    mode = string_attr(node, "mode", "nearest", ("nearest", "linear", "cubic"))
    return Interpolation(
        mode=mode,
        transform=string_attr(node, "coordinate_transformation_mode", "half_pixel", TRANSFORMS),
        nearest_mode=string_attr(node, "nearest_mode", "round_prefer_floor", NEAREST_MODES),
        cubic_a=float(node.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(node.attr("exclude_outside", 0)),
        extrapolation=float(node.attr("extrapolation_value", 0.0)),
        antialias=bool(node.attr("antialias", 0)) and mode != "nearest",
    )


def given(im: Importer, node: Node, index: int) -> np.ndarray | None:
    """An optional constant input; an empty tensor counts as absent."""
    array = im.optional_static(node, index)
    return None if array is None or array.size == 0 else np.ravel(array)


def resize_axes(node: Node, rank: int) -> list[int]:
    """The axes Resize's roi, scales and sizes refer to."""
    axes = node.attr("axes", None)
    if axes is None:
        return list(range(rank))
    if any(not -rank <= a < rank for a in axes):
        raise bad_attr("axes", axes, f" for rank {rank}")
    normalized = [a % rank for a in axes]
    if len(set(normalized)) != len(normalized):
        raise bad_attr("axes", axes, " (repeated axis)")
    return normalized


def axes_from_sizes(
    shape: Sequence[int], axes: Sequence[int], sizes: np.ndarray, policy: str
) -> list[AxisResize]:
    """The resized axes for output ``sizes`` under ``keep_aspect_ratio_policy``."""
    outs = [int(s) for s in sizes]
    if policy == "stretch":
        return [
            AxisResize(a, shape[a], s, s / shape[a], float(s))
            for a, s in zip(axes, outs, strict=True)
        ]
    ratios = [s / shape[a] for a, s in zip(axes, outs, strict=True)]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    return [
        AxisResize(a, shape[a], int(scale * shape[a] + 0.5), scale, scale * shape[a]) for a in axes
    ]


def resize_plan(im: Importer, node: Node, shape: Sequence[int], crop: bool) -> list[AxisResize]:
    """The resized axes of a Resize node (opset 11 on), from scales or sizes and the roi."""
    axes = resize_axes(node, len(shape))
    roi = given(im, node, 1) if crop else None
    scales, sizes = given(im, node, 2), given(im, node, 3)
    values = scales if sizes is None else sizes
    if values is None or (scales is not None and sizes is not None):
        raise NodeError("exactly one of the inputs scales and sizes must be given")
    count = len(axes)
    if len(values) != count:
        raise NodeError(f"scales or sizes must have {count} values, one per resized axis")
    if roi is not None and len(roi) != 2 * count:
        raise NodeError(f"roi must have {2 * count} values")
    if sizes is not None:
        policy = string_attr(
            node, "keep_aspect_ratio_policy", "stretch", ("stretch", "not_larger", "not_smaller")
        )
        plan = axes_from_sizes(shape, axes, sizes, policy)
    else:
        scales = values
        if min(scales) <= 0:
            raise NodeError(f"scales must be positive, got {scales.tolist()}")
        plan = []
        for i, a in enumerate(axes):
            scale = float(scales[i])
            extent = float(roi[count + i] - roi[i]) if roi is not None else 1.0
            out = int(np.floor(shape[a] * extent * scale))
            plan.append(AxisResize(a, shape[a], out, scale, scale * shape[a]))
    if roi is not None:
        plan = [
            AxisResize(ax.axis, ax.size, ax.out, ax.scale, ax.length, (roi[i], roi[count + i]))
            for i, ax in enumerate(plan)
        ]
    if any(ax.out < 1 for ax in plan):
        raise NodeError(f"the output shape would be empty ({[ax.out for ax in plan]})")
    return plan


def legacy_plan(shape: Sequence[int], scales: Sequence[float] | np.ndarray) -> list[AxisResize]:
    """The resized axes of Upsample and Resize-10: ``floor(size * scale)`` per axis."""
    if len(scales) != len(shape):
        raise NodeError(f"scales must have {len(shape)} values, got {len(scales)}")
    if min(scales) <= 0:
        raise NodeError(f"scales must be positive, got {list(scales)}")
    plan = []
    for axis, (size, scale) in enumerate(zip(shape, scales, strict=True)):
        scale = float(scale)
        plan.append(AxisResize(axis, size, int(np.floor(size * scale)), scale, scale * size))
    return plan


def legacy_resample(
    im: Importer, x: SSAValue, scales: Sequence[float] | np.ndarray, mode: str
) -> SSAValue:
    """Upsample and Resize-10: asymmetric coordinates; nearest takes the element at or below
    the coordinate when upsampling and at or above it when downsampling (as onnxruntime)."""
    if mode not in ("nearest", "linear", "bilinear"):
        raise bad_attr("mode", mode, " (expected nearest or linear)")
    kind = "nearest" if mode == "nearest" else "linear"
    y = x
    for ax in legacy_plan(shape_of(x), scales):
        nearest_mode = "floor" if ax.scale >= 1 else "ceil"
        y = resample(im, y, [ax], Interpolation(kind, "asymmetric", nearest_mode))
    return y


@register("Resize")
def _resize(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    if im.opset < 11:
        return [legacy_resample(im, x, np.ravel(im.static(node, 1)), node.attr("mode", "nearest"))]
    interp = resize_interpolation(node)
    plan = resize_plan(im, node, shape_of(x), interp.transform == "tf_crop_and_resize")
    return [resample(im, x, plan, interp)]


@register("Upsample")
def _upsample(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    mode = node.attr("mode", "nearest")
    scales: Sequence[float] | np.ndarray
    if im.opset >= 9:
        scales = np.ravel(im.static(node, 1))
    elif im.opset >= 7:
        scales = node.attr("scales", None)
        if scales is None:
            raise NodeError("attribute scales is required")
    else:
        if len(shape_of(x)) != 4:
            raise NodeError(f"the input must have rank 4, got {len(shape_of(x))}")
        scales = [1.0, 1.0, node.attr("height_scale", 1.0), node.attr("width_scale", 1.0)]
    return [legacy_resample(im, x, scales, mode)]
