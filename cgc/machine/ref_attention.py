"""numpy semantics of attention: fused causal multi-head attention, its gradient, and rotary
position embeddings.

Tensors are token-major, as the weight-streaming layout keeps activations: ``[T, heads * d]``
with ``T = batch * sequence`` tokens, sample after sample, and each head's ``d`` dimensions side
by side. ``attention`` computes, per sample and head, ``softmax(scale * q k^T + mask) v`` with a
causal mask when asked; grouped-query attention shares each key and value head among
``heads / kv_heads`` consecutive query heads. 16-bit inputs are computed in float32 (the
kernel's accumulators) and rounded once. ``attention_grad`` is its vector-Jacobian product,
computing the probabilities again from ``q`` and ``k`` as a fused kernel does.

``rotary`` rotates the first ``rotary_dim`` dimensions of every head by the angles of its
position: ``x * cos + rotate_half(x) * sin`` with ``rotate_half([a, b]) = [-b, a]`` on the two
halves; the tables repeat their first half in their second, so the inverse rotation (``sin``
negated) is also the rotation's transpose: its gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

Attrs = Mapping[str, Any]


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


def _probabilities(q: np.ndarray, k: np.ndarray, attrs: Attrs) -> np.ndarray:
    """``softmax(scale * q k^T + mask)`` of heads ``[B, H, S, d]`` (k with its groups)."""
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * q.dtype.type(attrs["scale"])
    if attrs["causal"]:
        sequence = scores.shape[-1]
        future = np.triu(np.ones((sequence, sequence), dtype=bool), 1)
        scores = np.where(future, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    probabilities: np.ndarray = weights / weights.sum(axis=-1, keepdims=True)
    return probabilities


def _operands(arrays: tuple[np.ndarray, ...], attrs: Attrs) -> tuple[np.ndarray, ...]:
    """Query, key and value heads in the work type, keys and values repeated over their
    query groups."""
    work = _work_type(arrays[0].dtype)
    heads, kv_heads, sequence = attrs["heads"], attrs["kv_heads"], attrs["sequence"]
    q = _heads(arrays[0].astype(work), sequence, heads)
    group = heads // kv_heads
    k, v = (np.repeat(_heads(a.astype(work), sequence, kv_heads), group, axis=1)
            for a in arrays[1:3])  # fmt: skip
    return q, k, v


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, attrs: Attrs) -> np.ndarray:
    """Fused attention (see the module's doc)."""
    qh, kh, vh = _operands((q, k, v), attrs)
    return _tokens(np.matmul(_probabilities(qh, kh, attrs), vh)).astype(q.dtype)


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
) -> list[np.ndarray]:
    """The gradients of ``q``, ``k`` and ``v`` given the output's gradient ``dout``."""
    qh, kh, vh = _operands((q, k, v), attrs)
    work = qh.dtype
    heads, sequence, kv_heads = attrs["heads"], attrs["sequence"], attrs["kv_heads"]
    do = _heads(dout.astype(work), sequence, heads)
    o = _heads(out.astype(work), sequence, heads)
    p = _probabilities(qh, kh, attrs)
    dv = np.matmul(np.swapaxes(p, -1, -2), do)
    dp = np.matmul(do, np.swapaxes(vh, -1, -2))
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True)) * work.type(attrs["scale"])
    dq = np.matmul(ds, kh)
    dk = np.matmul(np.swapaxes(ds, -1, -2), qh)
    return [
        _tokens(dq).astype(q.dtype),
        _tokens(_grouped(dk, kv_heads)).astype(k.dtype),
        _tokens(_grouped(dv, kv_heads)).astype(v.dtype),
    ]


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
