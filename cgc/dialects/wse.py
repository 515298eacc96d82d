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
from xdsl.ir import Attribute, Dialect, Operation, ParametrizedAttribute, Region, SSAValue
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

from cgc import dtypes, shapes


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
    permuted by ``perm`` (see ``cgc.runtime.reference.weight_view``), so that a kernel gets a
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
    """Converts every element to the result's element type (numpy ``astype`` semantics)."""

    name = "wse.cast"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, element: Attribute):
        super().__init__(operands=[input], result_types=[TensorType(element, tensor_shape(input))])

    def verify_(self) -> None:
        _check_result_shape(self, tensor_shape(self.input))


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


class PoolOp(IRDLOperation, abc.ABC):
    """Base of the N-d pooling windows over the trailing spatial axes of (N, C, *spatial)."""

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
    ):
        shape = _shape_rule(shapes.pool, tensor_shape(input), kernel, strides, pads, dilations)
        super().__init__(
            operands=[input],
            result_types=[TensorType(element_type(input), shape)],
            properties={
                "kernel": i64_array(kernel),
                "strides": i64_array(strides),
                "pads": i64_array(pads),
                "dilations": i64_array(dilations),
                **(extra or {}),
            },
        )

    def verify_(self) -> None:
        _check_result_shape(
            self,
            _shape_rule(
                shapes.pool,
                tensor_shape(self.input),
                self.kernel.get_values(),
                self.strides.get_values(),
                self.pads.get_values(),
                self.dilations.get_values(),
            ),
        )


@irdl_op_definition
class MaxPoolOp(PoolOp):
    """Maximum over each window; padding never wins."""

    name = "wse.max_pool"


@irdl_op_definition
class AvgPoolOp(PoolOp):
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
    ):
        super().__init__(
            input,
            kernel,
            strides,
            pads,
            dilations,
            {"count_include_pad": BoolAttr.from_bool(count_include_pad)},
        )


@irdl_op_definition
class Im2ColOp(IRDLOperation):
    """The patches of a grouped convolution, one row per output position.

    ``input`` (N, C, *spatial) becomes ``[group, N * prod(out), C/group * prod(kernel)]``:
    row ``(n, *o)`` of group ``g`` holds the window under output position ``o`` of sample
    ``n`` over that group's channels (channel-major, then kernel taps in row-major order);
    padding reads as zero. A convolution is this followed by a matmul with the filter.
    """

    name = "wse.im2col"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    kernel = prop_def(DenseArrayBase[i64])
    strides = prop_def(DenseArrayBase[i64])
    pads = prop_def(DenseArrayBase[i64])
    dilations = prop_def(DenseArrayBase[i64])
    group = prop_def(IntegerAttr[IntegerType], default_value=IntegerAttr(1, i64))
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
        group: int,
    ):
        super().__init__(
            operands=[input],
            result_types=[
                TensorType(
                    element_type(input),
                    self.infer(tensor_shape(input), kernel, strides, pads, dilations, group),
                )
            ],
            properties={
                "kernel": i64_array(kernel),
                "strides": i64_array(strides),
                "pads": i64_array(pads),
                "dilations": i64_array(dilations),
                "group": IntegerAttr(group, i64),
            },
        )

    @staticmethod
    def infer(x, kernel, strides, pads, dilations, group) -> tuple[int, ...]:
        """The result shape for input shape ``x``."""
        out = _shape_rule(shapes.pool, x, kernel, strides, pads, dilations)
        if x[1] % group:
            raise VerifyException(f"{x[1]} channels do not split into {group} groups")
        return (group, x[0] * prod(out[2:]), x[1] // group * prod(kernel))

    def verify_(self) -> None:
        _check_result_shape(
            self,
            self.infer(
                tensor_shape(self.input),
                self.kernel.get_values(),
                self.strides.get_values(),
                self.pads.get_values(),
                self.dilations.get_values(),
                self.group.value.data,
            ),
        )


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
    """Pads every axis with ``low[i]`` elements before and ``high[i]`` after, of ``value``."""

    name = "wse.pad"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    low = prop_def(DenseArrayBase[i64])
    high = prop_def(DenseArrayBase[i64])
    value = prop_def(FloatAttr[Float64Type], default_value=FloatAttr(0.0, f64))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(
        self, input: SSAValue, low: Sequence[int], high: Sequence[int], value: float = 0.0
    ):
        shape = tuple(d + lo + hi for d, lo, hi in zip(tensor_shape(input), low, high, strict=True))
        super().__init__(
            operands=[input],
            result_types=[TensorType(element_type(input), shape)],
            properties={
                "low": i64_array(low),
                "high": i64_array(high),
                "value": FloatAttr(float(value), f64),
            },
        )

    def verify_(self) -> None:
        low, high, src = self.low.get_values(), self.high.get_values(), tensor_shape(self.input)
        _check(len(low) == len(high) == len(src), "needs one low and one high amount per axis")
        _check(min((*low, *high), default=0) >= 0, "pad amounts must be non-negative")
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
    mode.

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
REDUCE_OPS: tuple[type[ReduceOp], ...] = (ReduceSumOp, ReduceMeanOp, ReduceMaxOp, ReduceMinOp)

WSE = Dialect(
    "wse",
    [
        WeightOp,
        ConstantOp,
        *UNARY_OPS,
        StopGradientOp,
        *BINARY_OPS,
        SelectOp,
        CastOp,
        *REDUCE_OPS,
        MatmulOp,
        ConvOp,
        MaxPoolOp,
        AvgPoolOp,
        Im2ColOp,
        ReshapeOp,
        BroadcastToOp,
        TransposeOp,
        ConcatOp,
        SliceOp,
        PadOp,
        OneHotOp,
        SoftmaxOp,
        LogSoftmaxOp,
        LayerNormOp,
        BatchNormOp,
        SoftmaxCrossEntropyOp,
        LayerOp,
        YieldOp,
    ],
    [RectAttr],
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
