"""ONNX quantization ops: QuantizeLinear, DequantizeLinear and the integer products.

Scales and zero points may be runtime values: per-axis parameters are reshaped to broadcast
along their axis, blocked ones repeated ``block_size`` times along it. Integer products
(MatMulInteger, ConvInteger and the QLinear ops) subtract the zero points in int32 and
multiply or convolve in int32; requantization rescales in float64, rounds half to even and
saturates, as the ONNX reference does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    add_channel_bias,
    axis_of,
    broadcast,
    cast,
    clamp,
    dtype_of,
    reshape,
    shape_of,
)
from cgc.frontends.onnx.conv import conv_kernel, convolution
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.linear import matmul
from cgc.frontends.onnx.model import dtype_attribute
from cgc.frontends.onnx.nodes import Node, bad_attr
from cgc.machine.hardware import dtypes

INTEGER_RANGES = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
    "uint4": (0, 15),
    "int4": (-8, 7),
    "uint2": (0, 3),
    "int2": (-2, 1),
}
"""The saturation range of every integer quantized type."""

FLOAT_TARGETS = (
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float4_e2m1fn",
)
"""The float quantized types."""


# ---------------------------------------------------------------------------------------------
# Scales and zero points
# ---------------------------------------------------------------------------------------------


def spread(
    im: Importer, param: SSAValue, shape: Sequence[int], axis: int, block_size: int, what: str
) -> SSAValue:
    """A scale or zero point made broadcastable to ``shape``: a scalar as it is, a 1-D tensor
    along ``axis``, a blocked one repeated ``block_size`` times along ``axis``."""
    pshape = shape_of(param)
    size = int(np.prod(pshape))
    if not pshape:
        return param
    if size == 1 and not block_size:
        return reshape(im, param, [])
    if not block_size:
        if len(pshape) != 1 or pshape[0] != shape[axis]:
            raise NodeError(
                f"{what} of shape {pshape} does not match axis {axis} of the input {tuple(shape)}"
            )
        dims = [1] * len(shape)
        dims[axis] = size
        return reshape(im, param, dims)
    return repeat_blocks(im, param, shape, axis, block_size, what)


def repeat_blocks(
    im: Importer, param: SSAValue, shape: Sequence[int], axis: int, block_size: int, what: str
) -> SSAValue:
    """A blocked parameter repeated ``block_size`` times along ``axis`` and cut to ``shape``."""
    pshape = list(shape_of(param))
    blocks = pshape[axis] if len(pshape) == len(shape) else 0
    others_match = len(pshape) == len(shape) and all(
        p == s for i, (p, s) in enumerate(zip(pshape, shape, strict=True)) if i != axis
    )
    if not others_match or not (blocks - 1) * block_size < shape[axis] <= blocks * block_size:
        raise NodeError(
            f"{what} of shape {tuple(pshape)} does not block the input {tuple(shape)} along "
            f"axis {axis} with block_size={block_size}"
        )
    split = [*pshape[: axis + 1], 1, *pshape[axis + 1 :]]
    wide = [*pshape[: axis + 1], block_size, *pshape[axis + 1 :]]
    value = broadcast(im, reshape(im, param, split), wide)
    full = [*pshape[:axis], blocks * block_size, *pshape[axis + 1 :]]
    value = reshape(im, value, full)
    if full[axis] == shape[axis]:
        return value
    rank = len(shape)
    return im.emit(wse.SliceOp(value, [0] * rank, list(shape), [1] * rank))


def _granularity(im: Importer, node: Node, x: SSAValue, scale: SSAValue) -> tuple[int, int]:
    """The quantization axis and block size, checked against the opset."""
    rank = len(shape_of(x))
    block_size = int(node.attr("block_size", 0)) if im.opset >= 21 else 0
    if block_size < 0:
        raise bad_attr("block_size", block_size, " (must be positive)")
    scale_rank = len(shape_of(scale))
    if im.opset < 13 and scale_rank > 0 and int(np.prod(shape_of(scale))) != 1:
        raise NodeError(f"the scale must be a scalar before opset 13, got {shape_of(scale)}")
    if not block_size and scale_rank > 1:
        raise NodeError(f"the scale {shape_of(scale)} must be a scalar or 1-D without block_size")
    axis = int(node.attr("axis", 1)) if im.opset >= 13 else 1
    if scale_rank == 0 or (int(np.prod(shape_of(scale))) == 1 and not block_size):
        return 0, 0
    return axis_of(axis, rank), block_size


# ---------------------------------------------------------------------------------------------
# QuantizeLinear and DequantizeLinear
# ---------------------------------------------------------------------------------------------


def quantized_type(im: Importer, node: Node, zero_point: SSAValue | None) -> str:
    """The output type of QuantizeLinear: ``output_dtype``, else the zero point's, else
    uint8."""
    code = int(node.attr("output_dtype", 0)) if im.opset >= 21 else 0
    declared = dtype_attribute("output_dtype", code).name if code else None
    if zero_point is not None:
        own = dtype_of(zero_point).name
        if declared is not None and declared != own:
            raise bad_attr("output_dtype", code, f" with a zero point of type {own}")
        declared = own
    declared = declared or "uint8"
    if declared not in INTEGER_RANGES and declared not in FLOAT_TARGETS:
        raise NodeError(f"quantizing to {declared} is not supported")
    return declared


def quantize(
    im: Importer, scaled: SSAValue, zero_point: SSAValue | None, target: str, saturate: bool
) -> SSAValue:
    """``saturate(round(scaled) + zero_point)`` in ``target``: integers round half to even and
    clip to their range; float targets add the zero point and convert."""
    if target in INTEGER_RANGES:
        rounded = im.emit(wse.RoundOp(scaled))
        wide = "float64" if dtype_of(scaled).name == "float64" else "float32"
        rounded = cast(im, rounded, wide)
        if zero_point is not None:
            rounded = im.emit(wse.AddOp(rounded, cast(im, zero_point, wide)))
        low, high = INTEGER_RANGES[target]
        return cast(im, clamp(im, rounded, low, high), target)
    if zero_point is not None:
        widened = cast(im, scaled, "float32")
        scaled = im.emit(wse.AddOp(widened, cast(im, zero_point, "float32")))
    return cast(im, scaled, target, saturate)


@register("QuantizeLinear")
def _quantize_linear(im: Importer, node: Node) -> list:
    x, scale = im.value(node, 0), im.value(node, 1)
    zero_point = im.optional(node, 2)
    target = quantized_type(im, node, zero_point)
    axis, block_size = _granularity(im, node, x, scale)
    shape = shape_of(x)
    precision = int(node.attr("precision", 0)) if im.opset >= 23 else 0
    work = dtype_attribute("precision", precision).name if precision else dtype_of(scale).name
    if work == "float8_e8m0fnu" or not dtypes.is_float(work):
        work = "float32"
    scale = spread(im, cast(im, scale, work), shape, axis, block_size, "the scale")
    scaled = im.emit(wse.DivOp(cast(im, x, work), scale))
    if zero_point is not None:
        zero_point = spread(im, zero_point, shape, axis, block_size, "the zero point")
    # saturate=0 only means something for the float8 types, which can hold infinities
    saturate = bool(node.attr("saturate", 1)) or not target.startswith("float8")
    return [quantize(im, scaled, zero_point, target, saturate)]


@register("DequantizeLinear")
def _dequantize_linear(im: Importer, node: Node) -> list:
    x, scale = im.value(node, 0), im.value(node, 1)
    zero_point = im.optional(node, 2)
    axis, block_size = _granularity(im, node, x, scale)
    shape = shape_of(x)
    code = int(node.attr("output_dtype", 0)) if im.opset >= 23 else 0
    out = dtype_attribute("output_dtype", code).name if code else dtype_of(scale).name
    if out == "float8_e8m0fnu" or not dtypes.is_float(out):
        raise NodeError(f"dequantizing to {out} is not supported")
    shifted = cast(im, x, "float32")
    if zero_point is not None:
        zp = spread(im, cast(im, zero_point, "float32"), shape, axis, block_size, "zero point")
        shifted = im.emit(wse.SubOp(shifted, zp))
    factor = spread(im, cast(im, scale, "float32"), shape, axis, block_size, "the scale")
    return [cast(im, im.emit(wse.MulOp(shifted, factor)), out)]


@register("DynamicQuantizeLinear")
def _dynamic_quantize_linear(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    if dtype_of(x).name != "float32":
        raise NodeError(f"the input must be float32, got {dtype_of(x).name}")
    axes = list(range(len(shape_of(x))))
    zero = im.scalar(0.0, x)
    high = im.emit(wse.MaxOp(im.emit(wse.ReduceMaxOp(x, axes, False)), zero))
    low = im.emit(wse.MinOp(im.emit(wse.ReduceMinOp(x, axes, False)), zero))
    scale = im.emit(wse.DivOp(im.emit(wse.SubOp(high, low)), im.scalar(255.0, x)))
    flat = im.emit(wse.EqualOp(high, low))
    scale = im.emit(wse.SelectOp(flat, im.scalar(1.0, x), scale))
    start = im.emit(wse.NegOp(im.emit(wse.DivOp(low, scale))))
    start = clamp(im, start, zero, 255.0)
    zero_point = im.emit(wse.RoundOp(start))
    y = quantize(im, im.emit(wse.DivOp(x, scale)), zero_point, "uint8", True)
    return [y, scale, cast(im, zero_point, "uint8")]


# ---------------------------------------------------------------------------------------------
# Integer products
# ---------------------------------------------------------------------------------------------


def accumulator(value: SSAValue) -> str:
    """The type products of quantized ``value`` accumulate in: int32, or float32 for floats."""
    return "float32" if dtypes.is_float(dtype_of(value)) else "int32"


def centered(im: Importer, x: SSAValue, zero_point: SSAValue | None, rows: bool) -> SSAValue:
    """``x - zero_point`` in the accumulator type; with ``rows`` a 1-D zero point of a matrix
    applies per row (it becomes a column)."""
    work = accumulator(x)
    x = cast(im, x, work)
    if zero_point is None:
        return x
    zp = cast(im, zero_point, work)
    zshape, xshape = shape_of(zp), shape_of(x)
    if rows and len(zshape) == 1 and len(xshape) >= 2 and zshape[0] == xshape[-2] > 1:
        zp = reshape(im, zp, [zshape[0], 1])
    return im.emit(wse.SubOp(x, zp))


@register("MatMulInteger")
def _matmul_integer(im: Importer, node: Node) -> list:
    a = centered(im, im.value(node, 0), im.optional(node, 2), True)
    b = centered(im, im.value(node, 1), im.optional(node, 3), False)
    return [matmul(im, a, b)]


def requantize(
    im: Importer,
    total: SSAValue,
    factor: SSAValue,
    zero_point: SSAValue,
) -> SSAValue:
    """``saturate(round(total * factor) + zero_point)`` in the zero point's type, with the
    product taken in float64 (numpy's promotion of int32 by a float scale)."""
    scaled = im.emit(wse.MulOp(cast(im, total, "float64"), cast(im, factor, "float64")))
    return quantize(im, scaled, zero_point, dtype_of(zero_point).name, True)


def _scale_ratio(im: Importer, *scales: SSAValue) -> SSAValue:
    """``scales[0] * scales[1] / scales[2]`` in the scales' type."""
    first, second, out = scales
    return im.emit(wse.DivOp(im.emit(wse.MulOp(first, second)), out))


@register("QLinearMatMul")
def _qlinear_matmul(im: Importer, node: Node) -> list:
    a = centered(im, im.value(node, 0), im.value(node, 2), True)
    b = centered(im, im.value(node, 3), im.value(node, 5), False)
    a_scale, b_scale = im.value(node, 1), im.value(node, 4)
    sa, sb = shape_of(a_scale), shape_of(b_scale)
    if len(sa) == 1 and len(shape_of(a)) >= 2 and sa[0] == shape_of(a)[-2] > 1:
        a_scale = reshape(im, a_scale, [sa[0], 1])
    if len(sb) == 1 and sb[0] == 1:
        b_scale = reshape(im, b_scale, [])
    work = "int32" if accumulator(a) == accumulator(b) == "int32" else "float32"
    total = matmul(im, cast(im, a, work), cast(im, b, work))
    factor = _scale_ratio(im, a_scale, b_scale, im.value(node, 6))
    return [requantize(im, total, factor, im.value(node, 7))]


def integer_conv(
    im: Importer,
    node: Node,
    x: SSAValue,
    w: SSAValue,
    x_zero_point: SSAValue | None,
    w_zero_point: SSAValue | None,
) -> SSAValue:
    """The int32 convolution of ``x - x_zero_point`` with ``w - w_zero_point`` (per output
    channel when 1-D); padding counts as the zero point."""
    ws = shape_of(w)
    kernel = conv_kernel(node, shape_of(x), ws)
    x = centered(im, x, x_zero_point, False)
    if w_zero_point is not None and len(shape_of(w_zero_point)) == 1:
        count = shape_of(w_zero_point)[0]
        if count not in (1, ws[0]):
            raise NodeError(f"the filter zero point {shape_of(w_zero_point)} needs {ws[0]} values")
        w_zero_point = reshape(im, w_zero_point, [count] + [1] * (len(ws) - 1))
    w = centered(im, w, w_zero_point, False)
    return convolution(im, node, x, w, kernel)


@register("ConvInteger")
def _conv_integer(im: Importer, node: Node) -> list:
    x, w = im.value(node, 0), im.value(node, 1)
    return [integer_conv(im, node, x, w, im.optional(node, 2), im.optional(node, 3))]


@register("QLinearConv")
def _qlinear_conv(im: Importer, node: Node) -> list:
    x, w = im.value(node, 0), im.value(node, 3)
    total = integer_conv(im, node, x, w, im.value(node, 2), im.value(node, 5))
    bias = im.optional(node, 8)
    total = add_channel_bias(im, total, None if bias is None else cast(im, bias, "int32"))
    rank = len(shape_of(x))
    w_scale = im.value(node, 4)
    if len(shape_of(w_scale)) == 1 and shape_of(w_scale)[0] > 1:
        w_scale = reshape(im, w_scale, [1, shape_of(w_scale)[0]] + [1] * (rank - 2))
    factor = _scale_ratio(im, im.value(node, 1), w_scale, im.value(node, 6))
    return [requantize(im, total, factor, im.value(node, 7))]
