"""The plans of matmul on a sparse weight: the weight-streaming kernel on the live weights
alone, and the weight gradient that forms only the live values of a sparse weight whose
dense gradient MemoryX does not need (static, or SET's random regrowth).

Streaming (``sparse_streaming``): PE column ``c`` receives tile ``(c, j)`` of the weight, its
rows of chunk ``j`` of the output columns, in the encoding ``sparse_tiles.encoding`` chose,
and does an AXPY per live weight; then the partial sums of chunk ``j`` sum along the mesh row
in a chain. A PE keeps the partials of ``PARTIAL_BUFFERS`` chunks, the one it forms and the
one the chain is taking (the overlap the dense kernel has too), so a column that had few live
weights in one chunk runs ahead into the next: the imbalance of the mask costs time only where
it outlasts that slack, replayed chunk by chunk (``_chain``). The partial sums stay dense
however sparse the weight, so where a column holds few of the weight's rows, the chain binds.
The matmul takes this kernel or the dense one, whichever is sooner (``plans.matmul``).

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

from cgc.machine.hardware.target import WAVELET_BYTES, Target
from cgc.machine.movement.layout import Layout, Rect, grid_extent
from cgc.machine.movement.traffic import Traffic
from cgc.machine.plans.kernel import (
    Cost,
    Operand,
    Plan,
    PlanRequest,
    arrival,
    row_chain,
    row_multicast,
    sequential_cycles,
)
from cgc.machine.sparse.tiles import (
    INDEX_CYCLES,
    SparseView,
    TileGrid,
    encoding,
    row_counts,
    stream_grid,
)

PARTIAL_BUFFERS = 2
"""Chunks of partial sums a PE keeps while the chain along its row takes them (a modelling
choice: a few hundred bytes each)."""


def sparse_streaming(
    target: Target, rect: Rect, a: Operand, view: SparseView, b: Operand, out: Layout,
    flops: float,
) -> Plan:  # fmt: skip
    """The streaming kernel on the live weights of ``view``."""
    grid = stream_grid(b.shape, rect[2])
    nb_out, mt = prod(out.batch), out.rt
    rows = nb_out * mt // grid.stacked
    code = encoding(view.weight, view.perm, grid, b.dtype, rows, target.fmacs(out.dtype))
    cols, chunks = code.live.shape
    a_at = Layout(a.shape, a.dtype, out.row0, out.col0, out.h, cols, out.fold)
    cycles, words = code.cycles.astype(np.float64), code.words.astype(np.float64)
    step = np.maximum(cycles, words)
    partial_words = nb_out * mt * out.ct * out.words_per_element
    hops = cols - 1
    end = _chain(step, partial_words * (hops > 0))
    column_words = float(words.sum(axis=1).max())
    ingress = Traffic(code.total_words * out.h, column_words, column_words, column_words, out.h)
    reduction = row_chain(chunks, partial_words, hops, out.h)
    moved = arrival(a, a_at)
    slowest = cycles.sum(axis=1).max()
    worked = np.where(code.formats == 0, grid.sizes, code.live)
    busy = float(step.sum(axis=1).max())
    cost = Cost(
        cycles=sequential_cycles(moved) + end + ingress.max_hops + reduction.max_hops,
        flops=flops * float(code.live.sum(dtype=np.float64)) / float(grid.sizes.sum()),
        fmacs=float(worked.sum(dtype=np.float64)) * rows * out.h,
        traffic=moved + ingress + reduction,
        # as the dense kernel's: a weight row's buffer and the partial sums, overlapped alike
        scratch_bytes=(out.ct + nb_out * mt * out.ct) * out.itemsize,
        compute_cycles=float(slowest),
        arrival_cycles=moved.cycles + busy - float(slowest) + ingress.max_hops,
    )
    mean = float(step.sum(axis=1).mean())
    terms = {
        "the AXPYs and indices": float(cycles.sum(axis=1).max()),
        "the weights arriving": column_words,
        "the dense partial sums along the rows": chunks * partial_words * (hops > 0),
    }
    detail = {
        "algorithm": "stream-sparse",
        "steps": chunks,
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


def sampled(q: PlanRequest, a: Operand, out: Layout, b_at: Layout) -> Plan:
    """The gradient of the static sparse weight ``q.attrs["live"]`` views, its live values
    alone; the column blocks keep pace with the multicast of the activations' columns
    (``_paced``)."""
    view: SparseView = q.attrs["live"]
    width = grid_extent(a.shape[-1], q.rect[2])
    a_at = Layout(a.shape, a.dtype, b_at.row0, b_at.col0, b_at.h, width)
    nb, rows, m = prod(out.batch), a.shape[-2], out.shape[-2]
    rate = q.target.fmacs(out.dtype)
    grid = TileGrid(m, out.shape[-1], 1, b_at.ct, out.batch)
    # ``live`` counts every leading index's entries: each is a dot of the PE's rows
    live, scale = row_counts(view.weight, view.perm, grid)
    dense = nb * b_at.rt * b_at.ct / rate
    entries = live * (ceil(b_at.rt / rate) + INDEX_CYCLES)
    compute = np.minimum(entries, dense)
    column = nb * b_at.rt * a_at.words_per_element
    partial = np.where(entries < dense, live, nb * b_at.ct) * out.words_per_element
    step = np.maximum(compute, partial * (b_at.h > 1))
    across = row_multicast(m, column, b_at)
    sums = float(partial.sum()) * scale
    busiest = float(partial.sum(axis=0).max()) * scale
    down = Traffic(sums * (b_at.h - 1), busiest * (b_at.h > 1), busiest, busiest, b_at.h - 1)
    b = q.operands[1]
    moved = sequential_cycles(arrival(a, a_at), arrival(b, b_at))
    worked = np.where(entries < dense, live * b_at.rt, nb * b_at.rt * b_at.ct)
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
