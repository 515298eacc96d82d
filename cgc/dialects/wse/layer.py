"""Sources and layers: ``wse.weight``, ``wse.constant``, ``wse.layer`` and ``wse.yield``.

A weight names an entry of the side store that travels with the module; its values never
appear in the IR text. A constant is a small tensor written inline. ``form-layers`` groups the
ops of a model into ``wse.layer`` regions, each ended by a ``wse.yield`` of its results:
the unit placement puts on a rectangle of PEs and routing connects.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    StringAttr,
    TensorType,
    UnitAttr,
)
from xdsl.ir import Attribute, Region, SSAValue
from xdsl.irdl import (
    AnyAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator, Pure

from cgc.dialects import shapes
from cgc.dialects.wse.types import RectAttr, RouteAttr, check, i64_array, shape_rule, tensor_shape

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
    perm = opt_prop_def(DenseArrayBase[I64])
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
            shape_rule(shapes.transpose, tensor_shape(self.result), self.perm.get_values())


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
        check(self.value.type == self.result.type, "value and result types differ")


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
        check(
            tuple(a.type for a in block.args) == tuple(self.inputs.types),
            f"layer {self.layer_name.data!r}: block arguments do not match its inputs",
        )
        term = block.last_op
        check(
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
