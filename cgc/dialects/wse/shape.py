"""Shape ops: the elements moved, repeated or padded, their values untouched.

The result shape of every op follows a rule of ``cgc.dialects.shapes`` (numpy semantics), which
both the builder and the verifier apply: reshape (row-major), broadcast, transpose, concat,
static strided slices, padding (numpy.pad modes), tile and reverse. ``wse.one_hot`` turns
integer class indices into one-hot rows.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
    UnitAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import Pure

from cgc.dialects import shapes
from cgc.dialects.wse.types import (
    check,
    check_element,
    check_result_shape,
    element_type,
    i64_array,
    shape_rule,
    tensor_shape,
)


class ToShapeOp(IRDLOperation, abc.ABC):
    """An op that gives its operand the result's shape, keeping the element type."""

    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, shape: Sequence[int]):
        super().__init__(
            operands=[input], result_types=[TensorType(element_type(input), tuple(shape))]
        )


@irdl_op_definition
class ReshapeOp(ToShapeOp):
    """Reinterprets the elements (row-major) with the result's shape."""

    name = "wse.reshape"

    def verify_(self) -> None:
        shape_rule(shapes.check_reshape, tensor_shape(self.input), tensor_shape(self.result))
        check(element_type(self.input) == element_type(self.result), "reshape changes dtype")


@irdl_op_definition
class BroadcastToOp(ToShapeOp):
    """Broadcasts the operand to the result's shape (numpy rules)."""

    name = "wse.broadcast_to"

    def verify_(self) -> None:
        shape_rule(shapes.check_broadcast_to, tensor_shape(self.input), tensor_shape(self.result))


@irdl_op_definition
class TransposeOp(IRDLOperation):
    """Permutes the axes: result axis ``i`` is input axis ``perm[i]``."""

    name = "wse.transpose"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    perm = prop_def(DenseArrayBase[I64])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, perm: Sequence[int]):
        shape = shape_rule(shapes.transpose, tensor_shape(input), tuple(perm))
        super().__init__(
            operands=[input],
            result_types=[TensorType(element_type(input), shape)],
            properties={"perm": i64_array(perm)},
        )

    def verify_(self) -> None:
        check_result_shape(
            self,
            shape_rule(shapes.transpose, tensor_shape(self.input), self.perm.get_values()),
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
        shape = shape_rule(shapes.concat, [tensor_shape(v) for v in inputs], axis)
        super().__init__(
            operands=[inputs],
            result_types=[TensorType(element_type(inputs[0]), shape)],
            properties={"axis": IntegerAttr(axis, i64)},
        )

    def verify_(self) -> None:
        check(len(self.inputs) >= 1, "needs at least one operand")
        check_result_shape(
            self,
            shape_rule(shapes.concat, [tensor_shape(v) for v in self.inputs], self.axis.value.data),
        )


@irdl_op_definition
class SliceOp(IRDLOperation):
    """A static strided slice: ``input[starts[i]:limits[i]:strides[i]]`` on every axis."""

    name = "wse.slice"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    starts = prop_def(DenseArrayBase[I64])
    limits = prop_def(DenseArrayBase[I64])
    strides = prop_def(DenseArrayBase[I64])
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
        shape = shape_rule(shapes.slice_shape, tensor_shape(input), starts, limits, strides)
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
        check_result_shape(
            self,
            shape_rule(
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
    low = prop_def(DenseArrayBase[I64])
    high = prop_def(DenseArrayBase[I64])
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
        check(len(low) == len(high) == len(src), "needs one low and one high amount per axis")
        check(min((*low, *high), default=0) >= 0, "pad amounts must be non-negative")
        check(self.mode.data in self.MODES, f"unknown pad mode {self.mode.data!r}")
        check_result_shape(
            self, tuple(d + lo + hi for d, lo, hi in zip(src, low, high, strict=True))
        )


@irdl_op_definition
class OneHotOp(IRDLOperation):
    """Integer class indices to one-hot rows: a new last axis of the result's size.

    Indices outside ``[0, depth)`` give an all-zero row, unless they are a loss's class
    labels (``labels``): then such an index other than ``ignore_index`` is an error at run
    time, as ONNX's losses make it.
    """

    name = "wse.one_hot"
    indices = operand_def(TensorType)
    result = result_def(TensorType)
    labels = opt_prop_def(UnitAttr)
    ignore_index = opt_prop_def(IntegerAttr[IntegerType])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$indices attr-dict `:` type($indices) `->` type($result)"

    def __init__(
        self,
        indices: SSAValue,
        depth: int,
        element: Attribute,
        labels: bool = False,
        ignore_index: int | None = None,
    ):
        props: dict[str, Attribute] = {"labels": UnitAttr()} if labels else {}
        if ignore_index is not None:
            props["ignore_index"] = IntegerAttr(ignore_index, i64)
        super().__init__(
            operands=[indices],
            result_types=[TensorType(element, (*tensor_shape(indices), depth))],
            properties=props,
        )

    def verify_(self) -> None:
        check(
            isinstance(element_type(self.indices), IntegerType),
            "indices must be integers",
        )
        check(
            tensor_shape(self.result)[:-1] == tensor_shape(self.indices),
            "the result must add exactly one trailing axis",
        )


@irdl_op_definition
class ReverseOp(IRDLOperation):
    """The elements in reverse order along ``axes``."""

    name = "wse.reverse"
    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    result = result_def(T)
    axes = prop_def(DenseArrayBase[I64])
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
        check(all(0 <= a < rank for a in axes), f"axes {axes} out of range for rank {rank}")


@irdl_op_definition
class TileOp(IRDLOperation):
    """``numpy.tile``: the tensor repeated ``repeats[i]`` times along axis ``i``."""

    name = "wse.tile"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    repeats = prop_def(DenseArrayBase[I64])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, repeats: Sequence[int]):
        shape = shape_rule(shapes.tile, tensor_shape(input), repeats)
        super().__init__(
            operands=[input],
            result_types=[TensorType(element_type(input), shape)],
            properties={"repeats": i64_array(repeats)},
        )

    def verify_(self) -> None:
        check_element(self.result, element_type(self.input), "the result")
        check_result_shape(
            self, shape_rule(shapes.tile, tensor_shape(self.input), self.repeats.get_values())
        )
