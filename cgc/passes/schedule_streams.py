"""Schedules weight and gradient streams: the weight-streaming execution mode.

Every layer runs on the whole wafer, one after another. Each weight a layer uses, frozen
constants included, streams from MemoryX through SwarmX when the layer runs: its
``wse.weight`` becomes a ``ws.stream_weight`` (keeping its view, so MemoryX sends it in the
order the kernel consumes it). The backward layers that autodiff built stream the weights
again and stream their gradients out. With ``optimizer`` set and gradients present, the step
ends with ``ws.optimizer_step``, which MemoryX runs once SwarmX has summed every gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntAttr, ModuleOp, TensorType
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from cgc.dialects import ws, wse
from cgc.dialects.ir import main_function, module_target
from cgc.errors import CgcError
from cgc.machine.training import optimizers


@dataclass(frozen=True)
class _ScheduleStreams(ModulePass):
    name = "schedule-streams"

    optimizer: str = ""
    """Optimizer MemoryX applies at the end of a step (``sgd``, ``adam``, ``adamw``); empty
    for inference."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        target = module_target(op)
        whole = wse.RectAttr(IntAttr(0), IntAttr(0), IntAttr(target.cols), IntAttr(target.rows))
        block = main_function(op).body.block
        streams_gradients = False
        for layer in [o for o in block.ops if isinstance(o, wse.LayerOp)]:
            layer.rect = whole
            for inner in list(layer.body.block.ops):
                streams_gradients |= isinstance(inner, ws.StreamGradientOp)
                if isinstance(inner, wse.WeightOp):
                    assert isinstance(inner.result.type, TensorType)
                    perm = None if inner.perm is None else list(inner.perm.get_values())
                    stream = ws.StreamWeightOp(inner.weight_name.data, inner.result.type, perm)
                    stream.location = inner.location
                    Rewriter.replace_op(inner, stream)
        if self.optimizer and streams_gradients:
            given = {k: getattr(self, k) for k in optimizers.SETTINGS}
            try:
                config = optimizers.settings(
                    self.optimizer, {k: v for k, v in given.items() if v is not None}
                )
            except ValueError as e:
                raise CgcError(f"schedule-streams: {e}") from None
            ret = block.last_op
            assert isinstance(ret, func.ReturnOp)
            Rewriter.insert_op(ws.OptimizerStepOp(self.optimizer, config), InsertPoint.before(ret))


ScheduleStreamsPass = make_dataclass(
    "ScheduleStreamsPass",
    [
        (s.name, (bool if s.flag else float) | None, field(default=None))
        for s in optimizers.SETTINGS.values()
    ],
    bases=(_ScheduleStreams,),
    frozen=True,
)
ScheduleStreamsPass.__module__ = __name__
ScheduleStreamsPass.__doc__ = """Turns weights into MemoryX streams and closes a training
step with the optimizer. Its options are ``optimizer`` and one per setting of
``cgc.machine.training.optimizers.SETTINGS`` (``lr``, ``momentum``, ``betas``' ``beta1`` and
``beta2``, ...); a setting left unset takes the optimizer's default, and only the optimizer's own
settings go into the step."""
