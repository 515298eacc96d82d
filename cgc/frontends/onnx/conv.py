"""ONNX convolutions: Conv, ConvTranspose, Col2Im, DeformConv and CausalConvWithState.

* Conv maps to ``wse.conv``. ConvTranspose is the convolution of the input with ``stride - 1``
  zeros inserted between its elements, with the filter's in/out channels swapped and its taps
  reversed, and with ``(kernel - 1) * dilation - pad`` padding.
* Col2Im scatters (adds) the columns into zeros with constant indices, then crops the padding.
* DeformConv samples the input bilinearly at every tap's offset position (the taps of
  ``sampling``), then multiplies the samples by the filter in one matmul.
* CausalConvWithState is a depthwise convolution of the state and the input concatenated.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from math import prod

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    add,
    add_channel_bias,
    cast,
    dtype_of,
    mul,
    reshape,
    shape_of,
    working_dtype,
)
from cgc.frontends.onnx.attributes import string_attr
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr
from cgc.frontends.onnx.sampling import gather_taps, interpolation_taps, padded_tap

# ---------------------------------------------------------------------------------------------
# Conv and ConvTranspose
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
# DeformConv and CausalConvWithState
# ---------------------------------------------------------------------------------------------


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
