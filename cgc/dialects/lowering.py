"""The IR in the machine's terms: every layer's work, and the whole module as one program.

A layer's work is a one-layer program of the machine's bytecode (``cgc.machine.program.bytecode``)
over registers of its own: the instructions the layer runs, with a ``FREE`` after the last use
of every register that no later part of the module reads. A register the work reads but
does not define arrives from another layer. This is what the passes ask the machine's cost
API about (``cgc.machine.timing.cost.layer_cost(work.program, 0, rect, target)``), without lowering
the module.

``lower`` joins the works into the program of the whole module, once, for the artifact:
every SSA value gets a register, numbered in the order values are defined; a layer's block
arguments and results share the registers of the values they stand for; graph inputs load at
the first layer that uses them (an input marked ``EVERY_LAYER``, a few control values every
layer needs, at each layer that uses it, rather than crossing from the first to all of
them), outputs leave as soon as they are computed; the joined program's layers cost exactly
what their works cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from math import ceil, prod

import networkx as nx
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from cgc.dialects import ws, wse
from cgc.dialects.ir import dense_to_numpy, main_function
from cgc.errors import CgcError
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import WAVELET_BYTES
from cgc.machine.movement.layout import Rect
from cgc.machine.program.bytecode import (
    PRIMITIVES,
    Instruction,
    LayerInfo,
    Opcode,
    Program,
    Route,
    kernel_opcode,
)

EVERY_LAYER = "wse.every_layer"
"""The argument attribute of a graph input that every layer reading it loads from the host
(generation's token positions, which every attention layer reads)."""


def _every_layer(fn: func.FuncOp) -> set[SSAValue]:
    """The arguments of ``fn`` marked ``EVERY_LAYER``."""
    if fn.arg_attrs is None:
        return set()
    return {
        arg
        for arg, attrs in zip(fn.body.block.args, fn.arg_attrs.data, strict=True)
        if EVERY_LAYER in attrs.data
    }


def _weight_attrs(op: wse.WeightOp | ws.StreamWeightOp | ws.StreamGradientOp) -> dict:
    attrs: dict = {"name": op.weight_name.data}
    if op.perm is not None:
        attrs["perm"] = [int(p) for p in op.perm.get_values()]
    return attrs


def _aliases(fn: func.FuncOp) -> dict[SSAValue, SSAValue]:
    """Every value that shares another's register, mapped to that value (its root): a layer's
    block arguments share their operands', its results what its body yields, a
    stop-gradient's result its input's."""
    roots: dict[SSAValue, SSAValue] = {}
    for op in fn.body.block.ops:
        if not isinstance(op, wse.LayerOp):
            continue
        body = op.body.block
        for arg, outer in zip(body.args, op.inputs, strict=True):
            roots[arg] = roots.get(outer, outer)
        for inner in body.ops:
            if isinstance(inner, wse.StopGradientOp):
                roots[inner.result] = roots.get(inner.input, inner.input)
            elif isinstance(inner, wse.YieldOp):
                for result, value in zip(op.results, inner.values, strict=True):
                    roots[result] = roots.get(value, value)
    return roots


@dataclass
class LayerWork:
    """One layer's work: a one-layer program, and the value each of its registers holds."""

    program: Program
    values: list[SSAValue]
    """Per register of ``program``, the value it holds (a root: see ``_aliases``)."""
    layer: wse.LayerOp | None
    """None for the instructions of a module without layers."""


@dataclass
class _Work:
    """A work while it is built."""

    layer: wse.LayerOp | None
    index: int
    """The work's place in the module."""
    roots: dict[SSAValue, SSAValue]
    """The module's aliases (``_aliases``)."""
    instructions: list[Instruction] = field(default_factory=list)
    values: list[SSAValue] = field(default_factory=list)
    of: dict[SSAValue, int] = field(default_factory=dict)

    def register(self, value: SSAValue) -> int:
        """The work's register of ``value``'s root (a new one the first time)."""
        root = self.roots.get(value, value)
        if root not in self.of:
            self.of[root] = len(self.values)
            self.values.append(root)
        return self.of[root]

    def emit(
        self,
        opcode: int,
        results: Sequence[SSAValue] = (),
        operands: Sequence[SSAValue] = (),
        attrs: dict | None = None,
        op: Operation | None = None,
    ) -> None:
        self.instructions.append(
            Instruction(
                opcode,
                tuple([self.register(r) for r in results]),
                tuple([self.register(v) for v in operands]),
                attrs or {},
                wse.location_name(op) if op is not None else None,
            )
        )


class _Works:
    """Builds the works of the ``@main`` function of a module."""

    def __init__(self, fn: func.FuncOp, default_rect: Rect):
        self.default_rect = default_rect
        self.ops = list(fn.body.block.ops)
        self.arguments: dict[SSAValue, int] = {arg: i for i, arg in enumerate(fn.body.block.args)}
        returned = self.ops[-1] if self.ops else None
        self.outputs: dict[SSAValue, list[int]] = {}
        if isinstance(returned, func.ReturnOp):
            for index, value in enumerate(returned.arguments):
                self.outputs.setdefault(value, []).append(index)
        self.roots = _aliases(fn)
        self.everywhere = _every_layer(fn)
        self.loaded: set[SSAValue] = set()
        self.specs: dict[SSAValue, tuple[tuple[int, ...], str]] = {}
        self.last_use: dict[SSAValue, int] = {}
        """Per root, the index of the last work whose instructions use it."""

    def build(self) -> list[LayerWork]:
        """Every layer's work, in program order (the ops after the last layer in its work)."""
        works: list[_Work] = []
        for op in self.ops:
            if isinstance(op, wse.LayerOp):
                works.append(_Work(op, len(works), self.roots))
                self._layer(works[-1], op)
            else:
                if not works:
                    works.append(_Work(None, 0, self.roots))
                self._other(works[-1], op)
            self._note_uses(works[-1])
        return [self._finished(work) for work in works]

    def _note_uses(self, work: _Work) -> None:
        for ins in work.instructions:
            for register in (*ins.results, *ins.operands):
                self.last_use[work.values[register]] = work.index

    def _input(self, work: _Work, value: SSAValue) -> None:
        """An INPUT for graph input ``value`` the first time a layer (or the end) needs it,
        or (``EVERY_LAYER``) the first time each layer does."""
        if value not in self.arguments:
            return
        first = value not in self.loaded and value not in work.of
        if first or (value in self.everywhere and value not in work.of):
            self.loaded.add(value)
            work.emit(Opcode.INPUT, results=[value], attrs={"index": self.arguments[value]})

    def _output(self, work: _Work, value: SSAValue) -> None:
        """OUTPUT instructions for every graph output that ``value`` is, if not yet given."""
        for index in self.outputs.pop(value, ()):
            work.emit(Opcode.OUTPUT, operands=[value], attrs={"index": index})

    def _layer(self, work: _Work, layer: wse.LayerOp) -> None:
        """One LAYER instruction, the layer's inputs, its body, the outputs it computes."""
        work.emit(Opcode.LAYER, attrs={"layer": 0}, op=layer)
        for value in layer.inputs:
            self._input(work, value)
        for op in layer.body.block.ops:
            if not isinstance(op, wse.YieldOp | wse.StopGradientOp):
                self._op(work, op)
        # a graph output leaves from the layer that computes it
        for result in layer.results:
            self._output(work, result)

    def _other(self, work: _Work, op: Operation) -> None:
        if isinstance(op, ws.OptimizerStepOp):
            attrs = {"optimizer": op.optimizer.data, "config": op.settings()}
            work.emit(Opcode.OPTIMIZER_STEP, attrs=attrs, op=op)
        elif isinstance(op, func.ReturnOp):
            for value in list(self.outputs):
                self._input(work, value)
                self._output(work, value)
        else:
            raise CgcError(f"cannot lower {op.name} outside a layer; run form-layers first")

    def _op(self, work: _Work, op: Operation) -> None:
        """One instruction for one op of a layer body."""
        if isinstance(op, wse.WeightOp):
            work.emit(Opcode.WEIGHT, op.results, attrs=_weight_attrs(op), op=op)
        elif isinstance(op, wse.ConstantOp):
            value = dense_to_numpy(op.value).ravel().tolist()
            work.emit(Opcode.CONSTANT, op.results, attrs={"value": value}, op=op)
        elif isinstance(op, wse.KvCacheOp):
            attrs = {"name": op.cache_name.data, "capacity": op.capacity.value.data}
            work.emit(Opcode.CACHE, op.results, attrs=attrs, op=op)
        elif isinstance(op, ws.StreamWeightOp):
            work.emit(Opcode.STREAM_WEIGHT, op.results, attrs=_weight_attrs(op), op=op)
        elif isinstance(op, ws.StreamGradientOp):
            work.emit(Opcode.STREAM_GRADIENT, (), op.operands, _weight_attrs(op), op=op)
        elif isinstance(op, wse.FusedMatmulOp):
            work.emit(kernel_opcode("fused_matmul"), op.results, op.operands, op.kernel_attrs(), op)
        elif op.name.startswith("wse.") and wse.mnemonic(op) in PRIMITIVES:
            attrs = wse.properties_as_python(op)
            work.emit(kernel_opcode(wse.mnemonic(op)), op.results, op.operands, attrs, op)
        else:
            where = wse.location_name(op)
            raise CgcError(
                f"cannot lower {op.name}{f' (node {where})' if where else ''}: "
                "it has no mesh kernel; run the decompose pass first"
            )

    def _finished(self, work: _Work) -> LayerWork:
        """The work with a FREE after the last use of each register no later op reads."""
        last = {}
        for position, ins in enumerate(work.instructions):
            for register in (*ins.results, *ins.operands):
                last[register] = position
        ends_here = [
            self.last_use[value] == work.index or value in self.everywhere for value in work.values
        ]
        instructions: list[Instruction] = []
        for position, ins in enumerate(work.instructions):
            instructions.append(ins)
            used = set(ins.results) | set(ins.operands)
            dead = sorted(r for r in used if last[r] == position and ends_here[r])
            if dead:
                instructions.append(Instruction(Opcode.FREE, (), tuple(dead)))
        registers = [self._spec(v) for v in work.values]
        layers = [self._info(work.layer)] if work.layer is not None else []
        return LayerWork(Program(instructions, registers, layers), work.values, work.layer)

    def _spec(self, value: SSAValue) -> tuple[tuple[int, ...], str]:
        """The shape and dtype name of a value (once per value: several works hold it)."""
        if value not in self.specs:
            self.specs[value] = wse.tensor_shape(value), wse.numpy_dtype(wse.element_type(value))
        return self.specs[value]

    def _info(self, layer: wse.LayerOp) -> LayerInfo:
        rect = layer.rect.as_tuple() if layer.rect is not None else self.default_rect
        weights = sorted(
            {
                o.weight_name.data
                for o in layer.body.block.ops
                if isinstance(o, wse.WeightOp | ws.StreamWeightOp)
            }
        )
        return LayerInfo(layer.layer_name.data, rect, tuple(weights))


def layer_works(fn: func.FuncOp, default_rect: Rect) -> list[LayerWork]:
    """The work of every layer of ``fn`` (whose body must consist of layers); layers without a
    rectangle get ``default_rect``."""
    return _Works(fn, default_rect).build()


def lower(module: ModuleOp, default_rect: Rect) -> Program:
    """The program of the module's ``@main``: its layers' works joined, registers numbered in
    the order values are defined; layers without a rectangle get ``default_rect``."""
    works = layer_works(main_function(module), default_rect)
    numbers = _numbering(works)
    instructions: list[Instruction] = []
    layers: list[LayerInfo] = []
    for work in works:
        global_of = [numbers[v] for v in work.values]
        for ins in work.program.instructions:
            attrs = {"layer": len(layers)} if ins.opcode == Opcode.LAYER else ins.attrs
            operands = tuple(global_of[r] for r in ins.operands)
            if ins.opcode == Opcode.FREE:
                operands = tuple(sorted(operands))
            results = tuple(global_of[r] for r in ins.results)
            instructions.append(Instruction(ins.opcode, results, operands, attrs, ins.location))
        if work.layer is not None:
            (info,) = work.program.layers
            routes = tuple(_route(r, layers, info.name) for r in work.layer.routes or ())
            layers.append(LayerInfo(info.name, info.rect, info.weights, routes))
    spec_of = {
        value: spec
        for work in works
        for value, spec in zip(work.values, work.program.registers, strict=True)
    }
    registers = [spec_of[v] for v in sorted(numbers, key=numbers.__getitem__)]
    return Program(instructions, registers, layers)


def _numbering(works: Sequence[LayerWork]) -> dict[SSAValue, int]:
    """Every value's register in the joined program: in the order the works define them."""
    numbers: dict[SSAValue, int] = {}
    for work in works:
        for ins in work.program.instructions:
            for register in ins.results:
                numbers.setdefault(work.values[register], len(numbers))
    return numbers


def _route(route: wse.RouteAttr, earlier: Sequence[LayerInfo], consumer: str) -> Route:
    """A route with its source layer as the index of the latest layer of that name."""
    name = route.source.data
    sources = [i for i, info in enumerate(earlier) if info.name == name]
    if not sources:
        raise CgcError(
            f"layer '{consumer}' has a route from '{name}', which is not an earlier layer"
        )
    return Route(
        sources[-1],
        route.color.data,
        route.lanes.data,
        route.wavelets.data,
        route.busiest.data,
        route.hops.data,
        tuple(v.data for v in route.path.data),
    )


def layer_graph(works: Sequence[LayerWork]) -> nx.MultiDiGraph:
    """The layers (their indices, in program order) as nodes, an edge from producer to
    consumer per tensor, keyed by its register in the joined program and carrying its
    ``wavelets`` per run."""
    numbers = _numbering(works)
    layered = [work for work in works if work.layer is not None]
    producer: dict[SSAValue, int] = {}
    for index, work in enumerate(layered):
        for ins in work.program.instructions:
            for register in ins.results:
                producer.setdefault(work.values[register], index)
    graph = nx.MultiDiGraph()
    graph.add_nodes_from(range(len(layered)))
    for consumer, work in enumerate(layered):
        for register in work.program.layer_inputs[0]:
            value = work.values[register]
            shape, dtype = work.program.registers[register]
            words = prod(shape) * (dtypes.dtype(dtype).itemsize / WAVELET_BYTES)
            graph.add_edge(producer[value], consumer, key=numbers[value], wavelets=ceil(words))
    return graph


Edge = tuple[int, int, int]
"""``(producer, consumer, wavelets)`` of a tensor between two layers."""


def tensor_edges(graph: nx.MultiDiGraph) -> list[Edge]:
    """Every tensor between layers (``cgc.dialects.lowering.layer_graph``), consumer by
    consumer in the order of its inputs."""
    return [
        (producer, consumer, wavelets)
        for consumer in graph.nodes
        for producer, _, _, wavelets in sorted(
            graph.in_edges(consumer, keys=True, data="wavelets"), key=lambda edge: edge[2]
        )
    ]
