"""Lowers the final IR to the register program of ``cgc.machine.bytecode``.

Every SSA value gets a register; a layer's block arguments and results share the registers of
the values they stand for. Graph inputs load at the first layer that uses them, outputs leave
at the end, and a ``FREE`` follows the last use of every register so the simulator's SRAM
accounting sees each tensor's real lifetime.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from cgc.dialects import ws, wse
from cgc.dialects.ir import dense_to_numpy, main_function
from cgc.errors import CgcError
from cgc.machine.bytecode import (
    PRIMITIVES,
    Instruction,
    LayerInfo,
    Opcode,
    Program,
    Route,
    kernel_opcode,
)


def _weight_attrs(op: wse.WeightOp | ws.StreamWeightOp | ws.StreamGradientOp) -> dict:
    attrs: dict = {"name": op.weight_name.data}
    if op.perm is not None:
        attrs["perm"] = [int(p) for p in op.perm.get_values()]
    return attrs


class Lowering:
    """Builds one program from the ``@main`` function of a module."""

    def __init__(self, default_rect: tuple[int, int, int, int]):
        self.default_rect = default_rect
        self.registers: list[tuple[tuple[int, ...], str]] = []
        self.of: dict[SSAValue, int] = {}
        self.instructions: list[Instruction] = []
        self.layers: list[LayerInfo] = []
        self.pending_inputs: dict[SSAValue, int] = {}

    def register(self, value: SSAValue) -> int:
        """A new register for ``value``."""
        shape = wse.tensor_shape(value)
        dtype = wse.numpy_dtype(wse.element_type(value))
        self.registers.append((shape, dtype))
        self.of[value] = len(self.registers) - 1
        return self.of[value]

    def emit(
        self,
        opcode: int,
        results: Sequence[SSAValue] = (),
        operands: Sequence[SSAValue] = (),
        attrs: dict | None = None,
        op: Operation | None = None,
    ) -> None:
        """Appends one instruction, giving its results fresh registers."""
        self.instructions.append(
            Instruction(
                opcode,
                tuple(self.register(r) for r in results),
                tuple(self.of[v] for v in operands),
                attrs or {},
                wse.location_name(op) if op is not None else None,
            )
        )

    def lower(self, fn: func.FuncOp) -> Program:
        """Lowers ``fn``, whose body must consist of layers."""
        self.pending_inputs = {arg: i for i, arg in enumerate(fn.body.block.args)}
        returned = fn.body.block.last_op
        self.pending_outputs: dict[SSAValue, list[int]] = {}
        if isinstance(returned, func.ReturnOp):
            for index, value in enumerate(returned.arguments):
                self.pending_outputs.setdefault(value, []).append(index)
        for op in fn.body.block.ops:
            if isinstance(op, wse.LayerOp):
                self.lower_layer(op)
            elif isinstance(op, ws.OptimizerStepOp):
                self.emit(
                    Opcode.OPTIMIZER_STEP,
                    attrs={"optimizer": op.optimizer.data, "config": op.settings()},
                    op=op,
                )
            elif isinstance(op, func.ReturnOp):
                for value in list(self.pending_outputs):
                    self._load_input(value)
                    self._output(value)
            else:
                raise CgcError(f"cannot lower {op.name} outside a layer; run form-layers first")
        return Program(self._with_frees(), self.registers, self.layers)

    def _output(self, value: SSAValue) -> None:
        """OUTPUT instructions for every graph output that ``value`` is, if not yet given."""
        for index in self.pending_outputs.pop(value, ()):
            self.emit(Opcode.OUTPUT, operands=[value], attrs={"index": index})

    def _load_input(self, value: SSAValue) -> None:
        if value in self.pending_inputs:
            index = self.pending_inputs.pop(value)
            self.emit(Opcode.INPUT, results=[value], attrs={"index": index})

    def lower_layer(self, layer: wse.LayerOp) -> None:
        """One LAYER instruction, the layer's inputs, then its body."""
        rect = layer.rect.as_tuple() if layer.rect is not None else self.default_rect
        body = layer.body.block
        weights = sorted(
            {
                o.weight_name.data
                for o in body.ops
                if isinstance(o, wse.WeightOp | ws.StreamWeightOp)
            }
        )
        self.emit(Opcode.LAYER, attrs={"layer": len(self.layers)}, op=layer)
        routes = tuple(self._route(r) for r in layer.routes.data) if layer.routes else ()
        self.layers.append(LayerInfo(layer.layer_name.data, rect, tuple(weights), routes))
        for value, arg in zip(layer.inputs, body.args, strict=True):
            self._load_input(value)
            self.of[arg] = self.of[value]
        for op in body.ops:
            if isinstance(op, wse.YieldOp):
                for result, value in zip(layer.results, op.values, strict=True):
                    self.of[result] = self.of[value]
            else:
                self.lower_op(op)
        # a graph output leaves from the layer that computes it
        for result in layer.results:
            self._output(result)

    def _route(self, route: wse.RouteAttr) -> Route:
        """A route with its source layer as the index of the latest layer of that name."""
        name = route.source.data
        earlier = [i for i, info in enumerate(self.layers) if info.name == name]
        if not earlier:
            raise CgcError(
                f"layer '{self.layers[-1].name}' has a route from '{name}', which is not an "
                "earlier layer"
            )
        source = earlier[-1]
        values = (getattr(route, f).data for f in wse.RouteAttr.FIELDS)
        return Route(source, *values, tuple(v.data for v in route.path.data))

    def lower_op(self, op: Operation) -> None:
        """One instruction for one op of a layer body."""
        if isinstance(op, wse.WeightOp):
            self.emit(Opcode.WEIGHT, op.results, attrs=_weight_attrs(op), op=op)
        elif isinstance(op, wse.ConstantOp):
            value = dense_to_numpy(op.value).ravel().tolist()
            self.emit(Opcode.CONSTANT, op.results, attrs={"value": value}, op=op)
        elif isinstance(op, ws.StreamWeightOp):
            self.emit(Opcode.STREAM_WEIGHT, op.results, attrs=_weight_attrs(op), op=op)
        elif isinstance(op, ws.StreamGradientOp):
            self.emit(Opcode.STREAM_GRADIENT, (), op.operands, _weight_attrs(op), op=op)
        elif isinstance(op, wse.StopGradientOp):  # the identity: the result is the operand
            self.of[op.result] = self.of[op.input]
        elif op.name.startswith("wse.") and wse.mnemonic(op) in PRIMITIVES:
            attrs = wse.properties_as_python(op)
            self.emit(kernel_opcode(wse.mnemonic(op)), op.results, op.operands, attrs, op)
        else:
            where = wse.location_name(op)
            raise CgcError(
                f"cannot lower {op.name}{f' (node {where})' if where else ''}: "
                "it has no mesh kernel; run the decompose pass first"
            )

    def _with_frees(self) -> list[Instruction]:
        """The instructions with a FREE after each register's last use."""
        last = np.full(len(self.registers), -1)
        for index, ins in enumerate(self.instructions):
            for r in (*ins.results, *ins.operands):
                last[r] = index
        out: list[Instruction] = []
        for index, ins in enumerate(self.instructions):
            out.append(ins)
            dead = tuple(sorted({r for r in (*ins.results, *ins.operands) if last[r] == index}))
            if dead:
                out.append(Instruction(Opcode.FREE, (), dead))
        return out


def lower(module: ModuleOp, default_rect: tuple[int, int, int, int]) -> Program:
    """The program of the module's ``@main``; layers without a placement get ``default_rect``."""
    return Lowering(default_rect).lower(main_function(module))
