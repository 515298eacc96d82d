"""The lowering of ``aten.scaled_dot_product_attention``, which ``capture`` keeps whole, as
``aten.linear``: PyTorch's own attention (transformers' default ``sdpa``) arrives as one op
whose decomposition would spell it out and, on a symbolic batch, fail to.

Without a mask, or with one known at compile time to be open, causal or a causal sliding window
(``cgc.machine.reference.attention.mask_kind``), it is ``wse.attention`` on token-major views of
query, key and value (``[B * S, heads * d]``), its grouped-query heads kept grouped, on as many
keys as queries or (not causal) on others. With another mask it is its arithmetic: the
scores, the mask, the softmax and the weighted values.
"""

from __future__ import annotations

import math

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, dtype_of, reshape, shape_of, transpose
from cgc.frontends.emitter import DROPOUT_ADVICE
from cgc.frontends.formulas import attend, attention_scores
from cgc.frontends.torch.lowering import Lowering, register
from cgc.machine.reference.attention import CAUSAL, OPEN, Mask, mask_kind


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
    kind = CAUSAL if is_causal else _mask_kind(lw, attn_mask, queries, keys)
    if kind is not None and (keys == queries or not kind.causal) and shape_of(v)[3] == head:
        y = _fused(lw, (q, k, v), kind, chosen)
    else:
        y = _spelled_out(lw, q, k, v, attn_mask, is_causal, chosen)
    return reshape(lw, y, (*shape[:-1], shape_of(v)[3]))


def _mask_kind(lw: Lowering, mask: SSAValue | None, queries: int, keys: int) -> Mask | None:
    """What ``mask`` keeps (``cgc.machine.reference.attention.mask_kind``) if it is absent or known
    and broadcasts over the scores, else None."""
    if mask is None:
        return OPEN
    known = lw.known.get(mask)
    if known is None or known.shape[-2:] not in ((queries, keys), (1, keys)):
        return None
    return mask_kind(known)


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


def _fused(lw: Lowering, qkv: tuple[SSAValue, ...], mask: Mask, scale: float) -> SSAValue:
    """``wse.attention`` of ``[B, heads, S, d]`` operands, back in their layout."""
    batch, heads, tokens, head = shape_of(qkv[0])
    kv_heads, keys = shape_of(qkv[1])[1:3]
    qs, ks, vs = (_token_major(lw, x) for x in qkv)
    fused = wse.AttentionOp(
        qs, ks, vs, tokens, heads, kv_heads, mask.causal, scale, mask.window, keys
    )
    y = lw.emit(fused)
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
