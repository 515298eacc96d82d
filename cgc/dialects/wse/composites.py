"""Composite ops, which the ``decompose`` pass lowers to primitives.

Convolution (im2col and matmul), softmax and log-softmax along one axis, layer and batch
normalization, and the softmax cross-entropy loss of ONNX. Frontends emit them as one op each
so that rewrites see the whole computation; no kernel runs them as they are.
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
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure

from cgc.dialects import shapes
from cgc.dialects.wse.types import (
    check,
    check_result_shape,
    element_type,
    i64_array,
    shape_rule,
    tensor_shape,
)


@irdl_op_definition
class ConvOp(IRDLOperation):
    """N-d cross-correlation of ``input`` (N, C, *spatial) with ``filter`` (K, C/group, *k).

    ``pads`` holds the begin padding of every spatial axis, then the end padding (ONNX order).
    """

    name = "wse.conv"
    input = operand_def(TensorType)
    filter = operand_def(TensorType)
    result = result_def(TensorType)
    strides = prop_def(DenseArrayBase[I64])
    pads = prop_def(DenseArrayBase[I64])
    dilations = prop_def(DenseArrayBase[I64])
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
        shape = shape_rule(
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
        check_result_shape(
            self,
            shape_rule(
                shapes.conv,
                tensor_shape(self.input),
                tensor_shape(self.filter),
                self.strides.get_values(),
                self.pads.get_values(),
                self.dilations.get_values(),
                self.group.value.data,
            ),
        )


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
        check(0 <= axis < rank, f"axis {axis} is out of range for rank {rank}")


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
        check(0 <= axis < len(shape), f"axis {axis} is out of range for rank {len(shape)}")
        for operand in (self.scale, self.bias):
            if operand is not None:
                shape_rule(shapes.check_broadcast_to, tensor_shape(operand), shape[axis:])
        check_result_shape(self, shape)


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
        check(len(shape) >= 2, "the input needs a channel axis")
        for operand in (self.scale, self.bias, self.mean, self.var):
            check(
                tensor_shape(operand) == (shape[1],),
                f"parameters must have shape ({shape[1]},)",
            )
        check_result_shape(self, shape)


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
        check(reduction in self.REDUCTIONS, f"unknown reduction {reduction!r}")
        check(len(scores) >= 2, "scores need a class axis")
        check(
            labels == (scores[0], *scores[2:]),
            f"labels {labels} do not match scores {scores} without the class axis",
        )
        check(isinstance(element_type(self.labels), IntegerType), "labels must be integers")
        if self.weights is not None:
            check(tensor_shape(self.weights) == (scores[1],), "weights must have shape (C,)")
        check_result_shape(self, labels if reduction == "none" else ())
