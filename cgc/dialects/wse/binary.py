"""Elementwise ops of two operands, and ``wse.select`` of three, with numpy broadcasting.

``TwoOperandOp`` is the base of the ops of two tensors whose result shape follows a shape rule
(numpy broadcasting here, ``shapes.matmul`` for ``wse.matmul``). Its elementwise subclasses
(``BinaryOp``) keep the operands' element type, except the comparisons (``CompareOp``), whose
result is a tensor of ``i1``. ``BINARY_OPS`` are the ones autodiff knows, ``LOGIC_OPS`` the
others (remainders, logic, bitwise ops and shifts).

Example: ``%c = wse.add %a, %b : (tensor<8x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import TensorType, i1
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from cgc.dialects import shapes
from cgc.dialects.wse.types import (
    check,
    check_result_shape,
    element_type,
    shape_rule,
    tensor_shape,
)


class TwoOperandOp(IRDLOperation, abc.ABC):
    """Base of the ops of two tensors whose result shape follows ``SHAPE_RULE``."""

    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = (
        "$lhs `,` $rhs attr-dict `:` `(` type($lhs) `,` type($rhs) `)` `->` type($result)"
    )
    SHAPE_RULE: ClassVar[staticmethod[[Sequence[int], Sequence[int]], tuple[int, ...]]] = (
        staticmethod(shapes.broadcast)
    )

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        shape = shape_rule(self.SHAPE_RULE, tensor_shape(lhs), tensor_shape(rhs))
        super().__init__(
            operands=[lhs, rhs], result_types=[TensorType(self.result_element(lhs), shape)]
        )

    @classmethod
    def result_element(cls, lhs: SSAValue) -> Attribute:
        """The result's element type, given the left operand."""
        return element_type(lhs)

    def verify_(self) -> None:
        check(
            element_type(self.lhs) == element_type(self.rhs),
            "operands have different element types",
        )
        check(
            element_type(self.result) == self.result_element(self.lhs),
            "wrong result element type",
        )
        check_result_shape(
            self, shape_rule(self.SHAPE_RULE, tensor_shape(self.lhs), tensor_shape(self.rhs))
        )


class BinaryOp(TwoOperandOp, abc.ABC):
    """Base of the elementwise ops of two operands with numpy broadcasting."""


@irdl_op_definition
class AddOp(BinaryOp):
    """``a + b``."""

    name = "wse.add"


@irdl_op_definition
class SubOp(BinaryOp):
    """``a - b``."""

    name = "wse.sub"


@irdl_op_definition
class MulOp(BinaryOp):
    """``a * b``."""

    name = "wse.mul"


@irdl_op_definition
class DivOp(BinaryOp):
    """``a / b``."""

    name = "wse.div"


@irdl_op_definition
class PowOp(BinaryOp):
    """``a ** b``."""

    name = "wse.pow"


@irdl_op_definition
class MaxOp(BinaryOp):
    """Elementwise maximum."""

    name = "wse.max"


@irdl_op_definition
class MinOp(BinaryOp):
    """Elementwise minimum."""

    name = "wse.min"


@irdl_op_definition
class ModOp(BinaryOp):
    """a mod b with the sign of b (Python's %)."""

    name = "wse.mod"


@irdl_op_definition
class FmodOp(BinaryOp):
    """C's fmod: the remainder with the sign of a."""

    name = "wse.fmod"


@irdl_op_definition
class AndOp(BinaryOp):
    """Logical and of booleans."""

    name = "wse.and"


@irdl_op_definition
class OrOp(BinaryOp):
    """Logical or of booleans."""

    name = "wse.or"


@irdl_op_definition
class XorOp(BinaryOp):
    """Logical exclusive or of booleans."""

    name = "wse.xor"


@irdl_op_definition
class BitwiseAndOp(BinaryOp):
    """Bitwise and of integers."""

    name = "wse.bitwise_and"


@irdl_op_definition
class BitwiseOrOp(BinaryOp):
    """Bitwise or of integers."""

    name = "wse.bitwise_or"


@irdl_op_definition
class BitwiseXorOp(BinaryOp):
    """Bitwise exclusive or of integers."""

    name = "wse.bitwise_xor"


@irdl_op_definition
class ShiftLeftOp(BinaryOp):
    """a shifted left by b bits."""

    name = "wse.shift_left"


@irdl_op_definition
class ShiftRightOp(BinaryOp):
    """a shifted right by b bits."""

    name = "wse.shift_right"


class CompareOp(BinaryOp, abc.ABC):
    """Base of the elementwise comparisons; the result is a tensor of ``i1``."""

    @classmethod
    def result_element(cls, lhs: SSAValue) -> Attribute:
        return i1


@irdl_op_definition
class GreaterOp(CompareOp):
    """``a > b``."""

    name = "wse.greater"


@irdl_op_definition
class EqualOp(CompareOp):
    """``a == b``."""

    name = "wse.equal"


@irdl_op_definition
class GreaterEqualOp(CompareOp):
    """``a >= b`` (false when either is NaN)."""

    name = "wse.greater_equal"


@irdl_op_definition
class SelectOp(IRDLOperation):
    """``cond ? a : b`` elementwise, with numpy broadcasting of all three operands."""

    name = "wse.select"
    cond = operand_def(TensorType)
    true_value = operand_def(TensorType)
    false_value = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = (
        "$cond `,` $true_value `,` $false_value attr-dict `:` "
        "`(` type($cond) `,` type($true_value) `,` type($false_value) `)` `->` type($result)"
    )

    def __init__(self, cond: SSAValue, true_value: SSAValue, false_value: SSAValue):
        shape = shape_rule(
            shapes.broadcast,
            tensor_shape(cond),
            tensor_shape(true_value),
            tensor_shape(false_value),
        )
        super().__init__(
            operands=[cond, true_value, false_value],
            result_types=[TensorType(element_type(true_value), shape)],
        )

    def verify_(self) -> None:
        check(element_type(self.cond) == i1, "the condition must be a tensor of i1")
        check(
            element_type(self.true_value)
            == element_type(self.false_value)
            == element_type(self.result),
            "values and result have different element types",
        )
        check_result_shape(
            self,
            shape_rule(
                shapes.broadcast,
                tensor_shape(self.cond),
                tensor_shape(self.true_value),
                tensor_shape(self.false_value),
            ),
        )


BINARY_OPS: tuple[type[BinaryOp], ...] = (
    AddOp,
    SubOp,
    MulOp,
    DivOp,
    PowOp,
    MaxOp,
    MinOp,
    GreaterOp,
    EqualOp,
)
"""The elementwise ops of two operands that autodiff knows."""
LOGIC_OPS: tuple[type[BinaryOp], ...] = (
    ModOp, FmodOp, AndOp, OrOp, XorOp, BitwiseAndOp, BitwiseOrOp, BitwiseXorOp, ShiftLeftOp,
    ShiftRightOp, GreaterEqualOp,
)  # fmt: skip
"""The other elementwise ops of two operands."""
