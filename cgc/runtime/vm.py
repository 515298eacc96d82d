"""The bytecode VM: one system running a program's instructions for one chunk of samples.

The machine floor's timing engine (``cgc.machine.timing.cost.Timing``) accounts for every
instruction exactly as the compiler's cost queries do: where each tensor is, what each kernel
costs, what each PE holds; a run that begins as an earlier run of the program began replays
that run's answers (``cgc.runtime.script``). The VM adds the numbers: it keeps every
register's value (tiles on the wafer, or the logical array of a weight, constant or stream),
brings each operand to the layout its kernel's plan asks for, and runs the kernel's
arithmetic (``cgc.runtime.kernels``). Without numbers a run is the timing engine alone.

An index that comes with the data (a token id, a label, a gather's or scatter's index) and
an integer divisor are checked where their kernel runs; one out of range, or 0, ends the run
with a ``CgcError`` naming the instruction's source node (or, without one, its layer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from cgc.errors import CgcError, DataError
from cgc.machine.hardware.target import Target
from cgc.machine.movement.layout import Layout
from cgc.machine.plans import Plan
from cgc.machine.program.bytecode import Instruction, Opcode, Program
from cgc.machine.timing.cost import (
    CACHE_KEY,
    Held,
    LayerRecord,
    OnWafer,
    Resident,
    Sram,
    Streamed,
    Timing,
)
from cgc.runtime import kernels
from cgc.runtime.memoryx import MemoryX
from cgc.runtime.script import Recording, Replay, script_for
from cgc.runtime.tiles import DistTensor


@dataclass
class System:
    """One system of a cluster: its SRAM, the numbers of the weights and constants pinned in
    it (they stay from one run of the program to the next), and its key-value caches by name
    (they stay too, and the programs of a generation share them)."""

    sram: Sram
    pinned: dict[tuple[str, Layout], DistTensor] = field(default_factory=dict)
    caches: dict[str, np.ndarray] = field(default_factory=dict)


Value = DistTensor | np.ndarray

OnLayer = Callable[[int, str], None]
"""Told of each layer of a run as it begins: its number in the run (from 1) and its name."""


class Executor:
    """Runs the program once on one system for one chunk of samples; with ``memoryx`` None
    the run has no numbers (timing only). ``on_layer`` is told of each layer as it begins."""

    def __init__(
        self,
        program: Program,
        target: Target,
        system: System,
        memoryx: MemoryX | None,
        deliver: bool = False,
        on_layer: OnLayer | None = None,
    ):
        self.program = program
        self.on_layer = on_layer
        self.system = system
        self.memoryx = memoryx
        script = script_for(program, target, deliver, system.sram)
        self.timing: Recording | Replay = (
            Replay(script)
            if script is not None
            else Recording(program, Timing(program, target, system.sram, deliver))
        )
        self.values: list[Value | None] = [None] * len(program.registers)
        self.arrived: dict[int, DistTensor] = {}
        """The current layer's copies of its inputs (when delivering)."""
        self.outputs: dict[int, np.ndarray] = {}
        """The graph outputs a run with numbers computed, by index."""
        self.gradients: list[tuple[str, list[int] | None, np.ndarray | None]] = []
        self.optimizer: tuple[str, dict[str, float]] | None = None
        self.inputs: Sequence[np.ndarray] = ()
        self.weight_names: dict[int, str] = {}
        """The weight each register holding one holds, by register."""
        self.layer = ""
        """The name of the layer running now, for errors of instructions without a location."""

    @property
    def numerics(self) -> bool:
        """Whether the run computes numbers."""
        return self.memoryx is not None

    def gradient(self, position: int) -> np.ndarray:
        """The ``position``-th gradient a run with numbers streamed out."""
        value = self.gradients[position][2]
        assert value is not None, "a run without numbers has no gradients"
        return value

    @property
    def records(self) -> list[LayerRecord]:
        """What every layer did."""
        return self.timing.records

    def run(self, inputs: Sequence[np.ndarray]) -> None:
        """Executes every instruction."""
        self.inputs = inputs
        on_layer, layers = self.on_layer, 0
        with np.errstate(all="ignore"):
            for ins in self.program.instructions:
                if on_layer is not None and ins.opcode == Opcode.LAYER:
                    layers += 1
                    on_layer(layers, self.program.layers[ins.attrs["layer"]].name)
                self.step(ins)
        if isinstance(self.timing, Recording):
            self.timing.keep()
        else:
            self.system.sram = self.timing.script.sram(self.system.sram)

    def step(self, ins: Instruction) -> None:
        """Executes one instruction. An instruction of a program read from a file that its
        kernel cannot run is a CgcError naming it: reading checks the program's structure,
        not every kernel's attributes, and a file can be edited with its checksums redone."""
        try:
            self._step(ins)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            if self.program.source is None or isinstance(e, CgcError):
                raise
            where = f"in layer '{self.layer}'" if self.layer else "before the first layer"
            raise CgcError(
                f"{self.program.source}: instruction '{ins.name}' {where} cannot run "
                f"({type(e).__name__}: {e}); the artifact is damaged"
            ) from None

    def _step(self, ins: Instruction) -> None:
        result = self.timing.step(ins)
        if ins.opcode == Opcode.OPTIMIZER_STEP:
            self.optimizer = (ins.attrs["optimizer"], ins.attrs["config"])
        if not self.numerics:
            if ins.opcode == Opcode.STREAM_GRADIENT:  # the timeline needs the weight's name
                self.gradients.append((ins.attrs["name"], ins.attrs.get("perm"), None))
        elif ins.is_kernel:
            assert isinstance(result, Plan)
            self._kernel(ins, result)
        else:
            self._data(ins, result)

    def _data(self, ins: Instruction, layout: Plan | Layout | None) -> None:
        """The numbers of an instruction that moves data rather than computing."""
        opcode = ins.opcode
        if opcode == Opcode.LAYER:
            self.layer = self.program.layers[ins.attrs["layer"]].name
            self._arrive()
        elif opcode == Opcode.INPUT:
            assert isinstance(layout, Layout)
            # a copy: the run keeps it, and the caller may change their array afterwards
            array = np.array(self.inputs[ins.attrs["index"]], dtype=layout.dtype)
            self.values[ins.results[0]] = DistTensor.scatter(array, layout)
        elif opcode == Opcode.OUTPUT:
            # a copy the caller owns: the run's tensors may share their arrays
            self.outputs[ins.attrs["index"]] = np.array(self._logical(ins.operands[0]))
        elif opcode in (Opcode.WEIGHT, Opcode.STREAM_WEIGHT):
            assert self.memoryx is not None
            shape, dtype = self.program.registers[ins.results[0]]
            weight = self.memoryx.stream(ins.attrs["name"], shape, ins.attrs.get("perm"), dtype)
            self.values[ins.results[0]] = weight
            self.weight_names[ins.results[0]] = ins.attrs["name"]
        elif opcode == Opcode.CACHE:
            shape, dtype = self.program.registers[ins.results[0]]
            caches = self.system.caches
            if ins.attrs["name"] not in caches:
                caches[ins.attrs["name"]] = np.zeros(shape, dtype)
            self.values[ins.results[0]] = caches[ins.attrs["name"]]
        elif opcode == Opcode.CONSTANT:
            shape, dtype = self.program.registers[ins.results[0]]
            value = np.asarray(ins.attrs["value"], dtype=dtype).reshape(shape)
            self.values[ins.results[0]] = value
        elif opcode == Opcode.STREAM_GRADIENT:
            gradient = self._logical(ins.operands[0])
            self.gradients.append((ins.attrs["name"], ins.attrs.get("perm"), gradient))
        elif opcode == Opcode.FREE:
            for register in ins.operands:
                self.arrived.pop(register, None)
                self.weight_names.pop(register, None)
                self.values[register] = None

    def _arrive(self) -> None:
        """The current layer's copies of its inputs from other layers, in the layouts the
        timing engine delivered them in."""
        self.arrived = {}
        for register, layout in self.timing.arrived.items():
            value = self.values[register]
            if isinstance(value, DistTensor):
                self.arrived[register] = value.relaid(layout)

    def _value(self, register: int) -> Value | None:
        """What ``register`` holds on the current layer's rectangle."""
        return self.arrived.get(register, self.values[register])

    def _logical(self, register: int) -> np.ndarray:
        value = self._value(register)
        if isinstance(value, DistTensor):
            return value.gather()
        assert value is not None, "register is empty"
        return value

    def _kernel(self, ins: Instruction, plan: Plan) -> None:
        held = self.timing.operands(ins)
        prepared = [
            self._prepare(r, now, want)
            for r, now, want in zip(ins.operands, held, plan.inputs, strict=True)
        ]
        try:
            outs = kernels.run(ins.name, plan, prepared, ins.attrs)
        except DataError as e:
            raise e.located(ins.location, ins.name, self.layer) from None
        for register, out in zip(ins.results, outs, strict=True):
            self.values[register] = out

    def _prepare(self, register: int, held: Held | None, want: Layout | None) -> Value:
        """Brings an operand to the layout its kernel asked for (the plan counted the cost)."""
        value = self._value(register)
        if want is None:
            assert isinstance(held, Streamed) and isinstance(value, np.ndarray)
            return value
        if isinstance(held, Resident):
            assert isinstance(value, np.ndarray)
            if held.key.startswith(CACHE_KEY):  # written in place: the system's own array
                return value
            key = (held.key, want)
            if key not in self.system.pinned:
                self.system.pinned[key] = self._pinned(register, key, value)
            return self.system.pinned[key]
        if isinstance(value, np.ndarray):  # a stream laid out on the wafer
            return DistTensor.scatter(value, want)
        assert isinstance(value, DistTensor) and isinstance(held, OnWafer)
        return value if value.layout == want else value.relaid(want)

    def _pinned(self, register: int, key: tuple[str, Layout], value: np.ndarray) -> DistTensor:
        """A weight or constant laid out on the wafer as ``key`` says: a weight as a run of
        its artifact laid it out before, if MemoryX still holds that array (``MemoryX.kept``),
        with what kernels made of it there."""
        laid_out = partial(DistTensor.scatter, value, key[1])
        name = self.weight_names.get(register)
        if name is None or self.memoryx is None:
            return laid_out()
        return self.memoryx.kept(name, key, laid_out)
