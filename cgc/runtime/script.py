"""The timing engine's answers to a run of a program, kept to replay on the runs after it.

A run's timing depends on the program, the target and what its system's SRAM held when it
began, never on the numbers. A run that begins where an earlier run of the program began
(a fresh system's empty SRAM, as every ``cgc.run`` makes; or the steady state of a system
that has run the program before: every weight and constant pinned, every tensor freed) makes
the same answers and leaves the SRAM as that run did: the VM replays them (``Replay``) and
takes the SRAM the run left, instead of accounting for every instruction again
(``Recording``, the engine itself with its answers written down). Timing-only runs and runs
with numbers alike.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

from cgc.machine.hardware.target import Target
from cgc.machine.movement.layout import Layout
from cgc.machine.plans import Plan
from cgc.machine.program.bytecode import Instruction, Opcode, Program
from cgc.machine.timing.cost import Held, LayerRecord, Sram, Timing

Answer = Plan | Layout | None
"""What the timing engine says about one instruction (``Timing.step``)."""


@dataclass(frozen=True)
class Script:
    """Every answer of a run of a program from SRAM state ``start``: per instruction, the
    engine's answer and (kernels) where each operand was; per layer, where its inputs
    arrived; and the SRAM the run left (None if it left it as it found it)."""

    target: Target
    deliver: bool
    start: tuple
    answers: tuple[Answer, ...]
    held: tuple[tuple[Held | None, ...], ...]
    """Per kernel, in program order."""
    arrivals: tuple[dict[int, Layout], ...]
    """Per layer instruction, in program order."""
    records: tuple[LayerRecord, ...]
    end: Sram | None

    def sram(self, now: Sram) -> Sram:
        """The SRAM after a replay of the run on ``now`` (its start state)."""
        return now if self.end is None else self.end.copy()


KEPT = 6
"""Scripts kept per program: a fresh system's, its second run's (which may raise the SRAM's
peak) and a steady one's, for two targets or modes."""

_SCRIPTS: dict[int, list[Script]] = {}
"""Scripts by the id of their program, while it lives."""


def _scripts(program: Program) -> list[Script]:
    key = id(program)
    if key not in _SCRIPTS:
        _SCRIPTS[key] = []
        weakref.finalize(program, _SCRIPTS.pop, key, None)
    return _SCRIPTS[key]


def _state(sram: Sram) -> tuple:
    """Everything of an SRAM that a run's answers or the SRAM it leaves depend on."""
    cells = (tuple(sram.row_edges), tuple(sram.col_edges), sram.cells.tobytes())
    figures = (sram.total, sram.peak, sram.peak_total, sram.recent)
    return (sram.strict, sram.region, *cells, *figures, frozenset(sram.pinned))


def script_for(program: Program, target: Target, deliver: bool, sram: Sram) -> Script | None:
    """A script of ``program`` that a run from ``sram`` as it is now can replay."""
    state = _state(sram)
    for script in _scripts(program):
        if script.deliver == deliver and script.target == target and script.start == state:
            return script
    return None


class Recording:
    """The timing engine on a run, its answers written down."""

    def __init__(self, program: Program, timing: Timing):
        self.program = program
        self.engine = timing
        self.start = _state(timing.sram)
        self.answers: list[Answer] = []
        self.held: list[tuple[Held | None, ...]] = []
        self.arrivals: list[dict[int, Layout]] = []

    @property
    def arrived(self) -> dict[int, Layout]:
        """The current layer's copies of its inputs (when delivering)."""
        return self.engine.arrived

    @property
    def records(self) -> list[LayerRecord]:
        """What every layer did."""
        return self.engine.records

    def step(self, ins: Instruction) -> Answer:
        """Accounts for one instruction (``Timing.step``)."""
        answer = self.engine.step(ins)
        self.answers.append(answer)
        if ins.is_kernel:
            self.held.append(self.operands(ins))
        elif ins.opcode == Opcode.LAYER:
            self.arrivals.append(dict(self.engine.arrived))
        return answer

    def operands(self, ins: Instruction) -> tuple[Held | None, ...]:
        """Where each operand of the kernel just stepped is."""
        return tuple(self.engine.now(r) for r in ins.operands)

    def keep(self) -> None:
        """Keeps the finished run's answers for the runs of the program that begin alike."""
        sram = self.engine.sram
        scripts = _scripts(self.program)
        scripts.append(
            Script(
                self.engine.target,
                self.engine.deliver,
                self.start,
                tuple(self.answers),
                tuple(self.held),
                tuple(self.arrivals),
                tuple(replace(r) for r in self.engine.records),
                None if _state(sram) == self.start else sram.copy(),
            )
        )
        del scripts[:-KEPT]


class Replay:
    """A recorded run's answers, given again in order."""

    def __init__(self, script: Script):
        self.script = script
        self.records: list[LayerRecord] = [replace(r) for r in script.records]
        self.arrived: dict[int, Layout] = {}
        self._answers = iter(script.answers)
        self._held = iter(script.held)
        self._arrivals = iter(script.arrivals)
        self._operands: tuple[Held | None, ...] = ()

    def step(self, ins: Instruction) -> Answer:
        """The answer for the next instruction, ``ins``."""
        if ins.is_kernel:
            self._operands = next(self._held)
        elif ins.opcode == Opcode.LAYER:
            self.arrived = next(self._arrivals)
        return next(self._answers)

    def operands(self, ins: Instruction) -> tuple[Held | None, ...]:
        """Where each operand of the kernel just stepped is."""
        return self._operands
