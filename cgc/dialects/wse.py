"""The WSE dialect: tensor-level ops of a model compiled for a wafer-scale engine.

A model enters as a ``func.func`` of ``wse`` ops on static tensors: sources (``wse.weight``
for parameters kept in a side store, ``wse.constant`` for small inline values), elementwise
math with numpy broadcasting, reductions, matmul, convolution and pooling, shape ops, and a
few composite ops (softmax, normalizations, the cross-entropy loss) that the ``decompose``
pass lowers to primitives. ``form-layers`` then groups ops into ``wse.layer`` regions: the
unit that pipelined mode places on a rectangle of PEs (``#wse.rect``) and that weight-streaming
mode streams weights into.

Weights never appear in the IR text: ``wse.weight "fc1.weight" : tensor<64x784xf32>`` names
an entry of the side store that travels with the module and ends up in the artifact.

Every op built by a frontend carries the location of its source node (``loc("fc1")``).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from math import prod
from typing import ClassVar

import numpy as np
from xdsl.dialects.builtin import (
    ArrayAttr,
    BoolAttr,
    BytesAttr,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    Float4E2M1FNType,
    Float8E4M3FNType,
    Float8E4M3FNUZType,
    Float8E5M2FNUZType,
    Float8E5M2Type,
    Float8E8M0FNUType,
    Float64Type,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    NameLoc,
    Signedness,
    StringAttr,
    TensorType,
    UnitAttr,
    bf16,
    f16,
    f32,
    f64,
    i1,
    i8,
    i16,
    i32,
    i64,
)
from xdsl.ir import Attribute, Data, Dialect, Operation, ParametrizedAttribute, Region, SSAValue
from xdsl.irdl import (
    AnyAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    base,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    param_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator, Pure
from xdsl.utils.exceptions import VerifyException

from cgc.dialects import shapes
from cgc.errors import CgcError
from cgc.machine import dtypes
from cgc.machine.target import Target, target_from_figures


def _unsigned(width: int) -> IntegerType:
    return IntegerType(width, Signedness.UNSIGNED)


NUMPY_DTYPES: dict[Attribute, str] = {
    f64: "float64",
    f32: "float32",
    f16: "float16",
    bf16: "bfloat16",
    Float8E4M3FNType(): "float8_e4m3fn",
    Float8E4M3FNUZType(): "float8_e4m3fnuz",
    Float8E5M2Type(): "float8_e5m2",
    Float8E5M2FNUZType(): "float8_e5m2fnuz",
    Float8E8M0FNUType(): "float8_e8m0fnu",
    Float4E2M1FNType(): "float4_e2m1fn",
    i64: "int64",
    i32: "int32",
    i16: "int16",
    i8: "int8",
    IntegerType(4): "int4",
    IntegerType(2): "int2",
    _unsigned(64): "uint64",
    _unsigned(32): "uint32",
    _unsigned(16): "uint16",
    _unsigned(8): "uint8",
    _unsigned(4): "uint4",
    _unsigned(2): "uint2",
    i1: "bool",
}
"""numpy dtype names of the element types cgc computes with."""
_ELEMENTS = {name: element for element, name in NUMPY_DTYPES.items()}


def numpy_dtype(element: Attribute) -> str:
    """The numpy dtype name of an element type."""
    try:
        return NUMPY_DTYPES[element]
    except KeyError:
        raise ValueError(f"element type {element} is not supported") from None


def element_of_numpy(dtype: str | np.dtype) -> Attribute:
    """The element type of a numpy dtype."""
    name = dtypes.dtype(dtype).name
    try:
        return _ELEMENTS[name]
    except KeyError:
        raise ValueError(f"dtype {name} is not supported") from None


def dense_attr(array: np.ndarray) -> DenseIntOrFPElementsAttr:
    """A dense elements attribute holding ``array`` (built from its bytes, not element-wise)."""
    array = np.asarray(array)
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return DenseIntOrFPElementsAttr(
        TensorType(element_of_numpy(array.dtype), array.shape), BytesAttr(data)
    )


def tensor_shape(value: SSAValue | Attribute) -> tuple[int, ...]:
    """The static shape of a tensor-typed value or type."""
    ty = value.type if isinstance(value, SSAValue) else value
    assert isinstance(ty, TensorType)
    return tuple(ty.get_shape())


def element_type(value: SSAValue | Attribute) -> Attribute:
    """The element type of a tensor-typed value or type."""
    ty = value.type if isinstance(value, SSAValue) else value
    assert isinstance(ty, TensorType)
    return ty.get_element_type()


def i64_array(values: Sequence[int]) -> DenseArrayBase:
    """An ``array<i64: ...>`` attribute."""
    return DenseArrayBase.from_list(i64, [int(v) for v in values])


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise VerifyException(message)


def _shape_rule(rule, *args) -> tuple[int, ...]:
    """Runs a ``cgc.shapes`` rule, turning its ValueError into a VerifyException."""
    try:
        return rule(*args)
    except ValueError as e:
        raise VerifyException(str(e)) from e


def _check_element(value: SSAValue, expected: Attribute, what: str) -> None:
    _check(element_type(value) == expected, f"{what} must have element type {expected}")


def _check_result_shape(op: IRDLOperation, expected: Sequence[int]) -> None:
    got = tensor_shape(op.results[0])
    _check(
        got == tuple(expected),
        f"{op.name} result shape {got} does not match the inferred shape {tuple(expected)}",
    )


# ---------------------------------------------------------------------------------------------
# Attributes
# ---------------------------------------------------------------------------------------------


@irdl_attr_definition
class RouteAttr(ParametrizedAttribute):
    """``#wse.route<"SOURCE", color C, lanes L, wavelets N, busiest B, hops H, path [...]>``:
    how a tensor that layer SOURCE computes reaches the layer that carries this attribute.

    The tensor crosses the mesh on ``L`` parallel lanes, each a dimension-ordered path of
    links, all on color ``C``; ``N`` wavelets per run of the per-system batch in all. ``B``
    is the load of the busiest link any lane uses, counting every route that shares it (a
    link moves one wavelet per cycle, so the consumer cannot take a batch in fewer than ``B``
    cycles); ``H`` the hops of the longest lane. ``path`` lists the PEs where the first lane
    starts, turns and ends as ``x, y`` pairs.
    """

    name = "wse.route"
    source: StringAttr = param_def()
    color: IntAttr = param_def(converter=IntAttr.get)
    lanes: IntAttr = param_def(converter=IntAttr.get)
    wavelets: IntAttr = param_def(converter=IntAttr.get)
    busiest: IntAttr = param_def(converter=IntAttr.get)
    hops: IntAttr = param_def(converter=IntAttr.get)
    path: ArrayAttr[IntAttr] = param_def()

    FIELDS: ClassVar[tuple[str, ...]] = ("color", "lanes", "wavelets", "busiest", "hops")

    def verify(self) -> None:
        if self.lanes.data < 1:
            raise VerifyException(f"a route needs at least one lane, got {self.lanes.data}")
        if len(self.path.data) % 2 or len(self.path.data) < 4:
            raise VerifyException("a route's path lists at least two x, y pairs")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            source = parser.parse_str_literal()
            values = []
            for field_name in cls.FIELDS:
                parser.parse_punctuation(",")
                parser.parse_keyword(field_name)
                values.append(IntAttr(parser.parse_integer(allow_negative=False)))
            parser.parse_punctuation(",")
            parser.parse_keyword("path")
            path = parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE, lambda: parser.parse_integer(allow_negative=False)
            )
        return (StringAttr(source), *values, ArrayAttr(IntAttr(v) for v in path))

    def print_parameters(self, printer: Printer) -> None:
        fields = ", ".join(f"{f} {getattr(self, f).data}" for f in self.FIELDS)
        path = ", ".join(str(v.data) for v in self.path.data)
        printer.print_string("<")
        printer.print_string_literal(self.source.data)
        printer.print_string(f", {fields}, path [{path}]>")


@irdl_attr_definition
class TargetAttr(Data[Target]):
    """``#wse.target<"NAME", rows = R, cols = C, ...>``: the whole machine a module is
    compiled for (``cgc.machine.target.Target``), every figure written out.

    The driver sets it once, as the module's ``wse.target`` attribute, and every pass reads
    it. Written by hand, ``#wse.target<"NAME">`` is a named target (``wse2``, ``wse3``,
    ``meshRxC``) and ``#wse.target<"NAME", field = value, ...>`` that target with some figures
    changed; a name cgc does not know needs every figure.
    """

    name = "wse.target"

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> Target:
        with parser.in_angle_brackets():
            target_name = parser.parse_str_literal()
            given: dict[str, int | float] = {}
            while parser.parse_optional_punctuation(",") is not None:
                key = parser.parse_identifier()
                parser.parse_punctuation("=")
                given[key] = parser.parse_number()
        try:
            return target_from_figures(target_name, given)
        except CgcError as e:
            parser.raise_error(str(e))

    def print_parameter(self, printer: Printer) -> None:
        printer.print_string("<")
        printer.print_string_literal(self.data.name)
        for key, value in self.data.to_json().items():
            if key != "name":
                printer.print_string(f", {key} = {_number_text(value)}")
        printer.print_string(">")


def _number_text(value: int | float) -> str:
    """``value`` as MLIR reads it back: floats keep a decimal point before any exponent."""
    if isinstance(value, int):
        return str(value)
    text = repr(float(value))
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{exponent}" if exponent else mantissa


@irdl_attr_definition
class RectAttr(ParametrizedAttribute):
    """``#wse.rect<x, y, WxH>``: a rectangle of PEs on the mesh.

    ``x`` is the column and ``y`` the row of the top-left PE; the rectangle is ``W`` columns
    wide and ``H`` rows high.
    """

    name = "wse.rect"
    x: IntAttr = param_def(converter=IntAttr.get)
    y: IntAttr = param_def(converter=IntAttr.get)
    w: IntAttr = param_def(converter=IntAttr.get)
    h: IntAttr = param_def(converter=IntAttr.get)

    def verify(self) -> None:
        if self.x.data < 0 or self.y.data < 0:
            raise VerifyException(f"rectangle origin must be non-negative, got {self.as_tuple()}")
        if self.w.data <= 0 or self.h.data <= 0:
            raise VerifyException(
                f"rectangle size must be positive, got {self.w.data}x{self.h.data}"
            )

    def as_tuple(self) -> tuple[int, int, int, int]:
        """``(x, y, w, h)``."""
        return (self.x.data, self.y.data, self.w.data, self.h.data)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            x = parser.parse_integer(allow_negative=False)
            parser.parse_punctuation(",")
            y = parser.parse_integer(allow_negative=False)
            parser.parse_punctuation(",")
            dims = parser.parse_dimension_list()
            if len(dims) != 2:
                parser.raise_error("expected WxH")
        return (IntAttr(x), IntAttr(y), IntAttr(dims[0]), IntAttr(dims[1]))

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.x.data}, {self.y.data}, {self.w.data}x{self.h.data}>")


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


@irdl_op_definition
class WeightOp(IRDLOperation):
    """A parameter of the model, held in the side store under ``name``.

    ``frozen`` marks tensors that came from constants rather than initializers: they are never
    trained. The result may be a view of the stored tensor: its elements reshaped and then
    permuted by ``perm`` (see ``cgc.machine.reference.weight_view``), so that a kernel gets a
    weight in the order it consumes it at no cost.

    Example: ``%w = wse.weight "fc1.weight" {perm = array<i64: 1, 0>} : tensor<784x64xf32>``.
    """

    name = "wse.weight"
    weight_name = prop_def(StringAttr, prop_name="name")
    frozen = opt_prop_def(UnitAttr)
    perm = opt_prop_def(DenseArrayBase[i64])
    result = result_def(TensorType)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$name attr-dict `:` type($result)"

    def __init__(
        self,
        name: str,
        result_type: TensorType,
        frozen: bool = False,
        perm: Sequence[int] | None = None,
    ):
        props: dict[str, Attribute] = {"name": StringAttr(name)}
        if frozen:
            props["frozen"] = UnitAttr()
        if perm is not None:
            props["perm"] = i64_array(perm)
        super().__init__(result_types=[result_type], properties=props)

    def verify_(self) -> None:
        if self.perm is not None:
            _shape_rule(shapes.transpose, tensor_shape(self.result), self.perm.get_values())


@irdl_op_definition
class ConstantOp(IRDLOperation):
    """A small tensor constant written inline, e.g. ``wse.constant dense<1.0> : tensor<f32>``."""

    name = "wse.constant"
    value = prop_def(DenseIntOrFPElementsAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, value: DenseIntOrFPElementsAttr):
        super().__init__(result_types=[value.type], properties={"value": value})

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_attribute(self.value)
        printer.print_op_attributes(self.attributes)

    @classmethod
    def parse(cls, parser: Parser) -> ConstantOp:
        value = parser.parse_attribute()
        if not isinstance(value, DenseIntOrFPElementsAttr):
            parser.raise_error("wse.constant expects a dense elements attribute")
        attrs = parser.parse_optional_attr_dict()
        op = cls(value)
        op.attributes |= attrs
        return op

    def verify_(self) -> None:
        _check(self.value.type == self.result.type, "value and result types differ")


# ---------------------------------------------------------------------------------------------
# Elementwise
# ---------------------------------------------------------------------------------------------


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


class TwoOperandOp(IRDLOperation, abc.ABC):
    """Base of the ops of two tensors whose result shape follows ``SHAPE_RULE``."""

    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = (
        "$lhs `,` $rhs attr-dict `:` `(` type($lhs) `,` type($rhs) `)` `->` type($result)"
    )
    SHAPE_RULE: ClassVar = staticmethod(shapes.broadcast)

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        shape = _shape_rule(self.SHAPE_RULE, tensor_shape(lhs), tensor_shape(rhs))
        super().__init__(
            operands=[lhs, rhs], result_types=[TensorType(self.result_element(lhs), shape)]
        )

    @classmethod
    def result_element(cls, lhs: SSAValue) -> Attribute:
        """The result's element type, given the left operand."""
        return element_type(lhs)

    def verify_(self) -> None:
        _check(
            element_type(self.lhs) == element_type(self.rhs),
            "operands have different element types",
        )
        _check(
            element_type(self.result) == self.result_element(self.lhs),
            "wrong result element type",
        )
        _check_result_shape(
            self, _shape_rule(self.SHAPE_RULE, tensor_shape(self.lhs), tensor_shape(self.rhs))
        )


@irdl_op_definition
class StopGradientOp(UnaryOp):
    """The identity, through which no gradient flows.

    ``decompose`` wraps the max that shifts a softmax for numerical stability in it: the
    shift's gradient is zero, so autodiff need not compute it. It lowers to no instruction.
    """

    name = "wse.stop_gradient"


def _unary_op(class_name: str, mnemonic: str, doc: str) -> type[UnaryOp]:
    """An elementwise op of one operand: a subclass of UnaryOp with its own name."""
    return irdl_op_definition(
        type(class_name, (UnaryOp,), {"name": f"wse.{mnemonic}", "__doc__": doc})
    )


SignOp = _unary_op("SignOp", "sign", "-1, 0 or 1 by the sign of x (NaN stays NaN).")
FloorOp = _unary_op("FloorOp", "floor", "The largest integer not above x.")
CeilOp = _unary_op("CeilOp", "ceil", "The smallest integer not below x.")
RoundOp = _unary_op("RoundOp", "round", "x rounded to the nearest integer, halves to even.")
SinOp = _unary_op("SinOp", "sin", "sin(x).")
CosOp = _unary_op("CosOp", "cos", "cos(x).")
TanOp = _unary_op("TanOp", "tan", "tan(x).")
AsinOp = _unary_op("AsinOp", "asin", "arcsin(x).")
AcosOp = _unary_op("AcosOp", "acos", "arccos(x).")
AtanOp = _unary_op("AtanOp", "atan", "arctan(x).")
SinhOp = _unary_op("SinhOp", "sinh", "sinh(x).")
CoshOp = _unary_op("CoshOp", "cosh", "cosh(x).")
AsinhOp = _unary_op("AsinhOp", "asinh", "arsinh(x).")
AcoshOp = _unary_op("AcoshOp", "acosh", "arcosh(x).")
AtanhOp = _unary_op("AtanhOp", "atanh", "artanh(x).")
NotOp = _unary_op("NotOp", "not", "Logical negation of booleans.")
BitwiseNotOp = _unary_op("BitwiseNotOp", "bitwise_not", "Bitwise complement of integers.")

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
        _check(dtypes.is_float(numpy_dtype(element_type(self.input))), "the input must be floats")
        _check(element_type(self.result) == i1, "the result must be a tensor of i1")
        _check_result_shape(self, tensor_shape(self.input))


@irdl_op_definition
class IsNanOp(PredicateOp):
    """Whether each element is NaN."""

    name = "wse.is_nan"


@irdl_op_definition
class IsInfOp(PredicateOp):
    """Whether each element is an infinity of either sign."""

    name = "wse.is_inf"


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


def _binary_op(class_name: str, mnemonic: str, doc: str) -> type[BinaryOp]:
    """An elementwise op of two operands with broadcasting, named ``wse.<mnemonic>``."""
    return irdl_op_definition(
        type(class_name, (BinaryOp,), {"name": f"wse.{mnemonic}", "__doc__": doc})
    )


ModOp = _binary_op("ModOp", "mod", "a mod b with the sign of b (Python's %).")
FmodOp = _binary_op("FmodOp", "fmod", "C's fmod: the remainder with the sign of a.")
AndOp = _binary_op("AndOp", "and", "Logical and of booleans.")
OrOp = _binary_op("OrOp", "or", "Logical or of booleans.")
XorOp = _binary_op("XorOp", "xor", "Logical exclusive or of booleans.")
BitwiseAndOp = _binary_op("BitwiseAndOp", "bitwise_and", "Bitwise and of integers.")
BitwiseOrOp = _binary_op("BitwiseOrOp", "bitwise_or", "Bitwise or of integers.")
BitwiseXorOp = _binary_op("BitwiseXorOp", "bitwise_xor", "Bitwise exclusive or of integers.")
ShiftLeftOp = _binary_op("ShiftLeftOp", "shift_left", "a shifted left by b bits.")
ShiftRightOp = _binary_op("ShiftRightOp", "shift_right", "a shifted right by b bits.")


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
        shape = _shape_rule(
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
        _check(element_type(self.cond) == i1, "the condition must be a tensor of i1")
        _check(
            element_type(self.true_value)
            == element_type(self.false_value)
            == element_type(self.result),
            "values and result have different element types",
        )
        _check_result_shape(
            self,
            _shape_rule(
                shapes.broadcast,
                tensor_shape(self.cond),
                tensor_shape(self.true_value),
                tensor_shape(self.false_value),
            ),
        )


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
        _check_result_shape(self, tensor_shape(self.input))


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
        _check_result_shape(self, tensor_shape(self.input))
        source, target = (
            dtypes.dtype(numpy_dtype(element_type(v))) for v in (self.input, self.result)
        )
        _check(
            dtypes.bits(source) == dtypes.bits(target),
            f"cannot reinterpret {source.name} as {target.name}: the widths differ",
        )
        _check(
            dtypes.bits(source) == 8 * source.itemsize,
            f"cannot reinterpret {source.name}: its values are narrower than a byte",
        )


# ---------------------------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------------------------


class ReduceOp(IRDLOperation, abc.ABC):
    """Base of the reductions over ``axes`` (normalized, sorted), optionally keeping them."""

    input = operand_def(TensorType)
    result = result_def(TensorType)
    axes = prop_def(DenseArrayBase[i64])
    keepdims = prop_def(BoolAttr, default_value=BoolAttr.from_bool(False))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, axes: Sequence[int], keepdims: bool):
        shape = _shape_rule(shapes.reduce, tensor_shape(input), tuple(axes), keepdims)
        super().__init__(
            operands=[input],
            result_types=[TensorType(element_type(input), shape)],
            properties={"axes": i64_array(axes), "keepdims": BoolAttr.from_bool(keepdims)},
        )

    @property
    def axis_list(self) -> tuple[int, ...]:
        """The reduced axes as Python ints."""
        return tuple(self.axes.get_values())

    @property
    def keeps_dims(self) -> bool:
        """Whether the reduced axes stay as size-1 axes."""
        return bool(self.keepdims.value.data)

    def verify_(self) -> None:
        axes = self.axis_list
        _check(list(axes) == sorted(axes), f"axes must be sorted, got {axes}")
        _check_result_shape(
            self, _shape_rule(shapes.reduce, tensor_shape(self.input), axes, self.keeps_dims)
        )


@irdl_op_definition
class ReduceSumOp(ReduceOp):
    """Sum over ``axes``."""

    name = "wse.reduce_sum"


@irdl_op_definition
class ReduceMeanOp(ReduceOp):
    """Arithmetic mean over ``axes``."""

    name = "wse.reduce_mean"


@irdl_op_definition
class ReduceMaxOp(ReduceOp):
    """Maximum over ``axes``."""

    name = "wse.reduce_max"


@irdl_op_definition
class ReduceMinOp(ReduceOp):
    """Minimum over ``axes``."""

    name = "wse.reduce_min"


@irdl_op_definition
class ReduceProdOp(ReduceOp):
    """Product over ``axes``."""

    name = "wse.reduce_prod"


# ---------------------------------------------------------------------------------------------
# Matmul, convolution, pooling
# ---------------------------------------------------------------------------------------------


@irdl_op_definition
class MatmulOp(TwoOperandOp):
    """numpy.matmul on operands of rank >= 2, broadcasting the leading (batch) dims."""

    name = "wse.matmul"
    SHAPE_RULE: ClassVar = staticmethod(shapes.matmul)


@irdl_op_definition
class ConvOp(IRDLOperation):
    """N-d cross-correlation of ``input`` (N, C, *spatial) with ``filter`` (K, C/group, *k).

    ``pads`` holds the begin padding of every spatial axis, then the end padding (ONNX order).
    """

    name = "wse.conv"
    input = operand_def(TensorType)
    filter = operand_def(TensorType)
    result = result_def(TensorType)
    strides = prop_def(DenseArrayBase[i64])
    pads = prop_def(DenseArrayBase[i64])
    dilations = prop_def(DenseArrayBase[i64])
    group = prop_def(IntegerAttr[IntegerType], default_value=IntegerAttr(1, i64))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$input `,` $filter attr-dict `:` `(` type($input) `,` type($filter) `)` `->` type($result)"
    )

    def __init__(
        self,
        input: SSAValue,
        filter: SSAValue,
        strides: Sequence[int],
        pads: Sequence[int],
        dilations: Sequence[int],
        group: int,
    ):
        shape = _shape_rule(
            shapes.conv, tensor_shape(input), tensor_shape(filter), strides, pads, dilations, group
        )
        super().__init__(
            operands=[input, filter],
            result_types=[TensorType(element_type(input), shape)],
            properties={
                "strides": i64_array(strides),
                "pads": i64_array(pads),
                "dilations": i64_array(dilations),
                "group": IntegerAttr(group, i64),
            },
        )

    def verify_(self) -> None:
        _check_result_shape(
            self,
            _shape_rule(
                shapes.conv,
                tensor_shape(self.input),
                tensor_shape(self.filter),
                self.strides.get_values(),
                self.pads.get_values(),
                self.dilations.get_values(),
                self.group.value.data,
            ),
        )


def channels_first(shape: Sequence[int], channels_last: bool) -> tuple[int, ...]:
    """``(N, C, *spatial)`` from a shape that is ``(N, *spatial, C)`` when ``channels_last``."""
    shape = tuple(shape)
    return (shape[0], shape[-1], *shape[1:-1]) if channels_last else shape


def channels_back(shape: Sequence[int], channels_last: bool) -> tuple[int, ...]:
    """The inverse of ``channels_first``: ``(N, C, *spatial)`` back to the op's order."""
    shape = tuple(shape)
    return (shape[0], *shape[2:], shape[1]) if channels_last else shape


class PoolOp(IRDLOperation, abc.ABC):
    """Base of the N-d pooling windows over the spatial axes of (N, C, *spatial), or of
    (N, *spatial, C) when ``channels_last``."""

    input = operand_def(TensorType)
    result = result_def(TensorType)
    kernel = prop_def(DenseArrayBase[i64])
    strides = prop_def(DenseArrayBase[i64])
    pads = prop_def(DenseArrayBase[i64])
    dilations = prop_def(DenseArrayBase[i64])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(
        self,
        input: SSAValue,
        kernel: Sequence[int],
        strides: Sequence[int],
        pads: Sequence[int],
        dilations: Sequence[int],
        extra: dict[str, Attribute] | None = None,
        element: Attribute | None = None,
        channels_last: bool = False,
    ):
        nchw = channels_first(tensor_shape(input), channels_last)
        shape = _shape_rule(shapes.pool, nchw, kernel, strides, pads, dilations)
        super().__init__(
            operands=[input],
            result_types=[
                TensorType(element or element_type(input), channels_back(shape, channels_last))
            ],
            properties={
                "kernel": i64_array(kernel),
                "strides": i64_array(strides),
                "pads": i64_array(pads),
                "dilations": i64_array(dilations),
                **(extra or {}),
            },
        )

    RESULT_ELEMENT: ClassVar[Attribute | None] = None
    """The result's element type when it is not the input's."""

    @property
    def is_channels_last(self) -> bool:
        """Whether the channels are the last axis instead of axis 1."""
        return False

    def verify_(self) -> None:
        _check_element(self.result, self.RESULT_ELEMENT or element_type(self.input), "the result")
        last = self.is_channels_last
        nchw = _shape_rule(
            shapes.pool,
            channels_first(tensor_shape(self.input), last),
            self.kernel.get_values(),
            self.strides.get_values(),
            self.pads.get_values(),
            self.dilations.get_values(),
        )
        _check_result_shape(self, channels_back(nchw, last))


class WindowReduceOp(PoolOp, abc.ABC):
    """Base of max and average pooling, which also work on channels-last tensors."""

    channels_last = prop_def(BoolAttr, default_value=BoolAttr.from_bool(False))

    @property
    def is_channels_last(self) -> bool:
        return bool(self.channels_last.value.data)


@irdl_op_definition
class MaxPoolOp(WindowReduceOp):
    """Maximum over each window; padding never wins."""

    name = "wse.max_pool"

    def __init__(
        self,
        input: SSAValue,
        kernel: Sequence[int],
        strides: Sequence[int],
        pads: Sequence[int],
        dilations: Sequence[int],
        channels_last: bool = False,
    ):
        super().__init__(
            input, kernel, strides, pads, dilations,
            {"channels_last": BoolAttr.from_bool(channels_last)}, channels_last=channels_last,
        )  # fmt: skip


@irdl_op_definition
class AvgPoolOp(WindowReduceOp):
    """Mean over each window; ``count_include_pad`` counts padded positions in the divisor."""

    name = "wse.avg_pool"
    count_include_pad = prop_def(BoolAttr, default_value=BoolAttr.from_bool(False))

    def __init__(
        self,
        input: SSAValue,
        kernel: Sequence[int],
        strides: Sequence[int],
        pads: Sequence[int],
        dilations: Sequence[int],
        count_include_pad: bool,
        channels_last: bool = False,
    ):
        extra = {
            "count_include_pad": BoolAttr.from_bool(count_include_pad),
            "channels_last": BoolAttr.from_bool(channels_last),
        }
        super().__init__(
            input, kernel, strides, pads, dilations, extra, channels_last=channels_last
        )


@irdl_op_definition
class ArgMaxPoolOp(PoolOp):
    """Where each window's maximum is: its flat index in the input (N, C, *spatial) in
    row-major order, or with ``storage_order`` 1 with the spatial axes column-major; the
    first of equal maxima wins."""

    name = "wse.argmax_pool"
    RESULT_ELEMENT: ClassVar[Attribute | None] = i64
    storage_order = prop_def(IntegerAttr[IntegerType], default_value=IntegerAttr(0, i64))

    def __init__(
        self,
        input: SSAValue,
        kernel: Sequence[int],
        strides: Sequence[int],
        pads: Sequence[int],
        dilations: Sequence[int],
        storage_order: int,
    ):
        super().__init__(
            input, kernel, strides, pads, dilations,
            {"storage_order": IntegerAttr(storage_order, i64)}, i64,
        )  # fmt: skip


class PatchOp(IRDLOperation, abc.ABC):
    """Base of im2col and its adjoint col2im: the windows of a grouped convolution over an
    image (N, C, *spatial), or (N, *spatial, C) with ``channels_last``."""

    input = operand_def(TensorType)
    result = result_def(TensorType)
    kernel = prop_def(DenseArrayBase[i64])
    strides = prop_def(DenseArrayBase[i64])
    pads = prop_def(DenseArrayBase[i64])
    dilations = prop_def(DenseArrayBase[i64])
    group = prop_def(IntegerAttr[IntegerType], default_value=IntegerAttr(1, i64))
    channels_last = prop_def(BoolAttr, default_value=BoolAttr.from_bool(False))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    @staticmethod
    def window_properties(
        kernel: Sequence[int],
        strides: Sequence[int],
        pads: Sequence[int],
        dilations: Sequence[int],
        group: int,
        channels_last: bool,
    ) -> dict[str, Attribute]:
        """The properties that describe the windows."""
        return {
            "kernel": i64_array(kernel),
            "strides": i64_array(strides),
            "pads": i64_array(pads),
            "dilations": i64_array(dilations),
            "group": IntegerAttr(group, i64),
            "channels_last": BoolAttr.from_bool(channels_last),
        }

    @property
    def is_channels_last(self) -> bool:
        """Whether the image is (N, *spatial, C)."""
        return bool(self.channels_last.value.data)

    def patches_of(self, image: Sequence[int]) -> tuple[int, ...]:
        """The patches' shape for an image of shape ``image`` (in the op's axis order)."""
        return Im2ColOp.infer(
            channels_first(tuple(image), self.is_channels_last),
            self.kernel.get_values(),
            self.strides.get_values(),
            self.pads.get_values(),
            self.dilations.get_values(),
            self.group.value.data,
        )


@irdl_op_definition
class Im2ColOp(PatchOp):
    """The patches of a grouped convolution, one row per output position.

    ``input`` (N, C, *spatial) becomes ``[group, N * prod(out), C/group * prod(kernel)]``:
    row ``(n, *o)`` of group ``g`` holds the window under output position ``o`` of sample
    ``n`` over that group's channels (channel-major, then kernel taps in row-major order);
    padding reads as zero. A convolution is this followed by a matmul with the filter.
    With ``channels_last`` the input is (N, *spatial, C); the result is the same.
    """

    name = "wse.im2col"

    def __init__(
        self,
        input: SSAValue,
        kernel: Sequence[int],
        strides: Sequence[int],
        pads: Sequence[int],
        dilations: Sequence[int],
        group: int,
        channels_last: bool = False,
    ):
        nchw = channels_first(tensor_shape(input), channels_last)
        super().__init__(
            operands=[input],
            result_types=[
                TensorType(
                    element_type(input),
                    self.infer(nchw, kernel, strides, pads, dilations, group),
                )
            ],
            properties=self.window_properties(
                kernel, strides, pads, dilations, group, channels_last
            ),
        )

    @staticmethod
    def infer(x, kernel, strides, pads, dilations, group) -> tuple[int, ...]:
        """The result shape for input shape ``x``."""
        out = _shape_rule(shapes.pool, x, kernel, strides, pads, dilations)
        if x[1] % group:
            raise VerifyException(f"{x[1]} channels do not split into {group} groups")
        return (group, x[0] * prod(out[2:]), x[1] // group * prod(kernel))

    def verify_(self) -> None:
        _check_result_shape(self, self.patches_of(tensor_shape(self.input)))


@irdl_op_definition
class Col2ImOp(PatchOp):
    """The adjoint of ``wse.im2col``: patches ``[group, N * prod(out), C/group *
    prod(kernel)]`` summed back into an image of the result's shape (N, C, *spatial), or
    (N, *spatial, C) with ``channels_last``. Each patch element adds to the image element it
    was read from; elements read from the padding are dropped. The gradient of a
    convolution's input is this applied to the gradient of its patches.
    """

    name = "wse.col2im"

    def __init__(
        self,
        input: SSAValue,
        image: Sequence[int],
        kernel: Sequence[int],
        strides: Sequence[int],
        pads: Sequence[int],
        dilations: Sequence[int],
        group: int,
        channels_last: bool = False,
    ):
        super().__init__(
            operands=[input],
            result_types=[TensorType(element_type(input), tuple(image))],
            properties=self.window_properties(
                kernel, strides, pads, dilations, group, channels_last
            ),
        )

    def verify_(self) -> None:
        patches = self.patches_of(tensor_shape(self.result))
        if tensor_shape(self.input) != patches:
            raise VerifyException(
                f"patches {tensor_shape(self.input)} do not come from an image "
                f"{tensor_shape(self.result)} (those would be {patches})"
            )
        _check_element(self.result, element_type(self.input), "the result")


# ---------------------------------------------------------------------------------------------
# Shape ops
# ---------------------------------------------------------------------------------------------


@irdl_op_definition
class ReshapeOp(IRDLOperation):
    """Reinterprets the elements (row-major) with the result's shape."""

    name = "wse.reshape"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, shape: Sequence[int]):
        super().__init__(
            operands=[input], result_types=[TensorType(element_type(input), tuple(shape))]
        )

    def verify_(self) -> None:
        _shape_rule(shapes.check_reshape, tensor_shape(self.input), tensor_shape(self.result))
        _check(element_type(self.input) == element_type(self.result), "reshape changes dtype")


@irdl_op_definition
class BroadcastToOp(IRDLOperation):
    """Broadcasts the operand to the result's shape (numpy rules)."""

    name = "wse.broadcast_to"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, shape: Sequence[int]):
        super().__init__(
            operands=[input], result_types=[TensorType(element_type(input), tuple(shape))]
        )

    def verify_(self) -> None:
        _shape_rule(shapes.check_broadcast_to, tensor_shape(self.input), tensor_shape(self.result))


@irdl_op_definition
class TransposeOp(IRDLOperation):
    """Permutes the axes: result axis ``i`` is input axis ``perm[i]``."""

    name = "wse.transpose"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    perm = prop_def(DenseArrayBase[i64])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, perm: Sequence[int]):
        shape = _shape_rule(shapes.transpose, tensor_shape(input), tuple(perm))
        super().__init__(
            operands=[input],
            result_types=[TensorType(element_type(input), shape)],
            properties={"perm": i64_array(perm)},
        )

    def verify_(self) -> None:
        _check_result_shape(
            self,
            _shape_rule(shapes.transpose, tensor_shape(self.input), self.perm.get_values()),
        )


@irdl_op_definition
class ConcatOp(IRDLOperation):
    """Concatenates the operands along ``axis``."""

    name = "wse.concat"
    inputs = var_operand_def(TensorType)
    result = result_def(TensorType)
    axis = prop_def(IntegerAttr[IntegerType])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$inputs attr-dict `:` `(` type($inputs) `)` `->` type($result)"

    def __init__(self, inputs: Sequence[SSAValue], axis: int):
        shape = _shape_rule(shapes.concat, [tensor_shape(v) for v in inputs], axis)
        super().__init__(
            operands=[inputs],
            result_types=[TensorType(element_type(inputs[0]), shape)],
            properties={"axis": IntegerAttr(axis, i64)},
        )

    def verify_(self) -> None:
        _check(len(self.inputs) >= 1, "needs at least one operand")
        _check_result_shape(
            self,
            _shape_rule(
                shapes.concat, [tensor_shape(v) for v in self.inputs], self.axis.value.data
            ),
        )


@irdl_op_definition
class SliceOp(IRDLOperation):
    """A static strided slice: ``input[starts[i]:limits[i]:strides[i]]`` on every axis."""

    name = "wse.slice"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    starts = prop_def(DenseArrayBase[i64])
    limits = prop_def(DenseArrayBase[i64])
    strides = prop_def(DenseArrayBase[i64])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(
        self,
        input: SSAValue,
        starts: Sequence[int],
        limits: Sequence[int],
        strides: Sequence[int],
    ):
        shape = _shape_rule(shapes.slice_shape, tensor_shape(input), starts, limits, strides)
        super().__init__(
            operands=[input],
            result_types=[TensorType(element_type(input), shape)],
            properties={
                "starts": i64_array(starts),
                "limits": i64_array(limits),
                "strides": i64_array(strides),
            },
        )

    def verify_(self) -> None:
        _check_result_shape(
            self,
            _shape_rule(
                shapes.slice_shape,
                tensor_shape(self.input),
                self.starts.get_values(),
                self.limits.get_values(),
                self.strides.get_values(),
            ),
        )


@irdl_op_definition
class PadOp(IRDLOperation):
    """Pads every axis with ``low[i]`` elements before and ``high[i]`` after.

    ``mode`` is ``constant`` (``value``), ``reflect`` (mirror without the edge), ``edge``
    (repeat the edge) or ``wrap`` (continue periodically), as numpy.pad.
    """

    name = "wse.pad"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    low = prop_def(DenseArrayBase[i64])
    high = prop_def(DenseArrayBase[i64])
    value = prop_def(FloatAttr[Float64Type], default_value=FloatAttr(0.0, f64))
    mode = prop_def(StringAttr, default_value=StringAttr("constant"))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    MODES: ClassVar = ("constant", "reflect", "edge", "wrap")

    def __init__(
        self,
        input: SSAValue,
        low: Sequence[int],
        high: Sequence[int],
        value: float = 0.0,
        mode: str = "constant",
    ):
        shape = tuple(d + lo + hi for d, lo, hi in zip(tensor_shape(input), low, high, strict=True))
        super().__init__(
            operands=[input],
            result_types=[TensorType(element_type(input), shape)],
            properties={
                "low": i64_array(low),
                "high": i64_array(high),
                "value": FloatAttr(float(value), f64),
                "mode": StringAttr(mode),
            },
        )

    def verify_(self) -> None:
        low, high, src = self.low.get_values(), self.high.get_values(), tensor_shape(self.input)
        _check(len(low) == len(high) == len(src), "needs one low and one high amount per axis")
        _check(min((*low, *high), default=0) >= 0, "pad amounts must be non-negative")
        _check(self.mode.data in self.MODES, f"unknown pad mode {self.mode.data!r}")
        _check_result_shape(
            self, tuple(d + lo + hi for d, lo, hi in zip(src, low, high, strict=True))
        )


@irdl_op_definition
class OneHotOp(IRDLOperation):
    """Integer class indices to one-hot rows: a new last axis of the result's size.

    Indices outside ``[0, depth)`` give an all-zero row.
    """

    name = "wse.one_hot"
    indices = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$indices attr-dict `:` type($indices) `->` type($result)"

    def __init__(self, indices: SSAValue, depth: int, element: Attribute):
        super().__init__(
            operands=[indices],
            result_types=[TensorType(element, (*tensor_shape(indices), depth))],
        )

    def verify_(self) -> None:
        _check(
            isinstance(element_type(self.indices), IntegerType),
            "indices must be integers",
        )
        _check(
            tensor_shape(self.result)[:-1] == tensor_shape(self.indices),
            "the result must add exactly one trailing axis",
        )


# ---------------------------------------------------------------------------------------------
# Indexed ops: the indices are data, known only at run time
# ---------------------------------------------------------------------------------------------

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _check_indices(value: SSAValue) -> None:
    _check(isinstance(element_type(value), IntegerType), "indices must be integers")


class GatherBase(IRDLOperation, abc.ABC):
    """Base of the gathers: elements of ``data`` picked by the integers in ``indices``."""

    data = operand_def(TensorType)
    indices = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$data `,` $indices attr-dict `:` `(` type($data) `,` type($indices) `)` `->` type($result)"
    )


@irdl_op_definition
class GatherOp(GatherBase):
    """``take(data, indices, axis)``: the axis of ``data`` replaced by the indices' shape;
    negative indices count from the end."""

    name = "wse.gather"
    axis = prop_def(IntegerAttr[IntegerType])

    def __init__(self, data: SSAValue, indices: SSAValue, axis: int):
        shape = _shape_rule(shapes.gather, tensor_shape(data), tensor_shape(indices), axis)
        super().__init__(
            operands=[data, indices],
            result_types=[TensorType(element_type(data), shape)],
            properties={"axis": IntegerAttr(axis, i64)},
        )

    def verify_(self) -> None:
        _check_indices(self.indices)
        _check_element(self.result, element_type(self.data), "the result")
        _check_result_shape(
            self,
            _shape_rule(
                shapes.gather,
                tensor_shape(self.data),
                tensor_shape(self.indices),
                self.axis.value.data,
            ),
        )


@irdl_op_definition
class GatherElementsOp(GatherBase):
    """``take_along_axis(data, indices, axis)``: one element of ``data`` per index."""

    name = "wse.gather_elements"
    axis = prop_def(IntegerAttr[IntegerType])

    def __init__(self, data: SSAValue, indices: SSAValue, axis: int):
        super().__init__(
            operands=[data, indices],
            result_types=[TensorType(element_type(data), tensor_shape(indices))],
            properties={"axis": IntegerAttr(axis, i64)},
        )

    def verify_(self) -> None:
        _check_indices(self.indices)
        rank, axis = len(tensor_shape(self.data)), self.axis.value.data
        _check(0 <= axis < rank, f"axis {axis} is out of range for rank {rank}")
        _check(len(tensor_shape(self.indices)) == rank, "indices must have the data's rank")
        _check_element(self.result, element_type(self.data), "the result")
        _check_result_shape(self, tensor_shape(self.indices))


@irdl_op_definition
class GatherNDOp(GatherBase):
    """ONNX GatherND: each index tuple (the last axis of ``indices``) picks a slice of
    ``data`` after its first ``batch_dims`` axes."""

    name = "wse.gather_nd"
    batch_dims = prop_def(IntegerAttr[IntegerType], default_value=IntegerAttr(0, i64))

    def __init__(self, data: SSAValue, indices: SSAValue, batch_dims: int):
        shape = _shape_rule(shapes.gather_nd, tensor_shape(data), tensor_shape(indices), batch_dims)
        super().__init__(
            operands=[data, indices],
            result_types=[TensorType(element_type(data), shape)],
            properties={"batch_dims": IntegerAttr(batch_dims, i64)},
        )

    def verify_(self) -> None:
        _check_indices(self.indices)
        _check_element(self.result, element_type(self.data), "the result")
        _check_result_shape(
            self,
            _shape_rule(
                shapes.gather_nd,
                tensor_shape(self.data),
                tensor_shape(self.indices),
                self.batch_dims.value.data,
            ),
        )


class ScatterOp(IRDLOperation, abc.ABC):
    """Base of the scatters: ``data`` with ``updates`` written (or reduced) at ``indices``."""

    data = operand_def(TensorType)
    indices = operand_def(TensorType)
    updates = operand_def(TensorType)
    result = result_def(TensorType)
    reduction = prop_def(StringAttr, default_value=StringAttr("none"))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$data `,` $indices `,` $updates attr-dict `:` `(` type($data) `,` type($indices) `,` "
        "type($updates) `)` `->` type($result)"
    )

    def verify_(self) -> None:
        _check_indices(self.indices)
        _check(
            self.reduction.data in SCATTER_REDUCTIONS,
            f"unknown reduction {self.reduction.data!r}",
        )
        _check(self.data.type == self.result.type, "the result must have the data's type")
        _check_element(self.updates, element_type(self.data), "updates")
        _check(
            tensor_shape(self.updates) == self.updates_shape(),
            f"updates must have shape {self.updates_shape()}, not {tensor_shape(self.updates)}",
        )

    @abc.abstractmethod
    def updates_shape(self) -> tuple[int, ...]:
        """The shape ``updates`` must have."""


@irdl_op_definition
class ScatterElementsOp(ScatterOp):
    """ONNX ScatterElements: ``updates`` go along ``axis`` to the positions ``indices``."""

    name = "wse.scatter_elements"
    axis = prop_def(IntegerAttr[IntegerType])

    def __init__(self, data, indices, updates, axis: int, reduction: str):
        super().__init__(
            operands=[data, indices, updates],
            result_types=[data.type],
            properties={"axis": IntegerAttr(axis, i64), "reduction": StringAttr(reduction)},
        )

    def updates_shape(self) -> tuple[int, ...]:
        rank, axis = len(tensor_shape(self.data)), self.axis.value.data
        _check(0 <= axis < rank, f"axis {axis} is out of range for rank {rank}")
        _check(len(tensor_shape(self.indices)) == rank, "indices must have the data's rank")
        return tensor_shape(self.indices)


@irdl_op_definition
class ScatterNDOp(ScatterOp):
    """ONNX ScatterND: each index tuple of ``indices`` addresses a slice that ``updates``
    replaces (or reduces into)."""

    name = "wse.scatter_nd"

    def __init__(self, data, indices, updates, reduction: str):
        super().__init__(
            operands=[data, indices, updates],
            result_types=[data.type],
            properties={"reduction": StringAttr(reduction)},
        )

    def updates_shape(self) -> tuple[int, ...]:
        data, indices = tensor_shape(self.data), tensor_shape(self.indices)
        _check(len(indices) >= 1, "indices must have at least one axis")
        depth = indices[-1]
        _check(depth <= len(data), f"index tuples of {depth} cannot address rank {len(data)}")
        return indices[:-1] + data[depth:]


class ScanOp(IRDLOperation, abc.ABC):
    """Base of the running sums and products along ``axis``; ``exclusive`` leaves the current
    element out, ``reverse`` runs from the end."""

    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    result = result_def(T)
    axis = prop_def(IntegerAttr[IntegerType])
    exclusive = prop_def(BoolAttr, default_value=BoolAttr.from_bool(False))
    reverse = prop_def(BoolAttr, default_value=BoolAttr.from_bool(False))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue, axis: int, exclusive: bool, reverse: bool):
        super().__init__(
            operands=[input],
            result_types=[input.type],
            properties={
                "axis": IntegerAttr(axis, i64),
                "exclusive": BoolAttr.from_bool(exclusive),
                "reverse": BoolAttr.from_bool(reverse),
            },
        )

    def verify_(self) -> None:
        rank, axis = len(tensor_shape(self.input)), self.axis.value.data
        _check(0 <= axis < rank, f"axis {axis} is out of range for rank {rank}")


@irdl_op_definition
class CumSumOp(ScanOp):
    """Running sums along ``axis``."""

    name = "wse.cumsum"


@irdl_op_definition
class CumProdOp(ScanOp):
    """Running products along ``axis``."""

    name = "wse.cumprod"


@irdl_op_definition
class TopKOp(IRDLOperation):
    """The ``k`` largest (or smallest) elements along ``axis`` and their indices; equal values
    keep their order of index."""

    name = "wse.topk"
    input = operand_def(TensorType)
    values = result_def(TensorType)
    indices = result_def(TensorType)
    axis = prop_def(IntegerAttr[IntegerType])
    largest = prop_def(BoolAttr, default_value=BoolAttr.from_bool(True))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($values) `,` type($indices)"

    def __init__(self, input: SSAValue, axis: int, k: int, largest: bool):
        shape = list(tensor_shape(input))
        shape[axis] = k
        super().__init__(
            operands=[input],
            result_types=[TensorType(element_type(input), shape), TensorType(i64, shape)],
            properties={"axis": IntegerAttr(axis, i64), "largest": BoolAttr.from_bool(largest)},
        )

    def verify_(self) -> None:
        src, axis = tensor_shape(self.input), self.axis.value.data
        _check(0 <= axis < len(src), f"axis {axis} is out of range for rank {len(src)}")
        out = tensor_shape(self.values)
        _check(out == tensor_shape(self.indices), "values and indices must have one shape")
        _check_element(self.values, element_type(self.input), "the values")
        _check_element(self.indices, i64, "the indices")
        _check(
            len(out) == len(src)
            and all(a == b for i, (a, b) in enumerate(zip(out, src, strict=True)) if i != axis)
            and out[axis] <= src[axis],
            f"cannot take {out[axis] if len(out) > axis else '?'} of {src} along axis {axis}",
        )  # fmt: skip


@irdl_op_definition
class ReverseOp(IRDLOperation):
    """The elements in reverse order along ``axes``."""

    name = "wse.reverse"
    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    result = result_def(T)
    axes = prop_def(DenseArrayBase[i64])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue, axes: Sequence[int]):
        super().__init__(
            operands=[input], result_types=[input.type], properties={"axes": i64_array(axes)}
        )

    def verify_(self) -> None:
        rank = len(tensor_shape(self.input))
        axes = self.axes.get_values()
        _check(all(0 <= a < rank for a in axes), f"axes {axes} out of range for rank {rank}")


@irdl_op_definition
class TileOp(IRDLOperation):
    """``numpy.tile``: the tensor repeated ``repeats[i]`` times along axis ``i``."""

    name = "wse.tile"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    repeats = prop_def(DenseArrayBase[i64])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, repeats: Sequence[int]):
        shape = _shape_rule(shapes.tile, tensor_shape(input), repeats)
        super().__init__(
            operands=[input],
            result_types=[TensorType(element_type(input), shape)],
            properties={"repeats": i64_array(repeats)},
        )

    def verify_(self) -> None:
        _check_element(self.result, element_type(self.input), "the result")
        _check_result_shape(
            self, _shape_rule(shapes.tile, tensor_shape(self.input), self.repeats.get_values())
        )


# ---------------------------------------------------------------------------------------------
# Composite ops (lowered by the ``decompose`` pass)
# ---------------------------------------------------------------------------------------------


class AxisOp(IRDLOperation, abc.ABC):
    """Base of the composite ops of one operand along one axis."""

    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    result = result_def(T)
    axis = prop_def(IntegerAttr[IntegerType])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue, axis: int):
        super().__init__(
            operands=[input],
            result_types=[input.type],
            properties={"axis": IntegerAttr(axis, i64)},
        )

    def verify_(self) -> None:
        axis, rank = self.axis.value.data, len(tensor_shape(self.input))
        _check(0 <= axis < rank, f"axis {axis} is out of range for rank {rank}")


@irdl_op_definition
class SoftmaxOp(AxisOp):
    """``exp(x) / sum(exp(x))`` along ``axis``."""

    name = "wse.softmax"


@irdl_op_definition
class LogSoftmaxOp(AxisOp):
    """``log(softmax(x))`` along ``axis``."""

    name = "wse.log_softmax"


@irdl_op_definition
class LayerNormOp(IRDLOperation):
    """Normalizes over the axes from ``axis`` to the last, then scales and shifts.

    ``scale`` and the optional ``bias`` broadcast against the normalized axes.
    """

    name = "wse.layer_norm"
    input = operand_def(TensorType)
    scale = operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    result = result_def(TensorType)
    axis = prop_def(IntegerAttr[IntegerType])
    epsilon = prop_def(FloatAttr[Float64Type])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$input `,` $scale (`,` $bias^)? attr-dict `:` "
        "`(` type($input) `,` type($scale) (`,` type($bias)^)? `)` `->` type($result)"
    )

    def __init__(
        self,
        input: SSAValue,
        scale: SSAValue,
        bias: SSAValue | None,
        axis: int,
        epsilon: float,
    ):
        super().__init__(
            operands=[input, scale, bias],
            result_types=[input.type],
            properties={"axis": IntegerAttr(axis, i64), "epsilon": FloatAttr(epsilon, f64)},
        )

    def verify_(self) -> None:
        shape, axis = tensor_shape(self.input), self.axis.value.data
        _check(0 <= axis < len(shape), f"axis {axis} is out of range for rank {len(shape)}")
        for operand in (self.scale, self.bias):
            if operand is not None:
                _shape_rule(shapes.check_broadcast_to, tensor_shape(operand), shape[axis:])
        _check_result_shape(self, shape)


@irdl_op_definition
class BatchNormOp(IRDLOperation):
    """Inference batch normalization over axis 1 with running ``mean`` and ``var``."""

    name = "wse.batch_norm"
    input = operand_def(TensorType)
    scale = operand_def(TensorType)
    bias = operand_def(TensorType)
    mean = operand_def(TensorType)
    var = operand_def(TensorType)
    result = result_def(TensorType)
    epsilon = prop_def(FloatAttr[Float64Type])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$input `,` $scale `,` $bias `,` $mean `,` $var attr-dict `:` "
        "`(` type($input) `,` type($scale) `,` type($bias) `,` type($mean) `,` type($var) `)`"
        " `->` type($result)"
    )

    def __init__(
        self,
        input: SSAValue,
        scale: SSAValue,
        bias: SSAValue,
        mean: SSAValue,
        var: SSAValue,
        epsilon: float,
    ):
        super().__init__(
            operands=[input, scale, bias, mean, var],
            result_types=[input.type],
            properties={"epsilon": FloatAttr(epsilon, f64)},
        )

    def verify_(self) -> None:
        shape = tensor_shape(self.input)
        _check(len(shape) >= 2, "the input needs a channel axis")
        for operand in (self.scale, self.bias, self.mean, self.var):
            _check(
                tensor_shape(operand) == (shape[1],),
                f"parameters must have shape ({shape[1]},)",
            )
        _check_result_shape(self, shape)


@irdl_op_definition
class SoftmaxCrossEntropyOp(IRDLOperation):
    """Cross-entropy of ``scores`` (N, C, ...) against integer ``labels`` (N, ...).

    Follows ONNX SoftmaxCrossEntropyLoss: the log-softmax runs over axis 1; ``reduction`` is
    ``mean``, ``sum`` or ``none``; samples whose label equals ``ignore_index`` contribute
    nothing (and are left out of the mean's divisor). The optional ``weights`` (C,) scale each
    class, and a weighted mean divides by the sum of the weights used.
    """

    name = "wse.softmax_cross_entropy"
    scores = operand_def(TensorType)
    labels = operand_def(TensorType)
    weights = opt_operand_def(TensorType)
    result = result_def(TensorType)
    reduction = prop_def(StringAttr)
    ignore_index = opt_prop_def(IntegerAttr[IntegerType])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$scores `,` $labels (`,` $weights^)? attr-dict `:` "
        "`(` type($scores) `,` type($labels) (`,` type($weights)^)? `)` `->` type($result)"
    )

    REDUCTIONS: ClassVar = ("mean", "sum", "none")

    def __init__(
        self,
        scores: SSAValue,
        labels: SSAValue,
        weights: SSAValue | None,
        reduction: str,
        ignore_index: int | None,
    ):
        shape = tensor_shape(labels) if reduction == "none" else ()
        props: dict[str, Attribute] = {"reduction": StringAttr(reduction)}
        if ignore_index is not None:
            props["ignore_index"] = IntegerAttr(ignore_index, i64)
        super().__init__(
            operands=[scores, labels, weights],
            result_types=[TensorType(element_type(scores), shape)],
            properties=props,
        )

    def verify_(self) -> None:
        scores, labels = tensor_shape(self.scores), tensor_shape(self.labels)
        reduction = self.reduction.data
        _check(reduction in self.REDUCTIONS, f"unknown reduction {reduction!r}")
        _check(len(scores) >= 2, "scores need a class axis")
        _check(
            labels == (scores[0], *scores[2:]),
            f"labels {labels} do not match scores {scores} without the class axis",
        )
        _check(isinstance(element_type(self.labels), IntegerType), "labels must be integers")
        if self.weights is not None:
            _check(tensor_shape(self.weights) == (scores[1],), "weights must have shape (C,)")
        _check_result_shape(self, labels if reduction == "none" else ())


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


@irdl_op_definition
class LayerOp(IRDLOperation):
    """A layer: the ops that run together as one kernel on one rectangle of PEs.

    The body is isolated from above: every value it uses enters through a block argument, and
    its weights and constants are created inside it. ``rect`` is set by placement in pipelined
    mode, ``routes`` (how its inputs from other layers reach it) by routing.

    Example::

        %y = wse.layer "fc1" (%x) : (tensor<8x784xf32>) -> tensor<8x64xf32> {
        ^bb0(%a: tensor<8x784xf32>):
          %w = wse.weight "fc1.weight" : tensor<784x64xf32>
          %m = wse.matmul %a, %w : (tensor<8x784xf32>, tensor<784x64xf32>) -> tensor<8x64xf32>
          wse.yield %m : tensor<8x64xf32>
        }
    """

    name = "wse.layer"
    layer_name = prop_def(StringAttr, prop_name="name")
    rect = opt_prop_def(RectAttr)
    routes = opt_prop_def(ArrayAttr[RouteAttr])
    inputs = var_operand_def(TensorType)
    outputs = var_result_def(TensorType)
    body = region_def("single_block")
    traits = traits_def(IsolatedFromAbove())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$name `(` $inputs `)` attr-dict `:` functional-type($inputs, $outputs) $body"

    def __init__(
        self,
        name: str,
        inputs: Sequence[SSAValue],
        result_types: Sequence[Attribute],
        body: Region,
        rect: RectAttr | None = None,
    ):
        props: dict[str, Attribute] = {"name": StringAttr(name)}
        if rect is not None:
            props["rect"] = rect
        super().__init__(
            operands=[inputs], result_types=[result_types], properties=props, regions=[body]
        )

    def verify_(self) -> None:
        block = self.body.block
        _check(
            tuple(a.type for a in block.args) == tuple(self.inputs.types),
            f"layer {self.layer_name.data!r}: block arguments do not match its inputs",
        )
        term = block.last_op
        _check(
            isinstance(term, YieldOp) and tuple(term.operand_types) == tuple(self.result_types),
            f"layer {self.layer_name.data!r}: the body must end with a wse.yield of its results",
        )


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Ends a ``wse.layer`` body and gives the layer's results."""

    name = "wse.yield"
    values = var_operand_def(AnyAttr())
    traits = traits_def(IsTerminator(), HasParent(LayerOp))
    assembly_format = "($values^ `:` type($values))? attr-dict"

    def __init__(self, *values: SSAValue):
        super().__init__(operands=[values])


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
REDUCE_OPS: tuple[type[ReduceOp], ...] = (
    ReduceSumOp,
    ReduceMeanOp,
    ReduceMaxOp,
    ReduceMinOp,
    ReduceProdOp,
)

WSE = Dialect(
    "wse",
    [
        WeightOp,
        ConstantOp,
        *UNARY_OPS,
        StopGradientOp,
        *MATH_OPS,
        IsNanOp,
        IsInfOp,
        *BINARY_OPS,
        *LOGIC_OPS,
        SelectOp,
        CastOp,
        BitcastOp,
        *REDUCE_OPS,
        MatmulOp,
        ConvOp,
        MaxPoolOp,
        AvgPoolOp,
        ArgMaxPoolOp,
        Im2ColOp,
        Col2ImOp,
        ReshapeOp,
        BroadcastToOp,
        TransposeOp,
        ConcatOp,
        SliceOp,
        PadOp,
        OneHotOp,
        GatherOp,
        GatherElementsOp,
        GatherNDOp,
        ScatterElementsOp,
        ScatterNDOp,
        CumSumOp,
        CumProdOp,
        TopKOp,
        ReverseOp,
        TileOp,
        SoftmaxOp,
        LogSoftmaxOp,
        LayerNormOp,
        BatchNormOp,
        SoftmaxCrossEntropyOp,
        LayerOp,
        YieldOp,
    ],
    [RectAttr, RouteAttr, TargetAttr],
)


def location_name(op: Operation) -> str | None:
    """The source node name an op's location carries, if any."""
    loc = op.location
    return loc.desc.data if isinstance(loc, NameLoc) else None


def properties_as_python(op: IRDLOperation) -> dict:
    """An op's properties as plain Python values (ints, floats, bools, strings, int lists)."""
    out: dict = {}
    for key, attr in sorted(op.properties.items()):
        if isinstance(attr, DenseArrayBase):
            out[key] = [int(v) for v in attr.get_values()]
        elif isinstance(attr, IntegerAttr):
            value = attr.value.data
            out[key] = bool(value) if attr.type == i1 else int(value)
        elif isinstance(attr, FloatAttr):
            out[key] = float(attr.value.data)
        elif isinstance(attr, StringAttr):
            out[key] = attr.data
        elif isinstance(attr, UnitAttr):
            out[key] = True
    return out


def mnemonic(op: IRDLOperation) -> str:
    """The op's name without its dialect prefix, e.g. ``matmul``."""
    return op.name.split(".", 1)[1]
