"""ONNX pooling ops: MaxPool, AveragePool, LpPool, the global pools and MaxUnpool.

MaxPool, AveragePool and LpPool map to the pooling primitives (LpPool: the mean of ``|x| ** p``
over the whole window, times its size, to the power ``1 / p``); a window over three or more
spatial axes runs as one 1-D pass per axis (max and mean are separable), which keeps every PE's
window scratch small. ``ceil_mode`` becomes extra end padding (the last window must start
inside the input or its begin padding, as in onnxruntime and PyTorch). The global pools are
reductions. MaxUnpool scatters into zeros with constant indices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, dtype_of, mul, reshape, shape_of
from cgc.frontends.onnx.conv import auto_pads
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr

SEPARABLE_FROM = 3
"""Pooling windows over this many spatial axes or more run as one 1-D pass per axis."""


# ---------------------------------------------------------------------------------------------
# Windows: ceil_mode and separable passes
# ---------------------------------------------------------------------------------------------


def ceil_extra(
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> list[int]:
    """The end padding ceil_mode adds per axis; the last window must start inside the input
    or its begin padding (as in onnxruntime and PyTorch)."""
    spatial = len(sizes)
    extra = []
    for i, (size, k, s, d) in enumerate(zip(sizes, kernel, strides, dilations, strict=True)):
        span = (k - 1) * d + 1
        padded = size + pads[i] + pads[spatial + i]
        out = -(-(padded - span) // s) + 1
        if (out - 1) * s >= size + pads[i]:
            out -= 1
        extra.append(max(0, (out - 1) * s + span - padded))
    return extra


@dataclass(frozen=True)
class Window:
    """A pooling window: ``pads`` include the extra end padding ``extra`` of ceil_mode."""

    kernel: list[int]
    strides: list[int]
    pads: list[int]
    dilations: list[int]
    extra: list[int]

    @property
    def real_pads(self) -> list[int]:
        """The padding without ceil_mode's extra end padding."""
        spatial = len(self.kernel)
        ends = [p - e for p, e in zip(self.pads[spatial:], self.extra, strict=True)]
        return self.pads[:spatial] + ends


def pool_window(node: Node, xs: Sequence[int]) -> Window:
    """The window of a pooling node over an input of shape ``xs``."""
    kernel = node.attr("kernel_shape", None)
    if kernel is None:
        raise NodeError("attribute kernel_shape is required")
    kernel = [int(k) for k in kernel]
    spatial = len(kernel)
    if len(xs) != spatial + 2:
        raise bad_attr("kernel_shape", kernel, f" for an input of shape {tuple(xs)}")
    strides = node.ints("strides", spatial, 1)
    dilations = node.ints("dilations", spatial, 1)
    pads = auto_pads(node, xs[2:], kernel, strides, dilations)
    auto_pad = node.attr("auto_pad", "NOTSET")
    extra = [0] * spatial
    if node.attr("ceil_mode", 0) and auto_pad in ("NOTSET", "VALID"):
        extra = ceil_extra(xs[2:], kernel, strides, pads, dilations)
        if auto_pad == "VALID" and any(extra):
            # The ONNX specification and onnxruntime disagree on this output shape.
            raise bad_attr("ceil_mode", 1, " with auto_pad=VALID")
        pads = pads[:spatial] + [p + e for p, e in zip(pads[spatial:], extra, strict=True)]
    return Window(kernel, strides, pads, dilations, extra)


PoolMaker = Callable[[SSAValue, list, list, list, list], wse.PoolOp]


def pool(im: Importer, x: SSAValue, make: PoolMaker, window: Window) -> SSAValue:
    """A max or mean pooling (``make`` builds the op); over three or more spatial axes, one
    1-D pass per axis."""
    kernel, strides, pads, dilations = window.kernel, window.strides, window.pads, window.dilations
    spatial = len(kernel)
    if spatial < SEPARABLE_FROM:
        return im.emit(make(x, kernel, strides, pads, dilations))
    for axis in range(spatial):
        axis_pads = only(pads[:spatial], axis, 0) + only(pads[spatial:], axis, 0)
        axis_kernel, axis_strides = (only(values, axis, 1) for values in (kernel, strides))
        x = im.emit(make(x, axis_kernel, axis_strides, axis_pads, only(dilations, axis, 1)))
    return x


def only(values: Sequence[int], axis: int, other: int) -> list[int]:
    """``values`` at ``axis``, ``other`` everywhere else."""
    return [v if i == axis else other for i, v in enumerate(values)]


def max_pool_op(x, kernel, strides, pads, dilations) -> wse.PoolOp:
    """A max pooling op (padding never wins)."""
    return wse.MaxPoolOp(x, kernel, strides, pads, dilations)


def mean_pool_op(include_pad: bool) -> PoolMaker:
    """The maker of mean pooling ops that count padded positions or not."""

    def make(x, kernel, strides, pads, dilations) -> wse.PoolOp:
        return wse.AvgPoolOp(x, kernel, strides, pads, dilations, include_pad)

    return make


def spatial_axes(x: SSAValue) -> tuple[int, ...]:
    """The spatial axes of an (N, C, *spatial) input."""
    rank = len(shape_of(x))
    if rank < 3:
        raise NodeError(f"the input needs rank >= 3, got {rank}")
    return tuple(range(2, rank))


# ---------------------------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------------------------


def max_pool_indices(im: Importer, node: Node, x: SSAValue, window: Window) -> SSAValue | None:
    """MaxPool's second output (flat indices into the input, spatial axes row-major or with
    ``storage_order`` 1 column-major), when the graph uses it."""
    storage_order = int(node.attr("storage_order", 0))
    if storage_order not in (0, 1):
        raise bad_attr("storage_order", storage_order)
    if len(node.proto.output) < 2 or node.proto.output[1] not in im.used:
        return None
    return im.emit(
        wse.ArgMaxPoolOp(
            x, window.kernel, window.strides, window.pads, window.dilations, storage_order
        )
    )


@register("MaxPool")
def _max_pool(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    window = pool_window(node, shape_of(x))
    return [pool(im, x, max_pool_op, window), max_pool_indices(im, node, x, window)]


@register("AveragePool")
def _average_pool(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    window = pool_window(node, shape_of(x))
    include_pad = bool(node.attr("count_include_pad", 0))
    if include_pad and any(window.extra):
        # The divisor counts the padding but not ceil_mode's overhang: pad with zeros as data.
        spatial = len(window.kernel)
        real = window.real_pads
        x = im.emit(wse.PadOp(x, [0, 0, *real[:spatial]], [0, 0, *real[spatial:]]))
        window = Window(
            window.kernel,
            window.strides,
            [0] * spatial + window.extra,
            window.dilations,
            window.extra,
        )
        include_pad = False
    return [pool(im, x, mean_pool_op(include_pad), window)]


def lp_exponent(im: Importer, node: Node) -> float:
    """LpPool's ``p``: a float before opset 2, an integer after; positive."""
    p = node.attr("p", 2.0 if im.opset < 2 else 2)
    if not p > 0:
        raise bad_attr("p", p, " (must be positive)")
    return float(p)


def lp_power(im: Importer, x: SSAValue, p: float) -> SSAValue:
    """``|x| ** p``."""
    if p == 2:
        return mul(im, x, x)
    magnitude = im.emit(wse.AbsOp(x))
    return magnitude if p == 1 else im.emit(wse.PowOp(magnitude, im.scalar(p, x)))


def lp_root(im: Importer, total: SSAValue, p: float) -> SSAValue:
    """``total ** (1 / p)``."""
    if p == 1:
        return total
    if p == 2:
        return im.emit(wse.SqrtOp(total))
    return im.emit(wse.PowOp(total, im.scalar(1 / p, total)))


@register("LpPool")
def _lp_pool(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    p = lp_exponent(im, node)
    window = pool_window(node, shape_of(x))
    mean = pool(im, lp_power(im, x, p), mean_pool_op(True), window)
    total = mul(im, mean, im.scalar(prod(window.kernel), mean))
    return [lp_root(im, total, p)]


@register("GlobalAveragePool")
def _global_average_pool(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    return [im.emit(wse.ReduceMeanOp(x, spatial_axes(x), True))]


@register("GlobalMaxPool")
def _global_max_pool(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    return [im.emit(wse.ReduceMaxOp(x, spatial_axes(x), True))]


@register("GlobalLpPool")
def _global_lp_pool(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    p = lp_exponent(im, node)
    total = im.emit(wse.ReduceSumOp(lp_power(im, x, p), spatial_axes(x), True))
    return [lp_root(im, total, p)]


@register("MaxUnpool")
def _max_unpool(im: Importer, node: Node) -> list:
    x, where = im.value(node, 0), im.value(node, 1)
    xs = shape_of(x)
    kernel = node.attr("kernel_shape", None)
    if kernel is None or len(kernel) != len(xs) - 2:
        raise NodeError(f"attribute kernel_shape must give {len(xs) - 2} values")
    spatial = len(kernel)
    strides = node.ints("strides", spatial, 1)
    pads = node.ints("pads", 2 * spatial, 0)
    sizes = [
        (n - 1) * s - pads[i] - pads[spatial + i] + k
        for i, (n, s, k) in enumerate(zip(xs[2:], strides, kernel, strict=True))
    ]
    inferred = (*xs[:2], *sizes)
    if shape_of(where) != xs:
        raise NodeError(f"indices of shape {shape_of(where)} do not match the input {xs}")
    zeros = im.const(np.zeros(prod(inferred), dtype=dtype_of(x)))
    flat_x, flat_where = reshape(im, x, (prod(xs),)), reshape(im, where, (prod(xs),))
    y = im.emit(wse.ScatterElementsOp(zeros, flat_where, flat_x, 0, "none"))
    y = reshape(im, y, inferred)
    requested = im.optional_static(node, 2)
    if requested is None:
        return [y]
    target = [int(t) for t in np.ravel(requested)]
    if len(target) != len(xs) or any(t < n for t, n in zip(target, inferred, strict=True)):
        raise NodeError(f"output_shape {target} is smaller than the unpooled shape {inferred}")
    grow = [t - n for t, n in zip(target, inferred, strict=True)]
    return [im.emit(wse.PadOp(y, [0] * len(xs), grow)) if any(grow) else y]
