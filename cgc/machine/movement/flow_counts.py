"""Counting columns of small integers (``flows``' factors) without ``np.unique``.

The columns of a factor's entries are numbered by a mixed-radix code over the span of each
row (``codes``); equal columns are told apart by counting over the range of the codes where
it is small (``flow_factors.dense``), and otherwise by a stable sort, which runs in linear time
over the few sorted runs factors arrive in (the shifts of one sorted factor, the sorted parts
of a sum), where ``np.unique`` sorted every time anew (``sorted_sums``).
"""

from __future__ import annotations

from math import prod

import numpy as np

MESH = np.int32
"""The type of mesh coordinates in factors (half the memory of the default)."""
RawFactor = tuple[tuple[int, ...], np.ndarray, np.ndarray]
"""Flow counts before ``flows`` merges them into a factor: ``(PE coordinates, entries
[coordinate, k], counts [k])``, an entry possibly repeated."""


def codes(at: np.ndarray) -> tuple[np.ndarray, tuple[int, ...], np.ndarray]:
    """One integer per column of ``at`` (in column order, ascending with the columns in
    lexicographic order), with the span and the least value of each row that decode it."""
    low = at.min(axis=1, keepdims=True)
    span = tuple(int(s) for s in at.max(axis=1) - low[:, 0] + 1)
    code = at[0].astype(np.int64)
    offset = int(low[0, 0])
    for row, first, radix in zip(at[1:], low[1:, 0].tolist(), span[1:], strict=True):
        code *= radix
        code += row
        offset = offset * radix + first
    code -= offset
    return code, span, low


def decode(code: np.ndarray, span: tuple[int, ...], low: np.ndarray) -> np.ndarray:
    """The columns (``MESH`` integers) that ``codes`` numbered ``code`` (in 32 bits where the
    codes fit: the divisions are the work)."""
    if prod(span) >= 1 << 31:
        wide: np.ndarray = (np.array(np.unravel_index(code, span)) + low).astype(MESH)
        return wide
    at = np.empty((len(span), code.size), MESH)
    rest = code.astype(MESH)
    for row in range(len(span) - 1, 0, -1):
        high = rest // span[row]
        np.subtract(rest, high * span[row], out=at[row])
        at[row] += low[row, 0]
        rest = high
    np.add(rest, low[0, 0], out=at[0], casting="unsafe")
    return at


def sorted_sums(code: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each distinct value of ``code``, in ascending order: a position holding it (the
    first), and the sum of ``counts`` over its positions. The counts are flow counts, whole
    numbers far below 2 ** 53, so the sums are exact in any order (and equal those of
    ``np.bincount``)."""
    counts = np.asarray(counts, dtype=np.float64)
    if ascending(code):
        starts = run_starts(code)
        return starts, np.add.reduceat(counts, starts)
    order = np.argsort(code, kind="stable")
    starts = run_starts(code[order])
    return order[starts], np.add.reduceat(counts[order], starts)


def ascending(values: np.ndarray) -> bool:
    """Whether ``values`` never fall."""
    return bool(np.all(values[1:] >= values[:-1]))


def run_starts(ordered: np.ndarray) -> np.ndarray:
    """Where each run of equal values of ``ordered`` starts."""
    change = np.empty(ordered.size, dtype=bool)
    change[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=change[1:])
    return np.flatnonzero(change)
