"""The plans of fused attention, its gradient, and rotary position embeddings.

Attention runs where its operands are: token-major ``[T, heads * d]`` tensors in their default
layout, tokens along the mesh rows (``rt`` a PE), the hidden dimension along its columns (``ct``
a PE; a head spans ``ceil(d / ct)`` PE columns). Every PE row keeps its block of queries; the
blocks of keys and values of its sample flow down the columns past it, one block a step, as a
ring attention does. At each step a PE multiplies its queries with the block's keys over its
columns (``rt * rt * ct`` multiply-accumulates), the partial scores of a head sum along the
head's columns, the softmax updates its running maximum and sum, the probabilities come back
along the head's columns, and the PE adds them times the block's values to its output. A
causal mask needs only the blocks up to the diagonal; handing each PE row early and late
blocks alike (the zig-zag order of causal ring attention) evens the rows out, so a sample of
``n`` blocks takes ``ceil((n + 1) / 2)`` steps. Each step takes the longest of its arithmetic,
the keys' and values' flow down a column and the scores' flow along a row, which overlap.

The gradient runs the same ring with five products a step instead of two (the scores again, the
probabilities' gradient, and the gradients of the queries, keys and values) and the keys',
values' and their gradients' blocks flowing. The rotary embedding is elementwise, plus the
rotated half of each head's rotary dimensions arriving from ``r / 2`` columns away.

Generation's cached attention keeps its key-value cache stationary, spread over the
rectangle as every token-major tensor is, and brings the few new queries to it
(``CachedAttention``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import ceil, prod

from cgc.machine.hardware.target import TRANSCENDENTAL_CYCLES
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC, Traffic
from cgc.machine.plans.kernel import (
    Attrs,
    Cost,
    Kernel,
    Operand,
    Plan,
    PlanRequest,
    arrival,
    multicast,
    phased_cost,
    sequential_cycles,
    vector_cycles,
)

SOFTMAX_OPS = TRANSCENDENTAL_CYCLES + 4
"""Vector cycles per score of the running softmax: the exponential, the maximum, the sum, the
rescale of the running sum, the scale of the scores."""


@dataclass(frozen=True)
class Work:
    """What a ring step does."""

    products: int
    """``rt x rt x ct`` products a PE computes."""
    kv_blocks: int
    """``rt x ct`` tiles flowing down the columns past it (keys, values, their gradients)."""
    score_passes: int
    """Blocks of scores (or their gradients) passing along a head's columns."""
    softmax_passes: float
    """Passes of the running softmax over a PE's share of the scores."""


FORWARD = Work(products=2, kv_blocks=2, score_passes=2, softmax_passes=1.0)
"""Scores and context; keys and values; the scores summed and the probabilities back."""
BACKWARD = Work(products=5, kv_blocks=4, score_passes=4, softmax_passes=1.5)
"""The scores again, the probabilities' gradient, and the gradients of the queries, keys and
values; keys, values and their gradients; scores and their gradients both ways; the softmax
again and its gradient."""


@dataclass(frozen=True)
class Ring:
    """The ring of one attention kernel on a rectangle: the layout of its operands and how
    many blocks flow past each PE row."""

    out: Layout
    d: int
    """Dimensions per head."""
    steps: int
    """Blocks a PE row takes in turn (causal: balanced)."""
    blocks: int
    """Blocks of keys per sample."""

    @classmethod
    def of(cls, q: PlanRequest) -> Ring:
        ((shape, dtype),) = q.results[:1]
        out = Layout.on(shape, dtype, q.rect)
        keys, heads = q.attrs.get("key_sequence", q.attrs["sequence"]), q.attrs["heads"]
        blocks = ceil(keys / out.rt)
        steps = blocks
        if q.attrs["causal"]:
            steps = ceil((blocks + 1) / 2)
        if window := q.attrs.get("window", 0):  # the blocks a window reaches back over
            steps = min(steps, ceil(window / out.rt) + 1)
        return cls(out, shape[-1] // heads, steps, blocks)

    @property
    def head_columns(self) -> int:
        """PE columns a head spans."""
        return ceil(self.d / self.out.ct)

    @property
    def scores(self) -> int:
        """Scores a PE's columns add to at a step: its queries against a block of keys, for
        each head it holds a part of."""
        heads_here = max(1, self.out.ct // self.d)
        return self.out.rt * self.out.rt * heads_here

    @property
    def softmax_share(self) -> int:
        """Scores whose softmax a PE computes: a head's partial scores are summed and
        scattered over its columns, each finishing a part (and gathering the rest back)."""
        return ceil(self.scores / self.head_columns)

    def flows(self, kv_blocks: int, score_passes: int) -> tuple[float, float, Traffic]:
        """Per step: the wavelets on a column link (``kv_blocks`` blocks of keys-like
        ``rt x ct`` tiles flowing down) and on a row link (``score_passes`` passes of scores
        along a head's columns), and the traffic of all the steps."""
        out = self.out
        words = out.words_per_element
        down = kv_blocks * out.rt * out.ct * words
        across = score_passes * self.scores * words if self.head_columns > 1 else 0.0
        links = down * out.w * (out.h - 1) + across * out.h * (out.w - 1)
        traffic = Traffic(
            self.steps * links,
            self.steps * max(down, across),
            self.steps * (down + across),
            self.steps * (down + across),
            (out.h - 1) + (self.head_columns - 1),
        )
        return down, across, traffic

    def cost(self, q: PlanRequest, work: Work, arrive: Traffic) -> Cost:
        """The cost of ``steps`` ring steps of ``work``."""
        out, target = self.out, q.target
        products, kv_blocks, score_passes = work.products, work.kv_blocks, work.score_passes
        macs = products * out.rt * out.rt * out.ct
        compute = macs / target.fmacs(out.dtype) + vector_cycles(
            self.softmax_share, SOFTMAX_OPS * work.softmax_passes, "float32", target
        )
        down, across, ring = self.flows(kv_blocks, score_passes)
        step = max(compute, down, across)
        flops = _flops(q.attrs, out.shape[0], out.shape[1]) * products / 2
        fill = ring.max_hops
        return Cost(
            cycles=sequential_cycles(arrive) + self.steps * step + fill,
            flops=flops,
            fmacs=self.steps * macs * out.pes,
            traffic=arrive + ring,
            scratch_bytes=_scratch(self, kv_blocks),
            compute_cycles=self.steps * compute,
            arrival_cycles=arrive.cycles,
        )


def _flops(attrs: Attrs, tokens: int, width: int) -> float:
    """Two products of ``queries x keys x d`` per sample and head, over the scores the mask
    keeps (about half with a causal mask, ``window`` a query with a sliding window)."""
    sequence = int(attrs["sequence"])
    return 4.0 * (tokens // sequence) * width * kept_scores(attrs)


def kept_scores(attrs: Attrs) -> float:
    """The scores of one sample and head that an attention's mask keeps."""
    sequence, window = int(attrs["sequence"]), int(attrs.get("window", 0))
    if not attrs["causal"]:
        return float(sequence * int(attrs.get("key_sequence", sequence)))
    if not window or window >= sequence:
        return sequence * (sequence + 1) / 2
    return window * (window + 1) / 2 + (sequence - window) * window


def _scratch(ring: Ring, kv_blocks: int) -> int:
    """Blocks in flight, a block of scores and of probabilities, and the softmax's running
    statistics and output accumulators, in float32."""
    out = ring.out
    return 4 * (kv_blocks * out.rt * out.ct + 2 * ring.scores + 2 * out.rt * out.ct)


def _arrivals(
    operands: tuple[Operand, ...], rect: tuple[int, int, int, int]
) -> tuple[tuple[Layout, ...], Traffic]:
    """Every operand in its default layout on the rectangle, and what bringing it costs."""
    layouts = tuple(Layout.on(op.shape, op.dtype, rect) for op in operands)
    arrive = sum((arrival(op, at) for op, at in zip(operands, layouts, strict=True)),
                 NO_TRAFFIC)  # fmt: skip
    return layouts, arrive


class Attention(Kernel):
    """Fused attention: two products a step, keys and values flowing down the columns."""

    def plan(self, q: PlanRequest) -> Plan:
        ring = Ring.of(q)
        layouts, arrive = _arrivals(q.operands, q.rect)
        cost = ring.cost(q, FORWARD, arrive)
        return Plan(layouts, (ring.out,), cost, {"algorithm": "ring", "steps": ring.steps})


class AttentionGrad(Kernel):
    """The gradient of fused attention: five products a step; keys, values and their
    gradients flowing; the scores and their gradients along the heads' columns."""

    def plan(self, q: PlanRequest) -> Plan:
        ring = Ring.of(q)
        layouts, arrive = _arrivals(q.operands, q.rect)
        cost = ring.cost(q, BACKWARD, arrive)
        outs = tuple(Layout.on(shape, dtype, q.rect) for shape, dtype in q.results)
        return Plan(layouts, outs, cost, {"algorithm": "ring", "steps": ring.steps})


class Rotary(Kernel):
    """Elementwise rotation; the tables multicast to every PE that holds their positions; the
    half each rotary dimension pairs with arrives from ``r / 2`` columns away."""

    def plan(self, q: PlanRequest) -> Plan:
        _, cos, _ = q.operands
        ((shape, dtype),) = q.results
        out = Layout.on(shape, dtype, q.rect)
        layouts, arrive = _arrivals(q.operands, q.rect)
        tables = _tables(out, cos)
        half = cos.shape[-1] // 2
        distance = ceil(half / out.ct)
        words = out.tile_elements * out.words_per_element
        pairing = Traffic(words * distance * out.pes, words, words, words, distance)
        traffic = arrive + tables + pairing
        compute = vector_cycles(out.tile_elements, 4.0, dtype, q.target)
        cost = phased_cost(compute, arrive, traffic, 2 * out.tile_bytes, flops=4.0 * prod(shape))
        return Plan(layouts, (out,), cost)


def _tables(out: Layout, table: Operand) -> Traffic:
    """The entries of both tables that each PE needs (its tokens' positions, its columns'
    rotary dimensions), multicast along the rows and down the columns from where they lie."""
    need = (out.rt, min(out.ct, table.shape[-1]))
    tile = Layout(need, table.dtype, out.row0, out.col0, 1, 1)
    spread = multicast(tile, out)
    return spread + spread


QUERY_BLOCK = 8
"""Queries whose scores a PE of the cached attention holds at once."""
ROW_BLOCK = 64
"""Cached rows a PE of the cached attention scores at once."""


class CachedAttention(Kernel):
    """Generation's attention on a key-value cache that stays where it is: the caches lie in
    their default layout on the rectangle, a sequence's ``capacity`` rows down the mesh rows,
    the heads' columns across. Each new token's key and value row flows down the columns to
    the PE row that holds its position; each query, repeated for its key head's columns,
    flows down the columns of its sequence's PE rows; every PE scores its cached rows against
    the queries of its sequence (``s x group x rt x ct`` products), the partial scores sum
    along a head's columns, the softmax's maximum and sum chain down the sequence's PE rows,
    and each PE's share of the context sums down them into the queries' rows; a prompt's many
    queries pass in blocks of ``QUERY_BLOCK`` and a PE's rows in blocks of ``ROW_BLOCK``, the
    softmax running over them, so a PE holds the scores of one block against one block at a
    time, whatever the prompt's or the cache's length. The cache is read whole at every step,
    masked past each query's position: the rows are spread over the PE rows, so a shorter
    context shortens no PE's work."""

    def plan(self, q: PlanRequest) -> Plan:
        _, key, _, cache, _, positions = q.operands
        ((shape, dtype),) = q.results
        out = Layout.on(shape, dtype, q.rect)
        layouts, arrive = _arrivals(q.operands, q.rect)
        held = layouts[3]
        sequences, tokens = positions.shape
        group = q.attrs["heads"] // q.attrs["kv_heads"]
        d = key.shape[1] // q.attrs["kv_heads"]
        sample_rows = ceil(cache.shape[0] // sequences / held.rt)  # a sequence's PE rows
        words = held.words_per_element
        queries = tokens * group * held.ct * words
        written = 2 * tokens * held.ct * words
        scores = tokens * group * held.rt * words if held.ct < d else 0.0
        context = tokens * group * held.ct * words
        down = queries + written + context + 2 * tokens * group * words
        flows = Traffic(
            down * held.w * (held.h - 1) + scores * held.h * (held.w - 1),
            max(down, scores),
            down + scores,
            down + scores,
            2 * min(sample_rows, held.h) + ceil(d / held.ct),
        )
        macs = 2 * tokens * group * held.rt * held.ct
        compute = macs / q.target.fmacs(dtype) + vector_cycles(
            tokens * group * held.rt, SOFTMAX_OPS, "float32", q.target
        )
        flops = 4.0 * sequences * tokens * q.attrs["heads"] * d * cache.shape[0] / sequences
        # a PE holds the scores of a block of queries against a block of its rows at a time,
        # their softmax running over the row blocks as flash attention's does
        queries, rows = min(tokens, QUERY_BLOCK), min(held.rt, ROW_BLOCK)
        scratch = 4 * (2 * queries * group * rows + 2 * queries * group * held.ct)
        cost = phased_cost(compute, arrive, arrive + flows, scratch, flops)
        cost = dataclasses.replace(cost, fmacs=macs * held.pes)
        return Plan(layouts, (out,), cost, {"algorithm": "stationary-cache"})
