"""ONNX padding: Pad and CenterCropPad.

The amounts must be known at compile time; negative amounts crop first (a slice), and the rest
pads the cropped tensor (modes constant, reflect, edge, and wrap from opset 19). Pad's constant
value may be a run-time tensor: the tensor is then padded with zeros and the value selected where
the padding is. CenterCropPad crops or pads every axis it names to the size asked for, centred
(the odd element at the end).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    along,
    as_scalar,
    int_list,
    shape_of,
    slice_axes,
    unique_axes,
)
from cgc.frontends.onnx.attributes import static_ints
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def pad_amounts(im: Importer, node: Node, rank: int) -> tuple[list[int], list[int]]:
    """Pad's amounts before and after every axis (negative amounts crop)."""
    if im.opset < 11:
        key = "paddings" if im.opset < 2 else "pads"
        pads = node.attr(key, None)
        if pads is None:
            raise NodeError(f"attribute {key} is required")
        pads, axes = int_list(pads), list(range(rank))
    else:
        pads = static_ints(im, node, 1)
        given = static_ints(im, node, 3) if im.opset >= 18 and node.has_input(3) else None
        axes = list(range(rank)) if given is None else unique_axes(given, rank)
    if len(pads) != 2 * len(axes):
        raise NodeError(f"pads {pads} need two amounts for each of {len(axes)} axes")
    low, high = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        low[axis], high[axis] = pads[i], pads[len(axes) + i]
    return low, high


def pad_region(low: Sequence[int], high: Sequence[int], shape: Sequence[int]) -> list:
    """Per padded axis, a boolean array (shaped along that axis) marking the padded positions."""
    masks = []
    for axis, (lo, hi, size) in enumerate(zip(low, high, shape, strict=True)):
        if lo or hi:
            outside = np.ones(lo + size + hi, dtype=bool)
            outside[lo : lo + size] = False
            masks.append(along(axis, len(shape), outside))
    return masks


def pad_with_value(
    im: Importer, x: SSAValue, low: list[int], high: list[int], value: SSAValue
) -> SSAValue:
    """Constant padding with a run-time value: pad with zeros, then select the value where
    the padding is."""
    padded = im.emit(wse.PadOp(x, low, high, 0.0, "constant"))
    masks = [im.const(m) for m in pad_region(low, high, shape_of(x))]
    outside = masks[0]
    for mask in masks[1:]:
        outside = im.emit(wse.OrOp(outside, mask))
    return im.emit(wse.SelectOp(outside, value, padded))


def pad_value(im: Importer, node: Node, x: SSAValue) -> float | SSAValue:
    """Pad's constant: an attribute before opset 11; from it, an optional input that may be a
    run-time tensor."""
    if im.opset < 11:
        return float(node.attr("value", 0.0))
    if not node.has_input(2):
        return 0.0
    array = im.known_value(node, 2)
    if array is not None:
        if np.asarray(array).size != 1:
            raise NodeError("input 'constant_value' must hold one value")
        return float(np.asarray(array).astype(np.float64).reshape(()))
    value = as_scalar(im, im.value(node, 2), "constant_value")
    if wse.element_type(value) != wse.element_type(x):
        raise NodeError("input 'constant_value' must have the data's type")
    return value


def crop_then_pad(
    im: Importer,
    x: SSAValue,
    low: list[int],
    high: list[int],
    value: float | SSAValue,
    mode: str,
) -> SSAValue:
    """Negative amounts crop first; the rest pads the cropped tensor."""
    shape = shape_of(x)
    crops = {
        axis: (max(-lo, 0), size - max(-hi, 0))
        for axis, (lo, hi, size) in enumerate(zip(low, high, shape, strict=True))
        if lo < 0 or hi < 0
    }
    for axis, (begin, end) in crops.items():
        if begin > end:
            raise NodeError(f"pads crop more than the {shape[axis]} elements of axis {axis}")
    x = slice_axes(im, x, crops, None)
    low, high = [max(v, 0) for v in low], [max(v, 0) for v in high]
    if not any(low) and not any(high):
        return x
    if mode != "constant" and 0 in shape_of(x):
        raise NodeError(f"mode {mode} cannot pad an empty axis")
    if isinstance(value, SSAValue):
        return pad_with_value(im, x, low, high, value)
    return im.emit(wse.PadOp(x, low, high, value, mode))


@register("Pad")
def _pad(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    mode = node.attr("mode", "constant")
    if mode not in PAD_MODES or (mode == "wrap" and im.opset < 19):
        raise bad_attr("mode", mode)
    low, high = pad_amounts(im, node, len(shape_of(x)))
    value = pad_value(im, node, x) if mode == "constant" else 0.0
    return [crop_then_pad(im, x, low, high, value, mode)]


@register("CenterCropPad")
def _center_crop_pad(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    given = node.attr("axes", None)
    axes = list(range(len(shape))) if given is None else unique_axes(int_list(given), len(shape))
    target = static_ints(im, node, 1)
    if len(target) != len(axes):
        raise NodeError(f"shape {target} needs one size for each of the {len(axes)} axes")
    low, high = [0] * len(shape), [0] * len(shape)
    for axis, size in zip(axes, target, strict=True):
        if size < 0:
            raise NodeError(f"shape {target} has a negative size")
        change = size - shape[axis]  # > 0 pads, < 0 crops; the odd element goes to the end
        low[axis] = change // 2 if change >= 0 else -(-change // 2)
        high[axis] = change - low[axis]
    return [crop_then_pad(im, x, low, high, 0.0, "constant")]
