"""ONNX attention ops: Attention, RotaryEmbedding and LinearAttention.

Attention becomes matmuls, a softmax and an additive bias built from the mask, the causal
frontier, the sliding window and the non-padding lengths (folded to a constant when it depends
only on shapes and constants). Grouped-query heads broadcast in the matmuls instead of being
copied. A query row whose bias is ``-inf`` everywhere attends nothing and yields zeros.
LinearAttention unrolls its recurrence over the (static) sequence length in float32.
"""

from __future__ import annotations

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, add, cast, dtype_of, reshape, shape_of, transpose
from cgc.frontends.formulas import attend, attention_scores
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr
from cgc.machine.hardware import dtypes

SOFTMAX_PRECISIONS = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}
"""The ``softmax_precision`` codes Attention accepts."""


def take(im: Importer, x: SSAValue, axis: int, start: int, stop: int) -> SSAValue:
    """``x[..., start:stop, ...]`` along ``axis``."""
    shape = list(shape_of(x))
    starts, limits = [0] * len(shape), list(shape)
    starts[axis], limits[axis] = start, stop
    return im.emit(wse.SliceOp(x, starts, limits, [1] * len(shape)))


def split_heads(im: Importer, x: SSAValue, heads: int, what: str) -> SSAValue:
    """``(B, S, H * D)`` to ``(B, H, S, D)``."""
    batch, seq, hidden = shape_of(x)
    if heads <= 0 or hidden % heads:
        raise NodeError(f"{what} {shape_of(x)} does not split into {heads} heads")
    x = reshape(im, x, [batch, seq, heads, hidden // heads])
    return transpose(im, x, [0, 2, 1, 3])


def neg_inf(im: Importer, dtype: str) -> SSAValue:
    """A rank-0 ``-inf`` of ``dtype``."""
    return im.const(np.array(-np.inf, dtype=dtypes.dtype(dtype)))


def additive(im: Importer, allowed: SSAValue, dtype: str) -> SSAValue:
    """``0`` where ``allowed``, ``-inf`` elsewhere."""
    known = im.known.get(allowed)
    if known is not None:
        return im.const(np.where(known, 0, -np.inf).astype(dtypes.dtype(dtype)))
    zero = im.const(np.array(0, dtype=dtypes.dtype(dtype)))
    return im.emit(wse.SelectOp(allowed, zero, neg_inf(im, dtype)))


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


class Frame:
    """The sequence geometry of one Attention node: query and total key lengths, and the
    offset of the first query (a constant, or per batch from ``nonpad_kv_seqlen``)."""

    def __init__(self, queries: int, keys: int, past: int, nonpad: SSAValue | None, dtype: str):
        self.queries = queries
        self.keys = keys
        self.past = past
        self.nonpad = nonpad
        self.dtype = dtype
        self.rows = np.arange(queries).reshape(queries, 1)
        self.cols = np.arange(keys).reshape(1, keys)

    def lengths(self, im: Importer) -> SSAValue:
        """``nonpad_kv_seqlen`` shaped ``(B, 1, 1, 1)``."""
        assert self.nonpad is not None
        return reshape(im, self.nonpad, [shape_of(self.nonpad)[0], 1, 1, 1])

    def per_batch_offset(self, im: Importer) -> SSAValue | None:
        """``nonpad_kv_seqlen - queries`` shaped ``(B, 1, 1, 1)``, or None for a constant
        offset."""
        if self.nonpad is None:
            return None
        queries = im.const(np.array(self.queries, dtype=np.int64))
        return im.emit(wse.SubOp(self.lengths(im), queries))

    def causal(self, im: Importer) -> SSAValue:
        """Where query ``i`` may see key ``j``: ``j <= i + offset``."""
        offset = self.per_batch_offset(im)
        if offset is None:
            return im.const(self.cols <= self.rows + self.past)
        lag = im.const((self.cols - self.rows).astype(np.int64))
        return im.emit(wse.GreaterEqualOp(offset, lag))

    def window(self, im: Importer, left: int, right: int) -> SSAValue:
        """Where key ``j`` lies in ``[p - left, p + right]`` of query position ``p``."""
        offset = self.per_batch_offset(im)
        if offset is None:
            diff = self.rows + self.past - self.cols
            mask = np.ones_like(diff, dtype=bool)
            if left >= 0:
                mask &= diff <= left
            if right >= 0:
                mask &= -diff <= right
            return im.const(mask)
        lag = (self.cols - self.rows).astype(np.int64)
        allowed: SSAValue | None = None
        if left >= 0:
            allowed = im.emit(wse.GreaterEqualOp(im.const(lag + left), offset))
        if right >= 0:
            ahead = im.emit(wse.GreaterEqualOp(offset, im.const(lag - right)))
            allowed = ahead if allowed is None else im.emit(wse.AndOp(allowed, ahead))
        assert allowed is not None, "a window needs a left or a right size"
        return allowed

    def padding(self, im: Importer) -> SSAValue:
        """Where key ``j`` is before the batch's ``nonpad_kv_seqlen``, ``(B, 1, 1, keys)``."""
        keys = im.const(np.arange(self.keys, dtype=np.int64))
        return im.emit(wse.GreaterOp(self.lengths(im), keys))


def mask_bias(im: Importer, mask: SSAValue, frame: Frame) -> SSAValue:
    """A boolean mask as 0 / -inf, other masks as an additive term; a mask shorter than the
    keys is padded with disallowed positions."""
    shape = shape_of(mask)
    if not shape:
        mask = reshape(im, mask, [1])
        shape = (1,)
    short = frame.keys - shape[-1]
    if short < 0:
        raise NodeError(f"attn_mask {shape} has more than {frame.keys} keys")
    if dtype_of(mask).name == "bool":
        if short:
            zeros = [0] * len(shape)
            mask = im.emit(wse.PadOp(mask, zeros, [*zeros[:-1], short], 0.0))
        return additive(im, mask, frame.dtype)
    mask = cast(im, mask, frame.dtype)
    if short:
        fill = np.full((*shape[:-1], short), -np.inf, dtype=dtypes.dtype(frame.dtype))
        mask = im.emit(wse.ConcatOp([mask, im.const(fill)], len(shape) - 1))
    return mask


def attention_bias(im: Importer, node: Node, mask: SSAValue | None, frame: Frame):
    """The additive bias of the attention scores (None when there is none)."""
    bias = None if mask is None else mask_bias(im, mask, frame)
    if node.attr("is_causal", 0):
        bias = add(im, bias, additive(im, frame.causal(im), frame.dtype))
    left, right = -1, -1
    if im.opset >= 25:
        left = int(node.attr("left_window_size", -1))
        right = int(node.attr("right_window_size", -1))
        for name, size in (("left_window_size", left), ("right_window_size", right)):
            if size < -1:
                raise bad_attr(name, size, " (must be -1 or non-negative)")
    if left >= 0 or right >= 0:
        bias = add(im, bias, additive(im, frame.window(im, left, right), frame.dtype))
    if frame.nonpad is not None:
        bias = add(im, bias, additive(im, frame.padding(im), frame.dtype))
    return bias


def masked_rows(im: Importer, bias: SSAValue | None) -> SSAValue | None:
    """Where a query row's bias is ``-inf`` for every key (``(..., q, 1)``); None when no row
    can be (the bias is known and has no such row)."""
    if bias is None:
        return None
    axis = len(shape_of(bias)) - 1
    known = im.known.get(bias)
    if known is not None and not np.isneginf(known.max(axis=axis)).any():
        return None
    peak = im.emit(wse.ReduceMaxOp(bias, [axis], True))
    return im.emit(wse.EqualOp(peak, neg_inf(im, dtype_of(bias).name)))


def probabilities(im: Importer, node: Node, scores: SSAValue, bias: SSAValue | None):
    """The attention weights in the scores' type: softmax (in ``softmax_precision``) with
    fully masked rows zeroed."""
    dtype = dtype_of(scores).name
    code = node.attr("softmax_precision", None)
    if code is not None:
        if int(code) not in SOFTMAX_PRECISIONS:
            raise bad_attr("softmax_precision", code)
        scores = cast(im, scores, SOFTMAX_PRECISIONS[int(code)])
    empty = masked_rows(im, bias)
    rank = len(shape_of(scores))
    if empty is not None:  # a row of -inf would make NaN, in the softmax and its gradient
        scores = im.emit(wse.SelectOp(empty, im.scalar(0.0, scores), scores))
    weights = im.emit(wse.SoftmaxOp(scores, rank - 1))
    if empty is not None:
        weights = im.emit(wse.SelectOp(empty, im.scalar(0.0, weights), weights))
    return cast(im, weights, dtype)


def attention_inputs(im: Importer, node: Node) -> tuple[SSAValue, SSAValue, SSAValue, bool]:
    """Q, K and V as ``(B, H, S, D)``, and whether they came in as 3-D."""
    q, k, v = im.value(node, 0), im.value(node, 1), im.value(node, 2)
    ranks = {len(shape_of(x)) for x in (q, k, v)}
    if len(ranks) != 1 or ranks.pop() not in (3, 4):
        raise NodeError(
            f"Q {shape_of(q)}, K {shape_of(k)} and V {shape_of(v)} must all be 3-D or all 4-D"
        )
    q_heads, kv_heads = node.attr("q_num_heads", None), node.attr("kv_num_heads", None)
    if len(shape_of(q)) == 4:
        if im.opset >= 25 and (q_heads is not None or kv_heads is not None):
            raise NodeError("q_num_heads and kv_num_heads are only for 3-D inputs")
        return q, k, v, False
    if q_heads is None or kv_heads is None:
        raise NodeError("3-D inputs need the attributes q_num_heads and kv_num_heads")
    q = split_heads(im, q, int(q_heads), "Q")
    k = split_heads(im, k, int(kv_heads), "K")
    v = split_heads(im, v, int(kv_heads), "V")
    return q, k, v, True


def with_past(im: Importer, node: Node, k: SSAValue, v: SSAValue) -> tuple:
    """K and V after the past cache (present_key, present_value) and the past length."""
    past_k, past_v = im.optional(node, 4), im.optional(node, 5)
    if (past_k is None) != (past_v is None):
        raise NodeError("past_key and past_value must be given together")
    if past_k is None:
        return k, v, 0
    assert past_v is not None
    past = shape_of(past_k)[2]
    k = im.emit(wse.ConcatOp([past_k, k], 2))
    v = im.emit(wse.ConcatOp([past_v, v], 2))
    return k, v, past


def soft_cap(im: Importer, scores: SSAValue, cap: float) -> SSAValue:
    """``cap * tanh(scores / cap)``; the scores themselves when ``cap`` is not positive."""
    if cap <= 0:
        return scores
    limit = im.scalar(cap, scores)
    return im.emit(wse.MulOp(im.emit(wse.TanhOp(im.emit(wse.DivOp(scores, limit)))), limit))


@register("Attention")
def _attention(im: Importer, node: Node) -> list:
    mode = int(node.attr("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise bad_attr("qk_matmul_output_mode", mode)
    q, k, v, packed = attention_inputs(im, node)
    batch, q_heads, queries, head = shape_of(q)
    kv_heads = shape_of(k)[1]
    if q_heads % kv_heads or shape_of(v)[1] != kv_heads:
        raise NodeError(f"{q_heads} query heads do not group over {kv_heads} key/value heads")
    nonpad = im.optional(node, 6) if im.opset >= 24 else None
    k, v, past = with_past(im, node, k, v)
    if nonpad is not None and past:
        raise NodeError("nonpad_kv_seqlen cannot be used with past_key and past_value")
    scale = node.attr("scale", None)
    scale = 1.0 / np.sqrt(head) if scale is None else float(scale)
    raw = attention_scores(im, q, k, scale)
    capped = soft_cap(im, raw, float(node.attr("softcap", 0.0)))
    dtype = dtype_of(q).name
    frame = Frame(queries, shape_of(k)[2], past, nonpad, dtype)
    bias = attention_bias(im, node, im.optional(node, 3), frame)
    scores = capped if bias is None else im.emit(wse.AddOp(capped, bias))
    weights = probabilities(im, node, scores, bias)
    y = attend(im, weights, v, q_heads // kv_heads)
    if packed:
        y = transpose(im, y, [0, 2, 1, 3])
        y = reshape(im, y, [batch, queries, q_heads * shape_of(v)[3]])
    debug = (raw, capped, scores, weights)[mode]
    return [y, k, v, cast(im, debug, dtype)]


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding
# ---------------------------------------------------------------------------------------------


def rotary_tables(
    im: Importer, node: Node, batch: int, seq: int, half: int
) -> tuple[SSAValue, SSAValue]:
    """The cos and sin of every token, ``(B, S, rotary_dim / 2)``."""
    cos, sin = im.value(node, 1), im.value(node, 2)
    positions = im.optional(node, 3)
    if positions is not None:
        if shape_of(positions) != (batch, seq):
            raise NodeError(f"position_ids {shape_of(positions)} must be {(batch, seq)}")
        cos = im.emit(wse.GatherOp(cos, positions, 0))
        sin = im.emit(wse.GatherOp(sin, positions, 0))
    for name, table in (("cos_cache", cos), ("sin_cache", sin)):
        if shape_of(table) != (batch, seq, half):
            raise NodeError(
                f"{name} gives {shape_of(table)} per token, expected {(batch, seq, half)}"
            )
    return cos, sin


@register("RotaryEmbedding")
def _rotary_embedding(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    if len(shape) == 4:
        batch, _, seq, head = shape
        table_shape = [batch, 1, seq, -1]
    elif len(shape) == 3:
        heads = node.attr("num_heads", None)
        if heads is None or int(heads) <= 0 or shape[2] % int(heads):
            raise NodeError(f"a 3-D input {shape} needs num_heads that divides its last axis")
        batch, seq, hidden = shape
        head = hidden // int(heads)
        x = reshape(im, x, [batch, seq, int(heads), head])
        table_shape = [batch, seq, 1, -1]
    else:
        raise NodeError(f"the input {shape} must be 3-D or 4-D")
    dim = int(node.attr("rotary_embedding_dim", 0)) or head
    if dim % 2 or dim > head:
        raise bad_attr("rotary_embedding_dim", dim, f" for heads of size {head}")
    cos, sin = rotary_tables(im, node, batch, seq, dim // 2)
    table_shape[-1] = dim // 2
    cos, sin = reshape(im, cos, table_shape), reshape(im, sin, table_shape)
    y = rotate(im, x, cos, sin, dim, bool(node.attr("interleaved", 0)))
    return [reshape(im, y, shape)]


def rotate(
    im: Importer, x: SSAValue, cos: SSAValue, sin: SSAValue, dim: int, interleaved: bool
) -> SSAValue:
    """The first ``dim`` features of the last axis rotated in pairs (halves, or neighbours when
    ``interleaved``); the rest pass through."""
    shape = shape_of(x)
    rank, head = len(shape), shape[-1]
    ones = [1] * rank
    if interleaved:
        evens = im.emit(wse.SliceOp(x, [0] * rank, [*shape[:-1], dim], [*ones[:-1], 2]))
        odds = im.emit(wse.SliceOp(x, [0] * (rank - 1) + [1], [*shape[:-1], dim], [*ones[:-1], 2]))
        first, second = evens, odds
    else:
        first = take(im, x, rank - 1, 0, dim // 2)
        second = take(im, x, rank - 1, dim // 2, dim)
    real = im.emit(wse.SubOp(im.emit(wse.MulOp(cos, first)), im.emit(wse.MulOp(sin, second))))
    imag = im.emit(wse.AddOp(im.emit(wse.MulOp(sin, first)), im.emit(wse.MulOp(cos, second))))
    if interleaved:
        pair = [*shape[:-1], dim // 2, 1]
        both = [reshape(im, real, pair), reshape(im, imag, pair)]
        rotated = reshape(im, im.emit(wse.ConcatOp(both, rank)), [*shape[:-1], dim])
    else:
        rotated = im.emit(wse.ConcatOp([real, imag], rank - 1))
    if dim == head:
        return rotated
    return im.emit(wse.ConcatOp([rotated, take(im, x, rank - 1, dim, head)], rank - 1))


# ---------------------------------------------------------------------------------------------
# LinearAttention
# ---------------------------------------------------------------------------------------------

UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


class LinearAttentionInputs:
    """The per-token inputs of LinearAttention, in float32, sliced out of the packed
    ``(B, T, H * D)`` tensors."""

    def __init__(self, im: Importer, node: Node, q_heads: int, kv_heads: int):
        self.im = im
        query, key, value = (cast(im, im.value(node, i), "float32") for i in range(3))
        for name, x in (("query", query), ("key", key), ("value", value)):
            if len(shape_of(x)) != 3:
                raise NodeError(f"{name} {shape_of(x)} must be 3-D (B, T, H * D)")
        self.batch, self.steps, q_hidden = shape_of(query)
        if q_hidden % q_heads or shape_of(value)[2] % kv_heads:
            raise NodeError(f"query {shape_of(query)} or value does not split into heads")
        self.q_heads, self.kv_heads = q_heads, kv_heads
        self.d_k, self.d_v = q_hidden // q_heads, shape_of(value)[2] // kv_heads
        if shape_of(key)[2] != kv_heads * self.d_k:
            raise NodeError(f"key {shape_of(key)} does not hold {kv_heads} heads of {self.d_k}")
        self.query, self.key, self.value = query, key, value
        self.decay = self._optional(node, 4)
        self.beta = self._optional(node, 5)

    def _optional(self, node: Node, index: int) -> SSAValue | None:
        value = self.im.optional(node, index)
        return None if value is None else cast(self.im, value, "float32")

    def token(self, x: SSAValue, step: int, shape: list[int]) -> SSAValue:
        """Token ``step`` of a packed tensor, reshaped."""
        return reshape(self.im, take(self.im, x, 1, step, step + 1), shape)

    def decay_shape(self) -> list[int]:
        """How a token's decay broadcasts over the state ``(B, H_kv, d_k, d_v)``."""
        assert self.decay is not None
        last = shape_of(self.decay)[2]
        if last == self.kv_heads:
            return [self.batch, self.kv_heads, 1, 1]
        if last == self.kv_heads * self.d_k:
            return [self.batch, self.kv_heads, self.d_k, 1]
        raise NodeError(f"decay {shape_of(self.decay)} must end in H_kv or H_kv * d_k")

    def beta_shape(self) -> list[int]:
        """How a token's update rate broadcasts over ``(B, H_kv, 1, d_v)``."""
        assert self.beta is not None
        last = shape_of(self.beta)[2]
        if last not in (1, self.kv_heads):
            raise NodeError(f"beta {shape_of(self.beta)} must end in H_kv or 1")
        return [self.batch, last, 1, 1]


def linear_attention_step(
    im: Importer, r: LinearAttentionInputs, state: SSAValue, step: int, scale: float
) -> tuple[SSAValue, SSAValue]:
    """One token of the recurrence: the new state and the output ``(B, 1, H_q * d_v)``."""
    b, hk, dk, dv = r.batch, r.kv_heads, r.d_k, r.d_v
    k_col = r.token(r.key, step, [b, hk, dk, 1])
    v_row = r.token(r.value, step, [b, hk, 1, dv])
    if r.decay is not None:
        gate = im.emit(wse.ExpOp(r.token(r.decay, step, r.decay_shape())))
        state = im.emit(wse.MulOp(state, gate))
    if r.beta is not None:
        k_row = reshape(im, k_col, [b, hk, 1, dk])
        recalled = im.emit(wse.MatmulOp(k_row, state))
        rate = r.token(r.beta, step, r.beta_shape())
        v_row = im.emit(wse.MulOp(rate, im.emit(wse.SubOp(v_row, recalled))))
    state = im.emit(wse.AddOp(state, im.emit(wse.MulOp(k_col, v_row))))
    groups = r.q_heads // hk
    q = r.token(r.query, step, [b, hk, groups, dk])
    out = im.emit(wse.MatmulOp(q, state))
    out = im.emit(wse.MulOp(out, im.scalar(scale, out)))
    return state, reshape(im, out, [b, 1, r.q_heads * dv])


@register("LinearAttention")
def _linear_attention(im: Importer, node: Node) -> list:
    rule = node.attr("update_rule", "gated_delta")
    if rule not in UPDATE_RULES:
        raise bad_attr("update_rule", rule)
    q_heads, kv_heads = node.attr("q_num_heads", None), node.attr("kv_num_heads", None)
    if q_heads is None or kv_heads is None:
        raise NodeError("attributes q_num_heads and kv_num_heads are required")
    q_heads, kv_heads = int(q_heads), int(kv_heads)
    if q_heads <= 0 or kv_heads <= 0 or q_heads % kv_heads:
        raise NodeError(f"q_num_heads={q_heads} must be a positive multiple of {kv_heads}")
    r = LinearAttentionInputs(im, node, q_heads, kv_heads)
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated != (r.decay is not None) or delta != (r.beta is not None):
        raise NodeError(f"update_rule={rule} takes {_rule_inputs(gated, delta)}")
    past = im.optional(node, 3)
    state_shape = [r.batch, kv_heads, r.d_k, r.d_v]
    if past is not None and shape_of(past) != tuple(state_shape):
        raise NodeError(f"past_state {shape_of(past)} must be {tuple(state_shape)}")
    out_dtype = dtype_of(im.value(node, 0)).name
    state_dtype = out_dtype if past is None else dtype_of(past).name
    state = im.const(np.zeros(state_shape, np.float32)) if past is None else past
    state = cast(im, state, "float32")
    scale = float(node.attr("scale", 0.0)) or 1.0 / float(np.sqrt(r.d_k))
    outputs = []
    for step in range(r.steps):
        state, out = linear_attention_step(im, r, state, step, scale)
        outputs.append(out)
    y = outputs[0] if len(outputs) == 1 else im.emit(wse.ConcatOp(outputs, 1))
    return [cast(im, y, out_dtype), cast(im, state, state_dtype)]


def _rule_inputs(gated: bool, delta: bool) -> str:
    wanted = [name for name, on in (("decay", gated), ("beta", delta)) if on]
    return " and ".join(wanted) + " inputs" if wanted else "neither decay nor beta"
