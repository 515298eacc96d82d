"""Elementwise ONNX ops: math, activations, logic, comparisons, casts, Identity and Dropout.

Ops with a WSE twin map to it (Abs to ``wse.abs``, Add to ``wse.add``); the others are
decomposed into WSE primitives at import: Less is a swapped ``wse.greater``, Clip a max and a
min, the activations select between branches (LeakyRelu is
``select(greater(x, 0), x, mul(x, alpha))``), the variadic Max/Min/Sum/Mean fold their inputs
pairwise with numpy broadcasting, and Cast becomes ``wse.cast`` (plus exact power-of-two
rounding for float8e8m0).

Opset differences handled here: the legacy ``broadcast``/``axis`` attributes of the binary ops
before opset 7, Clip's bounds as attributes before opset 11, Dropout's ``is_test`` (before
opset 7) and ``training_mode`` input (from opset 12) and its mask type (the input's type
before opset 10, bool after), Selu's defaults of opset 1, Cast's ``to`` as a type name in
opset 1, and Mod's float semantics with ``fmod=0`` (opset 28 and later).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from onnx import TensorProto
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.onnx.builders import affine, cast, clamp, dtype_of, less, reshape
from cgc.frontends.onnx.importer import (
    Entry,
    Importer,
    Lazy,
    Node,
    NodeError,
    OpImporter,
    bad_attr,
    dtype_attribute,
    register,
    shape_of,
)
from cgc.machine import dtypes

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def entry_dtype(entry: Entry) -> np.dtype:
    """The numpy dtype of an input as it is (a constant need not become an op to tell)."""
    return entry.array.dtype if isinstance(entry, Lazy) else dtype_of(entry)


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


for _op_type, _cls in BINARY.items():
    register(_op_type)(binary(_cls))
for _op_type, _cls in SWAPPED.items():
    register(_op_type)(binary(_cls, swap=True))


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
# Casts
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------

Activation = Callable[[Importer, Node, SSAValue], SSAValue]
"""``f(im, node, x) -> y``: an activation's formula."""


def activation(op_type: str) -> Callable[[Activation], Activation]:
    """Registers ``f(im, node, x) -> y`` as the importer of a one-input activation. Floats
    narrower than float32 are computed in float32 and rounded once at the end: a chain of
    half-precision steps loses too much (``exp(x) - 1`` near 0 in bfloat16, say)."""

    def add(function: Activation) -> Activation:
        def run(im: Importer, node: Node) -> list:
            x = im.value(node, 0)
            dtype = dtype_of(x)
            if not narrow_float(dtype):
                return [function(im, node, x)]
            y = function(im, node, cast(im, x, np.dtype(np.float32)))
            return [cast(im, y, dtype)]

        register(op_type)(run)
        return function

    return add


def narrow_float(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a float type of fewer than 32 bits."""
    return dtypes.is_float(dtype) and dtype.itemsize < 4


def positive(im: Importer, x: SSAValue) -> SSAValue:
    """``x > 0``."""
    return im.emit(wse.GreaterOp(x, im.scalar(0, x)))


def expm1_scaled(im: Importer, x: SSAValue, alpha: float) -> SSAValue:
    """``alpha * (exp(x) - 1)``."""
    e = im.emit(wse.SubOp(im.emit(wse.ExpOp(x)), im.scalar(1, x)))
    return im.emit(wse.MulOp(e, im.scalar(alpha, x)))


def elu(im: Importer, x: SSAValue, alpha: float) -> SSAValue:
    """``x`` where positive, else ``alpha * (exp(x) - 1)``."""
    return im.emit(wse.SelectOp(positive(im, x), x, expm1_scaled(im, x, alpha)))


@activation("Elu")
def _elu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    return elu(im, x, float(node.attr("alpha", 1.0)))


SELU_DEFAULTS = {
    1: (1.673200011253357, 1.0506999492645264),
    6: (1.6732631921768188, 1.0507010221481323),
}
"""Selu's (alpha, gamma) defaults: opset 1 had rounder ones than opset 6 on."""


@activation("Selu")
def _selu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``gamma * x`` where positive, else ``gamma * alpha * (exp(x) - 1)``."""
    alpha0, gamma0 = SELU_DEFAULTS[1 if im.opset < 6 else 6]
    alpha = float(node.attr("alpha", alpha0))
    gamma = float(node.attr("gamma", gamma0))
    y = elu(im, x, alpha)
    return im.emit(wse.MulOp(y, im.scalar(gamma, y)))


@activation("Celu")
def _celu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""
    alpha = float(node.attr("alpha", 1.0))
    if alpha == 0:
        raise bad_attr("alpha", alpha, " (it divides x)")
    scaled = im.emit(wse.MulOp(x, im.scalar(1 / alpha, x)))
    zero = im.scalar(0, x)
    negative = im.emit(wse.MinOp(expm1_scaled(im, scaled, alpha), zero))
    return im.emit(wse.AddOp(im.emit(wse.MaxOp(x, zero)), negative))


def leaky_relu(im: Importer, x: SSAValue, alpha: float) -> SSAValue:
    """``x`` where positive, else ``alpha * x``."""
    scaled = im.emit(wse.MulOp(x, im.scalar(alpha, x)))
    return im.emit(wse.SelectOp(positive(im, x), x, scaled))


@activation("LeakyRelu")
def _leaky_relu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    return leaky_relu(im, x, float(node.attr("alpha", 0.01)))


def thresholded_relu(im: Importer, x: SSAValue, alpha: float) -> SSAValue:
    """``x`` where above ``alpha``, else 0."""
    above = im.emit(wse.GreaterOp(x, im.scalar(alpha, x)))
    return im.emit(wse.SelectOp(above, x, im.scalar(0, x)))


@activation("ThresholdedRelu")
def _thresholded_relu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    return thresholded_relu(im, x, float(node.attr("alpha", 1.0)))


def hard_sigmoid(im: Importer, x: SSAValue, alpha: float, beta: float) -> SSAValue:
    """``max(0, min(1, alpha * x + beta))``."""
    y = affine(im, x, alpha, beta, skip_identities=False)
    return clamp(im, y, im.scalar(0, y), im.scalar(1, y))


@activation("HardSigmoid")
def _hard_sigmoid(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    alpha = float(node.attr("alpha", 0.2))
    beta = float(node.attr("beta", 0.5))
    return hard_sigmoid(im, x, alpha, beta)


@activation("HardSwish")
def _hard_swish(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``x * hard_sigmoid(x)`` with alpha 1/6 and beta 1/2."""
    return im.emit(wse.MulOp(x, hard_sigmoid(im, x, 1 / 6, 0.5)))


def softplus(im: Importer, x: SSAValue) -> SSAValue:
    """``log(1 + exp(x))`` as ``max(x, 0) + log(1 + exp(-|x|))``, which never overflows."""
    tail = im.emit(wse.ExpOp(im.emit(wse.NegOp(im.emit(wse.AbsOp(x))))))
    tail = im.emit(wse.LogOp(im.emit(wse.AddOp(tail, im.scalar(1, x)))))
    return im.emit(wse.AddOp(im.emit(wse.ReluOp(x)), tail))


@activation("Softplus")
def _softplus(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    return softplus(im, x)


def softsign(im: Importer, x: SSAValue) -> SSAValue:
    """``x / (1 + |x|)``."""
    denominator = im.emit(wse.AddOp(im.emit(wse.AbsOp(x)), im.scalar(1, x)))
    return im.emit(wse.DivOp(x, denominator))


@activation("Softsign")
def _softsign(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    return softsign(im, x)


@activation("Mish")
def _mish(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``x * tanh(softplus(x))``."""
    return im.emit(wse.MulOp(x, im.emit(wse.TanhOp(softplus(im, x)))))


@activation("Swish")
def _swish(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``x * sigmoid(alpha * x)``."""
    alpha = float(node.attr("alpha", 1.0))
    scaled = x if alpha == 1.0 else im.emit(wse.MulOp(x, im.scalar(alpha, x)))
    return im.emit(wse.MulOp(x, im.emit(wse.SigmoidOp(scaled))))


GELU_TANH_CUBIC = 0.044715


@activation("Gelu")
def _gelu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``0.5 * x * (1 + erf(x / sqrt(2)))``, or with ``approximate="tanh"``
    ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))``."""
    approximate = node.attr("approximate", "none")
    if approximate == "none":
        inner = im.emit(wse.MulOp(x, im.scalar(1 / math.sqrt(2), x)))
        curve = im.emit(wse.ErfOp(inner))
    elif approximate == "tanh":
        cube = im.emit(wse.MulOp(im.emit(wse.MulOp(x, x)), x))
        inner = im.emit(wse.AddOp(x, im.emit(wse.MulOp(cube, im.scalar(GELU_TANH_CUBIC, x)))))
        inner = im.emit(wse.MulOp(inner, im.scalar(math.sqrt(2 / math.pi), x)))
        curve = im.emit(wse.TanhOp(inner))
    else:
        raise bad_attr("approximate", approximate, " (none or tanh)")
    half = im.emit(wse.MulOp(x, im.scalar(0.5, x)))
    return im.emit(wse.MulOp(half, im.emit(wse.AddOp(curve, im.scalar(1, x)))))


@activation("Shrink")
def _shrink(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``x + bias`` below ``-lambd``, ``x - bias`` above ``lambd``, else 0. Integers are
    computed in float64 and truncated back, so fractional bounds and biases hold exactly."""
    lambd = float(node.attr("lambd", 0.5))
    bias = float(node.attr("bias", 0.0))
    wide = cast(im, x, np.dtype(np.float64)) if dtypes.is_integer(dtype_of(x)) else x
    below = less(im, wide, im.scalar(-lambd, wide))
    above = im.emit(wse.GreaterOp(wide, im.scalar(lambd, wide)))
    lowered = im.emit(wse.SubOp(wide, im.scalar(bias, wide)))
    raised = im.emit(wse.AddOp(wide, im.scalar(bias, wide)))
    y = im.emit(wse.SelectOp(above, lowered, im.scalar(0, wide)))
    y = im.emit(wse.SelectOp(below, raised, y))
    return cast(im, y, dtype_of(x))


@register("PRelu")
def _prelu(im: Importer, node: Node) -> list:
    """``x`` where non-negative, else ``slope * x``; the slope broadcasts to X (one way from
    opset 7; before, it has X's shape or a single element)."""
    x, slope = im.value(node, 0), im.value(node, 1)
    sx, ss = shape_of(x), shape_of(slope)
    if im.opset < 7 and ss != sx and math.prod(ss) != 1:
        raise NodeError(f"slope {ss} must have X's shape {sx} or one element before opset 7")
    if im.opset < 7 and ss != sx:
        slope = im.emit(wse.ReshapeOp(slope, ()))
    elif not _broadcasts_to(ss, sx):
        raise NodeError(f"slope {ss} does not broadcast to X {sx}")
    scaled = im.emit(wse.MulOp(x, slope))
    return [im.emit(wse.SelectOp(less(im, x, im.scalar(0, x)), scaled, x))]


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts one way to ``target``."""
    if len(shape) > len(target):
        return False
    return all(d in (1, t) for d, t in zip(shape[::-1], target[::-1], strict=False))


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
            f"training_mode=true with ratio={float(np.ravel(ratio)[0]):g} draws a random mask, "
            "which cgc cannot reproduce"
        )
    return [_poison_random(im, node, x), mask]


def _wants_mask(node: Node) -> bool:
    """Whether the node names its mask output."""
    return len(node.proto.output) > 1 and bool(node.proto.output[1])


def _check_legacy_dropout(im: Importer, node: Node) -> None:
    """Before opset 7, ``is_test=0`` (the default) means training mode."""
    ratio = float(node.attr("ratio", 0.5))
    if im.opset < 7 and not node.attr("is_test", 0) and ratio != 0.0:
        raise NodeError(
            f"is_test=0 (training) with ratio={ratio:g} draws a random mask, which cgc cannot "
            "reproduce; set is_test=1 for inference"
        )


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
