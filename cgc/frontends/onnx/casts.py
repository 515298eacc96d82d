"""ONNX type conversions: Cast, CastLike and BitCast.

Cast and CastLike become ``wse.cast`` (nothing when the input already has the type; the
``saturate`` and ``round_mode`` attributes matter for the 8-bit and 4-bit float types only),
plus exact power-of-two rounding for float8e8m0; BitCast reinterprets the bits as another type
of the same width (``wse.bitcast``).

Opset differences handled here: Cast's ``to`` as a type name in opset 1, and ``saturate`` from
opset 19.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, cast, clamp, dtype_of, less
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.model import dtype_attribute
from cgc.frontends.onnx.nodes import Entry, Lazy, Node, bad_attr
from cgc.machine.hardware import dtypes


def entry_dtype(entry: Entry) -> np.dtype:
    """The numpy dtype of an input as it is (a constant need not become an op to tell)."""
    return entry.array.dtype if isinstance(entry, Lazy) else dtype_of(entry)


def target_dtype(node: Node) -> np.dtype:
    """The numpy dtype of the required attribute ``to`` of Cast and BitCast: a TensorProto
    data type (a type name in opset 1)."""
    to = node.attr("to", None)
    if to is None:
        raise NodeError("attribute 'to' is required")
    if isinstance(to, str):
        try:
            to = TensorProto.DataType.Value(to.upper())
        except ValueError:
            raise bad_attr("to", to, " (not an ONNX data type)") from None
    if to == TensorProto.STRING:
        raise bad_attr("to", "STRING", " (cgc has no string tensors)")
    return dtype_attribute("to", to)


ROUND_MODES = ("up", "down", "nearest")


def convert(im: Importer, node: Node, x: SSAValue, dtype: np.dtype) -> SSAValue:
    """Cast's conversion of ``x`` to ``dtype`` with the node's ``saturate`` and
    ``round_mode`` (which matter for the 8-bit and 4-bit float types only)."""
    saturate = bool(node.attr("saturate", 1)) if im.opset >= 19 else True
    round_mode = node.attr("round_mode", "up")
    if round_mode not in ROUND_MODES:
        raise bad_attr("round_mode", round_mode, f" (one of {', '.join(ROUND_MODES)})")
    if dtype.name == "float8_e8m0fnu" and dtype_of(x) != dtype:
        return to_e8m0(im, x, saturate, round_mode)
    return cast(im, x, dtype, saturate)


@register("Cast")
def _cast(im: Importer, node: Node) -> list:
    dtype = target_dtype(node)
    if entry_dtype(im.entry(node, 0)).kind in "OSU":
        raise NodeError("casts from strings are not supported")
    if entry_dtype(im.entry(node, 0)) == dtype:
        return [im.entry(node, 0)]
    return [convert(im, node, im.value(node, 0), dtype)]


@register("CastLike")
def _cast_like(im: Importer, node: Node) -> list:
    dtype = entry_dtype(im.entry(node, 1))
    if entry_dtype(im.entry(node, 0)) == dtype:
        return [im.entry(node, 0)]
    return [convert(im, node, im.value(node, 0), dtype)]


E8M0_MIN = 2.0**-127
E8M0_MAX = 2.0**127


def to_e8m0(im: Importer, x: SSAValue, saturate: bool, round_mode: str) -> SSAValue:
    """A float cast to float8e8m0 (powers of two from 2^-127 to 2^127, no sign): |x| rounded
    to a power of two in float64 (``up``: the next one above, ``down``: the one below,
    ``nearest``: the closer one, 1.5 * 2^k rounding up), then clamped to the type's range
    when saturating or sent to NaN outside it."""
    wide = cast(im, im.emit(wse.AbsOp(x)), np.dtype(np.float64))
    below = power_of_two_below(im, wide)
    twice = im.emit(wse.MulOp(below, im.scalar(2.0, below)))
    if round_mode == "down":
        rounded = below
    elif round_mode == "up":
        exact = im.emit(wse.EqualOp(below, wide))
        rounded = im.emit(wse.SelectOp(exact, below, twice))
    else:
        halfway = im.emit(wse.MulOp(below, im.scalar(1.5, below)))
        rounded = im.emit(wse.SelectOp(less(im, wide, halfway), below, twice))
    low, high = im.scalar(E8M0_MIN, rounded), im.scalar(E8M0_MAX, rounded)
    if saturate:
        rounded = clamp(im, rounded, low, high)
    else:
        outside = im.emit(wse.OrOp(less(im, rounded, low), less(im, high, rounded)))
        rounded = im.emit(wse.SelectOp(outside, im.scalar(np.nan, rounded), rounded))
    return cast(im, rounded, "float8_e8m0fnu", saturate=False)


def power_of_two_below(im: Importer, a: SSAValue) -> SSAValue:
    """The largest power of two not above ``a`` (float64, a >= 0; 0 for 0, inf for inf):
    ``2^floor(log2(a))`` from the logarithm, then corrected by one step either way, since the
    logarithm may miss by one ulp at exact powers of two; products by 2 are exact."""
    log2 = im.emit(wse.MulOp(im.emit(wse.LogOp(a)), im.scalar(1 / math.log(2), a)))
    guess = im.emit(wse.PowOp(im.scalar(2.0, a), im.emit(wse.FloorOp(log2))))
    half = im.emit(wse.MulOp(guess, im.scalar(0.5, guess)))
    guess = im.emit(wse.SelectOp(less(im, a, guess), half, guess))
    double = im.emit(wse.MulOp(guess, im.scalar(2.0, guess)))
    return im.emit(wse.SelectOp(im.emit(wse.GreaterEqualOp(a, double)), double, guess))


@register("BitCast")
def _bit_cast(im: Importer, node: Node) -> list:
    """Reinterprets the bits as another type of the same width."""
    target = target_dtype(node)
    x = im.value(node, 0)
    source = dtype_of(x)
    if dtypes.bits(source) != dtypes.bits(target):
        raise bad_attr(
            "to", target.name, f" ({dtypes.bits(target)} bits; the input has {dtypes.bits(source)})"
        )
    if source == target:
        return [im.entry(node, 0)]
    if dtypes.bits(source) < 8:
        raise NodeError(f"cannot reinterpret {source.name}: its values are narrower than a byte")
    return [im.emit(wse.BitcastOp(x, wse.element_of_numpy(target)))]
