"""What a program costs on a target, on shapes alone.

``Timing`` steps through a program's instructions as a system of the target runs them, with
layouts in place of numbers: every kernel's plan (``cgc.machine.plans``) gives its cycles and
traffic, and a ledger of every PE's SRAM (``Sram``) follows every tensor's lifetime. The
simulator runs its arithmetic on top of the same engine, so what is asked here is the time and
memory a run takes.

The questions a compiler asks:

* ``layer_cost(program, index, rect, target)``: layer ``index`` alone on ``rect``, in the
  steady state of a pipelined run (its inputs from other layers arrive on the rectangle, its
  weights and constants are pinned from the first batch on): cycles by part (compute, data
  movement, arrival), FLOPs, the busiest link's load, SRAM per PE, bytes in and out;
* ``LayerCosts``: the same, remembered by what a cost depends on (the layer's signature and
  the rectangle), for searches that ask about the same layers again and again;
* ``program_costs(program, target)``: every layer of a program on its own rectangle.

A program can be a whole lowered module or one layer's work alone: a register the program
reads but never defines arrives from outside (``Program.layer_inputs``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from copy import copy as shallow_copy
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cgc.machine import plans
from cgc.machine.hardware.target import Target
from cgc.machine.movement.layout import Layout, Rect
from cgc.machine.movement.traffic import Traffic, edge_traffic
from cgc.machine.plans import RESIDENT, STREAM, WAFER, Operand, Plan
from cgc.machine.plans.kernel import held_bytes
from cgc.machine.program.bytecode import Instruction, Opcode, Program
from cgc.machine.sparse.tiles import SparseView, SparseWeight, layout_grid, resident_bytes


class SimulationError(RuntimeError):
    """The program broke a rule of the machine (an internal error: the compiler should have
    prevented it)."""


@dataclass(frozen=True)
class PinnedShare:
    """What some pins take of an SRAM ledger's cells (``Sram.pinned_share``)."""

    held: np.ndarray
    """Per cell, the bytes a PE holds now."""
    share: np.ndarray
    """Per cell, the bytes of the pins."""
    row_bytes: np.ndarray
    """Per cell, the bytes a row of the pins' tiles takes."""
    cells: list[tuple[str, Layout, tuple[slice, slice]]]
    """Each pin's key (without the prefix), layout and cells."""


class Sram:
    """One system's SRAM: the bytes every PE holds, and the weights and constants pinned in
    the layouts kernels asked for (they stay from one run of the program to the next).

    Every tensor charges the same bytes to each PE of its grid, a rectangle, so the ledger
    keeps one counter per cell of the grid that the rectangles' edges cut the mesh into: as
    exact as a counter per PE, at a cost set by how many distinct rectangles the program
    uses, not by the size of the mesh.
    """

    def __init__(self, target: Target, strict: bool = True, region: Rect | None = None):
        self.target = target
        self.strict = strict
        """Whether holding more than a PE has is an error (else it is only recorded)."""
        self.region = region or target.whole
        """The part of the mesh in use, ``(x, y, w, h)``: all of it unless a question about
        one layer needs only its rectangle."""
        x, y, w, h = self.region
        self.row_edges = [y, y + h]
        """Mesh rows where the ledger's cells start, and the end of the last one."""
        self.col_edges = [x, x + w]
        self.cells = np.zeros((1, 1), dtype=np.int64)
        """Bytes each PE of a cell holds."""
        self.spans: dict[tuple[int, int, int, int], tuple[slice, slice]] = {}
        """The cells of each rectangle asked about since the last cut."""
        self.peak = 0
        """Most bytes any PE has held."""
        self.total = 0
        self.peak_total = 0
        """Most bytes the whole mesh has held."""
        self.recent = 0
        """Most bytes any PE has held since ``restart``."""
        self.pinned: set[tuple[str, Layout, int | None]] = set()
        """The pinned weights and constants, with the bytes a PE holds if not their layouts'
        tiles' (two kernels may lay one weight out on the same PEs in tiles of their own)."""

    def held(self) -> int:
        """Most bytes any PE holds now."""
        return int(self.cells.max())

    def copy(self) -> Sram:
        """An independent copy of the ledger (its target and the layouts it holds never
        change, so they are shared): what a run's script keeps and hands back, at a cost of
        the ledger's cells, where a deep copy walks every layout."""
        twin = shallow_copy(self)
        twin.row_edges, twin.col_edges = list(self.row_edges), list(self.col_edges)
        twin.cells, twin.spans, twin.pinned = self.cells.copy(), dict(self.spans), set(self.pinned)
        return twin

    def restart(self) -> int:
        """Starts ``recent`` afresh from what the PEs hold now; returns that."""
        self.recent = self.held()
        return self.recent

    def _cut(self, edges: list[int], at: int, axis: int) -> int:
        """The index of the cell edge at mesh row (or column) ``at``, cutting a cell in two
        there if no edge is there yet."""
        index = bisect.bisect_left(edges, at)
        if index < len(edges) and edges[index] == at:
            return index
        assert 0 < index < len(edges), (at, edges)
        edges.insert(index, at)
        # the cell before the edge twice (one concatenation: np.insert costs several times more)
        before, after = [slice(None), slice(None)], [slice(None), slice(None)]
        before[axis], after[axis] = slice(index), slice(index - 1, None)
        self.cells = np.concatenate((self.cells[tuple(before)], self.cells[tuple(after)]), axis)
        self.spans.clear()  # the cells after the cut moved
        return index

    def _pes(self, layout: Layout) -> np.ndarray:
        """The SRAM counters of the cells ``layout``'s PEs make up."""
        place = (layout.row0, layout.h, layout.col0, layout.w)
        if place not in self.spans:
            top = self._cut(self.row_edges, layout.row0, 0)
            bottom = self._cut(self.row_edges, layout.row0 + layout.h, 0)
            left = self._cut(self.col_edges, layout.col0, 1)
            right = self._cut(self.col_edges, layout.col0 + layout.w, 1)
            self.spans[place] = (slice(top, bottom), slice(left, right))
        return self.cells[self.spans[place]]

    def allocate(self, layout: Layout, tile_bytes: int | None = None) -> None:
        """Charges ``layout``'s tiles to its PEs (``tile_bytes`` each: its tiles' bytes, or
        the most a PE holds of a sparse weight)."""
        self._charge(layout, tile_bytes)

    def _charge(self, layout: Layout, tile_bytes: int | None) -> None:
        nbytes = layout.tile_bytes if tile_bytes is None else tile_bytes
        region = self._pes(layout)
        region += nbytes
        self.total += nbytes * layout.pes
        self.peak_total = max(self.peak_total, self.total)
        self._check(layout, int(region.max()))

    def release(self, layout: Layout) -> None:
        """Returns ``layout``'s tiles to the free SRAM."""
        self._pes(layout)[...] -= layout.tile_bytes
        self.total -= layout.tile_bytes * layout.pes

    def transient(self, layout: Layout, nbytes: int) -> None:
        """Checks that ``layout``'s PEs have room for ``nbytes`` of scratch right now."""
        self._check(layout, int(self._pes(layout).max()) + nbytes)

    def pin(self, key: str, layout: Layout, tile_bytes: int | None = None) -> None:
        """Keeps weight or constant ``key`` in ``layout`` for good (once)."""
        if (key, layout, tile_bytes) not in self.pinned:
            self.pinned.add((key, layout, tile_bytes))
            self._charge(layout, tile_bytes)

    def pinned_share(self, prefix: str) -> PinnedShare:
        """What the pins whose keys start with ``prefix`` (a generation's key-value caches)
        take of every cell of the ledger."""
        pins = [pin for pin in self.pinned if pin[0].startswith(prefix)]
        for _, layout, _ in pins:  # every edge cut first, so that no cell moves below
            self._pes(layout)
        share, row = np.zeros_like(self.cells), np.zeros_like(self.cells)
        cells = []
        for key, layout, nbytes in pins:
            span = self.spans[(layout.row0, layout.h, layout.col0, layout.w)]
            tile = layout.tile_bytes if nbytes is None else nbytes
            share[span] += tile
            row[span] += tile // max(layout.rt, 1)
            cells.append((key[len(prefix) :], layout, span))
        return PinnedShare(self.cells, share, row, cells)

    def _check(self, layout: Layout, used: int) -> None:
        self.peak = max(self.peak, used)
        self.recent = max(self.recent, used)
        if self.strict and used > self.target.sram_bytes_per_pe:
            raise SimulationError(
                f"PE SRAM overflow: {used} bytes needed on the grid at row {layout.row0}, "
                f"column {layout.col0}; {self.target.sram_bytes_per_pe} available"
            )


class RecordedSram(Sram):
    """A ledger that also keeps its allocations, releases and scratch checks in order (not
    its pins), to play them again on a ledger that holds every pin from the start."""

    def __init__(self, target: Target, strict: bool = True, region: Rect | None = None):
        super().__init__(target, strict, region)
        self.events: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def allocate(self, layout: Layout, tile_bytes: int | None = None) -> None:
        self.events.append((Sram.allocate, (layout, tile_bytes)))
        super().allocate(layout, tile_bytes)

    def release(self, layout: Layout) -> None:
        self.events.append((Sram.release, (layout,)))
        super().release(layout)

    def transient(self, layout: Layout, nbytes: int) -> None:
        self.events.append((Sram.transient, (layout, nbytes)))
        super().transient(layout, nbytes)

    def replay(self, other: Sram) -> None:
        """Makes ``other`` allocate, release and check what this ledger did, in order."""
        for method, args in self.events:
            method(other, *args)


@dataclass(frozen=True)
class OnWafer:
    """A tensor on the wafer, in a layout."""

    layout: Layout


CACHE_KEY = "cache:"
"""The prefix of a key-value cache's key among the resident tensors."""


@dataclass(frozen=True)
class Resident:
    """A weight, constant or key-value cache kept on the wafer; a kernel lays it out where
    it wants it (a cache's ``key`` starts with ``CACHE_KEY``)."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    sparse: SparseWeight | None = None
    """A sparse weight: it keeps its live values (``sparse_tiles.resident_bytes``)."""


@dataclass(frozen=True)
class Streamed:
    """A weight arriving from MemoryX through the wafer's edge."""

    shape: tuple[int, ...]
    dtype: str
    sparse: SparseView | None = None


Held = OnWafer | Resident | Streamed


@dataclass
class LayerRecord:
    """What one layer did on one system for one run of the program."""

    name: str
    cycles: float = 0.0
    compute_cycles: float = 0.0
    """The part of ``cycles`` spent on arithmetic."""
    arrival_cycles: float = 0.0
    """The part spent bringing operands where the kernels need them: inputs from the host
    and weights from MemoryX entering through the edge, tensors relaid."""
    flops: float = 0.0
    fmacs: float = 0.0
    wavelet_hops: float = 0.0
    link_wavelets: float = 0.0
    """Wavelets on the busiest link of each step, summed over the steps (they run one after
    another)."""
    stream_in_bytes: float = 0.0
    stream_out_bytes: float = 0.0
    host_in_bytes: float = 0.0
    host_out_bytes: float = 0.0

    @property
    def movement_cycles(self) -> float:
        """The rest of ``cycles``: data movement that the arithmetic does not hide
        (broadcasts, reductions, gathers, results leaving through the edge)."""
        return self.cycles - self.compute_cycles - self.arrival_cycles

    def add(self, cost: plans.Cost) -> None:
        """Adds one kernel's cost."""
        self.cycles += cost.cycles
        self.compute_cycles += cost.compute_cycles
        self.arrival_cycles += cost.arrival_cycles
        self.flops += cost.flops
        self.fmacs += cost.fmacs
        self.wavelet_hops += cost.traffic.wavelet_hops
        self.link_wavelets += cost.traffic.max_link

    def transfer(self, traffic: Traffic, arriving: bool) -> None:
        """Adds a transfer through the edge."""
        self.cycles += traffic.cycles
        if arriving:
            self.arrival_cycles += traffic.cycles
        self.wavelet_hops += traffic.wavelet_hops
        self.link_wavelets += traffic.max_link


class Timing:
    """One run of a program on one system, on shapes: where every register's tensor is, what
    every layer costs, what every PE holds.

    ``deliver`` (pipelined mode): a layer's inputs from other layers arrive on its rectangle
    in their default folded layout there (every sample's rows over the mesh rows, as the
    kernels that fold keep them), over routes whose cost the pipeline's timing counts.
    """

    def __init__(
        self,
        program: Program,
        target: Target,
        sram: Sram,
        deliver: bool = False,
    ):
        self.program = program
        self.target = target
        self.sram = sram
        self.deliver = deliver
        self.held: list[Held | None] = [None] * len(program.registers)
        self.arrived: dict[int, Layout] = {}
        """The current layer's copies of its inputs (when delivering)."""
        self.records: list[LayerRecord] = []
        self.rect: Rect = target.whole
        self.unsent: set[int] = set()
        """Registers of sparse weights streamed in whose bytes are not counted yet."""

    @property
    def record(self) -> LayerRecord:
        """The record of the layer running now."""
        if not self.records:
            self.records.append(LayerRecord("<program>"))
        return self.records[-1]

    def step(self, ins: Instruction) -> Plan | Layout | None:
        """Accounts for one instruction. Returns a kernel's plan, and for instructions that
        move a tensor through the edge (input, output, gradient) its layout there."""
        try:
            if ins.is_kernel:
                return self._kernel(ins)
            return self._HANDLERS[Opcode(ins.opcode)](self, ins)
        except SimulationError as e:
            node = f" (node {ins.location})" if ins.location else ""
            raise SimulationError(f"layer '{self.record.name}', {ins.name}{node}: {e}") from None

    def enter_layer(self, index: int, rect: Rect) -> None:
        """Starts layer ``index`` on ``rect``; when delivering, each input from another layer
        arrives in its default folded layout on ``rect``."""
        for copy in self.arrived.values():
            self.sram.release(copy)
        self.arrived = {}
        self.rect = rect
        self.records.append(LayerRecord(self.program.layers[index].name))
        if not self.deliver:
            return
        for register in self.program.layer_inputs[index]:
            if isinstance(self.held[register], Resident | Streamed):
                continue
            shape, dtype = self.program.registers[register]
            self.arrived[register] = Layout.on(shape, dtype, rect, fold=True)
            self.sram.allocate(self.arrived[register])

    def now(self, register: int) -> Held | None:
        """What ``register`` holds on the current layer's rectangle."""
        if register in self.arrived:
            return OnWafer(self.arrived[register])
        return self.held[register]

    def _default(self, register: int) -> Layout:
        shape, dtype = self.program.registers[register]
        return Layout.on(shape, dtype, self.rect)

    def _store(self, register: int, held: Held) -> None:
        self.held[register] = held
        if isinstance(held, OnWafer):
            self.sram.allocate(held.layout)

    def _prepare(
        self, held: Held | None, want: Layout | None, tile: tuple[int, int] | None = None
    ) -> None:
        """Brings an operand to the layout a kernel asked for: a resident value is pinned
        there (once), each PE of the layout's grid holding ``tile`` of its matrices where the
        kernel lays it out its own way (``Plan.resident_tiles``); moving the others costs
        what the plan counted."""
        if isinstance(held, Resident):
            assert want is not None
            nbytes = None if tile is None else held_bytes(want, tile)
            if held.sparse is not None:
                rt, ct = tile or (want.rt, want.ct)
                grid = layout_grid(want.shape, want.rows, want.cols, rt, ct)
                nbytes = resident_bytes(held.sparse.live, grid, want.dtype)
            self.sram.pin(held.key, want, nbytes)

    def _leaving(self, register: int) -> Layout:
        """The layout in which ``register``'s tensor leaves through the edge."""
        held = self.now(register)
        if isinstance(held, OnWafer):
            return held.layout
        layout = self._default(register)
        self._prepare(held, layout)
        return layout

    def _layer(self, ins: Instruction) -> None:
        index = ins.attrs["layer"]
        self.enter_layer(index, self.program.layers[index].rect)

    def _input(self, ins: Instruction) -> Layout:
        layout = self._default(ins.results[0])
        self.record.transfer(edge_traffic(layout, inbound=True), arriving=True)
        self.record.host_in_bytes += self.program.tensor_bytes(ins.results[0])
        self._store(ins.results[0], OnWafer(layout))
        return layout

    def _send(self, register: int) -> Layout:
        """``register``'s tensor leaving through the edge; the layout it leaves in."""
        layout = self._leaving(register)
        self.record.transfer(edge_traffic(layout, inbound=False), arriving=False)
        return layout

    def _output(self, ins: Instruction) -> Layout:
        layout = self._send(ins.operands[0])
        self.record.host_out_bytes += self.program.tensor_bytes(ins.operands[0])
        return layout

    def _weight(self, ins: Instruction) -> None:
        shape, dtype = self.program.registers[ins.results[0]]
        name, perm = ins.attrs["name"], ins.attrs.get("perm")
        key = f"{name}:{perm}" if perm else name
        self.held[ins.results[0]] = Resident(key, shape, dtype, self.program.sparse.get(name))

    def _constant(self, ins: Instruction) -> None:
        shape, dtype = self.program.registers[ins.results[0]]
        # a system may run several programs (a generation's): a constant is its program's
        key = f"const:{self.program.digest}:{ins.results[0]}"
        self.held[ins.results[0]] = Resident(key, shape, dtype)

    def _cache(self, ins: Instruction) -> None:
        shape, dtype = self.program.registers[ins.results[0]]
        self.held[ins.results[0]] = Resident(CACHE_KEY + ins.attrs["name"], shape, dtype)

    def _stream_weight(self, ins: Instruction) -> None:
        shape, dtype = self.program.registers[ins.results[0]]
        weight = self.program.sparse.get(ins.attrs["name"])
        if weight is None:
            self.record.stream_in_bytes += self.program.tensor_bytes(ins.results[0])
            self.held[ins.results[0]] = Streamed(shape, dtype)
            return
        # its bytes are those of the encoding its kernel asks for (``_count_stream``)
        perm = ins.attrs.get("perm")
        view = SparseView(weight, None if perm is None else tuple(perm))
        self.held[ins.results[0]] = Streamed(shape, dtype, view)
        self.unsent.add(ins.results[0])

    def _count_stream(self, register: int, plan: Plan | None) -> None:
        """Counts the bytes of a sparse weight's stream once, as the first kernel that reads
        it planned them (``stream_bytes``), or whole, zeros and all, if it did not."""
        self.unsent.discard(register)
        whole = self.program.tensor_bytes(register)
        self.record.stream_in_bytes += plan.detail.get("stream_bytes", whole) if plan else whole

    def _stream_gradient(self, ins: Instruction) -> Layout:
        layout = self._send(ins.operands[0])
        nbytes = self.program.tensor_bytes(ins.operands[0])
        weight = self.program.sparse.get(ins.attrs["name"])
        if weight is not None and not weight.dense_gradient:  # MemoryX knows the live places
            nbytes = nbytes * weight.live // weight.size
        self.record.stream_out_bytes += nbytes
        return layout

    def _optimizer_step(self, ins: Instruction) -> None:
        return None

    def _free(self, ins: Instruction) -> None:
        for register in ins.operands:
            if register in self.unsent:
                self._count_stream(register, None)
            copy = self.arrived.pop(register, None)
            if copy is not None:
                self.sram.release(copy)
            held = self.held[register]
            if isinstance(held, OnWafer):
                self.sram.release(held.layout)
            self.held[register] = None

    _HANDLERS = {
        Opcode.LAYER: _layer,
        Opcode.INPUT: _input,
        Opcode.OUTPUT: _output,
        Opcode.WEIGHT: _weight,
        Opcode.CONSTANT: _constant,
        Opcode.STREAM_WEIGHT: _stream_weight,
        Opcode.STREAM_GRADIENT: _stream_gradient,
        Opcode.OPTIMIZER_STEP: _optimizer_step,
        Opcode.FREE: _free,
        Opcode.CACHE: _cache,
    }

    def _kernel(self, ins: Instruction) -> Plan:
        held = [self.now(r) for r in ins.operands]
        attrs = ins.attrs
        live = self.program.sparse_gradients.get(ins.results[0]) if ins.results else None
        if live is not None and ins.name == "matmul_transpose_a":
            attrs = {**attrs, "live": live}
        plan = plans.plan(
            ins.name,
            self.target,
            self.rect,
            [_operand(h) for h in held],
            attrs,
            [self.program.registers[r] for r in ins.results],
        )
        self.record.add(plan.cost)
        for register in set(ins.operands) & self.unsent:
            self._count_stream(register, plan)
        for index, (value, want) in enumerate(zip(held, plan.inputs, strict=True)):
            self._prepare(value, want, plan.resident_tile(index))
        self.sram.transient(plan.outputs[0], plan.cost.scratch_bytes)
        for register, layout in zip(ins.results, plan.outputs, strict=True):
            self._store(register, OnWafer(layout))
        return plan


def _operand(held: Held | None) -> Operand:
    if isinstance(held, Resident):
        return Operand(held.shape, held.dtype, RESIDENT)
    if isinstance(held, Streamed):
        return Operand(held.shape, held.dtype, STREAM, sparse=held.sparse)
    assert held is not None, "operand register is empty"
    layout = held.layout
    return Operand(layout.shape, layout.dtype, WAFER, layout)


@dataclass(frozen=True)
class LayerCost:
    """One layer on one rectangle."""

    name: str
    rect: Rect
    cycles: float
    compute_cycles: float
    """The part of ``cycles`` spent on arithmetic."""
    movement_cycles: float
    """The part spent on data movement inside the rectangle that the arithmetic does not
    hide, and on results leaving through the edge."""
    arrival_cycles: float
    """The part spent bringing operands where the kernels need them (host inputs and
    streamed weights entering through the edge, tensors relaid)."""
    flops: float
    link_wavelets: float
    """Wavelets on the busiest link of each step, summed over the layer's steps."""
    wavelet_hops: float
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


def _run_layer(
    program: Program,
    target: Target,
    index: int,
    rect: Rect,
    sram: Sram,
) -> Timing:
    """Layer ``index``'s instructions alone on ``rect``, its inputs delivered there."""
    timing = Timing(program, target, sram, deliver=True)
    timing.enter_layer(index, rect)
    for position in program.layer_spans[index][1:]:
        timing.step(program.instructions[position])
    return timing


def layer_cost(program: Program, index: int, rect: Rect, target: Target) -> LayerCost:
    """Layer ``index`` of ``program`` alone on ``rect``; its inputs from other layers arrive
    in their default folded layout there, as in a pipelined run.

    The memory is the steady state of a run: every weight and constant the layer lays out
    stays pinned on its PEs from the first batch on, so a first pass finds them and its
    allocations are played again on a ledger that starts with them all in place.
    """
    first = RecordedSram(target, False, rect)
    timing = _run_layer(program, target, index, rect, first)
    warm = Sram(target, strict=False, region=rect)
    for key, layout, nbytes in first.pinned:
        warm.pin(key, layout, nbytes)
    # the timing never reads the ledger: a second run would differ only in its pins
    first.replay(warm)
    record = timing.records[-1]
    weight_bytes = sum(
        program.tensor_bytes(ins.results[0])
        for ins in (program.instructions[p] for p in program.layer_spans[index])
        if ins.opcode in (Opcode.WEIGHT, Opcode.STREAM_WEIGHT)
    )
    activation_in, activation_out = program.activation_bytes(index)
    return LayerCost(
        name=record.name,
        rect=rect,
        cycles=record.cycles,
        compute_cycles=record.compute_cycles,
        movement_cycles=record.movement_cycles,
        arrival_cycles=record.arrival_cycles,
        flops=record.flops,
        link_wavelets=record.link_wavelets,
        wavelet_hops=record.wavelet_hops,
        sram_bytes_per_pe=warm.peak,
        sram_bytes=warm.peak_total,
        weight_bytes=weight_bytes,
        stream_in_bytes=record.stream_in_bytes,
        stream_out_bytes=record.stream_out_bytes,
        host_bytes=record.host_in_bytes + record.host_out_bytes,
        activation_in_bytes=activation_in,
        activation_out_bytes=activation_out,
    )


class LayerCosts:
    """``layer_cost`` remembered by layer signature and rectangle: the layers of a deep model
    repeat a few structures, and a placement asks about the same rectangles again."""

    def __init__(self, target: Target):
        self.target = target
        self.known: dict[tuple[object, ...], LayerCost] = {}

    def __call__(self, program: Program, index: int, rect: Sequence[int]) -> LayerCost:
        x, y, w, h = rect
        key = (program.layer_signatures[index], x, y, w, h)
        if key not in self.known:
            self.known[key] = layer_cost(program, index, (x, y, w, h), self.target)
        name = program.layers[index].name
        cost = self.known[key]
        return cost if cost.name == name else replace(cost, name=name)


def program_costs(program: Program, target: Target) -> list[LayerCost]:
    """Every layer of ``program`` on the rectangle it was given."""
    costs = LayerCosts(target)
    return [costs(program, i, layer.rect) for i, layer in enumerate(program.layers)]


@dataclass(frozen=True)
class Peak:
    """The most SRAM a PE holds over a program's runs, and where."""

    bytes_per_pe: int
    layer: str
    """The layer that was running when a PE first held that much."""


@dataclass(frozen=True)
class LayerSram:
    """What the busiest PE holds around one layer of a program."""

    name: str
    held: int
    """Bytes held as the layer starts (what earlier layers left for later ones)."""
    peak: int
    """The most bytes held while it runs."""


@dataclass(frozen=True)
class Profile:
    """A program's SRAM over a run, layer by layer, and its layers' records."""

    peak: Peak
    layers: list[LayerSram]
    records: list[LayerRecord]


def profile(program: Program, target: Target, deliver: bool = False) -> Profile:
    """The SRAM of ``program`` run twice on one system (the second run finds the first's
    weights and constants pinned, as every later run does), without stopping at the target's
    limit, and the second run's layers; ``deliver`` as for a pipelined run (``Timing``)."""
    sram = Sram(target, strict=False)
    peak = Peak(0, "")
    layers: list[LayerSram] = []
    timing = Timing(program, target, sram, deliver)
    for run in range(2):
        timing = Timing(program, target, sram, deliver)
        held = sram.restart()
        for ins in program.instructions:
            if ins.opcode == Opcode.LAYER and timing.records:
                layers.append(LayerSram(timing.record.name, held, sram.recent))
                held = sram.restart()
            timing.step(ins)
            if sram.peak > peak.bytes_per_pe:
                peak = Peak(sram.peak, timing.record.name)
        if timing.records:
            layers.append(LayerSram(timing.record.name, held, sram.recent))
        if run == 0:
            layers.clear()
    return Profile(peak, layers, timing.records)


def program_peak(program: Program, target: Target, deliver: bool = False) -> Peak:
    """The peak SRAM per PE of ``program`` in the steady state of its runs (``profile``)."""
    return profile(program, target, deliver).peak
