"""Elementwise ONNX ops: math, logic, comparisons, Identity and Dropout (the activations are in
``activations``, the casts in ``casts``).

Ops with a WSE twin map to it (Abs to ``wse.abs``, Add to ``wse.add``); the others are
decomposed into WSE primitives at import: Less is a swapped ``wse.greater``, Clip a max and a
min, and the variadic Max/Min/Sum/Mean fold their inputs pairwise with numpy broadcasting.

Opset differences handled here: the legacy ``broadcast``/``axis`` attributes of the binary ops
before opset 7, Clip's bounds as attributes before opset 11, Dropout's ``is_test`` (before
opset 7) and ``training_mode`` input (from opset 12) and its mask type (the input's type
before opset 10, bool after), and Mod's float semantics with ``fmod=0`` (opset 28 and later).
"""

from __future__ import annotations

import math

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, cast, clamp, dtype_of, less, reshape, shape_of
from cgc.frontends.emitter import DROPOUT_ADVICE
from cgc.frontends.onnx.importer import Importer, OpImporter, register
from cgc.frontends.onnx.nodes import Node, bad_attr
from cgc.machine.hardware import dtypes

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def inputs_of(im: Importer, node: Node) -> list[SSAValue]:
    """The values of every input the node has (skipping empty names)."""
    return [im.value(node, i) for i in range(len(node.proto.input)) if node.has_input(i)]


def zeros_like(im: Importer, x: SSAValue, dtype: np.dtype | None = None) -> SSAValue:
    """A constant tensor of zeros of ``x``'s shape (and type, unless ``dtype`` is given)."""
    return im.const(np.zeros(shape_of(x), dtype=dtype or dtype_of(x)))


def ones_like(im: Importer, x: SSAValue, dtype: np.dtype | None = None) -> SSAValue:
    """A constant tensor of ones of ``x``'s shape (and type, unless ``dtype`` is given)."""
    return im.const(np.ones(shape_of(x), dtype=dtype or dtype_of(x)))


def fold(im: Importer, cls: type[wse.BinaryOp], values: list[SSAValue]) -> SSAValue:
    """``values`` combined pairwise left to right by a broadcasting binary op."""
    result = values[0]
    for value in values[1:]:
        result = im.emit(cls(result, value))
    return result


def same_type(values: list[SSAValue]) -> None:
    """All inputs must share one element type (ONNX's type constraint ``T``)."""
    kinds = {dtype_of(v).name for v in values}
    if len(kinds) > 1:
        raise NodeError(f"inputs have different element types ({', '.join(sorted(kinds))})")


# ---------------------------------------------------------------------------------------------
# Unary ops with a WSE twin
# ---------------------------------------------------------------------------------------------

UNARY: dict[str, type[wse.UnaryOp]] = {
    "Abs": wse.AbsOp,
    "Neg": wse.NegOp,
    "Exp": wse.ExpOp,
    "Log": wse.LogOp,
    "Sqrt": wse.SqrtOp,
    "Reciprocal": wse.ReciprocalOp,
    "Floor": wse.FloorOp,
    "Ceil": wse.CeilOp,
    "Round": wse.RoundOp,
    "Sign": wse.SignOp,
    "Sin": wse.SinOp,
    "Cos": wse.CosOp,
    "Tan": wse.TanOp,
    "Asin": wse.AsinOp,
    "Acos": wse.AcosOp,
    "Atan": wse.AtanOp,
    "Sinh": wse.SinhOp,
    "Cosh": wse.CoshOp,
    "Asinh": wse.AsinhOp,
    "Acosh": wse.AcoshOp,
    "Atanh": wse.AtanhOp,
    "Erf": wse.ErfOp,
    "Relu": wse.ReluOp,
    "Sigmoid": wse.SigmoidOp,
    "Tanh": wse.TanhOp,
    "Not": wse.NotOp,
    "BitwiseNot": wse.BitwiseNotOp,
}


def unary(cls: type[wse.UnaryOp]) -> OpImporter:
    """The importer of an op that maps to one unary WSE op."""

    def run(im: Importer, node: Node) -> list:
        return [im.emit(cls(im.value(node, 0)))]

    return run


for _op_type, _cls in UNARY.items():
    register(_op_type)(unary(_cls))


@register("IsNaN")
def _is_nan(im: Importer, node: Node) -> list:
    return [im.emit(wse.IsNanOp(im.value(node, 0)))]


@register("IsInf")
def _is_inf(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    positive = bool(node.attr("detect_positive", 1))
    negative = bool(node.attr("detect_negative", 1))
    if not (positive or negative):
        return [zeros_like(im, x, np.dtype(bool))]
    found = im.emit(wse.IsInfOp(x))
    if positive and negative:
        return [found]
    zero = im.scalar(0, x)
    sign = im.emit(wse.GreaterOp(x, zero) if positive else wse.GreaterOp(zero, x))
    return [im.emit(wse.AndOp(found, sign))]


# ---------------------------------------------------------------------------------------------
# Binary ops
# ---------------------------------------------------------------------------------------------


def binary_operands(im: Importer, node: Node) -> tuple[SSAValue, SSAValue]:
    """The two operands of a binary op, with the legacy broadcast of opsets 1 to 6 applied:
    there B broadcasts to A only with ``broadcast=1``, aligned at ``axis`` (default: the
    trailing axes) or as a single element."""
    a, b = im.value(node, 0), im.value(node, 1)
    if im.opset >= 7:
        return a, b
    return a, legacy_broadcast(im, node, a, b)


def legacy_broadcast(im: Importer, node: Node, a: SSAValue, b: SSAValue) -> SSAValue:
    """B reshaped so that numpy broadcasting gives the opset-1-to-6 semantics."""
    sa, sb = shape_of(a), shape_of(b)
    if not node.attr("broadcast", 0):
        if sa != sb:
            raise NodeError(
                f"inputs of shapes {sa} and {sb} differ and broadcast=0 (before opset 7 "
                "only broadcast=1 broadcasts)"
            )
        return b
    if math.prod(sb) == 1:
        return reshape(im, b, ())
    axis = node.attr("axis", None)
    axis = len(sa) - len(sb) if axis is None else int(axis)
    axis = axis + len(sa) if axis < 0 else axis
    if axis < 0 or tuple(sa[axis : axis + len(sb)]) != sb:
        raise NodeError(f"B {sb} does not match A {sa} at axis {axis} for the legacy broadcast")
    aligned = (*sb, *([1] * (len(sa) - axis - len(sb))))
    return reshape(im, b, aligned)


BINARY: dict[str, type[wse.BinaryOp]] = {
    "Add": wse.AddOp,
    "Sub": wse.SubOp,
    "Mul": wse.MulOp,
    "Div": wse.DivOp,
    "And": wse.AndOp,
    "Or": wse.OrOp,
    "Xor": wse.XorOp,
    "Equal": wse.EqualOp,
    "Greater": wse.GreaterOp,
    "GreaterOrEqual": wse.GreaterEqualOp,
    "BitwiseAnd": wse.BitwiseAndOp,
    "BitwiseOr": wse.BitwiseOrOp,
    "BitwiseXor": wse.BitwiseXorOp,
}
SWAPPED: dict[str, type[wse.BinaryOp]] = {"Less": wse.GreaterOp, "LessOrEqual": wse.GreaterEqualOp}
"""Comparisons computed with their operands swapped: ``a < b`` is ``b > a``."""


def binary(cls: type[wse.BinaryOp], swap: bool = False) -> OpImporter:
    """The importer of an op that maps to one broadcasting binary WSE op."""

    def run(im: Importer, node: Node) -> list:
        a, b = binary_operands(im, node)
        return [im.emit(cls(b, a) if swap else cls(a, b))]

    return run


for _op_type, _binary_cls in BINARY.items():
    register(_op_type)(binary(_binary_cls))
for _op_type, _binary_cls in SWAPPED.items():
    register(_op_type)(binary(_binary_cls, swap=True))


def common_dtype(a: np.dtype, b: np.dtype) -> np.dtype:
    """numpy's common type of two dtypes, with bfloat16 computed as float32."""
    a = np.dtype(np.float32) if dtypes.is_extended(a) else a
    b = np.dtype(np.float32) if dtypes.is_extended(b) else b
    return np.result_type(a, b)


@register("Pow")
def _pow(im: Importer, node: Node) -> list:
    """``X ** Y`` in the type of X; an exponent of another type is applied in the two types'
    common type (as numpy does) and the result converted back to X's type."""
    x, y = binary_operands(im, node)
    if dtype_of(x) == dtype_of(y):
        return [im.emit(wse.PowOp(x, y))]
    common = common_dtype(dtype_of(x), dtype_of(y))
    z = im.emit(wse.PowOp(cast(im, x, common), cast(im, y, common)))
    return [cast(im, z, dtype_of(x))]


@register("Mod")
def _mod(im: Importer, node: Node) -> list:
    """``fmod=0``: the remainder with the divisor's sign (Python's ``%``); ``fmod=1``: C's
    ``fmod``, with the dividend's sign. Before opset 28 floats need ``fmod=1``."""
    a, b = im.value(node, 0), im.value(node, 1)
    fmod = int(node.attr("fmod", 0))
    if fmod not in (0, 1):
        raise bad_attr("fmod", fmod, " (0 or 1)")
    if fmod == 0 and dtypes.is_float(dtype_of(a)) and im.opset < 28:
        raise bad_attr("fmod", 0, f" for floating-point inputs before opset 28 (opset {im.opset})")
    return [im.emit(wse.FmodOp(a, b) if fmod else wse.ModOp(a, b))]


@register("BitShift")
def _bit_shift(im: Importer, node: Node) -> list:
    """Shifts X by Y bits; a shift that is negative or not below the bit width gives what the
    fill alone gives: -1 for a right shift of a negative X, else 0."""
    x, y = im.value(node, 0), im.value(node, 1)
    direction = node.attr("direction", None)
    if direction not in ("LEFT", "RIGHT"):
        raise bad_attr("direction", direction, " (LEFT or RIGHT)")
    left = direction == "LEFT"
    shifted = im.emit(wse.ShiftLeftOp(x, y) if left else wse.ShiftRightOp(x, y))
    width = dtypes.bits(dtype_of(y))
    in_range = im.emit(wse.GreaterOp(im.scalar(width, y), y))
    if dtype_of(y).kind == "i":
        in_range = im.emit(wse.AndOp(in_range, im.emit(wse.GreaterEqualOp(y, im.scalar(0, y)))))
    fill = im.scalar(0, x)
    if not left and dtype_of(x).kind == "i":
        fill = im.emit(wse.SelectOp(less(im, x, fill), im.scalar(-1, x), fill))
    return [im.emit(wse.SelectOp(in_range, shifted, fill))]


@register("Where")
def _where(im: Importer, node: Node) -> list:
    cond, x, y = (im.value(node, i) for i in range(3))
    return [im.emit(wse.SelectOp(cond, x, y))]


# ---------------------------------------------------------------------------------------------
# Variadic ops
# ---------------------------------------------------------------------------------------------

VARIADIC: dict[str, type[wse.BinaryOp]] = {"Max": wse.MaxOp, "Min": wse.MinOp, "Sum": wse.AddOp}


def variadic_inputs(im: Importer, node: Node) -> list[SSAValue]:
    """The inputs of Max/Min/Sum/Mean: at least one, one type, and before opset 8 one shape."""
    values = inputs_of(im, node)
    if not values:
        raise NodeError("there are no inputs")
    same_type(values)
    if im.opset < 8 and len({shape_of(v) for v in values}) > 1:
        shapes = ", ".join(str(shape_of(v)) for v in values)
        raise NodeError(f"inputs have different shapes ({shapes}); opset 8 adds broadcasting")
    return values


@register(*VARIADIC)
def _variadic(im: Importer, node: Node) -> list:
    values = variadic_inputs(im, node)
    return [fold(im, VARIADIC[node.op_type], values)]


@register("Mean")
def _mean(im: Importer, node: Node) -> list:
    values = variadic_inputs(im, node)
    total = fold(im, wse.AddOp, values)
    if len(values) == 1:
        return [total]
    return [im.emit(wse.DivOp(total, im.scalar(len(values), total)))]


# ---------------------------------------------------------------------------------------------
# Clip
# ---------------------------------------------------------------------------------------------

FLT_MAX = float(np.finfo(np.float32).max)


@register("Clip")
def _clip(im: Importer, node: Node) -> list:
    """``min(max(x, min), max)``: the bounds are attributes before opset 11 (with defaults
    of +-FLT_MAX from opset 6) and optional inputs after; a missing bound does not clip, and
    a min above the max gives the max everywhere."""
    x = im.value(node, 0)
    if im.opset >= 11:
        low, high = im.optional(node, 1), im.optional(node, 2)
        same_type([v for v in (x, low, high) if v is not None])
        for bound in (low, high):
            if bound is not None and math.prod(shape_of(bound)) != 1:
                raise NodeError(f"min and max must be scalars, got shape {shape_of(bound)}")
        # as rank-0 tensors, which broadcast to any input
        low, high = (None if b is None else reshape(im, b, ()) for b in (low, high))
        return [clamp(im, x, low, high)]
    default = FLT_MAX if im.opset >= 6 else None
    low_value = node.attr("min", None if default is None else -default)
    high_value = node.attr("max", default)
    low = None if low_value is None else clip_bound(im, low_value, x)
    high = None if high_value is None else clip_bound(im, high_value, x)
    return [clamp(im, x, low, high)]


def clip_bound(im: Importer, value: float, like: SSAValue) -> SSAValue:
    """A clip bound in ``like``'s type; beyond the type's range it becomes an infinity (as
    numpy's clip in float32 followed by a cast back gives), which does not clip."""
    with np.errstate(over="ignore"):
        return im.scalar(value, like)


# ---------------------------------------------------------------------------------------------
# Identity and Dropout
# ---------------------------------------------------------------------------------------------


@register("Identity")
def _identity(im: Importer, node: Node) -> list:
    return [im.entry(node, 0)]


@register("Dropout")
def _dropout(im: Importer, node: Node) -> list:
    """Inference: the output is the input and the mask all true (ones of the input's type
    before opset 10). Random dropout (training with a non-zero ratio) cannot be reproduced:
    known at compile time it is an error; decided by runtime inputs, the output is NaN
    wherever it would be random."""
    x = im.value(node, 0)
    mask_type = dtype_of(x) if im.opset < 10 else np.dtype(bool)
    mask = ones_like(im, x, mask_type) if _wants_mask(node) else None
    if im.opset < 12:
        _check_legacy_dropout(im, node)
        return [im.entry(node, 0), mask]
    training = _static_flag(im, node, 2)
    ratio = im.known_value(node, 1) if node.has_input(1) else np.array(0.5)
    if training is False or (ratio is not None and float(np.ravel(ratio)[0]) == 0.0):
        return [im.entry(node, 0), mask]
    if training is True and ratio is not None:
        raise NodeError(
            f"training_mode=true with ratio={float(np.ravel(ratio)[0]):g}: {DROPOUT_ADVICE}"
        )
    return [_poison_random(im, node, x), mask]


def _wants_mask(node: Node) -> bool:
    """Whether the node names its mask output."""
    return len(node.proto.output) > 1 and bool(node.proto.output[1])


def _check_legacy_dropout(im: Importer, node: Node) -> None:
    """Before opset 7, ``is_test=0`` (the default) means training mode."""
    ratio = float(node.attr("ratio", 0.5))
    if im.opset < 7 and not node.attr("is_test", 0) and ratio != 0.0:
        raise NodeError(f"is_test=0 (training) with ratio={ratio:g}: {DROPOUT_ADVICE}")


def _static_flag(im: Importer, node: Node, index: int) -> bool | None:
    """An optional boolean input: False when absent, its value when known, else None."""
    if not node.has_input(index):
        return False
    value = im.known_value(node, index)
    return None if value is None else bool(np.ravel(value)[0])


def _poison_random(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """X, or NaN where the runtime training_mode and ratio ask for random dropout."""
    ratio = im.value(node, 1) if node.has_input(1) else None
    training = im.value(node, 2)
    random = training
    if ratio is not None:
        drops = im.emit(wse.GreaterOp(ratio, im.scalar(0, ratio)))
        random = im.emit(wse.AndOp(training, drops))
    random = reshape(im, random, ())
    return im.emit(wse.SelectOp(random, im.scalar(np.nan, x), x))
