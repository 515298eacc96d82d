"""What a layer costs on a rectangle, from the simulator's own model.

The compiler never guesses a layer's time or memory with a separate formula: it lowers the
module and runs the layer's instructions in the simulator's timing-only mode (shapes and
layouts, no numbers) on the candidate rectangle. The kernels' plans count the cycles, and the
wafer's SRAM accounting gives the peak bytes per PE, exactly as a real run would.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cgc.runtime.bytecode import Opcode, Program, canonical_json
from cgc.runtime.layout import Rect
from cgc.runtime.machine import Target
from cgc.runtime.vm import Executor, Wafer


@dataclass(frozen=True)
class LayerCost:
    """One layer on one rectangle."""

    name: str
    rect: Rect
    cycles: float
    flops: float
    sram_bytes_per_pe: int
    """Peak SRAM on the busiest PE (weights, activations and scratch)."""
    sram_bytes: int
    """Peak SRAM over the whole rectangle."""
    weight_bytes: int
    stream_in_bytes: float
    stream_out_bytes: float
    host_bytes: float
    """Bytes to and from the host (graph inputs and outputs)."""
    activation_in_bytes: int
    """Bytes of the tensors it reads from other layers."""
    activation_out_bytes: int
    """Bytes of its results that other layers read."""


def simulate_layer(
    program: Program, target: Target, index: int, rect: Rect, traffic: bool = True
) -> LayerCost:
    """Times layer ``index`` alone on ``rect``; its inputs from other layers arrive in their
    default layout there, as in a pipelined run (``Executor.enter_layer``). Without
    ``traffic`` the memory is exact but the cycles leave out the data movement that is costly
    to work out (see ``kernels.Kernel.plan``).

    The memory is the steady state of a run: every weight and constant the layer lays out
    stays pinned on its PEs from the first batch on, so a first pass finds them and the timed
    pass starts with them all in place.
    """
    first = _run_layer(program, target, index, rect, Wafer(target, strict=False, region=rect))
    warm = Wafer(target, strict=False, region=rect)
    for key, value in first.wafer.pinned.items():
        warm.pinned[key] = value
        warm.allocate(key[1])
    executor = _run_layer(program, target, index, rect, warm, traffic)
    weight_bytes = sum(
        program.tensor_bytes(ins.results[0])
        for ins in (program.instructions[p] for p in program.layer_spans[index])
        if ins.opcode in (Opcode.WEIGHT, Opcode.STREAM_WEIGHT)
    )
    activation_in, activation_out = program.activation_bytes(index)
    record = executor.records[-1]
    return LayerCost(
        name=record.name,
        rect=rect,
        cycles=record.cycles,
        flops=record.flops,
        sram_bytes_per_pe=executor.wafer.peak,
        sram_bytes=executor.wafer.peak_total,
        weight_bytes=weight_bytes,
        stream_in_bytes=record.stream_in_bytes,
        stream_out_bytes=record.stream_out_bytes,
        host_bytes=record.host_in_bytes + record.host_out_bytes,
        activation_in_bytes=activation_in,
        activation_out_bytes=activation_out,
    )


def _run_layer(
    program: Program, target: Target, index: int, rect: Rect, wafer: Wafer, traffic: bool = False
) -> Executor:
    """Layer ``index``'s instructions on ``wafer`` without numbers."""
    executor = Executor(program, target, wafer, None, numerics=False, traffic=traffic, deliver=True)
    executor.enter_layer(index, rect)
    for position in program.layer_spans[index][1:]:
        executor.step(program.instructions[position])
    return executor


NAMING_ATTRS = frozenset({"name", "layer", "index"})
"""Attributes of the non-kernel instructions that name things and do not change the cost."""


def layer_signature(program: Program, index: int) -> tuple:
    """What layer ``index``'s cost depends on: its instructions with registers renumbered in
    order of appearance, with their shapes, dtypes and attributes, names left out."""
    numbering: dict[int, int] = {}
    parts = []
    for position in program.layer_spans[index][1:]:
        ins = program.instructions[position]
        attrs = ins.attrs
        if not ins.is_kernel:
            attrs = {k: v for k, v in attrs.items() if k not in NAMING_ATTRS}
        registers = tuple(
            (numbering.setdefault(r, len(numbering)), program.registers[r])
            for r in (*ins.operands, *ins.results)
        )
        parts.append((ins.opcode, len(ins.operands), registers, canonical_json(attrs)))
    return tuple(parts)


class LayerCosts:
    """``simulate_layer`` remembered by layer signature and rectangle: the layers of a deep
    model repeat a few structures, and placement asks about the same rectangles again."""

    def __init__(self, program: Program, target: Target, traffic: bool = True):
        self.program = program
        self.target = target
        self.traffic = traffic
        self.signatures: dict[int, tuple] = {}
        self.known: dict[tuple, LayerCost] = {}

    def __call__(self, index: int, rect: Rect) -> LayerCost:
        if index not in self.signatures:
            self.signatures[index] = layer_signature(self.program, index)
        key = (self.signatures[index], tuple(rect))
        if key not in self.known:
            self.known[key] = simulate_layer(self.program, self.target, index, rect, self.traffic)
        name = self.program.layers[index].name
        cost = self.known[key]
        return cost if cost.name == name else replace(cost, name=name)


def program_costs(program: Program, target: Target) -> list[LayerCost]:
    """Every layer of ``program`` on the rectangle it was given."""
    costs = LayerCosts(program, target)
    return [costs(i, layer.rect) for i, layer in enumerate(program.layers)]
