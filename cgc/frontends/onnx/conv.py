"""ONNX convolution, pooling and resampling ops."""

from __future__ import annotations

from collections.abc import Sequence

from cgc.dialects import wse
from cgc.frontends.onnx.importer import (
    Importer,
    Node,
    NodeError,
    bad_attr,
    register,
    shape_of,
)


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


@register("Conv")
def _conv(im: Importer, node: Node) -> list:
    x, w = im.value(node, 0), im.value(node, 1)
    xs, ws = shape_of(x), shape_of(w)
    spatial = len(xs) - 2
    if spatial < 1 or len(ws) != len(xs):
        raise NodeError(f"input {xs} and filter {ws} need the same rank >= 3")
    kernel = ws[2:]
    declared = node.attr("kernel_shape", None)
    if declared is not None and tuple(declared) != kernel:
        raise bad_attr("kernel_shape", declared, f" (the filter has kernel {list(kernel)})")
    strides = node.ints("strides", spatial, 1)
    dilations = node.ints("dilations", spatial, 1)
    pads = auto_pads(node, xs[2:], kernel, strides, dilations)
    group = int(node.attr("group", 1))
    y = im.emit(wse.ConvOp(x, w, strides, pads, dilations, group))
    bias = im.optional(node, 2)
    if bias is not None:
        bias = im.emit(wse.ReshapeOp(bias, (1, ws[0], *([1] * spatial))))
        y = im.emit(wse.AddOp(y, bias))
    return [y]


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


def pool_window(node: Node, xs: Sequence[int]) -> tuple[list, list, list, list, list]:
    """kernel, strides, pads, dilations, and the extra end padding that ceil_mode adds."""
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
    return kernel, strides, pads, dilations, extra


@register("MaxPool")
def _max_pool(im: Importer, node: Node) -> list:
    storage_order = int(node.attr("storage_order", 0))
    if storage_order != 0:
        raise bad_attr("storage_order", storage_order)
    x = im.value(node, 0)
    kernel, strides, pads, dilations, _ = pool_window(node, shape_of(x))
    return [im.emit(wse.MaxPoolOp(x, kernel, strides, pads, dilations))]


@register("AveragePool")
def _average_pool(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    kernel, strides, pads, dilations, extra = pool_window(node, shape_of(x))
    include_pad = bool(node.attr("count_include_pad", 0))
    if include_pad and any(extra):
        raise bad_attr(
            "ceil_mode", 1, " with count_include_pad=1 when the last window overhangs the padding"
        )
    return [im.emit(wse.AvgPoolOp(x, kernel, strides, pads, dilations, include_pad))]


@register("GlobalAveragePool")
def _global_average_pool(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    rank = len(shape_of(x))
    if rank < 3:
        raise NodeError(f"the input needs rank >= 3, got {rank}")
    return [im.emit(wse.ReduceMeanOp(x, tuple(range(2, rank)), True))]
