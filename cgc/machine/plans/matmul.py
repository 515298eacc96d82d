"""The plans of matmul (SUMMA, split-K SUMMA, MeshGEMM or, for a resident B, the
weight-streaming kernel on its own layout of B and, for a one-row result, MeshGEMV, whichever
is sooner; the weight-streaming kernel when B streams in from MemoryX) and of the weight
gradient's ``a^T @ b`` (their sparse forms: ``plans.sparse``; MeshGEMM: ``plans.meshgemm``;
MeshGEMV: ``plans.gemv``).

SUMMA: A keeps its columns split over the PE columns and B its rows over the PE rows; step
``s`` broadcasts the ``s``-th block of the contraction (the finer of the two splits) of A along
the rows and of B down the columns, then every PE multiply-accumulates. Each step's blocks come
from a new root, and a PE double-buffers them (two colors a dimension, as the SDK's SUMMA): a
step takes its arithmetic or its blocks through the PE's ramp, whichever is longer, plus the
broadcast's flight across the grid, which near full wafer is most of it (WaferLLM measured
SUMMA below half of peak there). On a rectangle at least twice as tall as the result's rows,
the contraction may split over groups of rows instead.
Weight streaming: each column receives its rows of B from the north edge and multicasts them
down; every PE forms partial sums that a chain reduction along the row lands in the output
layout. A resident B can stream the same way from inside its columns: its holders send ahead
of need, so the flight SUMMA pays for every panel of steps is paid once.

Where B is one matrix (a linear layer's weights, a convolution's filters), A and the result are
folded: the rows of all of A's matrices are one matrix's, split over the mesh rows together.
A batched B (attention's scores) keeps the batch of matrices, and a folded A is relaid.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil, prod

from cgc.machine.hardware.target import WAVELET_BYTES, Target
from cgc.machine.movement.layout import Layout, Rect, grid_extent
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic
from cgc.machine.plans.gemv import gemv_applies, plan_gemv
from cgc.machine.plans.kernel import (
    RESIDENT,
    STREAM,
    Cost,
    Kernel,
    Operand,
    Plan,
    PlanRequest,
    arrival,
    binding,
    block_words,
    row_chain,
    row_multicast,
    sequential_cycles,
)
from cgc.machine.plans.meshgemm import plan_meshgemm
from cgc.machine.plans.sparse import sampled, sparse_streaming


class Matmul(Kernel):
    """SUMMA and its rivals, or the weight-streaming kernel when B arrives from MemoryX."""

    def plan(self, q: PlanRequest) -> Plan:
        a, b = q.operands
        ((shape, dtype),) = q.results
        # an unbatched B (a linear layer's weights): the rows of A's every matrix are one
        # matrix's, and A and the result fold, all their rows over the mesh rows
        out = Layout.on(shape, dtype, q.rect, fold=prod(b.shape[:-2]) == 1)
        k = a.shape[-1]
        nb_out = prod(shape[:-2])
        flops = 2.0 * nb_out * shape[-2] * shape[-1] * k
        if b.source == STREAM and b.sparse is not None:
            sparse = sparse_streaming(q.target, q.rect, a, b.sparse, b, out, flops)
            dense = self._plan_streaming(q.target, q.rect, a, b, out, flops)
            if dense.cost.cycles < sparse.cost.cycles:  # zeros and all: the live FLOPs
                return replace(dense, cost=replace(dense.cost, flops=sparse.cost.flops))
            return sparse
        if b.source == STREAM:
            return self._plan_streaming(q.target, q.rect, a, b, out, flops)
        rivals = []
        if q.rect[3] >= 2 * out.h and k >= 2:
            rivals.append(self._plan_split_k(q, a, b, out, flops))
        if b.source == RESIDENT:
            rivals.append(self._plan_resident_stream(q, a, b, out, flops))
        if gemv_applies(out, b):
            rivals.append(plan_gemv(q, a, b, out.fold, flops))
        summa = self._plan_summa(q, a, b, out, flops)

        def soonest(plan: Plan) -> tuple[int, float]:
            """Fits the PEs' SRAM (else overflows least), then fewest cycles."""
            return sram_overflow(plan, q.target), plan.cost.cycles

        # MeshGEMM's operands' arrival is counted only where it might still win without it
        best = min(soonest(plan) for plan in (summa, *rivals))
        bound = plan_meshgemm(q, a, b, out.fold, flops, arrive=False)
        mesh = [plan_meshgemm(q, a, b, out.fold, flops)] if soonest(bound) <= best else []
        # SUMMA on a tie, then MeshGEMM
        return min((summa, *mesh, *rivals), key=soonest)

    @staticmethod
    def _plan_summa(q: PlanRequest, a: Operand, b: Operand, out: Layout, flops: float) -> Plan:
        ((_, dtype),) = q.results
        k = a.shape[-1]
        nb_out = prod(out.batch)
        # a step takes the finer of the two operands' blocks of the contraction
        a_at, b_at = _as_arrived(q, a, b, out)
        mt, kb, nt = out.rt, min(a_at.ct, b_at.rt), out.ct
        steps = ceil(k / kb)
        step_fmacs = nb_out * mt * kb * nt
        compute = step_fmacs / q.target.fmacs(dtype)
        a_words, b_words = block_words(a_at, b_at, mt, kb, nt)
        # a block of A crosses every column that holds A or the result, one of B every row
        across, down = max(out.w, a_at.w), max(out.h, b_at.h)
        broadcast = _block_broadcast(steps, a_words, b_words, out, across, down)
        arrive = sequential_cycles(arrival(a, a_at), arrival(b, b_at))
        panels = _panels(steps, a_words + b_words, q.target, (a_at, b_at, out))
        # every panel waits for its blocks from new roots, across the grid
        flight = max(across, down) - 1
        cost = Cost(
            cycles=arrive
            + panels.cycles(steps, compute, a_words * (across > 1), b_words * (down > 1), flight),
            flops=flops,
            fmacs=steps * step_fmacs * out.pes,
            traffic=arrival(a, a_at) + arrival(b, b_at) + broadcast,
            scratch_bytes=panels.scratch_bytes,
            compute_cycles=steps * compute,
            arrival_cycles=arrive,
        )
        terms = {
            "arrival": arrive,
            **panels.terms(steps, compute, a_words * (across > 1), b_words * (down > 1), flight),
        }
        detail = {"algorithm": "summa", "steps": steps, "binds": binding(terms)}
        return Plan((a_at, b_at), (out,), cost, detail)

    @staticmethod
    def _plan_split_k(q: PlanRequest, a: Operand, b: Operand, out: Layout, flops: float) -> Plan:
        """SUMMA with the contraction split over groups of mesh rows, for a rectangle taller
        than the result's rows: B's rows spread over the whole height, each group of ``out.h``
        rows holds a slice of them. A's columns of each slice stream down its PE column from
        the top group to the group that needs them while the groups run their SUMMA steps on
        the slices that have arrived; the groups' partial products then sum up the columns,
        group by group, into the top group, where the result stays."""
        ((_, dtype),) = q.results
        a_at, b_at = _as_arrived(q, a, b, out)
        rows = out.h
        groups = ceil(b_at.h / rows)
        mt, kb, nt = out.rt, b_at.rt, out.ct
        nb_out = prod(out.batch)
        step_fmacs = nb_out * mt * kb * nt
        compute = step_fmacs / q.target.fmacs(dtype)
        a_words, b_words = block_words(a_at, b_at, mt, kb, nt)
        partial_words = out.tile_elements * out.words_per_element
        steps = ceil(b_at.h / groups)
        panels = _panels(steps, a_words + b_words, q.target, (a_at, b_at, out))
        flight = max(out.w, rows) - 1
        group_cycles = panels.cycles(
            steps, compute, a_words * (out.w > 1), b_words * (rows > 1), flight
        )
        # every column's block of A leaves the top group for the groups holding its slice
        column_words = a_at.h * a_at.tile_elements * a_at.words_per_element
        descent = Traffic(
            column_words * a_at.w * (groups - 1) * rows,
            column_words,
            a_at.tile_elements * a_at.words_per_element,
            a_at.tile_elements * a_at.words_per_element,
            (groups - 1) * rows,
        )
        broadcast = _block_broadcast(steps, a_words, b_words, out, out.w, rows, groups)
        # partial products climb group by group; each boundary carries a column's tiles
        ascent = Traffic(
            partial_words * rows * out.w * (groups - 1) * rows,
            partial_words * rows,
            partial_words,
            partial_words,
            (groups - 1) * rows,
        )
        combine = (groups - 1) * out.tile_elements / q.target.fmacs(dtype)
        arrive = sequential_cycles(arrival(a, a_at), arrival(b, b_at))
        cycles = (
            arrive
            + max(descent.max_link, group_cycles)
            + descent.max_hops
            + max(ascent.max_link, combine)
            + ascent.max_hops
        )
        cost = Cost(
            cycles=cycles,
            flops=flops,
            fmacs=steps * step_fmacs * groups * rows * out.w,
            traffic=arrival(a, a_at) + arrival(b, b_at) + descent + broadcast + ascent,
            scratch_bytes=(a_at.tile_elements + out.tile_elements) * out.itemsize
            + panels.scratch_bytes,
            compute_cycles=steps * compute,
            arrival_cycles=arrive,
        )
        detail = {"algorithm": "summa-split-k", "steps": steps, "groups": groups}
        return Plan((a_at, b_at), (out,), cost, detail)

    @staticmethod
    def _plan_streaming(
        target: Target, rect: Rect, a: Operand, b: Operand, out: Layout, flops: float
    ) -> Plan:
        """The weight-streaming kernel: each PE column's rows of B arrive from the north
        edge, chunk after chunk, and stream down the column."""
        chunks = _Chunks.of(target, rect, a, b, out)
        ingress = Traffic(
            chunks.count * chunks.weight_words * chunks.a_at.w * out.h,
            chunks.count * chunks.weight_words,
            chunks.count * chunks.weight_words,
            chunks.count * chunks.weight_words,
            out.h,
        )
        cost = chunks.cost(arrival(a, chunks.a_at), ingress, chunks.weight_words, flops, edge=True)
        binds = chunks.binds(cost, chunks.weight_words)
        detail = {"algorithm": "stream", "steps": chunks.count, "binds": binds}
        return Plan((chunks.a_at, None), (out,), cost, detail)

    @staticmethod
    def _plan_resident_stream(
        q: PlanRequest, a: Operand, b: Operand, out: Layout, flops: float
    ) -> Plan:
        """The weight-streaming kernel on a resident B: every PE column keeps its rows of B
        (its block of the contraction), their chunks in runs of ``per`` down the column's
        PEs from the top (``_owners``). Chunk by chunk, the PE that holds it multicasts it up
        and down its column, every PE multiply-accumulates it as the streaming kernel does,
        and the same chain along the rows lands the partial sums. Nothing crosses the edge.

        Why it is faithful: a weight is static, so its holders need not wait for the
        arithmetic to ask for it. They send in the order of the chunks, each run's holder
        starting when the previous run's last wavelet passes it (it receives every chunk
        too), and flow control holds the wavelets in the routers' queues until a PE takes
        them in; the column is a pipeline whose flight (``out.h - 1`` hops) is paid once,
        and each hand-over from a holder to the next one down costs the PEs above it at most
        two hops of gap. Every PE receives every chunk through its ramp (a holder's own
        chunks come back to it, so that all PEs run the same program on one input); a
        holder sends its run through its ramp out, which moves a wavelet a cycle beside the
        ramp in, as ``Traffic`` counts them. It assumes, as the SDK's broadcasts do, that the
        routers switch a column's color from one holder to the next (control wavelets), and
        one row of receive buffer per PE, as the weight-streaming kernel."""
        chunks = _Chunks.of(q.target, q.rect, a, b, out)
        per, owners = _owners(chunks.count, out.h)
        weights, ramp = _column_multicast(chunks, out.h, per, owners)
        cost = chunks.cost(arrival(a, chunks.a_at), weights, ramp / chunks.count, flops, edge=False)
        b_at = Layout(b.shape, b.dtype, out.row0, out.col0, owners, chunks.a_at.w)
        binds = chunks.binds(cost, ramp / chunks.count)
        return Plan(
            (chunks.a_at, b_at),
            (out,),
            cost,
            {"algorithm": "stream-resident", "steps": chunks.count, "binds": binds},
            (None, (chunks.kb, per * chunks.nt)),
        )


def _owners(chunks: int, rows: int) -> tuple[int, int]:
    """How a column's ``chunks`` of resident weights spread over its ``rows`` PEs: runs of
    ``per`` consecutive chunks from the top, on ``owners`` PEs. The fewest chunks on the
    busiest PE, as chunk ``c`` on row ``c mod rows`` would give, but the holders hand over
    to their neighbours only, where the cyclic order would hand over from the bottom back
    to the top, a column's flight, once a round."""
    per = ceil(chunks / rows)
    return per, ceil(chunks / per)


def _column_multicast(chunks: _Chunks, rows: int, per: int, owners: int) -> tuple[Traffic, float]:
    """Every PE column's chunks of weights, in runs of ``per`` on its ``owners`` top PEs,
    each multicast up and down its ``rows``; and the cycles of the busiest PE's ramp in,
    which takes every chunk (a holder's run goes out through its ramp out at the same time)
    and waits up to two cycles at each hand-over. A chunk crosses every link of its column
    once, one way or the other; the busiest link is the last going down, which carries every
    chunk but the bottom row's."""
    if rows == 1:  # the one PE reads its chunks where it keeps them
        return NO_TRAFFIC, 0.0
    count, words = chunks.count, chunks.weight_words
    traffic = Traffic(
        count * words * (rows - 1) * chunks.a_at.w,
        min(count, (rows - 1) * per) * words,
        per * words,
        count * words,
        rows - 1,
    )
    return traffic, count * words + 2 * (owners - 1)


@dataclass(frozen=True)
class _Chunks:
    """The streaming kernel's arithmetic, wherever its weights come from: A's columns (the
    contraction) split over the PE columns of the rectangle, the result taken a chunk of its
    block columns at a time (``count``, one per PE column of the result); for each chunk
    every PE multiply-accumulates its block of A with the chunk's rows of its block of the
    contraction into a partial block, and a chain along each mesh row sums the partial
    blocks into the result's layout, overlapped with the next chunk."""

    target: Target
    a_at: Layout
    out: Layout
    weight_words: float
    """The wavelets of a chunk's rows of B that one PE column takes."""

    @classmethod
    def of(cls, target: Target, rect: Rect, a: Operand, b: Operand, out: Layout) -> _Chunks:
        a_at = Layout(
            a.shape, a.dtype, out.row0, out.col0, out.h, grid_extent(a.shape[-1], rect[2]), out.fold
        )
        words = prod(b.shape[:-2]) * a_at.ct * out.ct * out.words_per_element
        return cls(target, a_at, out, words)

    @property
    def count(self) -> int:
        return self.out.w

    @property
    def kb(self) -> int:
        """Rows of B (the contraction) per PE column."""
        return self.a_at.ct

    @property
    def nt(self) -> int:
        """Columns of B (and of the result) per chunk."""
        return self.out.ct

    @property
    def chunk_fmacs(self) -> int:
        return prod(self.out.batch) * self.out.rt * self.kb * self.nt

    @property
    def partial_words(self) -> float:
        return prod(self.out.batch) * self.out.rt * self.nt * self.out.words_per_element

    def binds(self, cost: Cost, weight_cycles: float) -> str:
        """What binds the kernel of ``cost``: of what sets the pace of its chunks (the
        arithmetic, the weights through the ramp, the partial sums along the rows), and what
        it waits for besides (the flight, the operands' arrival), the most cycles."""
        partial = self.partial_words * (self.a_at.w > 1)
        paced = {
            "arithmetic": cost.compute_cycles,
            "the weights through the ramp": self.count * weight_cycles,
            "the partial sums along the rows": self.count * partial,
        }
        rest = cost.cycles - max(paced.values())
        return binding({**paced, "the flight and the arrival": rest})

    def cost(
        self, moved: Traffic, weights: Traffic, weight_cycles: float, flops: float, edge: bool
    ) -> Cost:
        """The kernel after A's arrival (``moved``), its weights moving as ``weights`` and
        taking ``weight_cycles`` a chunk through the busiest PE's ramp; their arrival beyond
        the arithmetic counts as the operands' arrival when they come through the ``edge``,
        else as the kernel's own movement."""
        out = self.out
        compute = self.chunk_fmacs / self.target.fmacs(out.dtype)
        reduce_hops = self.a_at.w - 1
        reduction = row_chain(self.count, self.partial_words, reduce_hops, out.h)
        step = max(compute, weight_cycles, self.partial_words * (reduce_hops > 0))
        wait = self.count * (max(compute, weight_cycles) - compute) + weights.max_hops
        return Cost(
            cycles=sequential_cycles(moved)
            + self.count * step
            + weights.max_hops
            + reduction.max_hops,
            flops=flops,
            fmacs=self.count * self.chunk_fmacs * out.h * self.a_at.w,
            traffic=moved + weights + reduction,
            # a PE multiply-accumulates each weight row as it arrives: one row of buffer
            scratch_bytes=(self.nt + prod(out.batch) * out.rt * self.nt) * out.itemsize,
            compute_cycles=self.count * compute,
            arrival_cycles=moved.cycles + (wait if edge else 0.0),
        )


def sram_overflow(plan: Plan, target: Target) -> int:
    """The bytes by which a PE's tiles of the plan's operands (a resident weight's as the
    plan lays it out) and result, and its scratch, exceed its SRAM (zero if they fit)."""
    inputs = sum(plan.input_bytes(i) for i, layout in enumerate(plan.inputs) if layout)
    tiles = inputs + sum(layout.tile_bytes for layout in plan.outputs)
    return max(0, tiles + plan.cost.scratch_bytes - target.sram_bytes_per_pe)


def _as_arrived(q: PlanRequest, a: Operand, b: Operand, out: Layout) -> tuple[Layout, Layout]:
    """SUMMA's operands as they arrive: A's columns over every PE column of the rectangle,
    B's rows over every PE row, so that neither is relaid."""
    k = a.shape[-1]
    x, y, width, height = q.rect
    a_at = Layout(a.shape, a.dtype, y, x, out.h, grid_extent(k, width), out.fold)
    b_at = Layout(b.shape, b.dtype, y, x, grid_extent(k, height), out.w)
    return a_at, b_at


@dataclass(frozen=True)
class _Panels:
    """How SUMMA's steps run: ``size`` blocks of the contraction at a time, their roots
    broadcasting together so that a step's flight across the grid is paid once for them all,
    and with ``buffers`` panels in SRAM (two: the next panel arrives during this one's
    arithmetic; one: it arrives after)."""

    size: int
    buffers: int
    block_bytes: int

    @property
    def scratch_bytes(self) -> int:
        return self.buffers * self.size * self.block_bytes

    def cycles(
        self, steps: int, compute: float, a_words: float, b_words: float, flight: int
    ) -> float:
        """``steps`` steps of ``compute`` cycles whose blocks (``a_words`` and ``b_words``,
        zero for an operand that stays put) come in through a PE's one ramp."""
        words = a_words + b_words
        step = max(compute, words) if self.buffers == 2 else compute + words
        return steps * step + ceil(steps / self.size) * flight

    def terms(
        self, steps: int, compute: float, a_words: float, b_words: float, flight: int
    ) -> dict[str, float]:
        """What ``cycles`` is made of: the arithmetic and the blocks through the ramp (the
        longer sets a step's pace, or both add up with one buffer), and the panels' flight
        across the grid."""
        return {
            "arithmetic": steps * compute,
            "the blocks through the ramp": steps * (a_words + b_words),
            "the panels' flight": ceil(steps / self.size) * flight,
        }


def _panels(steps: int, block_words: float, target: Target, tiles: tuple[Layout, ...]) -> _Panels:
    """SUMMA's panels for blocks of ``block_words`` (A's and B's): each root needs colors of
    its own (static routes: two for A's blocks and two for B's, one a buffer), and two panels
    must fit in half of the SRAM that the kernel's ``tiles`` leave, the other half being for
    the layer's other tensors; where even two blocks do not, one block at a time."""
    block_bytes = ceil(block_words * WAVELET_BYTES)
    free = target.sram_bytes_per_pe - sum(t.tile_bytes for t in tiles)
    size = min(steps, target.colors // 4, free // (4 * max(1, block_bytes)))
    return _Panels(size, 2, block_bytes) if size >= 1 else _Panels(1, 1, block_bytes)


def _block_broadcast(
    steps: int, a_words: float, b_words: float, out: Layout, across: int, down: int, grids: int = 1
) -> Traffic:
    """``steps`` SUMMA steps on each of ``grids`` grids: a block of A along ``across``
    columns of each of the result's rows, one of B down ``down`` rows of each of its
    columns."""
    return Traffic(
        steps * grids * (a_words * out.h * (across - 1) + b_words * out.w * (down - 1)),
        steps * max(a_words * (across > 1), b_words * (down > 1)),
        steps * max(a_words, b_words),
        steps * (a_words + b_words),
        down - 1 + across - 1,
    )


class MatmulTransposeA(Kernel):
    """``a^T @ b`` where ``a`` ``[.., R, M]`` and ``b`` ``[.., R, N]`` share their rows (the
    tokens of a weight gradient): row ``m`` of the result at a time, the PE column that holds
    column ``m`` of ``a`` multicasts it along the mesh rows, every PE multiply-accumulates it
    with its block of ``b`` into a partial row, and the partial rows sum down the mesh columns
    to where the result keeps row ``m``; the next row's arithmetic overlaps this one's
    reduction. The contraction never leaves the rows, so nothing is transposed."""

    def plan(self, q: PlanRequest) -> Plan:
        a, b = q.operands
        ((shape, dtype),) = q.results
        out = Layout.on(shape, dtype, q.rect)
        b_at = Layout.on(b.shape, b.dtype, q.rect)
        if q.attrs.get("live") is not None:
            return sampled(q, a, out, b_at)
        a_at = Layout(
            a.shape, a.dtype, b_at.row0, b_at.col0, b_at.h, grid_extent(a.shape[-1], q.rect[2])
        )
        nb = prod(shape[:-2])
        rows, m, n = a.shape[-2], shape[-2], shape[-1]
        macs = nb * b_at.rt * b_at.ct
        compute = macs / q.target.fmacs(dtype)
        column = nb * b_at.rt * a_at.words_per_element
        partial = nb * b_at.ct * out.words_per_element
        across = row_multicast(m, column, b_at)
        down = Traffic(
            m * partial * (b_at.h - 1) * b_at.w,
            m * partial * (b_at.h > 1),
            m * partial,
            m * partial,
            b_at.h - 1,
        )
        moved = sequential_cycles(arrival(a, a_at), arrival(b, b_at))
        step = max(compute, column * (b_at.w > 1), partial * (b_at.h > 1))
        cost = Cost(
            cycles=moved + m * step + across.max_hops + down.max_hops,
            flops=2.0 * nb * rows * m * n,
            fmacs=m * macs * b_at.pes,
            traffic=arrival(a, a_at) + arrival(b, b_at) + across + down,
            scratch_bytes=(nb * b_at.rt + nb * b_at.ct) * out.itemsize,
            compute_cycles=m * compute,
            arrival_cycles=moved,
        )
        return Plan((a_at, b_at), (out,), cost, {"algorithm": "row-reduce", "steps": m})
