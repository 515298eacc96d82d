"""Indexed ops: gathers, scatters, scans and top-k, whose indices are data known only at run
time.

The gathers and scatters follow ONNX (Gather, GatherElements, GatherND, ScatterElements,
ScatterND); a scatter writes ``updates`` into ``data`` or reduces them into it (one of
``SCATTER_REDUCTIONS``). The scans are running sums and products along one axis;
``wse.topk`` gives the ``k`` largest or smallest elements along an axis and their indices.
"""

from __future__ import annotations

import abc
from typing import ClassVar

from xdsl.dialects.builtin import BoolAttr, IntegerAttr, IntegerType, StringAttr, TensorType, i64
from xdsl.ir import SSAValue
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

from cgc.dialects import shapes
from cgc.dialects.wse.types import (
    check,
    check_element,
    check_result_shape,
    element_type,
    shape_rule,
    tensor_shape,
)

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _check_indices(value: SSAValue) -> None:
    check(isinstance(element_type(value), IntegerType), "indices must be integers")


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
        shape = shape_rule(shapes.gather, tensor_shape(data), tensor_shape(indices), axis)
        super().__init__(
            operands=[data, indices],
            result_types=[TensorType(element_type(data), shape)],
            properties={"axis": IntegerAttr(axis, i64)},
        )

    def verify_(self) -> None:
        _check_indices(self.indices)
        check_element(self.result, element_type(self.data), "the result")
        check_result_shape(
            self,
            shape_rule(
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
        check(0 <= axis < rank, f"axis {axis} is out of range for rank {rank}")
        check(len(tensor_shape(self.indices)) == rank, "indices must have the data's rank")
        check_element(self.result, element_type(self.data), "the result")
        check_result_shape(self, tensor_shape(self.indices))


@irdl_op_definition
class GatherNDOp(GatherBase):
    """ONNX GatherND: each index tuple (the last axis of ``indices``) picks a slice of
    ``data`` after its first ``batch_dims`` axes."""

    name = "wse.gather_nd"
    batch_dims = prop_def(IntegerAttr[IntegerType], default_value=IntegerAttr(0, i64))

    def __init__(self, data: SSAValue, indices: SSAValue, batch_dims: int):
        shape = shape_rule(shapes.gather_nd, tensor_shape(data), tensor_shape(indices), batch_dims)
        super().__init__(
            operands=[data, indices],
            result_types=[TensorType(element_type(data), shape)],
            properties={"batch_dims": IntegerAttr(batch_dims, i64)},
        )

    def verify_(self) -> None:
        _check_indices(self.indices)
        check_element(self.result, element_type(self.data), "the result")
        check_result_shape(
            self,
            shape_rule(
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
        check(
            self.reduction.data in SCATTER_REDUCTIONS,
            f"unknown reduction {self.reduction.data!r}",
        )
        check(self.data.type == self.result.type, "the result must have the data's type")
        check_element(self.updates, element_type(self.data), "updates")
        check(
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
        check(0 <= axis < rank, f"axis {axis} is out of range for rank {rank}")
        check(len(tensor_shape(self.indices)) == rank, "indices must have the data's rank")
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
        check(len(indices) >= 1, "indices must have at least one axis")
        depth = indices[-1]
        check(depth <= len(data), f"index tuples of {depth} cannot address rank {len(data)}")
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
        check(0 <= axis < rank, f"axis {axis} is out of range for rank {rank}")


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
        check(0 <= axis < len(src), f"axis {axis} is out of range for rank {len(src)}")
        out = tensor_shape(self.values)
        check(out == tensor_shape(self.indices), "values and indices must have one shape")
        check_element(self.values, element_type(self.input), "the values")
        check_element(self.indices, i64, "the indices")
        check(
            len(out) == len(src)
            and all(a == b for i, (a, b) in enumerate(zip(out, src, strict=True)) if i != axis)
            and out[axis] <= src[axis],
            f"cannot take {out[axis] if len(out) > axis else '?'} of {src} along axis {axis}",
        )  # fmt: skip
