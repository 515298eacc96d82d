"""The weight-streaming dialect: traffic between MemoryX, SwarmX and the systems.

In weight-streaming mode the wafer holds activations only. MemoryX holds every weight and the
optimizer state; SwarmX is a broadcast/reduce tree between MemoryX and the K systems of a
data-parallel cluster. The ``schedule-streams`` pass turns each layer's ``wse.weight`` into a
``ws.stream_weight`` (MemoryX -> SwarmX broadcast -> every system), each weight gradient into a
``ws.stream_gradient`` (every system -> SwarmX sum -> MemoryX), and ends a training step with
``ws.optimizer_step``, the update MemoryX applies once all gradients of the step are in.

Example::

    %w = ws.stream_weight "fc1.weight" : tensor<784x64xf32>
    ws.stream_gradient "fc1.weight", %g : tensor<784x64xf32>
    ws.optimizer_step "sgd" {lr = 1.000000e-01 : f64, momentum = 0.000000e+00 : f64}
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    DictionaryAttr,
    FloatAttr,
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute, Dialect, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
)
from xdsl.utils.exceptions import VerifyException

from cgc.dialects.wse import i64_array
from cgc.machine.training import optimizers


def _weight_props(name: str, perm: Sequence[int] | None) -> dict[str, Attribute]:
    props: dict[str, Attribute] = {"name": StringAttr(name)}
    if perm is not None:
        props["perm"] = i64_array(perm)
    return props


@irdl_op_definition
class StreamWeightOp(IRDLOperation):
    """A layer's weight streamed from MemoryX, broadcast by SwarmX to every system.

    Like ``wse.weight``, the result may be a view (reshape, then ``perm``): MemoryX sends the
    elements in the order the kernel consumes them. Not pure: each occurrence is one transfer
    (the backward pass streams the weight again).
    """

    name = "ws.stream_weight"
    weight_name = prop_def(StringAttr, prop_name="name")
    perm = opt_prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$name attr-dict `:` type($result)"

    def __init__(self, name: str, result_type: TensorType, perm: Sequence[int] | None = None):
        super().__init__(result_types=[result_type], properties=_weight_props(name, perm))


@irdl_op_definition
class StreamGradientOp(IRDLOperation):
    """A weight gradient streamed out of every system, summed by SwarmX, sent to MemoryX.

    The gradient is of the view the weight was streamed as (``perm``); MemoryX maps it back.
    """

    name = "ws.stream_gradient"
    weight_name = prop_def(StringAttr, prop_name="name")
    perm = opt_prop_def(DenseArrayBase[I64])
    gradient = operand_def(TensorType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$name `,` $gradient attr-dict `:` type($gradient)"

    def __init__(self, name: str, gradient: SSAValue, perm: Sequence[int] | None = None):
        super().__init__(operands=[gradient], properties=_weight_props(name, perm))


@irdl_op_definition
class OptimizerStepOp(IRDLOperation):
    """MemoryX applies ``optimizer`` with hyper-parameters ``config`` to every streamed gradient."""

    name = "ws.optimizer_step"
    optimizer = prop_def(StringAttr)
    config = prop_def(DictionaryAttr)
    assembly_format = "$optimizer $config attr-dict"

    def __init__(self, optimizer: str, config: dict[str, float]):
        entries: dict[str, Attribute] = {
            key: FloatAttr(float(value), 64) for key, value in sorted(config.items())
        }
        super().__init__(
            properties={"optimizer": StringAttr(optimizer), "config": DictionaryAttr(entries)}
        )

    def verify_(self) -> None:
        try:
            optimizers.settings(self.optimizer.data, self.settings())
        except ValueError as e:
            raise VerifyException(str(e)) from None

    def settings(self) -> dict[str, float]:
        """The hyper-parameters as Python floats."""
        out: dict[str, float] = {}
        for key, value in self.config.data.items():
            if not isinstance(value, FloatAttr):
                raise VerifyException(f"optimizer setting {key!r} must be a float")
            out[key] = float(value.value.data)
        return out


WS = Dialect("ws", [StreamWeightOp, StreamGradientOp, OptimizerStepOp], [])
