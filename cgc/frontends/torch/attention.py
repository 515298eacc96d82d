"""The lowering of ``aten.scaled_dot_product_attention``, which ``capture`` keeps whole, as
``aten.linear``: PyTorch's own attention (transformers' default ``sdpa``) arrives as one op
whose decomposition would spell it out and, on a symbolic batch, fail to.

Without a mask, on keys as many as the queries, it is ``wse.attention`` on token-major views
of query, key and value (``[B * S, heads * d]``), causal or not, its grouped-query heads kept
grouped. With a mask, or keys of another length, it is its arithmetic: the scores, the mask,
the softmax and the weighted values, which ``fuse-attention`` fuses where the mask is known
causal or open at compile time.
"""

from __future__ import annotations

import math

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.emitter import DROPOUT_ADVICE
from cgc.frontends.onnx.attention import attend, attention_scores
from cgc.frontends.onnx.builders import dtype_of, reshape, transpose
from cgc.frontends.onnx.nodes import NodeError, shape_of
from cgc.frontends.torch.lowering import Lowering, register

MASKED = -1e4
"""The largest value with which an additive mask blocks a score, as the fused kernel's
``-inf`` does: ``exp`` of a score this far below the others is 0 in float32 (torch's masks
use the type's lowest value, or ``-inf``)."""


@register("aten.scaled_dot_product_attention.default")
def _scaled_dot_product_attention(
    lw: Lowering,
    query: SSAValue,
    key: SSAValue,
    value: SSAValue,
    attn_mask: SSAValue | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> SSAValue:
    if dropout_p:
        raise NodeError(f"dropout_p={dropout_p:g}: {DROPOUT_ADVICE}")
    if attn_mask is not None and is_causal:
        raise NodeError("attn_mask and is_causal cannot both be given")
    shape = shape_of(query)
    q, k, v = (_four_axes(lw, lw.tensor(x)) for x in (query, key, value))
    heads, queries, head = shape_of(q)[1:]
    kv_heads, keys = shape_of(k)[1:3]
    if heads % kv_heads or shape_of(v)[1] != kv_heads:
        raise NodeError(f"{heads} query heads do not group over {kv_heads} key/value heads")
    chosen = 1 / math.sqrt(head) if scale is None else float(scale)
    kind = "causal" if is_causal else _mask_kind(lw, attn_mask, queries, keys)
    if kind is not None and keys == queries and shape_of(v)[3] == head:
        y = _fused(lw, q, k, v, kind == "causal", chosen)
    else:
        y = _spelled_out(lw, q, k, v, attn_mask, is_causal, chosen)
    return reshape(lw, y, (*shape[:-1], shape_of(v)[3]))


def _mask_kind(lw: Lowering, mask: SSAValue | None, queries: int, keys: int) -> str | None:
    """``open`` for no mask or one known to allow every key, ``causal`` for one known to
    allow exactly the keys up to each query's own (a boolean one's true entries, or an
    additive one's zeros, the rest at most ``MASKED``), None otherwise. Every leading slice
    of the mask must be alike."""
    if mask is None:
        return "open"
    known = lw.known.get(mask)
    if known is None or known.shape[-2:] != (queries, keys):
        return None
    allowed = known if known.dtype == np.bool_ else known == 0
    if known.dtype != np.bool_ and not np.all(allowed | (known <= MASKED)):
        return None
    flat = allowed.reshape(-1, queries, keys)
    if flat.all():
        return "open"
    causal = np.tril(np.ones((queries, keys), bool))
    return "causal" if (flat == causal).all() else None


def _four_axes(lw: Lowering, x: SSAValue) -> SSAValue:
    """``x`` (``[..., heads, S, d]``, or ``[..., S, d]``: one head) as ``[B, heads, S, d]``."""
    shape = shape_of(x)
    if len(shape) < 3:
        raise NodeError(f"an operand of shape {shape} has no batch or head axis")
    if len(shape) == 3:
        return reshape(lw, x, (shape[0], 1, *shape[1:]))
    return reshape(lw, x, (math.prod(shape[:-3]), *shape[-3:]))


def _token_major(lw: Lowering, x: SSAValue) -> SSAValue:
    """``[B, heads, S, d]`` as ``[B * S, heads * d]``, the layout ``wse.attention`` takes."""
    batch, heads, tokens, head = shape_of(x)
    return reshape(lw, transpose(lw, x, [0, 2, 1, 3]), [batch * tokens, heads * head])


def _fused(
    lw: Lowering, q: SSAValue, k: SSAValue, v: SSAValue, causal: bool, scale: float
) -> SSAValue:
    """``wse.attention`` of ``[B, heads, S, d]`` operands, back in their layout."""
    batch, heads, tokens, head = shape_of(q)
    kv_heads = shape_of(k)[1]
    qs, ks, vs = (_token_major(lw, x) for x in (q, k, v))
    y = lw.emit(wse.AttentionOp(qs, ks, vs, tokens, heads, kv_heads, causal, scale))
    return transpose(lw, reshape(lw, y, [batch, tokens, heads, head]), [0, 2, 1, 3])


def _spelled_out(
    lw: Lowering,
    q: SSAValue,
    k: SSAValue,
    v: SSAValue,
    mask: SSAValue | None,
    causal: bool,
    scale: float,
) -> SSAValue:
    """Attention as torch's math defines it: ``softmax(q k^T * scale + bias) v``, the bias
    the additive or boolean mask, or the causal one aligned at the top left."""
    heads, queries = shape_of(q)[1:3]
    kv_heads, keys = shape_of(k)[1:3]
    scores = attention_scores(lw, q, k, scale)
    dtype = dtype_of(scores)
    if causal:
        allowed = np.tril(np.ones((queries, keys), bool))
        mask = lw.constant(np.where(allowed, 0, -np.inf).astype(dtype))
    elif mask is not None and dtype_of(mask) == np.bool_:
        zero, blocked = lw.constant(np.zeros((), dtype)), lw.constant(np.array(-np.inf, dtype))
        mask = lw.emit(wse.SelectOp(mask, zero, blocked))
    if mask is not None:
        scores = lw.emit(wse.AddOp(scores, lw.tensor(mask, dtype.name)))
    weights = lw.emit(wse.SoftmaxOp(scores, len(shape_of(scores)) - 1))
    return attend(lw, weights, v, heads // kv_heads)
