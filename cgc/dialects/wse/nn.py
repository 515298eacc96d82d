"""Reductions, matmul, pooling and the patches of a convolution (im2col, col2im).

Reductions run over sorted ``axes`` and may keep them as size-1 axes. ``wse.matmul`` is
numpy.matmul, broadcasting the batch dims; ``wse.matmul_transpose_a`` multiplies the transpose
of its left operand. Pooling windows run over the spatial axes of
(N, C, *spatial), or of (N, *spatial, C) with ``channels_last`` (max and average pooling
only); ``pads`` holds the begin padding of every spatial axis, then the end padding (ONNX
order). ``wse.im2col`` lays out the windows of a grouped convolution as matmul rows and
``wse.col2im`` is its adjoint.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from math import prod
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    BoolAttr,
    DenseArrayBase,
    IntegerAttr,
    IntegerType,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from cgc.dialects import shapes
from cgc.dialects.wse.binary import TwoOperandOp
from cgc.dialects.wse.types import (
    check,
    check_element,
    check_result_shape,
    element_type,
    i64_array,
    shape_rule,
    tensor_shape,
)

# ---------------------------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------------------------


class ReduceOp(IRDLOperation, abc.ABC):
    """Base of the reductions over ``axes`` (normalized, sorted), optionally keeping them."""

    input = operand_def(TensorType)
    result = result_def(TensorType)
    axes = prop_def(DenseArrayBase[I64])
    keepdims = prop_def(BoolAttr, default_value=BoolAttr.from_bool(False))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, axes: Sequence[int], keepdims: bool):
        shape = shape_rule(shapes.reduce, tensor_shape(input), tuple(axes), keepdims)
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
        check(list(axes) == sorted(axes), f"axes must be sorted, got {axes}")
        check_result_shape(
            self, shape_rule(shapes.reduce, tensor_shape(self.input), axes, self.keeps_dims)
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


REDUCE_OPS: tuple[type[ReduceOp], ...] = (
    ReduceSumOp,
    ReduceMeanOp,
    ReduceMaxOp,
    ReduceMinOp,
    ReduceProdOp,
)


# ---------------------------------------------------------------------------------------------
# Matmul, pooling, patches
# ---------------------------------------------------------------------------------------------


@irdl_op_definition
class MatmulOp(TwoOperandOp):
    """numpy.matmul on operands of rank >= 2, broadcasting the leading (batch) dims."""

    name = "wse.matmul"
    SHAPE_RULE: ClassVar = staticmethod(shapes.matmul)


@irdl_op_definition
class MatmulTransposeAOp(TwoOperandOp):
    """``lhs^T @ rhs`` over the last two axes (``[..., R, M]`` and ``[..., R, N]`` give
    ``[..., M, N]``), broadcasting the batch dims: the weight gradient of a matmul, whose
    contraction runs over the rows both operands share (the tokens) and whose result leaves
    row by row."""

    name = "wse.matmul_transpose_a"
    SHAPE_RULE: ClassVar = staticmethod(shapes.matmul_transpose_a)


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
    kernel = prop_def(DenseArrayBase[I64])
    strides = prop_def(DenseArrayBase[I64])
    pads = prop_def(DenseArrayBase[I64])
    dilations = prop_def(DenseArrayBase[I64])
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
        extra: Mapping[str, Attribute] | None = None,
        element: Attribute | None = None,
        channels_last: bool = False,
    ):
        nchw = channels_first(tensor_shape(input), channels_last)
        shape = shape_rule(shapes.pool, nchw, kernel, strides, pads, dilations)
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
        check_element(self.result, self.RESULT_ELEMENT or element_type(self.input), "the result")
        last = self.is_channels_last
        nchw = shape_rule(
            shapes.pool,
            channels_first(tensor_shape(self.input), last),
            self.kernel.get_values(),
            self.strides.get_values(),
            self.pads.get_values(),
            self.dilations.get_values(),
        )
        check_result_shape(self, channels_back(nchw, last))


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
    kernel = prop_def(DenseArrayBase[I64])
    strides = prop_def(DenseArrayBase[I64])
    pads = prop_def(DenseArrayBase[I64])
    dilations = prop_def(DenseArrayBase[I64])
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
        out = shape_rule(shapes.pool, x, kernel, strides, pads, dilations)
        if x[1] % group:
            raise VerifyException(f"{x[1]} channels do not split into {group} groups")
        return (group, x[0] * prod(out[2:]), x[1] // group * prod(kernel))

    def verify_(self) -> None:
        check_result_shape(self, self.patches_of(tensor_shape(self.input)))


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
        check_element(self.result, element_type(self.input), "the result")
