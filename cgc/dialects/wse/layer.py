"""Sources and the ops that hold a region: ``wse.weight``, ``wse.constant``, ``wse.layer``,
``wse.fused_matmul`` and ``wse.yield``.

A weight names an entry of the side store that travels with the module; its values never
appear in the IR text. A constant is a small tensor written inline. ``form-layers`` groups the
ops of a model into ``wse.layer`` regions, each ended by a ``wse.yield`` of its results:
the unit placement puts on a rectangle of PEs and routing connects. ``fuse-epilogues`` moves
the elementwise work after a matmul into a ``wse.fused_matmul``'s epilogue region.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

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
    AttrSizedOperandSegments,
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    operand_def,
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
from cgc.dialects.wse.types import (
    RectAttr,
    RouteAttr,
    check,
    element_type,
    i64_array,
    mnemonic,
    shape_rule,
    tensor_shape,
)

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


EPILOGUE_OPS = frozenset(
    {"add", "sub", "mul", "div", "pow", "max", "min"}
    | {"neg", "exp", "log", "sqrt", "reciprocal", "abs", "relu", "sigmoid", "tanh", "erf"}
)
"""The elementwise ops an epilogue may hold: float arithmetic without attributes."""


@irdl_op_definition
class FusedMatmulOp(IRDLOperation):
    """A matmul that finishes each tile of its product with an epilogue, as the tile is
    done, instead of passes over the result afterwards.

    ``lhs @ (rhs * scales)`` (``rhs`` one matrix, a layer's weights; each scale a vector of
    its columns, a weight or constant, multiplied into ``rhs`` where it is kept: a batch
    norm's gain folded into the filter) is viewed in the shape of the epilogue's first block
    argument (the same matrix rows and columns: a reshape that keeps the last axis), and the
    epilogue region computes the result from it and the ``extras``, its other block
    arguments (a bias, a residual, a normalization's shift): elementwise ops
    (``EPILOGUE_OPS``) ended by a ``wse.yield`` of the result.

    Example::

        %y = wse.fused_matmul %a, %w scaled (%g : tensor<8xf32>)
               with (%b, %r : tensor<8xf32>, tensor<1x6x6x8xf32>)
               : (tensor<1x36x72xf32>, tensor<1x72x8xf32>) -> tensor<1x6x6x8xf32> {
        ^bb0(%acc: tensor<1x6x6x8xf32>, %bias: tensor<8xf32>, %res: tensor<1x6x6x8xf32>):
          %0 = wse.add %acc, %bias : (tensor<1x6x6x8xf32>, tensor<8xf32>) -> tensor<1x6x6x8xf32>
          %1 = wse.add %0, %res : (...) -> tensor<1x6x6x8xf32>
          %2 = wse.relu %1 : tensor<1x6x6x8xf32>
          wse.yield %2 : tensor<1x6x6x8xf32>
        }
    """

    name = "wse.fused_matmul"
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    scales = var_operand_def(TensorType)
    extras = var_operand_def(TensorType)
    result = result_def(TensorType)
    epilogue = region_def("single_block")
    traits = traits_def(Pure(), IsolatedFromAbove())
    irdl_options = (AttrSizedOperandSegments(as_property=True), ParsePropInAttrDict())
    assembly_format = (
        "$lhs `,` $rhs (`scaled` `(` $scales^ `:` type($scales) `)`)?"
        " (`with` `(` $extras^ `:` type($extras) `)`)? attr-dict"
        " `:` `(` type($lhs) `,` type($rhs) `)` `->` type($result) $epilogue"
    )

    def __init__(
        self,
        lhs: SSAValue,
        rhs: SSAValue,
        scales: Sequence[SSAValue],
        extras: Sequence[SSAValue],
        epilogue: Region,
        result_type: Attribute,
    ):
        super().__init__(
            operands=[lhs, rhs, scales, extras], result_types=[result_type], regions=[epilogue]
        )

    @property
    def product_shape(self) -> tuple[int, ...]:
        """The shape of ``lhs @ rhs``."""
        return shape_rule(shapes.matmul, tensor_shape(self.lhs), tensor_shape(self.rhs))

    def steps(self) -> list[list]:
        """The epilogue as the kernel runs it: per op, its mnemonic and its operands, each an
        index into the accumulator, the extras, then the results of the steps before."""
        block = self.epilogue.block
        index = {arg: i for i, arg in enumerate(block.args)}
        steps: list[list] = []
        for op in block.ops:
            if isinstance(op, YieldOp):
                break
            steps.append([mnemonic(op), [index[v] for v in op.operands]])
            index[op.results[0]] = len(index)
        return steps

    def kernel_attrs(self) -> dict:
        """The attributes of its instruction: the number of scales and the epilogue."""
        return {"scales": len(self.scales), "epilogue": self.steps()}

    def verify_(self) -> None:
        rhs, product = tensor_shape(self.rhs), self.product_shape
        columns = rhs[-1]
        check(prod(rhs[:-2]) == 1, "the right operand must be one matrix")
        dtype = element_type(self.lhs)
        check(element_type(self.rhs) == dtype, "operands have different element types")
        for scale in self.scales:
            check(tensor_shape(scale) == (columns,), f"a scale must have shape ({columns},)")
        block = self.epilogue.block
        check(len(block.args) == 1 + len(self.extras), "the epilogue takes the product and extras")
        acc = tensor_shape(block.args[0])
        check(
            prod(acc) == prod(product) and acc[-1:] == product[-1:]
            and element_type(block.args[0]) == dtype,
            f"the epilogue's product {acc} is not the product {product} viewed",
        )  # fmt: skip
        check(tensor_shape(self.result) == acc, "the result must have the epilogue's shape")
        check(
            tuple(a.type for a in block.args[1:]) == tuple(self.extras.types),
            "the epilogue's arguments do not match its extras",
        )
        steps = [op for op in block.ops if not isinstance(op, YieldOp)]
        last = steps[-1].results[0] if steps else block.args[0]
        yielded = block.last_op
        check(
            isinstance(yielded, YieldOp) and tuple(yielded.operands) == (last,),
            "the epilogue must yield its last op's result (its product if it has none)",
        )
        for op in block.ops:
            if not isinstance(op, YieldOp):
                check(
                    mnemonic(op) in EPILOGUE_OPS and not op.properties and len(op.results) == 1,
                    f"{op.name} cannot be part of an epilogue",
                )


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Ends a ``wse.layer`` body and gives the layer's results, or an epilogue and gives
    its result."""

    name = "wse.yield"
    values = var_operand_def(AnyAttr())
    traits = traits_def(IsTerminator(), HasParent(LayerOp, FusedMatmulOp))
    assembly_format = "($values^ `:` type($values))? attr-dict"

    def __init__(self, *values: SSAValue):
        super().__init__(operands=[values])
