"""Lowerings of the core ATen element-wise ops: arithmetic with torch's type promotion (the
operands are cast to the node's result type, a Python number becomes a constant of it),
comparisons and logic, one-input math, activations and ``where``."""

from __future__ import annotations

import math

import torch
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, clamp, less, select
from cgc.frontends.formulas import GELU_APPROXIMATIONS, gelu
from cgc.frontends.torch.lowering import Lowering, OpLowering, numpy_dtype, register
from cgc.machine.hardware import dtypes

Operand = SSAValue | float | bool

BINARY = {
    "mul": wse.MulOp,
    "maximum": wse.MaxOp,
    "minimum": wse.MinOp,
    "fmod": wse.FmodOp,
    "bitwise_and": wse.BitwiseAndOp,
    "bitwise_or": wse.BitwiseOrOp,
    "bitwise_xor": wse.BitwiseXorOp,
    "logical_and": wse.AndOp,
    "logical_or": wse.OrOp,
    "logical_xor": wse.XorOp,
}
"""Binary ops that are one WSE op on operands of the result type."""

UNARY = {
    "neg": wse.NegOp,
    "exp": wse.ExpOp,
    "log": wse.LogOp,
    "sqrt": wse.SqrtOp,
    "reciprocal": wse.ReciprocalOp,
    "abs": wse.AbsOp,
    "relu": wse.ReluOp,
    "sigmoid": wse.SigmoidOp,
    "tanh": wse.TanhOp,
    "erf": wse.ErfOp,
    "sign": wse.SignOp,
    "floor": wse.FloorOp,
    "ceil": wse.CeilOp,
    "round": wse.RoundOp,
    "sin": wse.SinOp,
    "cos": wse.CosOp,
    "tan": wse.TanOp,
    "asin": wse.AsinOp,
    "acos": wse.AcosOp,
    "atan": wse.AtanOp,
    "sinh": wse.SinhOp,
    "cosh": wse.CoshOp,
    "asinh": wse.AsinhOp,
    "acosh": wse.AcoshOp,
    "atanh": wse.AtanhOp,
    "bitwise_not": wse.BitwiseNotOp,
}
"""One-input ops that are one WSE op on the operand in the result type."""

COMPARISONS = ("eq", "ne", "gt", "ge", "lt", "le")


def _binary(op: type) -> OpLowering:
    def lower(lw: Lowering, a: Operand, b: Operand, **_: object) -> SSAValue:
        return lw.emit(op(lw.tensor(a), lw.tensor(b)))

    return lower


for _name, _op in BINARY.items():
    register(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar", f"aten.{_name}.default")(_binary(_op))


def _unary(op: type) -> OpLowering:
    def lower(lw: Lowering, x: SSAValue) -> SSAValue:
        return lw.emit(op(lw.tensor(x)))

    return lower


for _name, _one in UNARY.items():
    register(f"aten.{_name}.default")(_unary(_one))


@register("aten.add.Tensor", "aten.add.Scalar")
def _add(lw: Lowering, a: Operand, b: Operand, alpha: float = 1) -> SSAValue:
    """``a + alpha * b``."""
    return lw.emit(wse.AddOp(lw.tensor(a), _scaled(lw, b, alpha)))


@register("aten.sub.Tensor", "aten.sub.Scalar")
def _sub(lw: Lowering, a: Operand, b: Operand, alpha: float = 1) -> SSAValue:
    """``a - alpha * b``."""
    return lw.emit(wse.SubOp(lw.tensor(a), _scaled(lw, b, alpha)))


@register("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(lw: Lowering, a: Operand, b: Operand, alpha: float = 1) -> SSAValue:
    """``b - alpha * a``."""
    return lw.emit(wse.SubOp(lw.tensor(b), _scaled(lw, a, alpha)))


def _scaled(lw: Lowering, x: Operand, alpha: float) -> SSAValue:
    if isinstance(x, SSAValue):
        value = lw.tensor(x)
        return value if alpha == 1 else lw.emit(wse.MulOp(value, lw.tensor(alpha)))
    return lw.tensor(x * alpha)


@register("aten.div.Tensor", "aten.div.Scalar")
def _div(lw: Lowering, a: Operand, b: Operand) -> SSAValue:
    """True division, in the (float) result type. (torch divides float16 and bfloat16 by one
    number in float32, ``_division_dtype``; doing so here would hide ``scores / sqrt(d)``
    behind casts from ``fuse-attention``.)"""
    return lw.emit(wse.DivOp(lw.tensor(a), lw.tensor(b)))


def _division_dtype(lw: Lowering, b: Operand) -> str:
    """The type torch's CPU kernels divide by ``b`` in with a rounding mode, rounding every
    step to it: the result type, but float32 (their opmath type) for float16 and bfloat16
    divided by one number, a Python number (not rounded to the result type) or a tensor of
    one element, which they divide in float32 and round once."""
    dtype = lw.result_dtype()
    one = not isinstance(b, SSAValue) or math.prod(wse.tensor_shape(b)) == 1
    return "float32" if one and dtype in ("float16", "bfloat16") else dtype


@register("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(lw: Lowering, a: Operand, b: Operand, rounding_mode: str | None = None) -> SSAValue:
    """Division rounded towards zero (``trunc``) or down (``floor``), as torch's CPU kernels
    round it. Integers divide in their own type, exact to the last bit (float64 cannot hold
    int64 beyond 2**53). Floats: ``trunc`` truncates the quotient, ``floor`` is Python's
    floor division (``_floor_divided``)."""
    if rounding_mode is None:
        return _div(lw, a, b)
    if rounding_mode not in ("trunc", "floor"):
        raise NodeError(f"rounding_mode={rounding_mode!r} is not supported (trunc or floor)")
    dtype = lw.result_dtype()
    if dtypes.is_integer(dtype):
        return _integer_div(lw, lw.tensor(a), lw.tensor(b), rounding_mode == "floor")
    work = _division_dtype(lw, b)
    x, y = lw.tensor(a, work), lw.tensor(b, work)
    if rounding_mode == "floor":
        return lw.tensor(_floor_divided(lw, x, y))
    return lw.tensor(_truncated(lw, lw.emit(wse.DivOp(x, y))))


def _floor_divided(lw: Lowering, a: SSAValue, b: SSAValue) -> SSAValue:
    """Python's ``a // b`` of floats, as torch computes it (``c10::div_floor_floating``, after
    CPython): IEEE's ``a / b`` where ``b`` is 0; else ``(a - fmod(a, b)) / b``, one less
    where the remainder's sign differs from ``b``'s, floored, one more where the floor took
    off more than a half (the division's rounding), and a zero with the sign of ``a / b``.
    Not ``floor(a / b)``: ``1 // 0.1`` is 9 (``1 / 0.1`` rounds to 10), ``-1 // inf`` is -1
    and ``inf // 2`` NaN."""
    zero, one = lw.scalar(0, a), lw.scalar(1, a)
    quotient = lw.emit(wse.DivOp(a, b))
    remainder = lw.emit(wse.FmodOp(a, b))
    exact = lw.emit(wse.DivOp(lw.emit(wse.SubOp(a, remainder)), b))
    exact = select(lw, _signs_differ(lw, remainder, b), lw.emit(wse.SubOp(exact, one)), exact)
    floor = lw.emit(wse.FloorOp(exact))
    above_half = lw.emit(wse.GreaterOp(lw.emit(wse.SubOp(exact, floor)), lw.scalar(0.5, a)))
    floor = select(lw, above_half, lw.emit(wse.AddOp(floor, one)), floor)
    # a / b is finite where the quotient is 0: times 0 it is a zero of its sign
    signed_zero = lw.emit(wse.MulOp(quotient, zero))
    floor = select(lw, lw.emit(wse.EqualOp(exact, zero)), signed_zero, floor)
    return select(lw, lw.emit(wse.EqualOp(b, zero)), quotient, floor)


def _signs_differ(lw: Lowering, remainder: SSAValue, divisor: SSAValue) -> SSAValue:
    """Where a float remainder of C's ``fmod`` is nonzero and its sign differs from the
    divisor's: where Python's remainder is ``remainder + divisor`` and its floor quotient one
    less (NaN counts as nonzero and as not negative, as in torch's kernels)."""
    zero = lw.scalar(0, remainder)
    nonzero = lw.emit(wse.NotOp(lw.emit(wse.EqualOp(remainder, zero))))
    differ = lw.emit(wse.XorOp(less(lw, divisor, zero), less(lw, remainder, zero)))
    return lw.emit(wse.AndOp(nonzero, differ))


def _truncated(lw: Lowering, x: SSAValue) -> SSAValue:
    """``x`` rounded toward zero: ``ceil`` below zero, ``floor`` elsewhere, so that -0.0, the
    infinities and NaN stay (``floor(|x|) * sign(x)`` turns -0.0 into 0.0: numpy's sign of
    -0.0 is 0.0)."""
    negative = less(lw, x, lw.scalar(0, x))
    return select(lw, negative, lw.emit(wse.CeilOp(x)), lw.emit(wse.FloorOp(x)))


def _integer_div(lw: Lowering, a: SSAValue, b: SSAValue, floor: bool) -> SSAValue:
    """``a / b`` of integers truncated (``wse.div``) or, with ``floor``, rounded down: one
    less where the floor remainder (``mod``) differs from the truncated one (``fmod``), that
    is where the division is inexact and the signs differ (no ``a - a % b``, which overflows
    at the type's minimum). A divisor of 0 is an error, as in torch (``ZeroDivisionError``):
    compiling refuses a known one, running one that comes with the data."""
    quotient = lw.emit(wse.DivOp(a, b))
    if not floor:
        return quotient
    exact = lw.emit(wse.EqualOp(lw.emit(wse.ModOp(a, b)), lw.emit(wse.FmodOp(a, b))))
    return select(lw, exact, quotient, lw.emit(wse.SubOp(quotient, lw.tensor(1))))


@register("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(lw: Lowering, a: Operand, b: Operand) -> SSAValue:
    """``a ** b``; a square is a product."""
    if b == 2 and isinstance(a, SSAValue):
        x = lw.tensor(a)
        return lw.emit(wse.MulOp(x, x))
    return lw.emit(wse.PowOp(lw.tensor(a), lw.tensor(b)))


@register("aten.rsqrt.default")
def _rsqrt(lw: Lowering, x: SSAValue) -> SSAValue:
    return lw.emit(wse.ReciprocalOp(lw.emit(wse.SqrtOp(lw.tensor(x)))))


@register("aten.expm1.default")
def _expm1(lw: Lowering, x: SSAValue) -> SSAValue:
    y = lw.emit(wse.ExpOp(lw.tensor(x)))
    return lw.emit(wse.SubOp(y, lw.tensor(1)))


@register("aten.log1p.default")
def _log1p(lw: Lowering, x: SSAValue) -> SSAValue:
    return lw.emit(wse.LogOp(lw.emit(wse.AddOp(lw.tensor(x), lw.tensor(1)))))


@register("aten.log2.default", "aten.log10.default")
def _log_base(lw: Lowering, x: SSAValue) -> SSAValue:
    assert lw.node is not None
    base = 2.0 if "log2" in str(lw.node.target) else 10.0
    return lw.emit(wse.MulOp(lw.emit(wse.LogOp(lw.tensor(x))), lw.tensor(1 / math.log(base))))


@register("aten.gelu.default")
def _gelu(lw: Lowering, x: SSAValue, approximate: str = "none") -> SSAValue:
    if approximate not in GELU_APPROXIMATIONS:
        raise NodeError(f"approximate={approximate!r} is not supported (none or tanh)")
    return gelu(lw, lw.tensor(x), approximate)


@register("aten.silu.default")
def _silu(lw: Lowering, x: SSAValue) -> SSAValue:
    x = lw.tensor(x)
    return lw.emit(wse.MulOp(x, lw.emit(wse.SigmoidOp(x))))


@register("aten.leaky_relu.default")
def _leaky_relu(lw: Lowering, x: SSAValue, negative_slope: float = 0.01) -> SSAValue:
    x = lw.tensor(x)
    positive = lw.emit(wse.GreaterOp(x, lw.tensor(0)))
    return select(lw, positive, x, lw.emit(wse.MulOp(x, lw.tensor(negative_slope))))


@register("aten.hardtanh.default")
def _hardtanh(lw: Lowering, x: SSAValue, min_val: float = -1.0, max_val: float = 1.0) -> SSAValue:
    low, high = _bound(lw, min_val, "min_val"), _bound(lw, max_val, "max_val")
    return clamp(lw, lw.tensor(x), low, high)


@register("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(
    lw: Lowering, x: SSAValue, min: Operand | None = None, max: Operand | None = None
) -> SSAValue:
    return clamp(lw, lw.tensor(x), _bound(lw, min, "min"), _bound(lw, max, "max"))


def _bound(lw: Lowering, value: Operand | None, name: str) -> SSAValue | None:
    """A bound of a clamp as a tensor of the result type. A Python number that type cannot
    hold is an error, as torch refuses it ("value cannot be converted to type float without
    overflow"): ``-3.4028235e+38``, float32's lowest printed to 8 digits, lies beyond it.
    A float type holds the infinities and NaN; an integer type neither."""
    if value is None or isinstance(value, SSAValue):
        return None if value is None else lw.tensor(value)
    dtype = lw.result_dtype()
    integer = dtypes.is_integer(dtype)
    if integer or math.isfinite(value):
        low, high = dtypes.integer_range(dtype) if integer else dtypes.finite_range(dtype)
        if not low <= value <= high:  # NaN too
            raise NodeError(f"{name}={value!r} cannot be converted to {dtype} without overflow")
    return lw.tensor(value)


@register("aten.where.self")
def _where(lw: Lowering, cond: SSAValue, a: Operand, b: Operand) -> SSAValue:
    return select(lw, lw.tensor(cond, "bool"), lw.tensor(a), lw.tensor(b))


@register("aten.logical_not.default")
def _logical_not(lw: Lowering, x: SSAValue) -> SSAValue:
    return lw.emit(wse.NotOp(lw.tensor(x, "bool")))


@register("aten.isnan.default")
def _isnan(lw: Lowering, x: SSAValue) -> SSAValue:
    return lw.emit(wse.IsNanOp(x))


def _comparison(kind: str) -> OpLowering:
    def lower(lw: Lowering, a: Operand, b: Operand) -> SSAValue:
        common = _common_dtype(lw, a, b)
        x, y = lw.tensor(a, common), lw.tensor(b, common)
        if kind in ("lt", "le"):
            x, y = y, x
        if kind in ("eq", "ne"):
            result = lw.emit(wse.EqualOp(x, y))
            return lw.emit(wse.NotOp(result)) if kind == "ne" else result
        op = wse.GreaterOp if kind in ("gt", "lt") else wse.GreaterEqualOp
        return lw.emit(op(x, y))

    return lower


def _common_dtype(lw: Lowering, a: Operand, b: Operand) -> str:
    """The type torch compares ``a`` and ``b`` in."""
    assert lw.node is not None
    metas = [arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg for arg in lw.node.args[:2]]
    return numpy_dtype(torch.result_type(*metas))  # type: ignore[arg-type]


for _kind in COMPARISONS:
    register(f"aten.{_kind}.Tensor", f"aten.{_kind}.Scalar")(_comparison(_kind))


@register("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.remainder.Scalar_Tensor")
def _remainder(lw: Lowering, a: Operand, b: Operand) -> SSAValue:
    """Python's ``a % b``, with the sign of ``b``. Floats as torch computes them: C's
    ``fmod(a, b)``, moved by ``b`` where it is nonzero and its sign differs from ``b``'s
    (``-0.0 % 1`` is -0.0, ``-1 % inf`` inf, ``x % 0`` NaN); not ``a - floor(a / b) * b``,
    which loses the remainder to the quotient's rounding and gives NaN for ``1 % inf``."""
    x, y = lw.tensor(a), lw.tensor(b)
    if not dtypes.is_float(lw.result_dtype()):
        return lw.emit(wse.ModOp(x, y))
    remainder = lw.emit(wse.FmodOp(x, y))
    moved = lw.emit(wse.AddOp(remainder, y))
    return select(lw, _signs_differ(lw, remainder, y), moved, remainder)


@register("aten.atan2.default")
def _atan2(lw: Lowering, a: Operand, b: Operand) -> SSAValue:
    """The angle of ``(b, a)``: ``atan(a / b)`` moved by pi into the quadrant of ``b < 0``."""
    y, x = lw.tensor(a), lw.tensor(b)
    zero = lw.tensor(0)
    base = lw.emit(wse.AtanOp(lw.emit(wse.DivOp(y, x))))
    # atan(y / x) is off by +-pi left of the y axis; the sign of y picks which
    turn = select(lw, lw.emit(wse.GreaterEqualOp(y, zero)), lw.tensor(math.pi), lw.tensor(-math.pi))
    shifted = lw.emit(wse.AddOp(base, turn))
    return select(lw, lw.emit(wse.GreaterOp(zero, x)), shifted, base)


@register("aten.trunc.default")
def _trunc(lw: Lowering, x: SSAValue) -> SSAValue:
    x = lw.tensor(x)
    return _truncated(lw, x) if dtypes.is_float(lw.result_dtype()) else x


@register("aten.isinf.default")
def _isinf(lw: Lowering, x: SSAValue) -> SSAValue:
    return lw.emit(wse.IsInfOp(x))


@register("aten.bitwise_left_shift.Tensor", "aten.bitwise_left_shift.Tensor_Scalar")
def _shift_left(lw: Lowering, a: Operand, b: Operand) -> SSAValue:
    return lw.emit(wse.ShiftLeftOp(lw.tensor(a), lw.tensor(b)))


@register("aten.bitwise_right_shift.Tensor", "aten.bitwise_right_shift.Tensor_Scalar")
def _shift_right(lw: Lowering, a: Operand, b: Operand) -> SSAValue:
    return lw.emit(wse.ShiftRightOp(lw.tensor(a), lw.tensor(b)))


@register("aten.elu.default")
def _elu(
    lw: Lowering, x: SSAValue, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0
) -> SSAValue:
    """``scale * x`` above zero, ``scale * alpha * (exp(input_scale * x) - 1)`` below."""
    x = lw.tensor(x)
    curve = lw.emit(wse.ExpOp(lw.emit(wse.MulOp(x, lw.tensor(input_scale)))))
    curve = lw.emit(wse.MulOp(lw.emit(wse.SubOp(curve, lw.tensor(1))), lw.tensor(alpha)))
    positive = lw.emit(wse.GreaterOp(x, lw.tensor(0)))
    return lw.emit(wse.MulOp(select(lw, positive, x, curve), lw.tensor(scale)))
