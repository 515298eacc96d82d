"""Lowerings of the core ATen element-wise ops: arithmetic with torch's type promotion (the
operands are cast to the node's result type, a Python number becomes a constant of it),
comparisons and logic, one-input math, activations and ``where``."""

from __future__ import annotations

import math

import torch
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.onnx.activations import GELU_APPROXIMATIONS, gelu
from cgc.frontends.onnx.builders import clamp, select
from cgc.frontends.onnx.nodes import NodeError
from cgc.frontends.torch.lowering import Lowering, OpLowering, numpy_dtype, register
from cgc.machine import dtypes

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
    """True division, in the (float) result type."""
    return lw.emit(wse.DivOp(lw.tensor(a), lw.tensor(b)))


@register("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(lw: Lowering, a: Operand, b: Operand, rounding_mode: str | None = None) -> SSAValue:
    """Division rounded towards zero (``trunc``) or down (``floor``); integers divide in
    their own type, exact to the last bit (float64 cannot hold int64 beyond 2**53)."""
    dtype = lw.result_dtype()
    if rounding_mode is None:
        return _div(lw, a, b)
    if rounding_mode in ("trunc", "floor") and dtypes.is_integer(dtype):
        return _integer_div(lw, lw.tensor(a), lw.tensor(b), rounding_mode == "floor")
    wide = "float64" if dtype == "float64" else "float32"
    quotient = lw.emit(wse.DivOp(lw.tensor(a, wide), lw.tensor(b, wide)))
    if rounding_mode == "floor":
        rounded = lw.emit(wse.FloorOp(quotient))
    elif rounding_mode == "trunc":
        magnitude = lw.emit(wse.FloorOp(lw.emit(wse.AbsOp(quotient))))
        rounded = lw.emit(wse.MulOp(magnitude, lw.emit(wse.SignOp(quotient))))
    else:
        raise NodeError(f"rounding_mode={rounding_mode!r} is not supported (trunc or floor)")
    return lw.tensor(rounded)


def _integer_div(lw: Lowering, a: SSAValue, b: SSAValue, floor: bool) -> SSAValue:
    """``a / b`` of integers truncated (``wse.div``) or, with ``floor``, rounded down: one
    less where the floor remainder (``mod``) differs from the truncated one (``fmod``), that
    is where the division is inexact and the signs differ (no ``a - a % b``, which overflows
    at the type's minimum)."""
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
    return clamp(lw, lw.tensor(x), min_val, max_val)


@register("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(
    lw: Lowering, x: SSAValue, min: Operand | None = None, max: Operand | None = None
) -> SSAValue:
    low = None if min is None else lw.tensor(min)
    high = None if max is None else lw.tensor(max)
    return clamp(lw, lw.tensor(x), low, high)


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
    """Python's ``a % b``, with the sign of ``b``: ``a - floor(a / b) * b`` for floats."""
    x, y = lw.tensor(a), lw.tensor(b)
    if lw.result_dtype() not in ("float32", "float64", "float16", "bfloat16"):
        return lw.emit(wse.ModOp(x, y))
    quotient = lw.emit(wse.FloorOp(lw.emit(wse.DivOp(x, y))))
    return lw.emit(wse.SubOp(x, lw.emit(wse.MulOp(quotient, y))))


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
    magnitude = lw.emit(wse.FloorOp(lw.emit(wse.AbsOp(x))))
    return lw.emit(wse.MulOp(magnitude, lw.emit(wse.SignOp(x))))


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
