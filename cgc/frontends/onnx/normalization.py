"""ONNX softmax-like ops and normalizations.

Softmax, LogSoftmax and the plain cases of LayerNormalization and BatchNormalization become
the composite ops of the WSE dialect (``decompose`` lowers them); everything else is built from
primitives here: Hardmax, the other normalizations (instance, group, RMS, LRN, Lp,
mean-variance), the extra outputs of LayerNormalization and BatchNormalization in training
mode. ``stash_type`` chooses the float type in which the statistics are computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
from onnx import TensorProto
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    affine,
    along,
    axis_of,
    cast,
    dtype_of,
    shape_of,
)
from cgc.frontends.formulas import per_channel, running_average, square, standardize, top_k
from cgc.frontends.onnx.importer import Importer, OpImporter, register
from cgc.frontends.onnx.model import dtype_attribute
from cgc.frontends.onnx.nodes import Node, bad_attr

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def used(im: Importer, node: Node, index: int) -> bool:
    """Whether output ``index`` of the node exists and something uses it."""
    outputs = node.proto.output
    return index < len(outputs) and bool(outputs[index]) and outputs[index] in im.used


STASH_DTYPES = ("float32", "float64", "float16", "bfloat16")
"""The types a normalization may compute its statistics in."""


def stash_dtype(node: Node, default: int = TensorProto.FLOAT) -> np.dtype:
    """The float type that ``stash_type`` names."""
    return dtype_attribute("stash_type", node.attr("stash_type", default), STASH_DTYPES)


def input_rank(x: SSAValue, at_least: int, what: str) -> int:
    """The rank of ``x``, which must be at least ``at_least``."""
    rank = len(shape_of(x))
    if rank < at_least:
        raise NodeError(f"the input needs rank >= {at_least} ({what}), got {rank}")
    return rank


def check_shape(value: SSAValue, expected: Sequence[int], what: str) -> None:
    """Fails unless ``value`` has exactly the ``expected`` shape."""
    if shape_of(value) != tuple(expected):
        raise NodeError(f"{what} must have shape {tuple(expected)}, got {shape_of(value)}")


# ---------------------------------------------------------------------------------------------
# Softmax, LogSoftmax, Hardmax
# ---------------------------------------------------------------------------------------------


def coerced_axis(im: Importer, node: Node, x: SSAValue) -> int:
    """The axis of a softmax-like op: default 1 before opset 13, -1 from then on."""
    shape = shape_of(x)
    if not shape:
        raise NodeError("the input must have rank >= 1")
    return axis_of(int(node.attr("axis", -1 if im.opset >= 13 else 1)), len(shape))


def along_axis(im: Importer, node: Node, x: SSAValue, apply) -> SSAValue:
    """``apply(im, x, axis)`` with the op's axis; before opset 13 the input is first coerced
    to 2-D at the axis, and the op runs over the flattened trailing axes."""
    shape = shape_of(x)
    axis = coerced_axis(im, node, x)
    if im.opset >= 13 or axis == len(shape) - 1:
        return apply(im, x, axis)
    flat = im.emit(wse.ReshapeOp(x, (prod(shape[:axis]), prod(shape[axis:]))))
    return im.emit(wse.ReshapeOp(apply(im, flat, 1), shape))


def softmax_like(cls: type[wse.SoftmaxOp | wse.LogSoftmaxOp]) -> OpImporter:
    """Softmax and LogSoftmax, with the coerce-to-2-D semantics before opset 13."""

    def run(im: Importer, node: Node) -> list:
        x = im.value(node, 0)
        return [along_axis(im, node, x, lambda im, v, axis: im.emit(cls(v, axis)))]

    return run


register("Softmax")(softmax_like(wse.SoftmaxOp))
register("LogSoftmax")(softmax_like(wse.LogSoftmaxOp))


def hardmax(im: Importer, x: SSAValue, axis: int) -> SSAValue:
    """1 where the first maximum along ``axis`` is, 0 elsewhere."""
    shape = shape_of(x)
    index = top_k(im, x, axis, 1, True)[1]
    positions = along(axis, len(shape), np.arange(shape[axis], dtype=np.int64))
    hit = im.emit(wse.EqualOp(im.const(positions), index))
    return im.emit(wse.CastOp(hit, wse.element_type(x)))


@register("Hardmax")
def _hardmax(im: Importer, node: Node) -> list:
    return [along_axis(im, node, im.value(node, 0), hardmax)]


# ---------------------------------------------------------------------------------------------
# Batch normalization
# ---------------------------------------------------------------------------------------------


def batch_norm_training(im: Importer, node: Node) -> bool:
    """Whether the node computes batch statistics: ``training_mode`` from opset 14, extra
    outputs from opset 7, ``is_test=0`` (the default) before."""
    if im.opset >= 14:
        return bool(node.attr("training_mode", 0))
    if im.opset >= 7:
        return any(bool(name) for name in node.proto.output[1:])
    return not node.attr("is_test", 0)


def channel_parameters(im: Importer, node: Node, x: SSAValue) -> list[SSAValue]:
    """scale, B, mean and var shaped to broadcast along axis 1 of ``x``: shape (C,), or with
    ``spatial=0`` (before opset 9) one value per activation, (C, D1, ...)."""
    shape = shape_of(x)
    spatial = im.opset >= 9 or bool(node.attr("spatial", 1))
    expected = shape[1:2] if spatial else shape[1:]
    params = [im.value(node, i) for i in range(1, 5)]
    for value, name in zip(params, ("scale", "B", "mean", "var"), strict=True):
        if shape_of(value) not in (tuple(expected), tuple(shape[1:2])):
            raise NodeError(f"input '{name}' must have shape {tuple(expected)}")
    return params


@register("BatchNormalization")
def _batch_norm(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    rank = input_rank(x, 2, "a channel axis")
    epsilon = float(node.attr("epsilon", 1e-5))
    scale, bias, mean, var = channel_parameters(im, node, x)
    if batch_norm_training(im, node):
        return batch_norm_with_batch_statistics(im, node, x, scale, bias, mean, var)
    one_type = all(wse.element_type(p) == wse.element_type(x) for p in (scale, bias, mean, var))
    if one_type and all(len(shape_of(p)) == 1 for p in (scale, bias, mean, var)):
        return [im.emit(wse.BatchNormOp(x, scale, bias, mean, var, epsilon))]
    mean, var, scale, bias = (per_channel(im, p, rank, x) for p in (mean, var, scale, bias))
    std = im.emit(wse.SqrtOp(im.emit(wse.AddOp(var, im.scalar(epsilon, var)))))
    gain = im.emit(wse.DivOp(scale, std))
    return [affine(im, im.emit(wse.SubOp(x, mean)), gain, bias)]


def batch_norm_with_batch_statistics(
    im: Importer,
    node: Node,
    x: SSAValue,
    scale: SSAValue,
    bias: SSAValue,
    mean: SSAValue,
    var: SSAValue,
) -> list:
    """Training-mode BatchNormalization: normalizes with the batch's own mean and (population)
    variance over every axis but 1 (axis 0 only for the per-activation parameters of
    ``spatial=0``) and updates the running statistics with ``momentum``. From opset 14 the
    outputs are Y, running_mean, running_var; before, Y, mean, var, saved_mean, saved_var:
    the batch's own mean and variance, as the specification names them (onnxruntime gives
    the inverse standard deviation as saved_var)."""
    shape = shape_of(x)
    rank = len(shape)
    epsilon = float(node.attr("epsilon", 1e-5))
    momentum = float(node.attr("momentum", 0.9))
    per_activation = len(shape_of(mean)) > 1
    axes = [0] if per_activation else [a for a in range(rank) if a != 1]
    low_precision = dtype_of(x).itemsize < 4 and im.opset >= 15
    stats_x = cast(im, x, "float32") if low_precision else x
    stats = standardize(im, stats_x, axes, epsilon)
    normed = cast(im, stats.normed, dtype_of(x))
    scale, bias = (per_channel(im, p, rank, x) for p in (scale, bias))
    y = affine(im, normed, scale, bias)
    batch = [as_statistic(im, v, like) for v, like in ((stats.mean, mean), (stats.var, var))]
    running = [
        running_average(im, old, new, momentum) for old, new in zip((mean, var), batch, strict=True)
    ]
    if im.opset >= 14:
        return [y, *running]
    return [y, *running, *batch]


def as_statistic(im: Importer, value: SSAValue, like: SSAValue) -> SSAValue:
    """A batch statistic in the shape and element type of the running one, ``like``."""
    value = cast(im, value, dtype_of(like))
    return im.emit(wse.ReshapeOp(value, shape_of(like)))


# ---------------------------------------------------------------------------------------------
# Layer, RMS, instance and group normalization
# ---------------------------------------------------------------------------------------------


def trailing_axes(node: Node, x: SSAValue) -> list[int]:
    """The axes from the ``axis`` attribute (default -1) to the last."""
    rank = input_rank(x, 1, "the normalized axes")
    return list(range(axis_of(int(node.attr("axis", -1)), rank), rank))


@register("LayerNormalization")
def _layer_norm(im: Importer, node: Node) -> list:
    x, scale = im.value(node, 0), im.value(node, 1)
    bias = im.optional(node, 2)
    axes = trailing_axes(node, x)
    epsilon = float(node.attr("epsilon", 1e-5))
    stash = stash_dtype(node)
    dtype = dtype_of(x)
    same_types = all(v is None or dtype_of(v) == dtype for v in (scale, bias))
    extra = used(im, node, 1) or used(im, node, 2)
    if stash == dtype and same_types and not extra:
        return [im.emit(wse.LayerNormOp(x, scale, bias, axes[0], epsilon))]
    stats = standardize(im, cast(im, x, stash), axes, epsilon)
    normed = cast(im, stats.normed, dtype)
    scale = cast(im, scale, dtype)
    bias = None if bias is None else cast(im, bias, dtype)
    return [affine(im, normed, scale, bias), stats.mean, stats.inv_std]


@register("RMSNormalization")
def _rms_norm(im: Importer, node: Node) -> list:
    x, scale = im.value(node, 0), im.value(node, 1)
    axes = trailing_axes(node, x)
    epsilon = float(node.attr("epsilon", 1e-5))
    wide = cast(im, x, stash_dtype(node))
    mean_square = im.emit(wse.ReduceMeanOp(square(im, wide), axes, True))
    rms = im.emit(wse.SqrtOp(im.emit(wse.AddOp(mean_square, im.scalar(epsilon, mean_square)))))
    normed = cast(im, im.emit(wse.DivOp(wide, rms)), dtype_of(scale))
    return [im.emit(wse.MulOp(normed, scale))]


@register("InstanceNormalization")
def _instance_norm(im: Importer, node: Node) -> list:
    x, scale, bias = (im.value(node, i) for i in range(3))
    rank = input_rank(x, 3, "N x C x D1 x ...")
    channels = shape_of(x)[1]
    for value, name in ((scale, "scale"), (bias, "B")):
        check_shape(value, (channels,), f"input '{name}'")
    epsilon = float(node.attr("epsilon", 1e-5))
    normed = standardize(im, x, range(2, rank), epsilon).normed
    scale, bias = (per_channel(im, v, rank, x) for v in (scale, bias))
    return [affine(im, normed, scale, bias)]


@register("GroupNormalization")
def _group_norm(im: Importer, node: Node) -> list:
    x, scale, bias = (im.value(node, i) for i in range(3))
    shape = shape_of(x)
    rank = input_rank(x, 2, "N x C x D1 x ...")
    groups = node.attr("num_groups", None)
    if groups is None:
        raise NodeError("attribute num_groups is required")
    groups = int(groups)
    if groups < 1 or shape[1] % groups:
        raise bad_attr("num_groups", groups, f" ({shape[1]} channels do not split evenly)")
    # Opset 18 scales and shifts each group; opset 21 each channel.
    per_group = im.opset < 21
    params = (groups,) if per_group else (shape[1],)
    for value, name in ((scale, "scale"), (bias, "bias")):
        check_shape(value, params, f"input '{name}'")
    dtype = dtype_of(x)
    stash = stash_dtype(node) if im.opset >= 21 else dtype
    grouped_shape = (shape[0], groups, prod(shape[1:]) // groups)
    grouped = im.emit(wse.ReshapeOp(cast(im, x, stash), grouped_shape))
    epsilon = float(node.attr("epsilon", 1e-5))
    normed = cast(im, standardize(im, grouped, [2], epsilon).normed, dtype)
    if per_group:
        scale, bias = (per_channel(im, v, 3, normed) for v in (scale, bias))
        return [im.emit(wse.ReshapeOp(affine(im, normed, scale, bias), shape))]
    scale, bias = (per_channel(im, v, rank, x) for v in (scale, bias))
    return [affine(im, im.emit(wse.ReshapeOp(normed, shape)), scale, bias)]


# ---------------------------------------------------------------------------------------------
# LRN, LpNormalization, MeanVarianceNormalization
# ---------------------------------------------------------------------------------------------


def channel_window(channels: int, size: int, weight: float, dtype: np.dtype) -> np.ndarray:
    """The (C, C) matrix that sums, for every channel c, the channels from
    ``c - floor((size - 1) / 2)`` to ``c + ceil((size - 1) / 2)``, each times ``weight``."""
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    offsets = np.arange(channels)[None, :] - np.arange(channels)[:, None]
    return ((offsets >= -before) & (offsets <= after)).astype(dtype) * np.asarray(weight, dtype)


@register("LRN")
def _lrn(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    input_rank(x, 2, "N x C x D1 x ...")
    size = node.attr("size", None)
    if size is None or int(size) < 1:
        raise bad_attr("size", size, " (a positive window size is required)")
    alpha = float(node.attr("alpha", 1e-4))
    beta = float(node.attr("beta", 0.75))
    bias = float(node.attr("bias", 1.0))
    rows = (shape[0], shape[1], prod(shape[2:]))
    squares = im.emit(wse.ReshapeOp(square(im, x), rows))
    window = im.const(channel_window(shape[1], int(size), alpha / int(size), dtype_of(x)))
    sums = im.emit(wse.ReshapeOp(im.emit(wse.MatmulOp(window, squares)), shape))
    base = im.emit(wse.AddOp(sums, im.scalar(bias, x)))
    return [im.emit(wse.DivOp(x, im.emit(wse.PowOp(base, im.scalar(beta, x)))))]


@register("LpNormalization")
def _lp_norm(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    rank = input_rank(x, 1, "an axis to normalize")
    axis = axis_of(int(node.attr("axis", -1)), rank)
    p = int(node.attr("p", 2))
    if p == 1:
        norm = im.emit(wse.ReduceSumOp(im.emit(wse.AbsOp(x)), [axis], True))
    elif p == 2:
        norm = im.emit(wse.SqrtOp(im.emit(wse.ReduceSumOp(square(im, x), [axis], True))))
    else:
        raise bad_attr("p", p, " (expected 1 or 2)")
    # A zero norm comes from an all-zero row, which stays zero.
    zero = im.emit(wse.EqualOp(norm, im.scalar(0, norm)))
    safe = im.emit(wse.SelectOp(zero, im.scalar(1, norm), norm))
    return [im.emit(wse.DivOp(x, safe))]


MVN_EPSILON = 1e-9
"""What MeanVarianceNormalization adds to the standard deviation (as its ONNX function)."""


@register("MeanVarianceNormalization")
def _mean_variance_norm(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    rank = len(shape_of(x))
    given = [int(a) for a in node.attr("axes", [0, 2, 3])]
    axes = sorted({axis_of(a, rank, "axes") for a in given})
    mean = im.emit(wse.ReduceMeanOp(x, axes, True))
    centered = im.emit(wse.SubOp(x, mean))
    var = im.emit(wse.ReduceMeanOp(square(im, centered), axes, True))
    std = im.emit(wse.AddOp(im.emit(wse.SqrtOp(var)), im.scalar(MVN_EPSILON, var)))
    return [im.emit(wse.DivOp(centered, std))]
