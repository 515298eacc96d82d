"""Elementwise ops of one operand: math functions, tests, casts.

``UnaryOp`` ops keep the operand's type: the functions that autodiff knows (``UNARY_OPS``),
the identity ``wse.stop_gradient``, and the further trigonometric, hyperbolic, rounding and
logical functions (``MATH_OPS``). ``PredicateOp`` ops test floats and give a tensor of ``i1``;
``wse.cast`` converts the elements' values and ``wse.bitcast`` reinterprets their bits, both
keeping the shape.

Example: ``%y = wse.relu %x : tensor<8x64xf32>``.
"""

from __future__ import annotations

import abc
from typing import ClassVar

from xdsl.dialects.builtin import BoolAttr, TensorType, i1
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure

from cgc.dialects.wse.types import (
    check,
    check_result_shape,
    element_type,
    numpy_dtype,
    tensor_shape,
)
from cgc.machine.hardware import dtypes


class UnaryOp(IRDLOperation, abc.ABC):
    """Base of the elementwise ops of one operand; result and operand types are equal."""

    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue):
        super().__init__(operands=[input], result_types=[input.type])


@irdl_op_definition
class NegOp(UnaryOp):
    """``-x``."""

    name = "wse.neg"


@irdl_op_definition
class ExpOp(UnaryOp):
    """``exp(x)``."""

    name = "wse.exp"


@irdl_op_definition
class LogOp(UnaryOp):
    """``log(x)``."""

    name = "wse.log"


@irdl_op_definition
class SqrtOp(UnaryOp):
    """``sqrt(x)``."""

    name = "wse.sqrt"


@irdl_op_definition
class ReciprocalOp(UnaryOp):
    """``1 / x``."""

    name = "wse.reciprocal"


@irdl_op_definition
class AbsOp(UnaryOp):
    """``|x|``."""

    name = "wse.abs"


@irdl_op_definition
class ReluOp(UnaryOp):
    """``max(x, 0)``."""

    name = "wse.relu"


@irdl_op_definition
class SigmoidOp(UnaryOp):
    """``1 / (1 + exp(-x))``."""

    name = "wse.sigmoid"


@irdl_op_definition
class TanhOp(UnaryOp):
    """``tanh(x)``."""

    name = "wse.tanh"


@irdl_op_definition
class ErfOp(UnaryOp):
    """The Gauss error function."""

    name = "wse.erf"


UNARY_OPS: tuple[type[UnaryOp], ...] = (
    NegOp,
    ExpOp,
    LogOp,
    SqrtOp,
    ReciprocalOp,
    AbsOp,
    ReluOp,
    SigmoidOp,
    TanhOp,
    ErfOp,
)


@irdl_op_definition
class StopGradientOp(UnaryOp):
    """The identity, through which no gradient flows.

    ``decompose`` wraps the max that shifts a softmax for numerical stability in it: the
    shift's gradient is zero, so autodiff need not compute it. It lowers to no instruction.
    """

    name = "wse.stop_gradient"


@irdl_op_definition
class SignOp(UnaryOp):
    """-1, 0 or 1 by the sign of x (NaN stays NaN)."""

    name = "wse.sign"


@irdl_op_definition
class FloorOp(UnaryOp):
    """The largest integer not above x."""

    name = "wse.floor"


@irdl_op_definition
class CeilOp(UnaryOp):
    """The smallest integer not below x."""

    name = "wse.ceil"


@irdl_op_definition
class RoundOp(UnaryOp):
    """x rounded to the nearest integer, halves to even."""

    name = "wse.round"


@irdl_op_definition
class SinOp(UnaryOp):
    """sin(x)."""

    name = "wse.sin"


@irdl_op_definition
class CosOp(UnaryOp):
    """cos(x)."""

    name = "wse.cos"


@irdl_op_definition
class TanOp(UnaryOp):
    """tan(x)."""

    name = "wse.tan"


@irdl_op_definition
class AsinOp(UnaryOp):
    """arcsin(x)."""

    name = "wse.asin"


@irdl_op_definition
class AcosOp(UnaryOp):
    """arccos(x)."""

    name = "wse.acos"


@irdl_op_definition
class AtanOp(UnaryOp):
    """arctan(x)."""

    name = "wse.atan"


@irdl_op_definition
class SinhOp(UnaryOp):
    """sinh(x)."""

    name = "wse.sinh"


@irdl_op_definition
class CoshOp(UnaryOp):
    """cosh(x)."""

    name = "wse.cosh"


@irdl_op_definition
class AsinhOp(UnaryOp):
    """arsinh(x)."""

    name = "wse.asinh"


@irdl_op_definition
class AcoshOp(UnaryOp):
    """arcosh(x)."""

    name = "wse.acosh"


@irdl_op_definition
class AtanhOp(UnaryOp):
    """artanh(x)."""

    name = "wse.atanh"


@irdl_op_definition
class NotOp(UnaryOp):
    """Logical negation of booleans."""

    name = "wse.not"


@irdl_op_definition
class BitwiseNotOp(UnaryOp):
    """Bitwise complement of integers."""

    name = "wse.bitwise_not"


MATH_OPS: tuple[type[UnaryOp], ...] = (
    SignOp, FloorOp, CeilOp, RoundOp, SinOp, CosOp, TanOp, AsinOp, AcosOp, AtanOp, SinhOp,
    CoshOp, AsinhOp, AcoshOp, AtanhOp, NotOp, BitwiseNotOp,
)  # fmt: skip
"""Elementwise ops of one operand beyond ``UNARY_OPS``: trigonometric, hyperbolic, rounding and
logical functions."""


class PredicateOp(IRDLOperation, abc.ABC):
    """Base of the elementwise tests of one operand; the result is a tensor of ``i1``."""

    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue):
        super().__init__(operands=[input], result_types=[TensorType(i1, tensor_shape(input))])

    def verify_(self) -> None:
        check(dtypes.is_float(numpy_dtype(element_type(self.input))), "the input must be floats")
        check(element_type(self.result) == i1, "the result must be a tensor of i1")
        check_result_shape(self, tensor_shape(self.input))


@irdl_op_definition
class IsNanOp(PredicateOp):
    """Whether each element is NaN."""

    name = "wse.is_nan"


@irdl_op_definition
class IsInfOp(PredicateOp):
    """Whether each element is an infinity of either sign."""

    name = "wse.is_inf"


@irdl_op_definition
class CastOp(IRDLOperation):
    """Converts every element to the result's element type (numpy ``astype`` semantics).

    ``saturate`` matters for 8-bit and 4-bit float results only: values beyond the type's
    range become its largest finite value of that sign instead of infinity or NaN.
    """

    name = "wse.cast"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    saturate = prop_def(BoolAttr, default_value=BoolAttr.from_bool(True))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, element: Attribute, saturate: bool = True):
        super().__init__(
            operands=[input],
            result_types=[TensorType(element, tensor_shape(input))],
            properties={"saturate": BoolAttr.from_bool(saturate)},
        )

    def verify_(self) -> None:
        check_result_shape(self, tensor_shape(self.input))


@irdl_op_definition
class BitcastOp(IRDLOperation):
    """Reinterprets the bits of every element as the result's element type, which has the
    same width (numpy ``view``)."""

    name = "wse.bitcast"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, element: Attribute):
        super().__init__(operands=[input], result_types=[TensorType(element, tensor_shape(input))])

    def verify_(self) -> None:
        check_result_shape(self, tensor_shape(self.input))
        source, target = (
            dtypes.dtype(numpy_dtype(element_type(v))) for v in (self.input, self.result)
        )
        check(
            dtypes.bits(source) == dtypes.bits(target),
            f"cannot reinterpret {source.name} as {target.name}: the widths differ",
        )
        check(
            dtypes.bits(source) == 8 * source.itemsize,
            f"cannot reinterpret {source.name}: its values are narrower than a byte",
        )
