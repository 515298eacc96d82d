"""numpy semantics of attention: fused causal multi-head attention, its gradient, and rotary
position embeddings.

Tensors are token-major, as the weight-streaming layout keeps activations: ``[T, heads * d]``
with ``T = batch * sequence`` tokens, sample after sample, and each head's ``d`` dimensions side
by side. ``attention`` computes, per sample and head, ``softmax(scale * q k^T + mask) v`` with a
causal mask when asked (a query sees the keys up to its own; with a ``window``, only the
``window`` latest of them); queries and keys may differ in number per sample
(``key_sequence``, without a causal mask); grouped-query attention shares each key and value
head among ``heads / kv_heads`` consecutive query heads. ``mask_kind`` tells which of these
masks a mask known at compile time is. 16-bit inputs are computed in float32 (the
kernel's accumulators) and rounded once. ``attention_grad`` is its vector-Jacobian product,
computing the probabilities again from ``q`` and ``k`` as a fused kernel does.

``rotary`` rotates the first ``rotary_dim`` dimensions of every head by the angles of its
position: ``x * cos + rotate_half(x) * sin`` with ``rotate_half([a, b]) = [-b, a]`` on the two
halves; the tables repeat their first half in their second, so the inverse rotation (``sin``
negated) is also the rotation's transpose: its gradient.

``cached_attention`` is generation's attention: it writes the new tokens' keys and values
into the key-value caches at their positions, in place, and attends each query to its
sequence's cache up to its own position.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cgc.errors import DataError

Attrs = Mapping[str, Any]


MASKED = -1e9
"""The largest value an additive mask (or a select's fill) may block a score with."""

MASK_ROWS = 256
"""Rows of a mask ``mask_kind`` reads at a time."""


@dataclass(frozen=True)
class Mask:
    """What a mask known at compile time keeps: every score (open), the keys up to the
    query's own (causal), or of those only the ``window`` latest (a sliding window)."""

    causal: bool = False
    window: int = 0

    def meet(self, other: Mask) -> Mask:
        """The mask of applying both."""
        windows = [w for w in (self.window, other.window) if w]
        return Mask(self.causal or other.causal, min(windows) if windows else 0)


OPEN, CAUSAL = Mask(), Mask(causal=True)


def mask_kind(mask: np.ndarray) -> Mask | None:
    """What ``mask`` (``[..., Sq, Sk]``, every leading slice alike) keeps, or ``None`` if it is
    neither open, causal nor a causal sliding window: a boolean one keeps the entries it is
    true at, an additive one blocks those at most ``MASKED``. A mask of one row (over the
    keys alone) or of ``Sq != Sk`` counts only when open. It reads ``MASK_ROWS`` rows of every
    slice at a time, so that a large mask costs little memory beyond its own."""
    if mask.ndim < 2 or not mask.size:
        return None
    rows, keys = mask.shape[-2:]
    slices = mask.reshape(-1, rows, keys)
    last = _allowed(slices[:1, -1:])
    if last is None:
        return None
    kept = int(last.sum())
    square = rows == keys and rows > 1
    window = kept if square and 0 < kept < keys else 0
    is_open = is_causal = True
    for start in range(0, rows, MASK_ROWS):
        block = slices[:, start : start + MASK_ROWS]
        allowed = _allowed(block)
        if allowed is None or not (block == block[:1]).all():
            return None
        is_open = is_open and bool(allowed.all())
        if square:
            offset = np.arange(start, start + len(allowed))[:, None] - np.arange(keys)
            expected = (offset >= 0) & (offset < window) if window else offset >= 0
            is_causal = is_causal and np.array_equal(allowed, expected)
        else:
            is_causal = False
        if not (is_open or is_causal):
            return None
    return OPEN if is_open else Mask(causal=True, window=window)


def _allowed(block: np.ndarray) -> np.ndarray | None:
    """Where the first slice of a block of mask rows lets a score through, if it blocks the
    rest."""
    rows: np.ndarray = block[0]
    if rows.dtype == np.bool_:
        return rows
    if rows.dtype.kind != "f":
        return None
    allowed = rows == 0
    blocked = rows[~allowed]
    return allowed if (blocked.astype(np.float64) <= blocking(rows.dtype)).all() else None


def blocking(dtype: np.dtype) -> float:
    """The largest score bias that blocks a score of ``dtype``: ``MASKED``, or the lowest
    value of a type that cannot hold it (half precision)."""
    return max(MASKED, float(np.finfo(dtype).min))


def _work_type(dtype: np.dtype) -> np.dtype:
    """What a kernel computes ``dtype`` in: float32 for 16-bit floats."""
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def _heads(x: np.ndarray, sequence: int, heads: int) -> np.ndarray:
    """``[T, heads * d]`` as ``[batch, heads, sequence, d]``."""
    tokens, width = x.shape
    split = x.reshape(tokens // sequence, sequence, heads, width // heads)
    return split.transpose(0, 2, 1, 3)


def _tokens(x: np.ndarray) -> np.ndarray:
    """``[batch, heads, sequence, d]`` back to ``[T, heads * d]``."""
    batch, heads, sequence, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch * sequence, heads * d)


def blocked(sequence: int, window: int = 0) -> np.ndarray:
    """Where a causal mask of ``sequence`` tokens blocks a score: the later keys, and with a
    ``window`` the keys ``window`` or more tokens earlier."""
    offset = np.arange(sequence)[:, None] - np.arange(sequence)
    return (offset < 0) | (offset >= window) if window else offset < 0


def _probabilities(
    q: np.ndarray, k: np.ndarray, attrs: Attrs, bias: np.ndarray | None = None
) -> np.ndarray:
    """``softmax(scale * q k^T + mask + bias)`` of heads ``[B, H, S, d]`` (k with its
    groups); a row whose every score is blocked has probabilities 0 (as the exporters' guards
    make them), not NaN."""
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * q.dtype.type(attrs["scale"])
    if bias is not None:
        scores = scores + bias.astype(scores.dtype)
    if attrs["causal"]:
        scores = np.where(blocked(scores.shape[-1], attrs.get("window", 0)), -np.inf, scores)
    peak = scores.max(axis=-1, keepdims=True)
    empty = np.isneginf(peak)
    weights = np.exp(scores - np.where(empty, 0, peak))
    total = weights.sum(axis=-1, keepdims=True)
    probabilities: np.ndarray = weights / np.where(empty, 1, total)
    return probabilities


def _operands(arrays: tuple[np.ndarray, ...], attrs: Attrs) -> tuple[np.ndarray, ...]:
    """Query, key and value heads in the work type, keys and values repeated over their
    query groups."""
    work = _work_type(arrays[0].dtype)
    heads, kv_heads, sequence = attrs["heads"], attrs["kv_heads"], attrs["sequence"]
    keys = attrs.get("key_sequence", sequence)
    q = _heads(arrays[0].astype(work, copy=False), sequence, heads)
    group = heads // kv_heads
    k, v = (_heads(a.astype(work, copy=False), keys, kv_heads) for a in arrays[1:3])
    if group > 1:
        k, v = (np.repeat(a, group, axis=1) for a in (k, v))
    return q, k, v


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, attrs: Attrs, bias: np.ndarray | None = None
) -> np.ndarray:
    """Fused attention (see the module's doc)."""
    qh, kh, vh = _operands((q, k, v), attrs)
    return _tokens(np.matmul(_probabilities(qh, kh, attrs, bias), vh)).astype(q.dtype)


def _grouped(x: np.ndarray, kv_heads: int) -> np.ndarray:
    """The gradients of repeated key or value heads summed back over their groups."""
    batch, heads, sequence, d = x.shape
    summed: np.ndarray = x.reshape(batch, kv_heads, heads // kv_heads, sequence, d).sum(axis=2)
    return summed


def attention_grad(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    dout: np.ndarray,
    attrs: Attrs,
    bias: np.ndarray | None = None,
) -> list[np.ndarray]:
    """The gradients of ``q``, ``k``, ``v`` (and ``bias``, summed over the axes it is
    broadcast along) given the output's gradient ``dout``."""
    qh, kh, vh = _operands((q, k, v), attrs)
    work = qh.dtype
    heads, sequence, kv_heads = attrs["heads"], attrs["sequence"], attrs["kv_heads"]
    do = _heads(dout.astype(work), sequence, heads)
    p = _probabilities(qh, kh, attrs, bias)
    dv = np.matmul(np.swapaxes(p, -1, -2), do)
    dp = np.matmul(do, np.swapaxes(vh, -1, -2))
    # sum(p * dp) equals flash attention's sum(do * out), and is exactly 0 where a row keeps
    # one key (p one-hot), as autograd's softmax gradient is: Adam would blow up rounding
    dscores = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    ds = dscores * work.type(attrs["scale"])
    dq = np.matmul(ds, kh)
    dk = np.matmul(np.swapaxes(ds, -1, -2), qh)
    grads = [
        _tokens(dq).astype(q.dtype),
        _tokens(_grouped(dk, kv_heads)).astype(k.dtype),
        _tokens(_grouped(dv, kv_heads)).astype(v.dtype),
    ]
    if bias is not None:
        broadcast = tuple(i for i, n in enumerate(bias.shape) if n == 1)
        grads.append(dscores.sum(axis=broadcast, keepdims=True).astype(bias.dtype))
    return grads


def rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, attrs: Attrs) -> np.ndarray:
    """Rotary position embedding of ``x`` ``[T, heads * d]`` by the tables ``[S, r]``; with
    ``inverse`` the rotation back (and the transpose of the forward one)."""
    work = _work_type(x.dtype)
    sequence, dims = cos.shape
    heads = attrs["heads"]
    split = x.astype(work).reshape(x.shape[0] // sequence, sequence, heads, -1)
    part = split[..., :dims]
    half = dims // 2
    turned = np.concatenate([-part[..., half:], part[..., :half]], axis=-1)
    c = cos.astype(work)[None, :, None, :]
    s = sin.astype(work)[None, :, None, :] * (-1 if attrs.get("inverse") else 1)
    rotated = part * c + turned * s
    whole = np.concatenate([rotated, split[..., dims:]], axis=-1)
    return whole.reshape(x.shape).astype(x.dtype)


def cached_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    positions: np.ndarray,
    attrs: Attrs,
) -> np.ndarray:
    """Writes the new tokens' keys ``k`` and values ``v`` ``[B * s, kv_heads * d]`` into the
    caches ``[B * capacity, kv_heads * d]`` at the rows of ``positions`` ``[B, s]`` (in place:
    the caches are the state generation keeps), then attends each query ``q`` ``[B * s, heads
    * d]`` to its sequence's cached keys at positions up to its own (of them only the
    ``window`` latest, with a window). A negative position is padding: its key and value are
    not written and its query's result is zeros. A position past the capacity is a
    ``DataError``."""
    sequences, tokens = positions.shape
    capacity = key_cache.shape[0] // sequences
    where = positions.astype(np.int64)
    if where.size and where.max() >= capacity:
        raise DataError(f"a position ({int(where.max())}) is outside the cache's {capacity} tokens")
    real = where >= 0
    rows = (where + capacity * np.arange(sequences)[:, None])[real]
    key_cache[rows] = k[real.ravel()]
    value_cache[rows] = v[real.ravel()]
    work = _work_type(q.dtype)
    heads, kv_heads = attrs["heads"], attrs["kv_heads"]
    qh = _heads(q.astype(work), tokens, heads)
    kh, vh = (np.repeat(_heads(c.astype(work), capacity, kv_heads), heads // kv_heads, axis=1)
              for c in (key_cache, value_cache))  # fmt: skip
    offset = where[:, None, :, None] - np.arange(capacity)  # [B, 1, s, capacity]
    window = attrs.get("window", 0)
    seen = (offset >= 0) & (offset < window) if window else offset >= 0
    seen &= real[:, None, :, None]
    scores = np.matmul(qh, np.swapaxes(kh, -1, -2)) * work.type(attrs["scale"])
    scores = np.where(seen, scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    empty = np.isneginf(peak)
    weights = np.exp(scores - np.where(empty, 0, peak))
    probabilities = weights / np.where(empty, 1, weights.sum(axis=-1, keepdims=True))
    return _tokens(np.matmul(probabilities, vh)).astype(q.dtype)
