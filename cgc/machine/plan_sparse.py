"""The plans of matmul on a sparse weight: the weight-streaming kernel on the live weights
alone, and the weight gradient that forms a static sparse weight's live values alone.

Streaming (``sparse_streaming``): PE column ``c`` receives tile ``(c, j)`` of the weight, its
rows of chunk ``j`` of the output columns, in the encoding ``sparse_tiles.encoding`` chose,
and does an AXPY per live weight; then the partial sums of chunk ``j`` sum along the mesh row
in a chain. A PE keeps the partials of up to ``PARTIAL_BUFFERS`` chunks that the chain has not
taken yet, so a column that had few live weights in one chunk runs ahead into the next: the
imbalance of the mask costs time only where it outlasts that slack. The partial sums stay
dense however sparse the weight, so where a column's rows are few, the chain binds; the
kernel then splits the columns into ``groups`` that each take every ``groups``-th chunk over
``groups`` times the rows, with chains of their own, at the price of a copy of the
activations for every group. It takes the number of groups (a power of two) that finishes
soonest, replaying the chunks of every group step by step (``_chain``).

Weight gradient (``sampled``): as ``MatmulTransposeA``, row ``m`` of the result at a time,
but the PEs of column block ``j`` form only the live entries there (a dot product each and
``INDEX_CYCLES`` for its index), or the whole partial row where that is sooner, and only the
live partials sum down the columns, each column block on its own. What ties the blocks is the
multicast of the activations' column ``m`` along the rows: a block keeps up to
``PARTIAL_BUFFERS`` of them, so the multicast runs at most that many rows ahead of the
slowest block (``_paced``).
"""

from __future__ import annotations

from math import ceil, prod

import numpy as np

from cgc.machine.kernel import (
    Cost,
    Operand,
    Plan,
    Request,
    arrival,
    row_chain,
    row_multicast,
    sequential_cycles,
)
from cgc.machine.layout import Layout, Rect, grid_extent
from cgc.machine.sparse_tiles import (
    INDEX_CYCLES,
    SparseView,
    TileGrid,
    encoding,
    row_counts,
    stream_grid,
)
from cgc.machine.target import WAVELET_BYTES, Target
from cgc.machine.traffic import NO_TRAFFIC, Traffic

PARTIAL_BUFFERS = 4
"""Chunks of partial sums a PE keeps while the chain along its row takes them (a modelling
choice: a few hundred bytes each)."""
MOST_GROUPS = 16
"""Most groups of columns a sparse streaming matmul splits into."""


def sparse_streaming(
    target: Target, rect: Rect, a: Operand, view: SparseView, b: Operand, out: Layout,
    flops: float,
) -> Plan:  # fmt: skip
    """The streaming kernel on the live weights of ``view``, in the number of column groups
    that finishes soonest."""
    options = [1 << n for n in range(MOST_GROUPS.bit_length()) if 1 << n <= rect[2]]
    plans = [_grouped(target, rect, a, view, b, out, flops, groups) for groups in options]
    return min(plans, key=lambda plan: plan.cost.cycles)


def _grouped(
    target: Target,
    rect: Rect,
    a: Operand,
    view: SparseView,
    b: Operand,
    out: Layout,
    flops: float,
    groups: int,
) -> Plan:
    """The kernel with its columns in ``groups`` groups."""
    grid = stream_grid(b.shape, rect[2] // groups, rect[2])
    nb_out, mt = prod(out.batch), out.rt
    rows = nb_out * mt // grid.stacked
    code = encoding(view.weight, view.perm, grid, b.dtype, rows, target.fmacs(out.dtype))
    cols, chunks = code.live.shape
    a_at = Layout(a.shape, a.dtype, out.row0, out.col0, out.h, cols)
    step = np.maximum(code.cycles, code.words)
    partial_words = nb_out * mt * out.ct * out.words_per_element
    hops = cols - 1
    ends = [_chain(step[:, g::groups], partial_words * (hops > 0)) for g in range(groups)]
    copies = _copies(a_at, groups)
    column_words = float(code.words.sum(axis=1).max())
    ingress = Traffic(code.total_words * out.h, column_words, column_words, column_words, out.h)
    reduction = row_chain(chunks, partial_words, hops, out.h)
    moved = arrival(a, a_at) + copies
    slowest = code.cycles.sum(axis=1).max()
    worked = np.where(code.formats == 0, grid.sizes, code.live)
    cycles = max(ends) + ingress.max_hops + reduction.max_hops
    busy = float(step.sum(axis=1).max())
    cost = Cost(
        cycles=sequential_cycles(moved) + cycles,
        flops=flops * float(code.live.sum()) / float(grid.sizes.sum()),
        fmacs=float(worked.sum()) * rows * out.h,
        traffic=moved + ingress + reduction,
        scratch_bytes=(out.ct + PARTIAL_BUFFERS * nb_out * mt * out.ct) * out.itemsize,
        compute_cycles=float(slowest),
        arrival_cycles=moved.cycles + busy - float(slowest) + ingress.max_hops,
    )
    mean = float(step.sum(axis=1).mean())
    per_group = ceil(chunks / groups)
    terms = {
        "the AXPYs and indices": float(code.cycles.sum(axis=1).max()) / groups,
        "the weights arriving": float(code.words.sum(axis=1).max()) / groups,
        "the dense partial sums along the rows": per_group * partial_words * (hops > 0),
    }
    detail = {
        "algorithm": "stream-sparse",
        "steps": chunks,
        "groups": groups,
        "binds": max(terms, key=terms.__getitem__),
        "formats": code.format_counts(),
        "imbalance": busy / mean if mean else 1.0,
        "stream_bytes": code.total_words * WAVELET_BYTES,
    }
    return Plan((a_at, None), (out,), cost, detail)


def _chain(step: np.ndarray, partial: float) -> float:
    """When the chain along the rows has taken the last partials of chunks whose columns
    take ``step`` (``[columns, chunks]``) cycles each: a column starts a chunk when it has
    done the one before and has a buffer free (``PARTIAL_BUFFERS``: the chain has taken
    the partials of the chunk that many before), and the chain takes a chunk ``partial``
    cycles after the last column has done it and the chain has taken the one before."""
    done = np.zeros(step.shape[0])
    taken: list[float] = []
    for j in range(step.shape[1]):
        free = taken[j - PARTIAL_BUFFERS] if j >= PARTIAL_BUFFERS else 0.0
        done = np.maximum(done, free) + step[:, j]
        taken.append(max(taken[-1] if taken else 0.0, float(done.max())) + partial)
    return taken[-1] if taken else 0.0


def _paced(step: np.ndarray, column: float) -> float:
    """When the column blocks are done with rows that take them ``step`` (``[rows,
    blocks]``) cycles each, after a multicast of ``column`` cycles a row that may run
    ``PARTIAL_BUFFERS`` rows ahead of the slowest block."""
    done = np.zeros(step.shape[1])
    sent: list[float] = []
    finished: list[float] = []
    for m in range(step.shape[0]):
        free = finished[m - PARTIAL_BUFFERS] if m >= PARTIAL_BUFFERS else 0.0
        sent.append(max(sent[-1] if sent else 0.0, free) + column)
        done = np.maximum(done, sent[-1]) + step[m]
        finished.append(float(done.max()))
    return float(done.max()) if sent else 0.0


def _copies(a_at: Layout, groups: int) -> Traffic:
    """A copy of the activations for every group beyond the first: each mesh row's slice
    streams along the row once, the routers dropping a copy at every group."""
    if groups == 1:
        return NO_TRAFFIC
    words = a_at.tile_elements * a_at.words_per_element * a_at.w
    return Traffic(
        words * a_at.h * a_at.w * (groups - 1), words, words / a_at.w, words / a_at.w,
        a_at.w * (groups - 1),
    )  # fmt: skip


def sampled(q: Request, a: Operand, out: Layout, b_at: Layout) -> Plan:
    """The gradient of the static sparse weight ``q.attrs["live"]`` views, its live values
    alone; a result row takes as long as its slowest column block."""
    view: SparseView = q.attrs["live"]
    width = grid_extent(a.shape[-1], q.rect[2])
    a_at = Layout(a.shape, a.dtype, b_at.row0, b_at.col0, b_at.h, width)
    nb, rows, m = prod(out.batch), a.shape[-2], out.shape[-2]
    rate = q.target.fmacs(out.dtype)
    grid = TileGrid(m, out.shape[-1], 1, b_at.ct, out.batch)
    live, scale = row_counts(view.weight, view.perm, grid)
    dense = nb * b_at.rt * b_at.ct / rate
    entries = live * (ceil(nb * b_at.rt / rate) + INDEX_CYCLES)
    compute = np.minimum(entries, dense)
    column = nb * b_at.rt * a_at.words_per_element
    partial = np.where(entries < dense, live, b_at.ct) * nb * out.words_per_element
    step = np.maximum(compute, partial * (b_at.h > 1))
    across = row_multicast(m, column, b_at)
    sums = float(partial.sum()) * scale
    busiest = float(partial.sum(axis=0).max()) * scale
    down = Traffic(sums * (b_at.h - 1), busiest * (b_at.h > 1), busiest, busiest, b_at.h - 1)
    b = q.operands[1]
    moved = sequential_cycles(arrival(a, a_at), arrival(b, b_at))
    worked = np.where(entries < dense, live * nb * b_at.rt, nb * b_at.rt * b_at.ct)
    cost = Cost(
        cycles=moved
        + _paced(step, column * (b_at.w > 1)) * scale
        + across.max_hops
        + down.max_hops,
        flops=2.0 * nb * rows * m * out.shape[-1] * view.weight.density,
        fmacs=float(worked.sum()) * scale * b_at.h,
        traffic=arrival(a, a_at) + arrival(b, b_at) + across + down,
        scratch_bytes=(nb * b_at.rt + nb * b_at.ct) * out.itemsize,
        compute_cycles=float(compute.max(axis=1).sum()) * scale,
        arrival_cycles=moved,
    )
    terms = {
        "the dot products and indices": float(compute.sum(axis=0).max()),
        "the partial sums down the columns": float(partial.sum(axis=0).max()) * (b_at.h > 1),
        "the activations' multicast": m * column * (b_at.w > 1) / scale,
    }
    detail = {"algorithm": "sampled", "steps": m, "binds": max(terms, key=terms.__getitem__)}
    return Plan((a_at, b_at), (out,), cost, detail)
