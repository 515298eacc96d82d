"""ONNX convolution, pooling and resampling ops.

* Conv maps to ``wse.conv``. ConvTranspose is the convolution of the input with ``stride - 1``
  zeros inserted between its elements, with the filter's in/out channels swapped and its taps
  reversed, and with ``(kernel - 1) * dilation - pad`` padding.
* MaxPool, AveragePool and LpPool map to the pooling primitives (LpPool: the mean of
  ``|x| ** p`` over the whole window, times its size, to the power ``1 / p``); a window over
  three or more spatial axes runs as one 1-D pass per axis (max and mean are separable), which
  keeps every PE's window scratch small. The global pools are reductions. MaxUnpool and
  Col2Im scatter into zeros with constant indices.
* Resize and Upsample are separable: each resized axis gets one constant interpolation matrix,
  built with numpy and applied with a matmul (nearest: a gather with constant indices).
* GridSample, DeformConv and RoiAlign sample at positions that are data: elementwise ops compute
  every tap's index and weight, and ``wse.gather_elements`` fetches the taps.
* AffineGrid is a matmul of a constant grid of positions with the affine matrices;
  CausalConvWithState a depthwise convolution of the state and the input concatenated.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod

import ml_dtypes
import numpy as np
from xdsl.ir import SSAValue

from cgc import dtypes
from cgc.dialects import wse
from cgc.frontends.onnx.builders import (
    add,
    add_channel_bias,
    affine,
    broadcast,
    cast,
    clamp,
    dtype_of,
    less,
    mul,
    reshape,
    select,
    sub,
)
from cgc.frontends.onnx.importer import Importer, Node, NodeError, bad_attr, register, shape_of

SEPARABLE_FROM = 3
"""Pooling windows over this many spatial axes or more run as one 1-D pass per axis."""

# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------


def working_dtype(dtype: np.dtype) -> np.dtype:
    """The float type that resampling and sampling of ``dtype`` values compute in: float32 and
    float64 as they are, the narrow floats and small integers in float32, wider integers in
    float64."""
    if dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        return dtype
    if dtypes.is_float(dtype) or dtype.itemsize <= 2:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def from_float(im: Importer, y: SSAValue, dtype: np.dtype) -> SSAValue:
    """A float result back in ``dtype``: integers are rounded (half to even) and clipped."""
    if dtypes.is_integer(dtype):
        info = ml_dtypes.iinfo(dtype)
        y = clamp(im, im.emit(wse.RoundOp(y)), info.min, info.max)
    return cast(im, y, dtype)


def string_attr(node: Node, name: str, default: str, choices: Sequence[str]) -> str:
    """A string attribute that must be one of ``choices``."""
    value = node.attr(name, default)
    if value not in choices:
        raise bad_attr(name, value, f" (expected one of {', '.join(choices)})")
    return value


# ---------------------------------------------------------------------------------------------
# Windows: padding, auto_pad and ceil_mode
# ---------------------------------------------------------------------------------------------


def auto_pads(
    node: Node,
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
) -> list[int]:
    """Begin then end padding of every spatial axis, from ``pads`` or ``auto_pad``."""
    spatial = len(sizes)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = node.ints("pads", 2 * spatial, 0)
        if min(pads, default=0) < 0:
            raise bad_attr("pads", pads)
        return pads
    if auto_pad == "VALID":
        return [0] * (2 * spatial)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise bad_attr("auto_pad", auto_pad)
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return begins + ends


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
        sizes = [only(values, axis, 1) for values in (kernel, strides)]
        x = im.emit(make(x, *sizes, axis_pads, only(dilations, axis, 1)))
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
# Convolutions
# ---------------------------------------------------------------------------------------------


def conv_kernel(node: Node, xs: Sequence[int], ws: Sequence[int]) -> tuple[int, ...]:
    """The filter's spatial shape, checked against the input and ``kernel_shape``."""
    if len(xs) < 3 or len(ws) != len(xs):
        raise NodeError(f"input {tuple(xs)} and filter {tuple(ws)} need the same rank >= 3")
    kernel = tuple(ws[2:])
    declared = node.attr("kernel_shape", None)
    if declared is not None and tuple(declared) != kernel:
        raise bad_attr("kernel_shape", declared, f" (the filter has kernel {list(kernel)})")
    return kernel


def convolution(
    im: Importer, node: Node, x: SSAValue, w: SSAValue, kernel: Sequence[int]
) -> SSAValue:
    """The convolution of ``x`` with the filter ``w`` of spatial shape ``kernel``, with the
    node's strides, dilations, padding (``pads`` or ``auto_pad``) and group."""
    spatial = len(kernel)
    strides = node.ints("strides", spatial, 1)
    dilations = node.ints("dilations", spatial, 1)
    pads = auto_pads(node, shape_of(x)[2:], kernel, strides, dilations)
    group = int(node.attr("group", 1))
    return im.emit(wse.ConvOp(x, w, strides, pads, dilations, group))


@register("Conv")
def _conv(im: Importer, node: Node) -> list:
    x, w = im.value(node, 0), im.value(node, 1)
    y = convolution(im, node, x, w, conv_kernel(node, shape_of(x), shape_of(w)))
    return [add_channel_bias(im, y, im.optional(node, 2))]


def transpose_pads(
    node: Node,
    opset: int,
    sizes: Sequence[int],
    full: Sequence[int],
    strides: Sequence[int],
) -> list[int]:
    """Begin then end padding that ConvTranspose crops from its full output ``full``.

    With ``output_shape`` (or SAME auto_pad, whose output shape is ``size * stride``) the
    padding is the difference, split in halves; the smaller half goes first for SAME_UPPER
    from opset 11 on, and for every mode but SAME_UPPER before.
    """
    spatial = len(sizes)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise bad_attr("auto_pad", auto_pad)
    target = node.attr("output_shape", None)
    if target is not None:
        if len(target) not in (spatial, spatial + 2):
            raise bad_attr("output_shape", target, f" (expected {spatial} values)")
        target = [int(t) for t in target[-spatial:]]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [n * s for n, s in zip(sizes, strides, strict=True)]
    if target is None:
        return [0] * (2 * spatial) if auto_pad == "VALID" else node.ints("pads", 2 * spatial, 0)
    small_first = (auto_pad == "SAME_UPPER") == (opset >= 11)
    totals = [f - t for f, t in zip(full, target, strict=True)]
    begins = [t // 2 if small_first else t - t // 2 for t in totals]
    return begins + [t - b for t, b in zip(totals, begins, strict=True)]


def insert_zeros(
    im: Importer, x: SSAValue, strides: Sequence[int], trim: Sequence[int]
) -> SSAValue:
    """``x`` (N, C, *spatial) with ``stride - 1`` zeros between neighbours along every spatial
    axis, then ``trim`` (begins, then ends) elements cut from the ends of every axis."""
    n, c, *sizes = shape_of(x)
    spatial = len(sizes)
    if any(s > 1 for s in strides):
        split = [n, c, *itertools.chain.from_iterable((size, 1) for size in sizes)]
        gaps = [0, 0, *itertools.chain.from_iterable((0, s - 1) for s in strides)]
        x = im.emit(wse.PadOp(reshape(im, x, split), [0] * len(split), gaps))
        x = reshape(im, x, (n, c, *[size * s for size, s in zip(sizes, strides, strict=True)]))
    dilated = [(size - 1) * s + 1 for size, s in zip(sizes, strides, strict=True)]
    limits = [d - e for d, e in zip(dilated, trim[spatial:], strict=True)]
    if list(shape_of(x)[2:]) == limits and not any(trim[:spatial]):
        return x
    return im.emit(wse.SliceOp(x, [0, 0, *trim[:spatial]], [n, c, *limits], [1] * (spatial + 2)))


def transposed_filter(im: Importer, w: SSAValue, group: int) -> SSAValue:
    """A ConvTranspose filter (C, M/group, *k) as the equivalent convolution's filter
    (M, C/group, *k): in and out channels swapped within each group, taps reversed."""
    c, m_per_group, *kernel = shape_of(w)
    if c % group:
        raise NodeError(f"{c} input channels do not split into {group} groups")
    spatial = len(kernel)
    w = reshape(im, w, (group, c // group, m_per_group, *kernel))
    w = im.emit(wse.TransposeOp(w, [0, 2, 1, *range(3, spatial + 3)]))
    w = reshape(im, w, (group * m_per_group, c // group, *kernel))
    return im.emit(wse.ReverseOp(w, list(range(2, spatial + 2))))


@register("ConvTranspose")
def _conv_transpose(im: Importer, node: Node) -> list:
    x, w = im.value(node, 0), im.value(node, 1)
    xs = shape_of(x)
    kernel = conv_kernel(node, xs, shape_of(w))
    spatial = len(kernel)
    strides = node.ints("strides", spatial, 1)
    dilations = node.ints("dilations", spatial, 1)
    extra = node.ints("output_padding", spatial, 0)
    group = int(node.attr("group", 1))
    spans = [(k - 1) * d for k, d in zip(kernel, dilations, strict=True)]
    full = [
        s * (n - 1) + e + span + 1
        for n, s, e, span in zip(xs[2:], strides, extra, spans, strict=True)
    ]
    pads = transpose_pads(node, im.opset, xs[2:], full, strides)
    conv_pads = [span - p for span, p in zip(spans, pads[:spatial], strict=True)]
    conv_pads += [span - p + e for span, p, e in zip(spans, pads[spatial:], extra, strict=True)]
    dilated = insert_zeros(im, x, strides, [max(0, -p) for p in conv_pads])
    filt = transposed_filter(im, w, group)
    y = im.emit(
        wse.ConvOp(dilated, filt, [1] * spatial, [max(0, p) for p in conv_pads], dilations, group)
    )
    return [add_channel_bias(im, y, im.optional(node, 2))]


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
    target = im.optional_static(node, 2)
    if target is None:
        return [y]
    target = [int(t) for t in np.ravel(target)]
    if len(target) != len(xs) or any(t < n for t, n in zip(target, inferred, strict=True)):
        raise NodeError(f"output_shape {target} is smaller than the unpooled shape {inferred}")
    grow = [t - n for t, n in zip(target, inferred, strict=True)]
    return [im.emit(wse.PadOp(y, [0] * len(xs), grow)) if any(grow) else y]


# ---------------------------------------------------------------------------------------------
# Col2Im
# ---------------------------------------------------------------------------------------------


def col2im_targets(
    image: Sequence[int],
    block: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> tuple[np.ndarray, list[int], list[int]]:
    """Where every column element lands in the padded image (flat indices, block taps major,
    block positions minor), the padded image's shape, and the number of blocks per axis."""
    nd = len(image)
    padded = [image[i] + pads[i] + pads[nd + i] for i in range(nd)]
    blocks = [
        (padded[i] - (dilations[i] * (block[i] - 1) + 1)) // strides[i] + 1 for i in range(nd)
    ]
    if min(blocks) < 1:
        raise NodeError(f"block_shape {list(block)} does not fit in image_shape {list(image)}")
    taps = np.indices(block).reshape(nd, -1)
    positions = np.indices(blocks).reshape(nd, -1)
    coords = [
        positions[i][None, :] * strides[i] + taps[i][:, None] * dilations[i] for i in range(nd)
    ]
    flat = np.ravel_multi_index(tuple(coords), padded).reshape(-1)
    return flat.astype(np.int64), padded, blocks


@register("Col2Im")
def _col2im(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    image = [int(v) for v in np.ravel(im.static(node, 1))]
    block = [int(v) for v in np.ravel(im.static(node, 2))]
    nd = len(image)
    if len(block) != nd:
        raise NodeError(f"image_shape {image} and block_shape {block} differ in length")
    strides, dilations = node.ints("strides", nd, 1), node.ints("dilations", nd, 1)
    pads = node.ints("pads", 2 * nd, 0)
    n, rows, length = shape_of(x)
    taps = prod(block)
    flat, padded, blocks = col2im_targets(image, block, strides, pads, dilations)
    if rows % taps or length != prod(blocks):
        raise NodeError(
            f"input {shape_of(x)} does not hold blocks {block} of an image {image} "
            f"({prod(blocks)} blocks)"
        )
    c = rows // taps
    updates = reshape(im, x, (n, c, taps * length))
    where = im.const(np.broadcast_to(flat, (n, c, flat.size)).copy())
    zeros = im.const(np.zeros((n, c, prod(padded)), dtype=dtype_of(x)))
    y = im.emit(wse.ScatterElementsOp(zeros, where, updates, 2, "add"))
    y = reshape(im, y, (n, c, *padded))
    if not any(pads):
        return [y]
    limits = [n, c, *[pads[i] + image[i] for i in range(nd)]]
    return [im.emit(wse.SliceOp(y, [0, 0, *pads[:nd]], limits, [1] * (nd + 2)))]


# ---------------------------------------------------------------------------------------------
# Resize and Upsample
# ---------------------------------------------------------------------------------------------

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
    sizes = [int(s) for s in sizes]
    if policy == "stretch":
        return [
            AxisResize(a, shape[a], s, s / shape[a], float(s))
            for a, s in zip(axes, sizes, strict=True)
        ]
    ratios = [s / shape[a] for a, s in zip(axes, sizes, strict=True)]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    return [
        AxisResize(a, shape[a], int(scale * shape[a] + 0.5), scale, scale * shape[a]) for a in axes
    ]


def resize_plan(im: Importer, node: Node, shape: Sequence[int], crop: bool) -> list[AxisResize]:
    """The resized axes of a Resize node (opset 11 on), from scales or sizes and the roi."""
    axes = resize_axes(node, len(shape))
    roi = given(im, node, 1) if crop else None
    scales, sizes = given(im, node, 2), given(im, node, 3)
    if (scales is None) == (sizes is None):
        raise NodeError("exactly one of the inputs scales and sizes must be given")
    count = len(axes)
    if len(scales if sizes is None else sizes) != count:
        raise NodeError(f"scales or sizes must have {count} values, one per resized axis")
    if roi is not None and len(roi) != 2 * count:
        raise NodeError(f"roi must have {2 * count} values")
    if sizes is not None:
        policy = string_attr(
            node, "keep_aspect_ratio_policy", "stretch", ("stretch", "not_larger", "not_smaller")
        )
        plan = axes_from_sizes(shape, axes, sizes, policy)
    else:
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


def legacy_plan(shape: Sequence[int], scales: Sequence[float]) -> list[AxisResize]:
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


def legacy_resample(im: Importer, x: SSAValue, scales: Sequence[float], mode: str) -> SSAValue:
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


# ---------------------------------------------------------------------------------------------
# Sampling at data-dependent positions: GridSample, DeformConv, RoiAlign
# ---------------------------------------------------------------------------------------------

Tap = tuple[SSAValue, SSAValue | None]
"""One interpolation tap along one axis: its input index (a float tensor of whole numbers, or
an int64 tensor once in range) and its weight (None for weight 1)."""


def reflect(im: Importer, v: SSAValue, low: float, high: float) -> SSAValue:
    """Coordinates outside ``[low, high]`` reflected back in by the nearer border, as often as
    needed; coordinates inside are kept."""
    span = high - low
    if span <= 0:
        return affine(im, v, 0.0, low)
    below, above = less(im, v, im.scalar(low, v)), less(im, im.scalar(high, v), v)
    distance = select(im, below, affine(im, v, -1.0, low), affine(im, v, 1.0, -high))
    flips = im.emit(wse.FloorOp(affine(im, distance, 1 / span, 0.0)))
    rest = sub(im, distance, affine(im, flips, span, 0.0))
    even = im.emit(wse.EqualOp(im.emit(wse.ModOp(flips, im.scalar(2, flips))), im.scalar(0, v)))
    from_low, from_high = affine(im, rest, 1.0, low), affine(im, rest, -1.0, high)
    inside_below = select(im, even, from_low, from_high)
    inside_above = select(im, even, from_high, from_low)
    return select(im, below, inside_below, select(im, above, inside_above, v))


def keys_near(im: Importer, d: SSAValue, a: float) -> SSAValue:
    """Keys' cubic kernel for distances ``d`` in [0, 1]."""
    inner = affine(im, d, a + 2, -(a + 3))
    return affine(im, mul(im, mul(im, inner, d), d), 1.0, 1.0)


def keys_far(im: Importer, d: SSAValue, a: float) -> SSAValue:
    """Keys' cubic kernel for distances ``d`` in [1, 2]."""
    inner = affine(im, mul(im, affine(im, d, a, -5 * a), d), 1.0, 8 * a)
    return affine(im, mul(im, inner, d), 1.0, -4 * a)


def interpolation_taps(im: Importer, v: SSAValue, mode: str) -> list[Tap]:
    """The taps of coordinates ``v`` for nearest (``v`` already rounded), linear or cubic
    (Keys, a = -0.75) interpolation."""
    if mode == "nearest":
        return [(v, None)]
    base = im.emit(wse.FloorOp(v))
    frac = sub(im, v, base)
    if mode == "linear":
        return [(base, affine(im, frac, -1.0, 1.0)), (affine(im, base, 1.0, 1.0), frac)]
    a = -0.75
    weights = [
        keys_far(im, affine(im, frac, 1.0, 1.0), a),
        keys_near(im, frac, a),
        keys_near(im, affine(im, frac, -1.0, 1.0), a),
        keys_far(im, affine(im, frac, -1.0, 2.0), a),
    ]
    return [
        (affine(im, base, 1.0, shift), w) for shift, w in zip((-1, 0, 1, 2), weights, strict=True)
    ]


def padded_tap(im: Importer, tap: Tap, padding: str, bounds: tuple[float, float], size: int):
    """A tap whose index may lie outside ``[0, size)``, read the way ``padding`` says: zeros
    (no weight), border (the edge element) or reflection (mirrored at ``bounds``); the index
    comes back as int64 in range."""
    index, weight = tap
    if padding == "zeros":
        inside = im.emit(
            wse.AndOp(
                im.emit(wse.GreaterEqualOp(index, im.scalar(0, index))),
                im.emit(wse.GreaterEqualOp(im.scalar(size - 1, index), index)),
            )
        )
        one = weight if weight is not None else im.scalar(1, index)
        weight = select(im, inside, one, im.scalar(0, index))
    elif padding == "reflection":
        index = reflect(im, index, *bounds)
    index = clamp(im, index, 0, size - 1)
    return cast(im, index, np.dtype(np.int64)), weight


def gather_taps(
    im: Importer,
    data: SSAValue,
    taps: Sequence[Sequence[Tap]],
    sizes: Sequence[int],
    combine: type[wse.BinaryOp] = wse.AddOp,
) -> SSAValue:
    """``data`` (*lead, prod(sizes)) read at every combination of one tap per axis, weighted,
    and combined (summed, or with ``combine``): the result is (*lead, P).

    Tap indices and weights broadcast to (*lead', P) where ``lead'`` has size 1 on the axes
    they share with all of ``lead``'s channels; they are flattened to one point axis."""
    strides = [prod(sizes[i + 1 :]) for i in range(len(sizes))]
    lead = shape_of(data)[:-1]
    result = None
    for combo in itertools.product(*taps):
        flat, weight = None, None
        for (index, w), stride in zip(combo, strides, strict=True):
            term = index if stride == 1 else mul(im, index, im.scalar(stride, index))
            flat = term if flat is None else add(im, flat, term)
            if w is not None:
                weight = w if weight is None else mul(im, weight, w)
        points = shape_of(flat)
        shape = (*points[: len(lead) - 1], 1, prod(points[len(lead) - 1 :]))
        flat = broadcast(im, reshape(im, flat, shape), (*lead, shape[-1]))
        value = im.emit(wse.GatherElementsOp(data, flat, len(lead)))
        if weight is not None:
            value = mul(im, value, reshape(im, broadcast(im, weight, points), shape))
        result = value if result is None else im.emit(combine(result, value))
    assert result is not None
    return result


def grid_mode(im: Importer, node: Node) -> str:
    """GridSample's mode as ``nearest``, ``linear`` or ``cubic`` (opset 16 spells the last two
    ``bilinear`` and ``bicubic``)."""
    if im.opset < 20:
        mode = string_attr(node, "mode", "bilinear", ("bilinear", "nearest", "bicubic"))
        return {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    return string_attr(node, "mode", "linear", ("linear", "nearest", "cubic"))


def grid_axis_taps(
    im: Importer, g: SSAValue, size: int, mode: str, padding: str, align: bool
) -> list[Tap]:
    """The taps along one axis of normalized grid coordinates ``g``."""
    if align:
        v, bounds = affine(im, g, (size - 1) / 2, (size - 1) / 2), (0.0, size - 1.0)
    else:
        v, bounds = affine(im, g, size / 2, (size - 1) / 2), (-0.5, size - 0.5)
    if mode == "nearest":
        v = im.emit(wse.RoundOp(v))
    if padding == "border":
        outside = im.emit(
            wse.OrOp(less(im, v, im.scalar(bounds[0], v)), less(im, im.scalar(bounds[1], v), v))
        )
        v = select(im, outside, clamp(im, v, 0, size - 1), v)
    elif padding == "reflection":
        v = reflect(im, v, *bounds)
    return [padded_tap(im, t, padding, bounds, size) for t in interpolation_taps(im, v, mode)]


@register("GridSample")
def _grid_sample(im: Importer, node: Node) -> list:
    x, grid = im.value(node, 0), im.value(node, 1)
    n, c, *sizes = shape_of(x)
    gs = shape_of(grid)
    nd = len(sizes)
    if nd < 1 or len(gs) != nd + 2 or gs[0] != n or gs[-1] != nd:
        raise NodeError(f"grid {gs} does not match an input of shape {shape_of(x)}")
    mode = grid_mode(im, node)
    padding = string_attr(node, "padding_mode", "zeros", ("zeros", "border", "reflection"))
    align = bool(node.attr("align_corners", 0))
    dtype = dtype_of(x)
    work = working_dtype(dtype)
    out = gs[1:-1]
    points = reshape(im, cast(im, grid, work), (n, prod(out), nd))
    taps = []
    for i, size in enumerate(sizes):
        part = nd - 1 - i  # the grid holds (x, y, ...): the last spatial axis first
        g = im.emit(wse.SliceOp(points, [0, 0, part], [n, prod(out), part + 1], [1, 1, 1]))
        g = reshape(im, g, (n, 1, prod(out)))
        taps.append(grid_axis_taps(im, g, size, mode, padding, align))
    data = reshape(im, cast(im, x, work), (n, c, prod(sizes)))
    y = gather_taps(im, data, taps, sizes)
    return [cast(im, reshape(im, y, (n, c, *out)), dtype)]


def deform_positions(
    kernel: Sequence[int],
    out: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> np.ndarray:
    """(nd, K, P): the undeformed input position of every kernel tap at every output point."""
    nd = len(kernel)
    taps = np.indices(kernel).reshape(nd, -1)
    points = np.indices(out).reshape(nd, -1)
    return np.stack(
        [
            points[i][None, :] * strides[i] - pads[i] + taps[i][:, None] * dilations[i]
            for i in range(nd)
        ]
    ).astype(np.float64)


@register("DeformConv")
def _deform_conv(im: Importer, node: Node) -> list:
    x, w, offset = im.value(node, 0), im.value(node, 1), im.value(node, 2)
    xs, ws = shape_of(x), shape_of(w)
    kernel = conv_kernel(node, xs, ws)
    nd = len(kernel)
    strides, dilations = node.ints("strides", nd, 1), node.ints("dilations", nd, 1)
    pads = node.ints("pads", 2 * nd, 0)
    group, offset_group = int(node.attr("group", 1)), int(node.attr("offset_group", 1))
    n, c, *sizes = xs
    out = [
        (size + pads[i] + pads[nd + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1
        for i, size in enumerate(sizes)
    ]
    taps_k, points = prod(kernel), prod(out)
    if shape_of(offset) != (n, offset_group * taps_k * nd, *out):
        raise NodeError(f"offset {shape_of(offset)} does not match {nd}-D kernel {list(kernel)}")
    if c % group or c % offset_group or ws[0] % group or ws[1] * group != c:
        raise NodeError(f"input {xs} and filter {ws} do not match group={group}")
    dtype = dtype_of(x)
    work = working_dtype(dtype)
    offsets = reshape(im, cast(im, offset, work), (n, offset_group, taps_k, nd, points))
    base = deform_positions(kernel, out, strides, pads, dilations)
    taps = []
    for i, size in enumerate(sizes):
        part = im.emit(
            wse.SliceOp(offsets, [0, 0, 0, i, 0], [n, offset_group, taps_k, i + 1, points], [1] * 5)
        )
        part = reshape(im, part, (n, offset_group, 1, taps_k * points))
        coords = add(im, part, im.const(base[i].reshape(1, 1, 1, -1).astype(work)))
        bounds = (0.0, size - 1.0)
        taps.append(
            [
                padded_tap(im, t, "zeros", bounds, size)
                for t in interpolation_taps(im, coords, "linear")
            ]
        )
    data = reshape(im, cast(im, x, work), (n, offset_group, c // offset_group, prod(sizes)))
    sampled = gather_taps(im, data, taps, sizes)
    mask = im.optional(node, 4)
    if mask is not None:
        sampled = mul(
            im, sampled, reshape(im, cast(im, mask, work), (n, offset_group, 1, taps_k * points))
        )
    cols = reshape(im, sampled, (n, group, c // group * taps_k, points))
    filt = reshape(im, cast(im, w, work), (group, ws[0] // group, c // group * taps_k))
    y = reshape(im, im.emit(wse.MatmulOp(filt, cols)), (n, ws[0], *out))
    bias = im.optional(node, 3)
    y = add_channel_bias(im, y, None if bias is None else cast(im, bias, work))
    return [cast(im, y, dtype)]


@dataclass(frozen=True)
class RoiGeometry:
    """How RoiAlign samples along one axis of the image."""

    size: int
    """The image's extent along the axis."""
    pooled: int
    """Output bins along the axis."""
    columns: tuple[int, int]
    """The roi columns of the box's start and end along the axis."""


def roi_grid_counts(
    rois: np.ndarray | None,
    geometry: RoiGeometry,
    ratio: int,
    scale: float,
    offset: float,
    work: np.dtype,
) -> np.ndarray:
    """Samples per bin along one axis, per roi: ``sampling_ratio``, or when it is 0 the bin's
    extent rounded up (which needs the rois at compile time)."""
    if ratio > 0:
        return np.array([ratio])
    assert rois is not None, "sampling_ratio=0 needs the rois at compile time"
    boxes = rois.astype(work) * work.type(scale) - work.type(offset)
    start, end = boxes[:, geometry.columns[0]], boxes[:, geometry.columns[1]]
    extent = end - start if offset else np.maximum(end - start, work.type(1))
    return np.maximum(np.ceil(extent / work.type(geometry.pooled)), 1).astype(np.int64)


def sample_fractions(geometry: RoiGeometry, counts: np.ndarray) -> np.ndarray:
    """(R or 1, pooled * G): where each sample sits, in bins from the box start; G is the
    largest count, and a roi with fewer samples per bin repeats its last one (masked)."""
    most = int(counts.max())
    sample = np.minimum(np.arange(most)[None, :], counts.reshape(-1, 1) - 1)
    centres = (sample + 0.5) / counts.reshape(-1, 1)
    fractions = np.arange(geometry.pooled)[None, :, None] + centres[:, None, :]
    return fractions.reshape(len(counts), -1)


def sample_present(geometry: RoiGeometry, counts: np.ndarray) -> np.ndarray:
    """(R or 1, pooled * G): which samples exist (rois with fewer samples per bin than the
    largest count have gaps)."""
    most = int(counts.max())
    present = np.arange(most)[None, :] < counts.reshape(-1, 1)
    return np.broadcast_to(present[:, None, :], (len(counts), geometry.pooled, most)).reshape(
        len(counts), -1
    )


def box_side(im: Importer, boxes: SSAValue, column: int) -> SSAValue:
    """Column ``column`` of the (R, 4) boxes, as (R, 1)."""
    r = shape_of(boxes)[0]
    return im.emit(wse.SliceOp(boxes, [0, column], [r, column + 1], [1, 1]))


def roi_axis_taps(
    im: Importer,
    boxes: SSAValue,
    geometry: RoiGeometry,
    counts: np.ndarray,
    half_pixel: bool,
) -> list[Tap]:
    """The two bilinear taps (R, pooled * G) of every sample along one axis: samples sit at
    the centres of a ``counts``-way split of each bin; samples beyond -1 or the image's extent
    weigh nothing, samples below 0 read element 0 and samples past the last element read it."""
    start = box_side(im, boxes, geometry.columns[0])
    extent = sub(im, box_side(im, boxes, geometry.columns[1]), start)
    if not half_pixel:
        extent = im.emit(wse.MaxOp(extent, im.scalar(1.0, extent)))
    bin_size = affine(im, extent, 1 / geometry.pooled, 0.0)
    fractions = im.const(sample_fractions(geometry, counts).astype(dtype_of(boxes)))
    v = add(im, start, mul(im, bin_size, fractions))
    size = geometry.size
    valid = im.emit(
        wse.AndOp(
            im.emit(wse.GreaterEqualOp(v, im.scalar(-1.0, v))),
            im.emit(wse.GreaterEqualOp(im.scalar(size, v), v)),
        )
    )
    present = sample_present(geometry, counts)
    if not present.all():
        valid = im.emit(wse.AndOp(valid, im.const(present.copy())))
    v = clamp(im, v, 0, size - 1)
    low = im.emit(wse.FloorOp(v))
    high = clamp(im, affine(im, low, 1.0, 1.0), 0, size - 1)
    frac = sub(im, v, low)
    zero = im.scalar(0, v)
    weights = (select(im, valid, affine(im, frac, -1.0, 1.0), zero), select(im, valid, frac, zero))
    return [(cast(im, i, np.dtype(np.int64)), w) for i, w in zip((low, high), weights, strict=True)]


def roi_options(im: Importer, node: Node) -> tuple[str, int, int, int, float, bool]:
    """RoiAlign's mode, output height and width, sampling ratio, spatial scale, and whether
    boxes use half-pixel coordinates (the default from opset 16 on)."""
    mode = string_attr(node, "mode", "avg", ("avg", "max"))
    height, width = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    ratio = int(node.attr("sampling_ratio", 0))
    if height < 1 or width < 1 or ratio < 0:
        raise NodeError(
            f"output_height={height}, output_width={width} and sampling_ratio={ratio} "
            "must be positive (sampling_ratio may be 0)"
        )
    half_pixel = False
    if im.opset >= 16:
        transform = string_attr(
            node,
            "coordinate_transformation_mode",
            "half_pixel",
            ("half_pixel", "output_half_pixel"),
        )
        half_pixel = transform == "half_pixel"
    return mode, height, width, ratio, float(node.attr("spatial_scale", 1.0)), half_pixel


def pool_samples(im: Importer, samples: SSAValue, mode: str, present: np.ndarray) -> SSAValue:
    """The (R, C, out_h, G, out_w, G) samples of RoiAlign's bins averaged or maxed over the
    samples of each bin that are ``present``."""
    if mode == "avg":  # absent samples weigh nothing
        total = im.emit(wse.ReduceSumOp(samples, [3, 5], False))
        count = np.maximum(present.sum(axis=(3, 5)), 1).astype(dtype_of(samples))
        return im.emit(wse.DivOp(total, im.const(count)))
    if not present.all():
        samples = select(im, im.const(present.copy()), samples, im.scalar(-np.inf, samples))
    return im.emit(wse.ReduceMaxOp(samples, [3, 5], False))


@register("RoiAlign")
def _roi_align(im: Importer, node: Node) -> list:
    x, rois, batch = im.value(node, 0), im.value(node, 1), im.value(node, 2)
    xs = shape_of(x)
    if len(xs) != 4 or len(shape_of(rois)) != 2 or shape_of(rois)[1] != 4:
        raise NodeError(f"expected X (N, C, H, W) and rois (R, 4), got {xs} and {shape_of(rois)}")
    n, c, height, width = xs
    r = shape_of(rois)[0]
    mode, out_h, out_w, ratio, scale, half_pixel = roi_options(im, node)
    dtype = dtype_of(x)
    work = working_dtype(dtype)
    offset = 0.5 if half_pixel else 0.0
    boxes = affine(im, cast(im, rois, work), scale, -offset)
    known = im.known_value(node, 1)
    if known is None and ratio == 0:
        why = " for sampling_ratio=0 (the number of samples per bin depends on each box)"
        raise im.not_constant(node, 1, why)
    rows = RoiGeometry(height, out_h, (1, 3))
    cols = RoiGeometry(width, out_w, (0, 2))
    row_counts = roi_grid_counts(known, rows, ratio, scale, offset, work)
    col_counts = roi_grid_counts(known, cols, ratio, scale, offset, work)
    row_taps = roi_axis_taps(im, boxes, rows, row_counts, half_pixel)
    col_taps = roi_axis_taps(im, boxes, cols, col_counts, half_pixel)
    grid_h, grid_w = int(row_counts.max()), int(col_counts.max())
    a, b = out_h * grid_h, out_w * grid_w
    row_taps = [(reshape(im, i, (r, a, 1)), reshape(im, w, (r, a, 1))) for i, w in row_taps]
    col_taps = [(reshape(im, i, (r, 1, b)), reshape(im, w, (r, 1, b))) for i, w in col_taps]
    images = reshape(im, cast(im, x, work), (n, c, height * width))
    data = im.emit(wse.GatherOp(images, batch, 0))
    combine = wse.AddOp if mode == "avg" else wse.MaxOp
    samples = gather_taps(im, data, [row_taps, col_taps], [height, width], combine)
    samples = reshape(im, samples, (r, c, out_h, grid_h, out_w, grid_w))
    present = (
        sample_present(rows, row_counts)[:, :, None] & sample_present(cols, col_counts)[:, None, :]
    )
    y = pool_samples(im, samples, mode, present.reshape(-1, 1, out_h, grid_h, out_w, grid_w))
    return [cast(im, y, dtype)]


# ---------------------------------------------------------------------------------------------
# AffineGrid and CausalConvWithState
# ---------------------------------------------------------------------------------------------


def normalized_positions(size: int, align: bool) -> np.ndarray:
    """The centres of ``size`` elements on [-1, 1]: the corner elements' centres at -1 and 1
    with ``align``, else the corner elements' outer edges."""
    if align:
        step = 2.0 / (size - 1) if size > 1 else 0.0
        return -1.0 + step * np.arange(size)
    step = 2.0 / size
    return -1.0 + step / 2 + step * np.arange(size)


@register("AffineGrid")
def _affine_grid(im: Importer, node: Node) -> list:
    theta = im.value(node, 0)
    size = [int(v) for v in np.ravel(im.static(node, 1))]
    nd = len(size) - 2
    if nd not in (2, 3) or shape_of(theta) != (size[0], nd, nd + 1):
        raise NodeError(f"theta {shape_of(theta)} does not match size {size}")
    align = bool(node.attr("align_corners", 0))
    spatial = size[2:]
    axes = np.meshgrid(*[normalized_positions(s, align) for s in spatial], indexing="ij")
    columns = [a.reshape(-1) for a in reversed(axes)]  # x (the last axis) first
    base = np.stack([*columns, np.ones(prod(spatial))], axis=1).astype(dtype_of(theta))
    turned = im.emit(wse.TransposeOp(theta, [0, 2, 1]))
    grid = im.emit(wse.MatmulOp(im.const(base), turned))
    return [reshape(im, grid, (size[0], *spatial, nd))]


@register("CausalConvWithState")
def _causal_conv_with_state(im: Importer, node: Node) -> list:
    x, w = im.value(node, 0), im.value(node, 1)
    xs, ws = shape_of(x), shape_of(w)
    if len(xs) != 3 or len(ws) != 3 or ws[:2] != (xs[1], 1):
        raise NodeError(f"expected input (B, C, L) and weight (C, 1, k), got {xs} and {ws}")
    activation = string_attr(node, "activation", "none", ("none", "silu", "swish"))
    batch, channels, length = xs
    keep = ws[2] - 1
    past = im.optional(node, 3)
    if past is None:
        past = im.const(np.zeros((batch, channels, keep), dtype=dtype_of(x)))
    elif shape_of(past) != (batch, channels, keep):
        raise NodeError(f"past_state {shape_of(past)} must be {(batch, channels, keep)}")
    padded = im.emit(wse.ConcatOp([past, x], 2)) if keep else x
    dtype = dtype_of(x)
    work = working_dtype(dtype)
    y = im.emit(wse.ConvOp(cast(im, padded, work), cast(im, w, work), [1], [0, 0], [1], channels))
    bias = im.optional(node, 2)
    y = add_channel_bias(im, y, None if bias is None else cast(im, bias, work))
    if activation != "none":
        y = mul(im, y, im.emit(wse.SigmoidOp(y)))
    if not keep:  # a kernel of one tap keeps no state
        return [cast(im, y, dtype), im.const(np.zeros((batch, channels, 0), dtype=dtype))]
    total = length + keep
    state = im.emit(wse.SliceOp(padded, [0, 0, length], [batch, channels, total], [1, 1, 1]))
    return [cast(im, y, dtype), state]
